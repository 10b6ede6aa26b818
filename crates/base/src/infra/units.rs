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
    chrono::DateTime::from_timestamp(unix, 0).map(rfc3339)
}

/// `at` as the API writes a time: RFC 3339, UTC, to the second (the fraction dropped, so a
/// time written is never later than the instant).
pub fn rfc3339(at: chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Now, as [`rfc3339`] writes it.
pub fn now_rfc3339() -> String {
    rfc3339(chrono::Utc::now())
}

/// Unix seconds as [`rfc3339`] writes them (the epoch for a time out of chrono's range).
pub fn unix_rfc3339(unix: i64) -> String {
    utc_seconds(unix).unwrap_or_else(|| rfc3339(chrono::DateTime::default()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_are_utc_to_the_second() {
        assert_eq!(
            super::utc_seconds(1_790_000_000).as_deref(),
            Some("2026-09-21T14:13:20Z")
        );
        assert_eq!(super::unix_rfc3339(1_790_000_000), "2026-09-21T14:13:20Z");
        assert_eq!(super::unix_rfc3339(i64::MAX), "1970-01-01T00:00:00Z");
        let t = chrono::DateTime::from_timestamp(1_790_000_000, 999_000_000).unwrap();
        assert_eq!(super::rfc3339(t), "2026-09-21T14:13:20Z");
        assert_eq!(super::utc_seconds(i64::MAX), None);
    }
}
