//! Configuration of quota alerts (`gateway.quota.alerts`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds};

use drg_webhook::config::{delivery_problems, read_secret_file, url_problem};
use drg_webhook::guard::{Listener, Policy};

use super::marks::MAX_THRESHOLDS;

/// Where alerts go, how they are signed, when they fire and how hard delivery tries. Without
/// `url` they go only to the projects' own webhooks (`gateway.webhooks`).
///
/// Where they may go: the URL's host and, when an alert is sent, every address its name resolves
/// to must be public. Loopback, private (10/8, 172.16/12, 192.168/16, fc00::/7), carrier-grade NAT
/// (100.64/10), documentation, benchmarking and reserved ranges are refused unless
/// `allow_private: true`; link-local (169.254/16, fe80::/10: cloud metadata services),
/// unspecified, multicast and broadcast addresses, and the gateway's own listeners
/// (`gateway.listen`, `gateway.admin.listen`), always. An IPv4 address inside an IPv6 one
/// (`::ffff:a.b.c.d`, NAT64 `64:ff9b::/96`) is judged as itself, and a host spelled as a number
/// (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`) as the address it is.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsConfig {
    /// The operator's receiver: `http://` or `https://` (with `secret_file`).
    #[serde(default)]
    pub url: Option<String>,
    /// Let the receiver be on loopback or a private network (see above); link-local addresses
    /// and the gateway's own listeners stay refused. Default `false`.
    #[serde(default)]
    pub allow_private: bool,
    /// A file holding the HMAC-SHA256 secret (its first line, at least 16 bytes). Relative to
    /// the config file.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
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
    /// The previous release's own alerts outbox (SQLite), whose alerts are carried into the
    /// webhook engine's outbox at start (the one record of an alert since). Default:
    /// `quota_alerts.sqlite` beside the quota state file.
    #[serde(default)]
    pub outbox_file: Option<PathBuf>,
    /// Alerts waiting in the webhook outbox (for delivery or their claim) at most; past it new
    /// ones wait outside it (logged, counted as dropped).
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

impl Default for AlertsConfig {
    /// Alerts for the projects' own webhooks only, at the default thresholds.
    fn default() -> AlertsConfig {
        AlertsConfig {
            url: None,
            allow_private: false,
            secret_file: None,
            thresholds: default_thresholds(),
            timeout: default_timeout(),
            max_attempts: default_attempts(),
            outbox_file: None,
            max_pending: default_max_pending(),
        }
    }
}

