//! Settings of the one Redis connection (`gateway.quota.redis`) the quota store, call logs and
//! top-domains share, and the quota store's policies on it.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds};

use crate::infra::units::ms;

/// What to do when Redis cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// Keep serving, count locally, add the local counts to Redis when it is back.
    FailOpen,
    /// Refuse counted calls (503) until Redis is back.
    FailClosed,
}

/// What to do when Redis may evict keys (its `maxmemory-policy` is not `noeviction`): under
/// memory pressure it would silently drop API-made keys and month counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvictionPolicyCheck {
    /// Keep serving; a WARN when it is seen (at the first probe and on each change), the
    /// policy in `/readyz` (admin) and `drg_quota_store_noeviction 0`.
    #[default]
    Warn,
    /// As `warn`, and not ready (`/readyz` 503 `quota_store_evicts`) while it lasts, so an
    /// orchestrator keeps traffic away until Redis is set to `noeviction`.
    Unready,
}

/// Which kind of Redis deployment the gateway talks to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RedisMode {
    /// One server (or a primary behind a fixed address): `url`.
    #[default]
    Single,
    /// Redis Cluster: `nodes` are seeds; the slot map is read from them and followed.
    Cluster,
    /// A primary watched by Sentinel: `sentinel.nodes` tell which server is the master now.
    Sentinel,
}

/// `gateway.quota.redis.sentinel`: where the sentinels are and what they call the master.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SentinelConfig {
    /// The name the sentinels monitor the master under (`sentinel monitor <name> ...`).
    pub master_name: String,
    /// Sentinel addresses, `redis://host:port` (credentials in a URL are the sentinel's own).
    pub nodes: Vec<String>,
    /// A counted call is trusted only once this many replicas have it (`WAIT`, within the call
    /// budget); otherwise it is settled by its id later, like a call whose reply never came.
    /// Replication is asynchronous: without it, counts the old master acknowledged and had not
    /// passed on yet are lost in a failover. `0` turns the wait off.
    pub wait_replicas: u32,
}

impl Default for SentinelConfig {
    fn default() -> Self {
        SentinelConfig {
            master_name: String::new(),
            nodes: Vec::new(),
            wait_replicas: 1,
        }
    }
}

/// Settings of the Redis store.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RedisConfig {
    pub mode: RedisMode,
    /// `redis://[user:password@]host:port[/db]`. In sentinel mode only its credentials and db are
    /// used (for the master the sentinels name).
    pub url: String,
    /// Cluster mode: seed nodes, `redis://[user:password@]host:port` (a few suffice).
    pub nodes: Vec<String>,
    pub sentinel: SentinelConfig,
    /// Budget of one Redis call, in milliseconds.
    #[serde(rename = "call_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub call_timeout: Duration,
    /// Budget of one (re)connection attempt, in milliseconds.
    #[serde(rename = "connect_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub connect_timeout: Duration,
    pub failure_policy: FailurePolicy,
    /// When Redis's `maxmemory-policy` is not `noeviction` (checked with every probe).
    pub on_eviction_policy: EvictionPolicyCheck,
    /// Consecutive failures that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long the breaker stays open before one call probes Redis again, in milliseconds.
    #[serde(rename = "breaker_open_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub breaker_open: Duration,
    /// How often local counts are added to Redis after an outage, in milliseconds.
    #[serde(rename = "reconcile_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub reconcile_interval: Duration,
    /// Batched counting: `0` (the default) makes one Redis call per counted call. Otherwise a
    /// gateway far from a key's limit reserves `batch_max` calls in one round trip (a lease) and
    /// admits from it locally; unused leases are given back after this many ms.
    #[serde(rename = "sync_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub sync_interval: Duration,
    /// Batched counting: the lease size. Within `batch_max` of the limit every call goes to
    /// Redis. Leases are counted before they are used, so a key never exceeds its limit; until
    /// unused leases are given back, a key may be refused up to `gateways x batch_max` early and
    /// `/v1/usage` may read that much high.
    pub batch_max: u64,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            mode: RedisMode::Single,
            url: "redis://127.0.0.1:6379/".into(),
            nodes: Vec::new(),
            sentinel: SentinelConfig::default(),
            call_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(200),
            failure_policy: FailurePolicy::FailOpen,
            on_eviction_policy: EvictionPolicyCheck::Warn,
            breaker_failures: 3,
            breaker_open: Duration::from_millis(1_000),
            reconcile_interval: Duration::from_millis(250),
            sync_interval: Duration::ZERO,
            batch_max: 20,
        }
    }
}

