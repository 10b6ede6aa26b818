//! Configuration of the quota store: embedded state file or Redis.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds};

use crate::quota::alerts::config::AlertsConfig;
use drg_base::infra::redis::config::RedisConfig;
use drg_base::infra::units::ms;
use drg_webhook::guard::Listener;

/// The quota store.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct QuotaConfig {
    /// `local`: counters in a memory-mapped `state_file` shared by the gateways on this host.
    pub store: QuotaStoreKind,
    /// Where the local store keeps its counts. Relative to the config file. A path ending in
    /// `.json` (the format before) means the `.counters` file next to it; the JSON is imported.
    pub state_file: PathBuf,
    /// How often the counts are synced to disk (`msync`), in milliseconds (100 to 1000): the
    /// most a power loss can take (a crash of the process loses nothing).
    #[serde(rename = "flush_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub flush_interval: Duration,
    /// Key ids the state file has room for (a slot each, never freed), fixed when the file is
    /// created; beyond, calls of projects without a slot are refused (503, logged, counted).
    pub slots: u32,
    /// The shared store, when `store: redis`.
    pub redis: RedisConfig,
    /// Webhook alerts when a project's month reaches a threshold (absent: none).
    pub alerts: Option<AlertsConfig>,
}

/// Which quota store to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaStoreKind {
    Local,
    /// Redis, shared by several gateways (see `redis`).
    Redis,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        QuotaConfig {
            store: QuotaStoreKind::Local,
            state_file: PathBuf::from("../state/quota.counters"),
            flush_interval: Duration::from_millis(1_000),
            slots: crate::quota::local::DEFAULT_SLOTS,
            redis: RedisConfig::default(),
            alerts: None,
        }
    }
}

impl QuotaConfig {
    /// Problems of `gateway.quota`, each naming its key (Redis's only with `store: redis`);
    /// `listeners`: the gateway's own, which alerts may never go to.
    pub fn problems(&self, listeners: &[Listener]) -> Vec<String> {
        let mut out = Vec::new();
        if !(100..=1_000).contains(&ms(self.flush_interval)) {
            out.push(format!(
                "gateway.quota.flush_interval_ms: {} is outside 100..=1000",
                ms(self.flush_interval)
            ));
        }
        {
            use crate::quota::local::{MAX_SLOTS, MIN_SLOTS};
            if !(MIN_SLOTS..=MAX_SLOTS).contains(&self.slots) {
                out.push(format!(
                    "gateway.quota.slots: {} is outside {MIN_SLOTS}..={MAX_SLOTS}",
                    self.slots
                ));
            }
        }
        if self.store == QuotaStoreKind::Redis {
            out.extend(self.redis.problems());
        }
        if let Some(alerts) = &self.alerts {
            out.extend(alerts.problems(listeners));
        }
        out
    }
}
