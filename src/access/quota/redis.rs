//! The shared quota store on Redis: several gateways, one monthly count per key.
//!
//! Each call checks and counts in one round trip (a Lua script on `q:<key_id>:<YYYY-MM>`, which
//! expires shortly after its month). Every Redis call runs under a short time budget; a circuit
//! breaker makes a dead Redis cost nothing per request while it is open. On failure the policy
//! decides: `fail_open` keeps serving and counts locally, then adds those counts to Redis when it
//! is back (nothing lost); `fail_closed` refuses (the gateway answers 503).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use serde::{Deserialize, Serialize};

use super::{Consumed, Month, QuotaError, QuotaStore, Usage};

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]`.
    pub url: String,
    /// Budget of one Redis call, in milliseconds.
    pub call_timeout_ms: u64,
    /// Budget of one (re)connection attempt, in milliseconds.
    pub connect_timeout_ms: u64,
    pub failure_policy: FailurePolicy,
    /// Consecutive failures that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long the breaker stays open before one call probes Redis again, in milliseconds.
    pub breaker_open_ms: u64,
    /// How often local counts are added to Redis after an outage, in milliseconds.
    pub reconcile_interval_ms: u64,
    /// Batched counting: `0` (the default) makes one Redis call per counted call. Otherwise a
    /// gateway far from a key's limit reserves `batch_max` calls in one round trip (a lease) and
    /// admits from it locally; unused leases are given back after this many ms.
    pub sync_interval_ms: u64,
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
            call_timeout_ms: 50,
            connect_timeout_ms: 200,
            failure_policy: FailurePolicy::FailOpen,
            breaker_failures: 3,
            breaker_open_ms: 1_000,
            reconcile_interval_ms: 250,
            sync_interval_ms: 0,
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
        for (k, v, max) in [
            ("call_timeout_ms", self.call_timeout_ms, 10_000),
            ("connect_timeout_ms", self.connect_timeout_ms, 10_000),
            ("breaker_open_ms", self.breaker_open_ms, 600_000),
            ("reconcile_interval_ms", self.reconcile_interval_ms, 60_000),
        ] {
            if !(1..=max).contains(&v) {
                out.push(format!("gateway.quota.redis.{k}: {v} is outside 1..={max}"));
            }
        }
        if self.sync_interval_ms > 60_000 {
            out.push(format!(
                "gateway.quota.redis.sync_interval_ms: {} is outside 0..=60000",
                self.sync_interval_ms
            ));
        }
        if self.sync_interval_ms > 0 && self.batch_max == 0 {
            out.push(
                "gateway.quota.redis.batch_max: must be at least 1 with sync_interval_ms".into(),
            );
        }
        if self.breaker_failures == 0 {
            out.push("gateway.quota.redis.breaker_failures: must be at least 1".into());
        }
        out
    }

    /// How often the background task pushes local counts to Redis.
    pub fn reconcile_interval(&self) -> Duration {
        let ms = match self.sync_interval_ms {
            0 => self.reconcile_interval_ms,
            sync => sync.min(self.reconcile_interval_ms),
        };
        Duration::from_millis(ms)
    }

    fn batched(&self) -> bool {
        self.sync_interval_ms > 0
    }
}

/// Adds the pending local counts (ARGV[2]), then, under the limit (ARGV[1]), either reserves a
/// lease of ARGV[4] calls (returns 2; batched mode, far from the limit) or counts one call
/// (returns 1); returns 0 at the limit. Sets the expiry in seconds (ARGV[3]; relative, so clock
/// skew with Redis does not matter). Returns {outcome, used}.
const CONSUME: &str = r#"
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local add = tonumber(ARGV[2])
if add > 0 then used = redis.call('INCRBY', KEYS[1], add) end
local limit = tonumber(ARGV[1])
local lease = tonumber(ARGV[4])
local outcome = 0
if lease > 1 and used + lease <= limit then
  used = redis.call('INCRBY', KEYS[1], lease)
  outcome = 2
elseif used < limit then
  used = redis.call('INCR', KEYS[1])
  outcome = 1
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {outcome, used}
"#;

/// Keys outlive their month by this much, so a late reconcile still lands in the right key.
const EXPIRY_GRACE_SECONDS: i64 = 86_400;

type Slot = (String, u32);

/// The Redis quota store.
pub struct RedisStore {
    client: redis::Client,
    manager_config: ConnectionManagerConfig,
    /// Made on first use, inside a runtime (the manager spawns its driver task there).
    manager: tokio::sync::OnceCell<ConnectionManager>,
    consume: redis::Script,
    config: RedisConfig,
    call_timeout: Duration,
    failures: AtomicU32,
    open_until: Mutex<Option<Instant>>,
    connected: AtomicBool,
    /// Counts made locally while Redis was unreachable, per key and month.
    pending: Mutex<HashMap<Slot, u64>>,
    /// The last shared count seen per key and month (what fail-open admission starts from).
    known: Mutex<HashMap<Slot, u64>>,
    /// Batched mode: calls reserved in Redis and not yet used, per key and month.
    leases: Mutex<HashMap<Slot, Lease>>,
    /// Keys with a lease request in flight.
    leasing: Mutex<std::collections::HashSet<Slot>>,
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    left: u64,
    granted: Instant,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn redis_key(key_id: &str, month: Month) -> String {
    format!("q:{key_id}:{}", month.label())
}

/// Seconds the month's key should live from `now`: to the end of the month, plus a grace period.
fn ttl_seconds(month: Month, now: DateTime<Utc>) -> i64 {
    (month.reset_at() - now).num_seconds().max(0) + EXPIRY_GRACE_SECONDS
}

impl RedisStore {
    /// Sets the store up without connecting: the gateway starts even when Redis is down.
    pub fn new(config: &RedisConfig) -> Result<Self, QuotaError> {
        let client = redis::Client::open(config.url.as_str())
            .map_err(|e| QuotaError(format!("redis url: {e}")))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(config.connect_timeout_ms)))
            .set_response_timeout(Some(Duration::from_millis(config.call_timeout_ms)))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(config.breaker_open_ms));
        Ok(RedisStore {
            client,
            manager_config,
            manager: tokio::sync::OnceCell::new(),
            consume: redis::Script::new(CONSUME),
            call_timeout: Duration::from_millis(config.call_timeout_ms),
            config: config.clone(),
            failures: AtomicU32::new(0),
            open_until: Mutex::new(None),
            connected: AtomicBool::new(false),
            pending: Mutex::new(HashMap::new()),
            known: Mutex::new(HashMap::new()),
            leases: Mutex::new(HashMap::new()),
            leasing: Mutex::new(std::collections::HashSet::new()),
        })
    }

    /// Whether calls should skip Redis now (breaker open and not yet due for a probe).
    fn breaker_open(&self) -> bool {
        let mut open = lock(&self.open_until);
        match *open {
            Some(until) if Instant::now() < until => true,
            Some(_) => {
                // Half-open: let callers probe; a failure re-opens it at once.
                *open = None;
                false
            }
            None => false,
        }
    }

    fn succeeded(&self) {
        self.failures.store(0, Ordering::Relaxed);
        *lock(&self.open_until) = None;
        if !self.connected.swap(true, Ordering::Relaxed) {
            log::info!("quota store: Redis reachable");
        }
    }

    fn failed(&self, why: &str) {
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if self.connected.swap(false, Ordering::Relaxed) || n == 1 {
            log::warn!(
                "quota store: Redis call failed ({why}); policy {:?}",
                self.config.failure_policy
            );
        }
        if n >= self.config.breaker_failures {
            let mut open = lock(&self.open_until);
            if open.is_none() {
                log::warn!(
                    "quota store: circuit breaker open for {} ms",
                    self.config.breaker_open_ms
                );
            }
            *open = Some(Instant::now() + Duration::from_millis(self.config.breaker_open_ms));
        }
    }

    /// The shared connection (multiplexed, reconnecting), without waiting for a connection.
    async fn connection(&self) -> Result<ConnectionManager, String> {
        self.manager
            .get_or_try_init(|| async {
                ConnectionManager::new_lazy_with_config(
                    self.client.clone(),
                    self.manager_config.clone(),
                )
            })
            .await
            .cloned()
            .map_err(|e| e.to_string())
    }

    async fn call<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> Result<T, String> {
        let mut conn = self.connection().await?;
        match tokio::time::timeout(self.call_timeout, cmd.query_async::<T>(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".into()),
        }
    }

    fn fallback(
        &self,
        slot: Slot,
        limit: u64,
        month: Month,
        now: DateTime<Utc>,
    ) -> Result<Consumed, QuotaError> {
        if self.config.failure_policy == FailurePolicy::FailClosed {
            return Err(QuotaError(
                "Redis is unreachable and the policy is fail_closed".into(),
            ));
        }
        let known = lock(&self.known).get(&slot).copied().unwrap_or(0);
        let mut pending = lock(&self.pending);
        let mine = pending.entry(slot).or_insert(0);
        let used = known + *mine;
        let usage = Usage {
            used,
            limit,
            month,
            now,
        };
        if used >= limit {
            return Ok(Consumed::Exceeded(usage));
        }
        *mine += 1;
        Ok(Consumed::Allowed(Usage {
            used: used + 1,
            ..usage
        }))
    }

    /// Batched mode: takes one call from this gateway's lease on the key, if it has one.
    fn take_from_lease(
        &self,
        slot: &Slot,
        limit: u64,
        month: Month,
        now: DateTime<Utc>,
    ) -> Option<Consumed> {
        let mut leases = lock(&self.leases);
        let lease = leases.get_mut(slot).filter(|l| l.left > 0)?;
        lease.left -= 1;
        let known = lock(&self.known).get(slot).copied().unwrap_or(0);
        Some(Consumed::Allowed(Usage {
            used: known.saturating_sub(lease.left),
            limit,
            month,
            now,
        }))
    }

    /// Gives back the unused part of leases older than the sync interval (all with `all`).
    async fn return_leases(&self, all: bool) {
        let age = Duration::from_millis(self.config.sync_interval_ms);
        let due: Vec<(Slot, u64)> = {
            let mut leases = lock(&self.leases);
            let slots: Vec<Slot> = leases
                .iter()
                .filter(|(_, l)| all || l.granted.elapsed() >= age)
                .map(|(s, _)| s.clone())
                .collect();
            slots
                .into_iter()
                .filter_map(|s| leases.remove(&s).map(|l| (s, l.left)))
                .filter(|(_, left)| *left > 0)
                .collect()
        };
        for ((key_id, month_index), left) in due {
            let key = redis_key(&key_id, Month::from_index(month_index));
            let result = self
                .call::<i64>(redis::cmd("DECRBY").arg(&key).arg(left))
                .await;
            match result {
                Ok(total) => {
                    lock(&self.known).insert((key_id, month_index), total.max(0) as u64);
                }
                Err(e) => {
                    // Not returned: the key under-admits by `left` this month, never over-admits.
                    log::warn!("quota store: could not return {left} leased calls on {key}: {e}");
                }
            }
        }
    }

    /// Pushes local state to Redis: counts made during an outage, and (batched mode) unused
    /// leases past the sync interval (all of them when `shutting_down`). Returns what is still
    /// pending.
    pub async fn sync(&self, shutting_down: bool) -> u64 {
        if self.config.batched() && !self.breaker_open() {
            self.return_leases(shutting_down).await;
        }
        self.reconcile().await
    }

    /// Adds every pending local count to Redis (after an outage). Returns what is still pending.
    pub async fn reconcile(&self) -> u64 {
        let slots: Vec<(Slot, u64)> = lock(&self.pending)
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(s, n)| (s.clone(), *n))
            .collect();
        if slots.is_empty() || self.breaker_open() {
            return slots.iter().map(|(_, n)| n).sum();
        }
        for ((key_id, month_index), n) in slots {
            let month = Month::from_index(month_index);
            let key = redis_key(&key_id, month);
            let mut pipe = redis::pipe();
            pipe.atomic()
                .cmd("INCRBY")
                .arg(&key)
                .arg(n)
                .cmd("EXPIRE")
                .arg(&key)
                .arg(ttl_seconds(month, Utc::now()))
                .ignore();
            let Ok(mut conn) = self.connection().await else {
                break;
            };
            let result =
                tokio::time::timeout(self.call_timeout, pipe.query_async::<(u64,)>(&mut conn))
                    .await;
            match result {
                Ok(Ok((total,))) => {
                    self.succeeded();
                    let slot = (key_id, month_index);
                    let mut pending = lock(&self.pending);
                    if let Some(p) = pending.get_mut(&slot) {
                        *p = p.saturating_sub(n);
                        if *p == 0 {
                            pending.remove(&slot);
                        }
                    }
                    lock(&self.known).insert(slot, total);
                    log::info!("quota store: added {n} locally counted calls to {key}");
                }
                Ok(Err(e)) => {
                    self.failed(&e.to_string());
                    break;
                }
                Err(_) => {
                    self.failed("timed out");
                    break;
                }
            }
        }
        lock(&self.pending).values().sum()
    }
}

#[async_trait]
impl QuotaStore for RedisStore {
    async fn consume(
        &self,
        key_id: &str,
        limit: u64,
        now: DateTime<Utc>,
    ) -> Result<Consumed, QuotaError> {
        let month = Month::containing(now);
        let slot: Slot = (key_id.to_owned(), month.index());
        // A lease is already counted in Redis: it serves even while Redis is down.
        if self.config.batched() {
            if let Some(admitted) = self.take_from_lease(&slot, limit, month, now) {
                return Ok(admitted);
            }
        }
        if self.breaker_open() {
            return self.fallback(slot, limit, month, now);
        }
        // Pending local counts ride along with this call, so they land atomically with it.
        let carried = lock(&self.pending).remove(&slot).unwrap_or(0);
        let mut invocation = self.consume.key(redis_key(key_id, month));
        // One lease request per key at a time; concurrent calls meanwhile go the exact way.
        let lease = if self.config.batched() && lock(&self.leasing).insert(slot.clone()) {
            self.config.batch_max
        } else {
            0
        };
        invocation
            .arg(limit)
            .arg(carried)
            .arg(ttl_seconds(month, now))
            .arg(lease);
        let result = match self.connection().await {
            Ok(mut conn) => {
                tokio::time::timeout(
                    self.call_timeout,
                    invocation.invoke_async::<(u8, u64)>(&mut conn),
                )
                .await
            }
            Err(e) => Ok(Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "connection",
                e,
            )))),
        };
        if lease > 0 {
            lock(&self.leasing).remove(&slot);
        }
        match result {
            Ok(Ok((outcome, used))) => {
                self.succeeded();
                lock(&self.known).insert(slot.clone(), used);
                let usage = Usage {
                    used,
                    limit,
                    month,
                    now,
                };
                Ok(match outcome {
                    2 => {
                        // This call takes the first of the lease.
                        let left = lease - 1;
                        let granted = Instant::now();
                        let mut leases = lock(&self.leases);
                        let entry = leases.entry(slot).or_insert(Lease { left: 0, granted });
                        entry.left += left;
                        entry.granted = granted;
                        Consumed::Allowed(Usage {
                            used: used - left,
                            ..usage
                        })
                    }
                    1 => Consumed::Allowed(usage),
                    _ => Consumed::Exceeded(usage),
                })
            }
            outcome => {
                if carried > 0 {
                    *lock(&self.pending).entry(slot.clone()).or_insert(0) += carried;
                }
                self.failed(&match outcome {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".into(),
                });
                self.fallback(slot, limit, month, now)
            }
        }
    }

    async fn usage(
        &self,
        key_id: &str,
        limit: u64,
        now: DateTime<Utc>,
    ) -> Result<Usage, QuotaError> {
        let month = Month::containing(now);
        let slot: Slot = (key_id.to_owned(), month.index());
        let pending = lock(&self.pending).get(&slot).copied().unwrap_or(0);
        let shared = if self.breaker_open() {
            None
        } else {
            match self
                .call::<Option<u64>>(redis::cmd("GET").arg(redis_key(key_id, month)))
                .await
            {
                Ok(v) => {
                    self.succeeded();
                    Some(v.unwrap_or(0))
                }
                Err(e) => {
                    self.failed(&e);
                    None
                }
            }
        };
        let used = match shared {
            Some(n) => {
                lock(&self.known).insert(slot, n);
                n + pending
            }
            None if self.config.failure_policy == FailurePolicy::FailClosed => {
                return Err(QuotaError(
                    "Redis is unreachable and the policy is fail_closed".into(),
                ))
            }
            None => lock(&self.known).get(&slot).copied().unwrap_or(0) + pending,
        };
        Ok(Usage {
            used,
            limit,
            month,
            now,
        })
    }

    fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "store": "redis",
            "connected": self.connected.load(Ordering::Relaxed),
            "breaker_open": lock(&self.open_until).is_some_and(|u| Instant::now() < u),
            "pending_local_counts": lock(&self.pending).values().sum::<u64>(),
            "failure_policy": self.config.failure_policy,
        })
    }
}