impl RedisConfig {
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Err(e) = redis::Client::open(self.url.as_str()) {
            out.push(format!("gateway.quota.redis.url: {e}"));
        }
        out.extend(self.mode_problems());
        for (k, v, max) in [
            ("call_timeout_ms", self.call_timeout, 10_000),
            ("connect_timeout_ms", self.connect_timeout, 10_000),
            ("breaker_open_ms", self.breaker_open, 600_000),
            ("reconcile_interval_ms", self.reconcile_interval, 60_000),
        ] {
            let v = ms(v);
            if !(1..=max).contains(&v) {
                out.push(format!("gateway.quota.redis.{k}: {v} is outside 1..={max}"));
            }
        }
        if ms(self.sync_interval) > 60_000 {
            out.push(format!(
                "gateway.quota.redis.sync_interval_ms: {} is outside 0..=60000",
                ms(self.sync_interval)
            ));
        }
        if self.batched() && self.batch_max == 0 {
            out.push(
                "gateway.quota.redis.batch_max: must be at least 1 with sync_interval_ms".into(),
            );
        }
        if self.breaker_failures == 0 {
            out.push("gateway.quota.redis.breaker_failures: must be at least 1".into());
        }
        out
    }

    /// What is wrong with the keys of the chosen `mode` (and keys of another mode that are set,
    /// which would otherwise be silently ignored).
    fn mode_problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let bad_urls = |key: &str, urls: &[String], out: &mut Vec<String>| {
            if urls.is_empty() {
                out.push(format!(
                    "gateway.quota.redis.{key}: at least one node is needed"
                ));
            }
            for u in urls {
                if let Err(e) = redis::Client::open(u.as_str()) {
                    out.push(format!("gateway.quota.redis.{key}: {e}"));
                }
            }
        };
        let sentinel_set = self.sentinel != SentinelConfig::default();
        match self.mode {
            RedisMode::Single => {
                if !self.nodes.is_empty() || sentinel_set {
                    out.push(
                        "gateway.quota.redis: `nodes` and `sentinel` need `mode: cluster` or `mode: sentinel`"
                            .into(),
                    );
                }
            }
            RedisMode::Cluster => {
                bad_urls("nodes", &self.nodes, &mut out);
                if sentinel_set {
                    out.push("gateway.quota.redis.sentinel: only with `mode: sentinel`".into());
                }
            }
            RedisMode::Sentinel => {
                bad_urls("sentinel.nodes", &self.sentinel.nodes, &mut out);
                if self.sentinel.master_name.trim().is_empty() {
                    out.push("gateway.quota.redis.sentinel.master_name: must be set".into());
                }
                if !self.nodes.is_empty() {
                    out.push("gateway.quota.redis.nodes: only with `mode: cluster`".into());
                }
            }
        }
        out
    }

    /// The deployment, for the log, its URLs passed through `redact` (no passwords in logs).
    pub fn describe(&self, redact: fn(&str) -> String) -> String {
        let list = |urls: &[String]| {
            urls.iter()
                .map(|u| redact(u))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self.mode {
            RedisMode::Single => format!("Redis at {}", redact(&self.url)),
            RedisMode::Cluster => format!("Redis Cluster, seed nodes {}", list(&self.nodes)),
            RedisMode::Sentinel => format!(
                "Redis master '{}' named by the sentinels at {}",
                self.sentinel.master_name,
                list(&self.sentinel.nodes)
            ),
        }
    }

    /// Replicas a counted call must reach before its reply is trusted (sentinel mode only).
    pub fn wait_replicas(&self) -> u32 {
        match self.mode {
            RedisMode::Sentinel => self.sentinel.wait_replicas,
            _ => 0,
        }
    }

    /// How often the background task pushes local counts to Redis: the reconcile interval, or
    /// the sync interval when batched counting gives leases back more often.
    pub fn sync_every(&self) -> Duration {
        if self.batched() {
            self.sync_interval.min(self.reconcile_interval)
        } else {
            self.reconcile_interval
        }
    }

    pub fn batched(&self) -> bool {
        !self.sync_interval.is_zero()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_their_millisecond_keys() {
        let c: RedisConfig = serde_yaml::from_str(
            "call_timeout_ms: 20\nbreaker_open_ms: 300\nsync_interval_ms: 40\nbatch_max: 5\n",
        )
        .unwrap();
        assert_eq!(c.call_timeout, Duration::from_millis(20));
        assert_eq!(c.breaker_open, Duration::from_millis(300));
        assert_eq!(c.connect_timeout, Duration::from_millis(200));
        assert_eq!(c.sync_every(), Duration::from_millis(40));
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        let bad: RedisConfig =
            serde_yaml::from_str("call_timeout_ms: 0\nsync_interval_ms: 10\nbatch_max: 0\n")
                .unwrap();
        assert_eq!(
            bad.problems(),
            [
                "gateway.quota.redis.call_timeout_ms: 0 is outside 1..=10000",
                "gateway.quota.redis.batch_max: must be at least 1 with sync_interval_ms",
            ]
        );
        assert_eq!(
            RedisConfig::default().sync_every(),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn each_mode_needs_its_own_keys_and_only_those() {
        let problems = |yaml: &str| {
            serde_yaml::from_str::<RedisConfig>(yaml)
                .unwrap()
                .problems()
        };
        assert!(problems("mode: single\n").is_empty());
        assert!(
            problems("mode: cluster\nnodes: [redis://10.0.0.1:7000, redis://10.0.0.2:7000]\n")
                .is_empty()
        );
        let sentinel = problems(
            "mode: sentinel\nsentinel: {master_name: quota, nodes: [redis://10.0.0.1:26379]}\n",
        );
        assert!(sentinel.is_empty(), "{sentinel:?}");
        assert_eq!(
            problems("mode: cluster\n"),
            ["gateway.quota.redis.nodes: at least one node is needed"]
        );
        assert_eq!(
            problems("nodes: [redis://10.0.0.1:7000]\n"),
            ["gateway.quota.redis: `nodes` and `sentinel` need `mode: cluster` or `mode: sentinel`"]
        );
        assert_eq!(
            problems("mode: sentinel\nsentinel: {nodes: [redis://10.0.0.1:26379]}\n"),
            ["gateway.quota.redis.sentinel.master_name: must be set"]
        );
        let bad = problems("mode: cluster\nnodes: [http://x]\n");
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].starts_with("gateway.quota.redis.nodes: "), "{bad:?}");
        assert!(serde_yaml::from_str::<RedisConfig>("mode: galaxy\n").is_err());
        let c: RedisConfig = serde_yaml::from_str(
            "mode: sentinel\nsentinel: {master_name: q, nodes: [redis://a]}\n",
        )
        .unwrap();
        assert_eq!(c.wait_replicas(), 1);
        assert_eq!(RedisConfig::default().wait_replicas(), 0);
        assert_eq!(
            c.describe(|u| u.replace('a', "*")),
            "Redis master 'q' named by the sentinels at redis://*"
        );
    }
}
