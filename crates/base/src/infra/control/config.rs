//! `gateway.control`: the PostgreSQL URL several gateways share, the call budget and the pool's
//! size. Without it, the control store is SQLite in the state folder.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds};
use sqlx::postgres::PgConnectOptions;

/// `gateway.control`: where the control store is.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// `postgres://user:password@host:port/database` (libpq's URL; `?sslmode=require` for
    /// TLS). Never logged: it may hold a password.
    pub url: String,
    /// One call's budget, the database's own `statement_timeout` included: past it a write
    /// answers `503` and the database has rolled it back.
    #[serde(rename = "call_timeout_ms", default = "default_call_timeout")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub call_timeout: Duration,
    /// Connections of this gateway at most.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// How often the store's revisions are asked, behind PostgreSQL's `NOTIFY` (which tells a
    /// change at once): what a notification lost while the listening connection was down waits
    /// at most.
    #[serde(rename = "poll_ms", default = "default_poll")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub poll: Duration,
}

fn default_poll() -> Duration {
    DEFAULT_POLL
}

/// The poll of the store's revisions by default (and always on SQLite).
pub const DEFAULT_POLL: Duration = Duration::from_millis(400);

fn default_call_timeout() -> Duration {
    Duration::from_millis(2_000)
}

fn default_max_connections() -> u32 {
    8
}

impl ControlConfig {
    /// Problems of the section, each naming its key.
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut out = Vec::new();
        let scheme = ["postgres://", "postgresql://"]
            .iter()
            .any(|s| self.url.starts_with(s));
        if !scheme || self.url.parse::<PgConnectOptions>().is_err() {
            out.push(format!(
                "{at}.url: not a postgres:// URL (postgres://user:password@host:5432/database)"
            ));
        }
        let ms = crate::infra::units::ms(self.call_timeout);
        if !(50..=60_000).contains(&ms) {
            out.push(format!("{at}.call_timeout_ms: {ms}; 50 to 60000"));
        }
        let poll = crate::infra::units::ms(self.poll);
        if !(50..=60_000).contains(&poll) {
            out.push(format!("{at}.poll_ms: {poll}; 50 to 60000"));
        }
        if !(1..=256).contains(&self.max_connections) {
            out.push(format!(
                "{at}.max_connections: {}; 1 to 256",
                self.max_connections
            ));
        }
        out
    }
}

/// The budget of one call on the state folder's SQLite (no section to set it).
pub const SQLITE_CALL_TIMEOUT: Duration = Duration::from_millis(2_000);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_takes_defaults_and_names_each_problem() {
        let c: ControlConfig =
            serde_yaml::from_str("{ url: 'postgres://drg:pw@127.0.0.1:5432/drg' }").unwrap();
        assert_eq!(c.call_timeout, Duration::from_millis(2_000));
        assert_eq!(c.max_connections, 8);
        assert!(c.problems("gateway.control").is_empty());
        let bad: ControlConfig = serde_yaml::from_str(
            "{ url: 'redis://x', call_timeout_ms: 10, max_connections: 0, poll_ms: 1 }",
        )
        .unwrap();
        let p = bad.problems("gateway.control").join("\n");
        for key in ["url", "call_timeout_ms", "max_connections", "poll_ms"] {
            assert!(p.contains(&format!("gateway.control.{key}")), "{p}");
        }
        assert!(serde_yaml::from_str::<ControlConfig>("{ url: x, other: 1 }").is_err());
    }
}
