//! Settings of the Redis quota store (`gateway.quota.redis`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds};

/// What to do when Redis cannot be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// Keep serving, count locally, add the local counts to Redis when it is back.
    FailOpen,
    /// Refuse counted calls (503) until Redis is back.
    FailClosed,
}

/// Settings of the Redis store.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]`.
    pub url: String,
    /// Budget of one Redis call, in milliseconds.
    #[serde(rename = "call_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub call_timeout: Duration,
    /// Budget of one (re)connection attempt, in milliseconds.
    #[serde(rename = "connect_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub connect_timeout: Duration,
    pub failure_policy: FailurePolicy,
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
            url: "redis://127.0.0.1:6379/".into(),
            call_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_millis(200),
            failure_policy: FailurePolicy::FailOpen,
            breaker_failures: 3,
            breaker_open: Duration::from_millis(1_000),
            reconcile_interval: Duration::from_millis(250),
            sync_interval: Duration::ZERO,
            batch_max: 20,
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl RedisConfig {
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Err(e) = redis::Client::open(self.url.as_str()) {
            out.push(format!("gateway.quota.redis.url: {e}"));
        }
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

    /// How often the background task pushes local counts to Redis: the reconcile interval, or
    /// the sync interval when batched counting gives leases back more often.
    pub fn sync_every(&self) -> Duration {
        if self.batched() {
            self.sync_interval.min(self.reconcile_interval)
        } else {
            self.reconcile_interval
        }
    }

    pub(super) fn batched(&self) -> bool {
        !self.sync_interval.is_zero()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_their_millisecond_keys() {
        let c: RedisConfig = serde_yaml_ng::from_str(
            "call_timeout_ms: 20\nbreaker_open_ms: 300\nsync_interval_ms: 40\nbatch_max: 5\n",
        )
        .unwrap();
        assert_eq!(c.call_timeout, Duration::from_millis(20));
        assert_eq!(c.breaker_open, Duration::from_millis(300));
        assert_eq!(c.connect_timeout, Duration::from_millis(200));
        assert_eq!(c.sync_every(), Duration::from_millis(40));
        assert!(c.problems().is_empty(), "{:?}", c.problems());
        let bad: RedisConfig =
            serde_yaml_ng::from_str("call_timeout_ms: 0\nsync_interval_ms: 10\nbatch_max: 0\n")
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
}
