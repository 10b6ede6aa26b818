//! Durations as whole units, for configuration range checks and messages, and times as the
//! API writes them.

use std::time::Duration;

/// A duration in whole milliseconds.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A duration in whole seconds.
pub fn secs(d: Duration) -> u64 {
    d.as_secs()
}

/// Unix seconds as the API writes a time: RFC 3339, UTC, to the second (`None`: out of
/// chrono's range).
pub fn utc_seconds(unix: i64) -> Option<String> {
    let t = chrono::DateTime::from_timestamp(unix, 0)?;
    Some(t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_are_utc_to_the_second() {
        assert_eq!(
            super::utc_seconds(1_790_000_000).as_deref(),
            Some("2026-09-21T14:13:20Z")
        );
        assert_eq!(super::utc_seconds(i64::MAX), None);
    }
}
