//! `gateway.changes`: which plans' projects have their verdicts watched, how fast they are
//! judged again, and where (and how often) their changes are sent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds, DurationSeconds};

use drg_webhook::config::ReceiverConfig;
use drg_webhook::guard::Listener;

/// File name of the embedded store when `file` is not set: beside the quota state file.
pub const DEFAULT_FILE_NAME: &str = "changes.sqlite3";

/// Verdict changes (see docs/api.md, "Verdict changes"). Off unless `watch_days` names a plan.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChangesConfig {
    /// Plan name -> days a domain a project of that plan looked up stays watched after its
    /// last lookup (1-400). A plan not named here is not watched.
    pub watch_days: BTreeMap<String, u32>,
    /// Where each project's changes are POSTed, signed; absent: only `GET /v1/changes`.
    pub webhook: Option<ReceiverConfig>,
    /// Watched domains judged again per second at most (off the request path).
    pub reclassify_per_second: u32,
    /// A full pass over the watched domains at least this often, in seconds (evidence
    /// learned between reloads); every reload of the domain table starts one at once.
    #[serde(rename = "pass_interval_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub pass_interval: Duration,
    /// A change that rests on DNS evidence alone (no list, record or registry) is recorded
    /// only once every pass for this long found it, in seconds.
    #[serde(rename = "stable_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub stable: Duration,
    /// A domain's changes in one message that end where they began, within this many hours,
    /// are left out of it (a flip and its flip back; `GET /v1/changes` keeps both).
    pub quiet_hours: u32,
    /// A project's changes are gathered this long into one message, in milliseconds.
    #[serde(rename = "send_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub send_interval: Duration,
    /// Changes named in one message at most; beyond it the message is a summary (counts per
    /// transition) and `GET /v1/changes` has them all.
    pub max_per_message: u32,
    /// Domains watched per project at most; past it new domains are not watched (counted).
    pub max_watched_per_project: u32,
    /// Days a change stays readable through `GET /v1/changes`.
    pub keep_days: u32,
    /// The embedded store's SQLite file (with `quota.store: local`); `null`: `changes.sqlite3`
    /// in the folder of `quota.state_file`. Relative to the config file.
    pub file: Option<PathBuf>,
}

impl Default for ChangesConfig {
    fn default() -> Self {
        ChangesConfig {
            watch_days: BTreeMap::new(),
            webhook: None,
            reclassify_per_second: 2_000,
            pass_interval: Duration::from_secs(600),
            stable: Duration::from_secs(3_600),
            quiet_hours: 24,
            send_interval: Duration::from_millis(60_000),
            max_per_message: 100,
            max_watched_per_project: 100_000,
            keep_days: 30,
            file: None,
        }
    }
}

impl ChangesConfig {
    /// Whether any plan is watched.
    pub fn enabled(&self) -> bool {
        !self.watch_days.is_empty()
    }

    /// Problems of `gateway.changes`, each naming its key; `listeners` are the gateway's own.
    pub fn problems(&self, listeners: &[Listener]) -> Vec<String> {
        let at = "gateway.changes";
        let mut out = Vec::new();
        for (plan, days) in &self.watch_days {
            if !(1..=400).contains(days) {
                out.push(format!("{at}.watch_days.{plan}: {days} is outside 1..=400"));
            }
        }
        let mut range = |key: &str, v: u64, lo: u64, hi: u64| {
            if !(lo..=hi).contains(&v) {
                out.push(format!("{at}.{key}: {v} is outside {lo}..={hi}"));
            }
        };
        range(
            "reclassify_per_second",
            self.reclassify_per_second.into(),
            1,
            1_000_000,
        );
        range(
            "pass_interval_seconds",
            self.pass_interval.as_secs(),
            1,
            86_400,
        );
        range("stable_seconds", self.stable.as_secs(), 0, 7 * 86_400);
        range("quiet_hours", self.quiet_hours.into(), 0, 168);
        let send = drg_base::infra::units::ms(self.send_interval);
        range("send_interval_ms", send, 100, 86_400_000);
        range("max_per_message", self.max_per_message.into(), 1, 1_000);
        range(
            "max_watched_per_project",
            self.max_watched_per_project.into(),
            1,
            10_000_000,
        );
        range("keep_days", self.keep_days.into(), 1, 400);
        if let Some(hook) = &self.webhook {
            out.extend(hook.problems("gateway.changes.webhook", listeners));
        }
        out
    }

    /// Makes relative paths relative to `base` (the config file's folder).
    pub fn resolve_paths(&mut self, base: &Path) {
        if let Some(hook) = &mut self.webhook {
            hook.resolve_paths(base);
        }
        if let Some(f) = &mut self.file {
            *f = base.join(&*f);
        }
    }

    /// The embedded store's file: `file`, else beside the quota state file.
    pub fn file_path(&self, state_file: &Path) -> PathBuf {
        self.file.clone().unwrap_or_else(|| {
            state_file
                .parent()
                .unwrap_or(Path::new("."))
                .join(DEFAULT_FILE_NAME)
        })
    }

    /// How long a domain a project of `plan` looked up stays watched (`None`: not watched).
    pub fn watch_for(&self, plan: &str) -> Option<Duration> {
        self.watch_days
            .get(plan)
            .map(|d| Duration::from_secs(u64::from(*d) * 86_400))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_by_default_and_problems_name_their_keys() {
        let c = ChangesConfig::default();
        assert!(!c.enabled() && c.problems(&[]).is_empty());
        let bad: ChangesConfig = serde_yaml::from_str(
            "{ watch_days: { pro: 0 }, max_per_message: 0, send_interval_ms: 5, webhook: { url: 'ftp://x', secret_file: s } }",
        )
        .unwrap();
        let p = bad.problems(&[]).join("\n");
        for needle in [
            "watch_days.pro: 0",
            "max_per_message: 0",
            "send_interval_ms: 5",
            "webhook.url",
        ] {
            assert!(p.contains(needle), "{needle}: {p}");
        }
        let loopback: ChangesConfig = serde_yaml::from_str(
            "{ watch_days: { pro: 30 }, webhook: { url: 'http://127.0.0.1:9/h', secret_file: s } }",
        )
        .unwrap();
        assert!(loopback.problems(&[]).join("\n").contains("loopback"));
        assert_eq!(
            loopback.watch_for("pro"),
            Some(Duration::from_secs(30 * 86_400))
        );
        assert_eq!(loopback.watch_for("free"), None);
        assert!(serde_yaml::from_str::<ChangesConfig>("{ when: 1 }").is_err());
    }
}
