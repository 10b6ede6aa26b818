//! Configuration of what operators see: the access log and the admin listener.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds};

use drg_base::infra::units::ms;
use std::net::SocketAddr;

/// The JSON access log (see docs/operations.md, "Access log").
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AccessLogConfig {
    pub enabled: bool,
    /// The file lines are appended to (reopened on SIGUSR1); `null`: stderr. Relative to the
    /// config file.
    pub path: Option<PathBuf>,
    /// Lines waiting for the writer at most; beyond it lines are dropped (and counted), never
    /// waited for.
    pub buffer_lines: usize,
    /// Under a steady stream, buffered lines are written at least this often, in milliseconds
    /// (an idle writer writes at once).
    #[serde(rename = "flush_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub flush_interval: Duration,
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        AccessLogConfig {
            enabled: false,
            path: None,
            buffer_lines: 8_192,
            flush_interval: Duration::from_millis(1_000),
        }
    }
}

impl AccessLogConfig {
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !(1..=1_048_576).contains(&self.buffer_lines) {
            out.push(format!(
                "gateway.access_log.buffer_lines: {} is outside 1..=1048576",
                self.buffer_lines
            ));
        }
        if !(10..=10_000).contains(&ms(self.flush_interval)) {
            out.push(format!(
                "gateway.access_log.flush_interval_ms: {} is outside 10..=10000",
                ms(self.flush_interval)
            ));
        }
        if self.path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            out.push(
                "gateway.access_log.path: empty (use null for stderr, or a file path)".to_owned(),
            );
        }
        out
    }
}

/// The operator-only listener: readiness details (and, later, metrics).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdminConfig {
    /// `ip:port` (keep it on loopback or a private network) or `unix:/path/to.sock`;
    /// `null` turns the admin listener off.
    pub listen: Option<String>,
    /// Whether requests are recorded for `/metrics` (counters and histograms); gauges and
    /// reload counts are always kept. Off only to measure what recording costs.
    pub metrics: bool,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: Some("127.0.0.1:9180".into()),
            metrics: true,
        }
    }
}

impl AdminConfig {
    /// Problems of `gateway.admin`; `public_listen` is the public listener it must differ from.
    pub fn problems(&self, public_listen: &str) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(admin) = &self.listen {
            match admin.strip_prefix("unix:") {
                Some(path) if !path.is_empty() => {}
                Some(_) => out.push("gateway.admin.listen: 'unix:' needs a path".to_owned()),
                None if admin.parse::<SocketAddr>().is_err() => out.push(format!(
                    "gateway.admin.listen: '{admin}' is not ip:port or unix:/path"
                )),
                None if *admin == public_listen => out.push(
                    "gateway.admin.listen: must differ from gateway.listen (admin details are not for the public port)"
                        .to_owned(),
                ),
                None => {}
            }
        }
        out
    }
}
