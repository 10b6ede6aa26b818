//! `gateway.calls`: the settings of the call logs and daily stats (`/v1/logs`, `/v1/stats`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds, DurationSeconds};

/// File name of the embedded store when `path` is not set: beside the quota state file, in the
/// gateway's state folder.
pub const DEFAULT_FILE_NAME: &str = "calls.sqlite3";

/// The call logs and daily stats of each project (see docs/api.md, "Call logs and stats").
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CallsConfig {
    /// Record calls and answer `/v1/logs` and `/v1/stats` (off: those routes answer 404 and
    /// nothing is recorded).
    pub enabled: bool,
    /// The embedded store's SQLite file (with `quota.store: local`); `null`: `calls.sqlite3`
    /// in the folder of `quota.state_file`. Relative to the config file.
    pub path: Option<PathBuf>,
    /// Calls waiting for the writer at most; beyond, calls are dropped (and counted), never
    /// waited for.
    pub queue_capacity: usize,
    /// Calls of one project waiting for the writer at most (its share of `queue_capacity`;
    /// above it, `queue_capacity`): beyond, that project's calls are dropped and counted, so
    /// a few big batches of one project cannot push out the others' calls.
    pub queue_per_project: usize,
    /// How often the writer takes the waiting calls and stores them in one batch, in
    /// milliseconds: how far `/v1/logs` and `/v1/stats` may lag behind the calls.
    #[serde(rename = "batch_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub batch_interval: Duration,
    /// Log entries kept per project; the oldest go first.
    pub max_per_project: u64,
    /// How often entries older than their plan's `log_retention` are deleted, in seconds (reads
    /// never show them, whatever this says).
    #[serde(rename = "sweep_interval_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub sweep_interval: Duration,
    /// Most bytes of a `/v1/check` answer read for its `risk_score` and `reason`; a larger
    /// answer is passed on untouched and its call is not logged (still counted in the stats).
    pub check_body_max_bytes: usize,
}

impl Default for CallsConfig {
    fn default() -> Self {
        CallsConfig {
            enabled: true,
            path: None,
            queue_capacity: 65_536,
            queue_per_project: 8_192,
            batch_interval: Duration::from_millis(200),
            max_per_project: 10_000,
            sweep_interval: Duration::from_secs(300),
            check_body_max_bytes: 64 * 1024,
        }
    }
}

impl CallsConfig {
    /// Problems, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut range = |key: &str, value: u64, lo: u64, hi: u64| {
            if !(lo..=hi).contains(&value) {
                out.push(format!(
                    "gateway.calls.{key}: {value} is outside {lo}..={hi}"
                ));
            }
        };
        range("queue_capacity", self.queue_capacity as u64, 1, 1 << 20);
        // Above `queue_capacity` it is `queue_capacity` (one project may fill the queue).
        range(
            "queue_per_project",
            self.queue_per_project as u64,
            1,
            1 << 20,
        );
        range(
            "batch_interval_ms",
            self.batch_interval.as_millis() as u64,
            10,
            10_000,
        );
        range("max_per_project", self.max_per_project, 1, 10_000_000);
        range(
            "sweep_interval_seconds",
            self.sweep_interval.as_secs(),
            1,
            86_400,
        );
        range(
            "check_body_max_bytes",
            self.check_body_max_bytes as u64,
            1_024,
            1 << 24,
        );
        if self.path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            out.push("gateway.calls.path: empty (use null for the default)".to_owned());
        }
        out
    }

    /// The embedded store's file: `path`, relative to `base` (the config file's folder), or the
    /// default beside `quota_state_file` (already resolved).
    pub fn resolve_path(&mut self, base: &Path, quota_state_file: &Path) {
        self.path = Some(match self.path.take() {
            Some(p) if p.is_relative() => base.join(p),
            Some(p) => p,
            None => quota_state_file
                .parent()
                .unwrap_or(base)
                .join(DEFAULT_FILE_NAME),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_name_their_keys() {
        let c = CallsConfig {
            queue_capacity: 0,
            queue_per_project: 0,
            batch_interval: Duration::from_millis(1),
            max_per_project: 0,
            sweep_interval: Duration::ZERO,
            check_body_max_bytes: 10,
            path: Some(PathBuf::new()),
            enabled: true,
        };
        let p = c.problems().join("\n");
        for key in [
            "queue_capacity: 0",
            "queue_per_project: 0",
            "batch_interval_ms: 1 ",
            "max_per_project: 0",
            "sweep_interval_seconds: 0",
            "check_body_max_bytes: 10",
            "path: empty",
        ] {
            assert!(p.contains(key), "{key} in {p}");
        }
        assert!(CallsConfig::default().problems().is_empty());
    }

    #[test]
    fn default_file_sits_beside_the_quota_state() {
        let mut c = CallsConfig::default();
        c.resolve_path(Path::new("/etc/g"), Path::new("/var/lib/g/quota.counters"));
        assert_eq!(c.path.unwrap(), Path::new("/var/lib/g/calls.sqlite3"));
        let mut c = CallsConfig {
            path: Some("x/calls.db".into()),
            ..CallsConfig::default()
        };
        c.resolve_path(Path::new("/etc/g"), Path::new("/var/lib/g/quota.counters"));
        assert_eq!(c.path.unwrap(), Path::new("/etc/g/x/calls.db"));
    }
}
