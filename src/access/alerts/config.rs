//! Configuration of quota alerts (`gateway.quota.alerts`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds};

/// Where alerts go, how they are signed, when they fire and how hard delivery tries.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsConfig {
    /// The receiver: `http://` or `https://`.
    pub url: String,
    /// A file holding the HMAC-SHA256 secret (its first line, at least 16 bytes). Relative to
    /// the config file.
    pub secret_file: PathBuf,
    /// Percentages of the monthly limit, each alerted once per project and month.
    #[serde(default = "default_thresholds")]
    pub thresholds: Vec<u32>,
    /// One delivery attempt's budget, connection included, in milliseconds.
    #[serde(rename = "timeout_ms", default = "default_timeout")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub timeout: Duration,
    /// Attempts per alert before it is given up (counted as failed); the waits between them
    /// double from one second, up to ten minutes.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
    /// The outbox (SQLite). Default: `quota_alerts.sqlite` beside the quota state file.
    #[serde(default)]
    pub outbox_file: Option<PathBuf>,
    /// Alerts waiting for delivery at most; past it new ones are dropped (logged, counted).
    #[serde(default = "default_max_pending")]
    pub max_pending: u32,
}

fn default_thresholds() -> Vec<u32> {
    vec![80, 90, 100]
}

fn default_timeout() -> Duration {
    Duration::from_millis(5_000)
}

fn default_attempts() -> u32 {
    12
}

fn default_max_pending() -> u32 {
    10_000
}

/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;

impl AlertsConfig {
    /// Problems of `gateway.quota.alerts`, each naming its key (the secret file is read at
    /// start, see [`AlertsConfig::read_secret`]).
    pub fn problems(&self) -> Vec<String> {
        let at = "gateway.quota.alerts";
        let mut out = Vec::new();
        let scheme_ok = self.url.starts_with("http://") || self.url.starts_with("https://");
        if !scheme_ok || self.url.parse::<http::Uri>().is_err() {
            out.push(format!(
                "{at}.url: '{}' is not an http:// or https:// URL",
                self.url
            ));
        }
        if self.thresholds.is_empty() {
            out.push(format!("{at}.thresholds: at least one is needed"));
        }
        if let Some(t) = self.thresholds.iter().find(|t| !(1..=1000).contains(*t)) {
            out.push(format!(
                "{at}.thresholds: {t} is outside 1..=1000 (percent of the monthly limit)"
            ));
        }
        if self.thresholds.windows(2).any(|w| w[0] >= w[1]) {
            out.push(format!(
                "{at}.thresholds: {:?} must rise strictly",
                self.thresholds
            ));
        }
        let ms = crate::infra::units::ms(self.timeout);
        if !(100..=60_000).contains(&ms) {
            out.push(format!("{at}.timeout_ms: {ms} is outside 100..=60000"));
        }
        if !(1..=100).contains(&self.max_attempts) {
            out.push(format!(
                "{at}.max_attempts: {} is outside 1..=100",
                self.max_attempts
            ));
        }
        if !(1..=1_000_000).contains(&self.max_pending) {
            out.push(format!(
                "{at}.max_pending: {} is outside 1..=1000000",
                self.max_pending
            ));
        }
        out
    }

    /// Makes the relative paths relative to `base` (the config file's directory).
    pub fn resolve_paths(&mut self, base: &Path) {
        self.secret_file = base.join(&self.secret_file);
        if let Some(p) = &mut self.outbox_file {
            *p = base.join(&*p);
        }
    }

    /// The outbox file: as configured, or beside the quota state file.
    pub fn outbox_path(&self, state_file: &Path) -> PathBuf {
        self.outbox_file.clone().unwrap_or_else(|| {
            state_file
                .parent()
                .unwrap_or(Path::new("."))
                .join("quota_alerts.sqlite")
        })
    }

    /// The secret: the file's first line, trimmed.
    pub fn read_secret(&self) -> Result<Vec<u8>, String> {
        let text = std::fs::read_to_string(&self.secret_file).map_err(|e| {
            format!(
                "gateway.quota.alerts.secret_file {}: {e}",
                self.secret_file.display()
            )
        })?;
        let secret = text.lines().next().unwrap_or("").trim();
        if secret.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "gateway.quota.alerts.secret_file {}: the secret (first line) has {} bytes, at least {MIN_SECRET_BYTES} are needed",
                self.secret_file.display(),
                secret.len()
            ));
        }
        Ok(secret.as_bytes().to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> AlertsConfig {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn defaults_and_problems() {
        let c = config("{ url: 'https://hooks.example/drg', secret_file: s }");
        assert_eq!(c.thresholds, [80, 90, 100]);
        assert_eq!((c.max_attempts, c.timeout.as_millis()), (12, 5_000));
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        let bad = config(
            "{ url: 'ftp://x', secret_file: s, thresholds: [90, 80, 0], timeout_ms: 5, max_attempts: 0 }",
        );
        let p = bad.problems().join("\n");
        for needle in [
            "url",
            "0 is outside",
            "rise strictly",
            "timeout_ms",
            "max_attempts",
        ] {
            assert!(p.contains(needle), "{needle}: {p}");
        }
        assert!(
            serde_yaml_ng::from_str::<AlertsConfig>("{ url: x, secret_file: s, when: 1 }").is_err()
        );
    }

    #[test]
    fn the_outbox_sits_beside_the_state_file() {
        let c = config("{ url: 'http://x', secret_file: s }");
        assert_eq!(
            c.outbox_path(Path::new("/var/lib/drg/quota.counters")),
            Path::new("/var/lib/drg/quota_alerts.sqlite")
        );
    }
}
