//! Durations as whole units, for configuration range checks and messages.

use std::time::Duration;

/// A duration in whole milliseconds.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A duration in whole seconds.
pub fn secs(d: Duration) -> u64 {
    d.as_secs()
}