impl AlertsConfig {
    /// Problems of `gateway.quota.alerts`, each naming its key (the secret file is read at
    /// start, see [`AlertsConfig::read_secret`]); `listeners` are the gateway's own.
    pub fn problems(&self, listeners: &[Listener]) -> Vec<String> {
        let at = "gateway.quota.alerts";
        let mut out = Vec::new();
        match (&self.url, &self.secret_file) {
            (Some(url), Some(_)) => out.extend(url_problem(at, url, &self.policy(listeners))),
            (Some(_), None) => out.push(format!("{at}.secret_file: needed with url")),
            (None, Some(_)) => out.push(format!("{at}.url: needed with secret_file")),
            (None, None) => {}
        }
        if self.thresholds.is_empty() {
            out.push(format!("{at}.thresholds: at least one is needed"));
        }
        // One bit each in the word the request path reads without a lock (`marks.rs`).
        if self.thresholds.len() > MAX_THRESHOLDS {
            out.push(format!(
                "{at}.thresholds: {} given, at most {MAX_THRESHOLDS}",
                self.thresholds.len()
            ));
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
        out.extend(delivery_problems(at, self.timeout, self.max_attempts));
        if !(1..=1_000_000).contains(&self.max_pending) {
            out.push(format!(
                "{at}.max_pending: {} is outside 1..=1000000",
                self.max_pending
            ));
        }
        out
    }

    /// What may receive the alerts.
    pub fn policy(&self, listeners: &[Listener]) -> Policy {
        Policy {
            allow_private: self.allow_private,
            listeners: listeners.to_vec(),
        }
    }

    /// Why the URL may not receive alerts, if it may not (checked again against listeners the
    /// command line gave).
    pub fn destination_problem(&self, listeners: &[Listener]) -> Option<String> {
        let url = self.url.as_ref()?;
        url_problem("gateway.quota.alerts", url, &self.policy(listeners))
    }

    /// Makes the relative paths relative to `base` (the config file's directory).
    pub fn resolve_paths(&mut self, base: &Path) {
        if let Some(p) = &mut self.secret_file {
            *p = base.join(&*p);
        }
        if let Some(p) = &mut self.outbox_file {
            *p = base.join(&*p);
        }
    }

    /// The previous release's outbox file: as configured, or beside the quota state file.
    pub fn previous_outbox_path(&self, state_file: &Path) -> PathBuf {
        self.outbox_file.clone().unwrap_or_else(|| {
            state_file
                .parent()
                .unwrap_or(Path::new("."))
                .join("quota_alerts.sqlite")
        })
    }

    /// The operator's receiver's secret (`None`: no `url`): the file's first line, trimmed.
    pub fn read_secret(&self) -> Result<Option<Vec<u8>>, String> {
        self.secret_file
            .as_ref()
            .map(|p| read_secret_file("gateway.quota.alerts.secret_file", p))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> AlertsConfig {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn defaults_and_problems() {
        let c = config("{ url: 'https://hooks.example/drg', secret_file: s }");
        assert_eq!(c.thresholds, [80, 90, 100]);
        assert_eq!((c.max_attempts, c.timeout.as_millis()), (12, 5_000));
        assert!(!c.allow_private);
        assert!(c.problems(&[]).is_empty(), "{:?}", c.problems(&[]));
        let bad = config(
            "{ url: 'ftp://x', secret_file: s, thresholds: [90, 80, 0], timeout_ms: 5, max_attempts: 0 }",
        );
        let p = bad.problems(&[]).join("\n");
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
            serde_yaml::from_str::<AlertsConfig>("{ url: x, secret_file: s, when: 1 }").is_err()
        );
        let mut many = config("{ url: 'https://hooks.example/drg', secret_file: s }");
        many.thresholds = (1..=33).collect();
        assert!(
            many.problems(&[])
                .join("\n")
                .contains("33 given, at most 32"),
            "{:?}",
            many.problems(&[])
        );
        many.thresholds.pop();
        assert!(many.problems(&[]).is_empty());
        // Without a receiver: alerts for the projects' webhooks only; a half receiver is wrong.
        assert!(config("{ thresholds: [50] }").problems(&[]).is_empty());
        let half = config("{ url: 'https://hooks.example/drg' }").problems(&[]);
        assert_eq!(half, ["gateway.quota.alerts.secret_file: needed with url"]);
    }

    #[test]
    fn a_private_or_own_destination_is_a_problem_of_the_url_listed_with_the_others() {
        let own = [
            Listener::parse("gateway.listen", "0.0.0.0:8080").unwrap(),
            Listener::parse("gateway.admin.listen", "127.0.0.1:9180").unwrap(),
        ];
        let problems = |url: &str, private: bool| {
            let mut c = config("{ url: x, secret_file: s }");
            (c.url, c.allow_private) = (Some(url.to_owned()), private);
            c.problems(&own).join("\n")
        };
        for (url, private, needle) in [
            (
                "http://169.254.169.254/latest/meta-data/",
                true,
                "link-local",
            ),
            ("http://127.0.0.1:9/x", false, "loopback"),
            (
                "http://[::ffff:127.0.0.1]/",
                false,
                "carries the IPv4 address 127.0.0.1, which is loopback",
            ),
            ("http://0x7f000001/", false, "127.0.0.1 is loopback"),
            ("http://2130706433/", false, "127.0.0.1 is loopback"),
            ("https://10.0.0.7/hook", false, "10.0.0.7 is private"),
            (
                "http://127.1:9180/",
                true,
                "own listener gateway.admin.listen",
            ),
            ("https://[::1]:8080/", true, "own listener gateway.listen"),
            (
                "http://foo.123/",
                true,
                "neither a DNS name nor an IP address",
            ),
        ] {
            let p = problems(url, private);
            assert!(
                p.starts_with("gateway.quota.alerts.url: host '"),
                "{url}: {p}"
            );
            assert!(p.contains(needle), "{url}: {p}");
            assert!(
                !p.contains("/x") && !p.contains("meta-data"),
                "no path: {p}"
            );
        }
        for fine in [
            "https://hooks.example.com/drg",
            "http://localhost:9180/",
            "http://93.184.216.34/",
        ] {
            assert_eq!(problems(fine, false), "", "{fine}");
        }
        assert_eq!(problems("http://127.0.0.1:9181/", true), "");
        // Listed with the section's other problems.
        let mut c = config("{ url: 'http://0177.0.0.1/', secret_file: s, max_attempts: 0 }");
        c.allow_private = false;
        let p = c.problems(&own);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(
            serde_yaml::from_str::<AlertsConfig>("{ url: x, secret_file: s, allow_private: true }")
                .unwrap()
                .allow_private
        );
    }

    #[test]
    fn the_outbox_sits_beside_the_state_file() {
        let c = config("{ url: 'http://x', secret_file: s }");
        assert_eq!(
            c.previous_outbox_path(Path::new("/var/lib/drg/quota.counters")),
            Path::new("/var/lib/drg/quota_alerts.sqlite")
        );
    }
}
