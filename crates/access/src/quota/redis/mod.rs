//! The shared quota store on Redis: several gateways, one monthly count per key.
//!
//! Each call checks and counts in one round trip (a Lua script on `q:{<key_id>}:<YYYY-MM>`, which
//! expires shortly after its month; see `script.rs`); every key of one id shares that `{hash tag}`,
//! so the store works on Redis Cluster, and behind Sentinel (`redis_link.rs`). Every Redis call
//! runs under a short time budget; a circuit breaker (`breaker.rs`) makes a dead Redis cost
//! nothing per request while it is open. On failure the policy decides: `fail_open` keeps serving
//! and counts locally, then adds those counts to Redis when it is back (nothing lost, nothing
//! counted twice: a call whose reply never came is settled by its id); `fail_closed` refuses (the
//! gateway answers 503).
//!
//! Per key and month the store keeps one slot (`slots.rs`): the count last seen, the local counts
//! owed to Redis and, in batched mode, the lease (`leases.rs`). The background sync drops slots
//! of past months once they owe Redis nothing.

pub mod carried;
mod leases;
mod links;
mod probe;
pub mod rate;
mod script;
mod slots;

use drg_base::infra::redis::config::{FailurePolicy, RedisConfig, RedisMode};

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::Poll;
use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use redis::{ErrorKind, ServerErrorKind};

use crate::rate::{RateConfig, RateStanding};
use drg_base::infra::redis::RedisLink;

use super::{Clock, Consumed, Month, QuotaError, QuotaStore, Usage};
use drg_base::infra::breaker::{Admit, Breaker};
use script::{Outcome, Reply};
use slots::{Carry, Slot, Slots};

/// Keys outlive their month by this much, so a late reconcile still lands in the right key.
const EXPIRY_GRACE_SECONDS: i64 = 86_400;

/// Calls one sync makes at most per slot.
const SYNC_CALLS_PER_SLOT: usize = 8;

/// Seconds the month's key should live from `now`: to the end of the month, plus a grace period.
fn ttl_seconds(month: Month, now: DateTime<Utc>) -> i64 {
    (month.reset_at() - now).num_seconds().max(0) + EXPIRY_GRACE_SECONDS
}

/// Why a Redis call failed.
struct Failure {
    why: String,
    /// The script may have run (a timeout, a broken connection), as opposed to a call that
    /// never reached Redis or that Redis refused.
    maybe_ran: bool,
}

impl From<redis::RedisError> for Failure {
    fn from(e: redis::RedisError) -> Self {
        let refused = e.is_connection_refusal() || matches!(e.kind(), redis::ErrorKind::Server(_));
        Failure {
            why: e.to_string(),
            maybe_ran: !refused,
        }
    }
}

/// The Redis quota store.
pub struct RedisStore {
    /// Made on first use, inside a runtime (the link spawns its driver task there).
    link: tokio::sync::OnceCell<RedisLink>,
    /// On a single server: a link per single-threaded runtime's thread instead ([`links`]).
    thread_links: links::ThreadLinks,
    script: redis::Script,
    config: RedisConfig,
    /// The gateway's quota clock (for the expiry of keys the background sync writes).
    clock: Arc<dyn Clock>,
    breaker: Breaker,
    connected: AtomicBool,
    slots: Slots,
    /// Call ids: a random start per process, so that gateways sharing a key do not collide.
    next_id: AtomicU64,
    rate_script: redis::Script,
    give_back_script: redis::Script,
    /// Per-project rates while Redis is away under `fail_open`: per gateway, as embedded.
    local_rates: crate::rate::Limiter,
    /// Redis's `maxmemory-policy`, as the probe last read it.
    eviction_policy: std::sync::Mutex<Option<Box<str>>>,
    /// Where calls Redis lacks, and the counts read, are kept across restarts ([`carried`]).
    carried: Option<carried::OwnFile>,
    /// When a failed probe last looked into a slow link.
    diagnosed: std::sync::Mutex<Option<Instant>>,
    /// Month counts found missing in Redis and set back (flushed, evicted).
    restored: AtomicU64,
    /// Calls that found their key's lease used up with the next one on its way, and the
    /// microseconds they waited for it: a lease that lasts less than a round trip to Redis
    /// (`batch_max` too small for the key's rate) shows here.
    lease_waits: AtomicU64,
    lease_waited_us: AtomicU64,
    /// Calls served from leases (granted into them, or the call that took a lease's first).
    leased_calls: AtomicU64,
    /// Tells the operator when many leased calls wait (`batch_max` too small for the rates).
    wait_watch: std::sync::Mutex<leases::WaitWatch>,
    /// This store, once shared ([`RedisStore::shared`]): a refill runs as a task of its own
    /// holding it, so the call that asked answers at once instead of waiting out the round trip.
    me: Weak<RedisStore>,
    /// Refills running on their own: the final sync waits for them (a lease granted after it
    /// would be counted in Redis and never used or given back).
    refills: AtomicUsize,
    /// A test's pause between the sync's calls and its write of the carried file.
    carry_pause: Option<std::time::Duration>,
}

/// What a counting call does ([`RedisStore::plan`]).
enum Plan {
    /// Answered from the lease.
    Done(Consumed),
    /// Answered from the lease; the call also asks for the next one.
    Refill(Carry, Consumed),
    /// Counted in Redis.
    Exchange(Carry),
    /// Redis is being skipped: counted locally.
    Fallback,
}

impl RedisStore {
    /// Sets the store up without connecting: the gateway starts even when Redis is down.
    pub fn new(config: &RedisConfig, clock: Arc<dyn Clock>) -> Result<Self, QuotaError> {
        redis::Client::open(config.url.as_str())
            .map_err(|e| QuotaError(format!("redis url: {e}")))?;
        let mut seed = [0u8; 8];
        getrandom::fill(&mut seed).map_err(|e| QuotaError(format!("random call ids: {e}")))?;
        Ok(RedisStore {
            link: tokio::sync::OnceCell::new(),
            thread_links: links::ThreadLinks::default(),
            script: script::script(),
            breaker: Breaker::new(
                config.breaker_failures,
                config.breaker_open,
                config.call_timeout,
                Instant::now(),
            ),
            config: config.clone(),
            clock,
            connected: AtomicBool::new(false),
            slots: Slots::default(),
            next_id: AtomicU64::new(u64::from_le_bytes(seed)),
            rate_script: rate::script(),
            give_back_script: rate::give_back_script(),
            local_rates: Default::default(),
            eviction_policy: std::sync::Mutex::new(None),
            carried: None,
            diagnosed: std::sync::Mutex::new(None),
            restored: AtomicU64::new(0),
            lease_waits: AtomicU64::new(0),
            lease_waited_us: AtomicU64::new(0),
            leased_calls: AtomicU64::new(0),
            wait_watch: std::sync::Mutex::new(leases::WaitWatch::new(Instant::now())),
            me: Weak::new(),
            refills: AtomicUsize::new(0),
            carry_pause: None,
        })
    }

    /// The store, shared; its lease refills then run as tasks of their own.
    pub fn shared(self) -> Arc<Self> {
        Arc::new_cyclic(|me| RedisStore {
            me: me.clone(),
            ..self
        })
    }

    /// Holds each sync that sent counts to Redis for `pause` before it writes the carried file
    /// (tests of a `kill -9` in that window; `DOMAIN_RISK_GATEWAY_CARRY_PAUSE_MS`).
    pub fn with_carry_pause(mut self, pause: Option<std::time::Duration>) -> Self {
        self.carry_pause = pause;
        self
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn succeeded(&self) {
        if self.breaker.succeeded() {
            log::info!("quota store: circuit breaker closed");
        }
        if !self.connected.swap(true, Ordering::Relaxed) {
            log::info!("quota store: Redis reachable");
        }
    }

    fn failed(&self, why: &str) {
        let was_connected = self.connected.swap(false, Ordering::Relaxed);
        let opened = self.breaker.failed(Instant::now());
        if was_connected || opened {
            log::warn!(
                "quota store: Redis call failed ({why}); policy {:?}",
                self.config.failure_policy
            );
        }
        if opened {
            log::warn!(
                "quota store: circuit breaker open for {} ms",
                self.config.breaker_open.as_millis()
            );
        }
    }

    /// The shared connection (multiplexed, reconnecting), without waiting for a connection.
    /// On a single server, called on a worker's thread (a single-threaded runtime), the
    /// thread's own link: a lease refill is then one more socket in the worker's event loop,
    /// not a wakeup of the thread that made the shared link (measured: 21 wakeups a thousand
    /// lookups, each preempting the worker on its core).
    async fn connection(&self) -> Result<RedisLink, Failure> {
        let failure = |e: redis::RedisError| Failure {
            why: e.to_string(),
            maybe_ran: false,
        };
        if self.config.mode == RedisMode::Single && links::ThreadLinks::wanted_here() {
            return self
                .thread_links
                .get_or_make(|| RedisLink::connect_lazy(&self.config))
                .map_err(failure);
        }
        self.link
            .get_or_try_init(|| async { RedisLink::connect_lazy(&self.config) })
            .await
            .cloned()
            .map_err(failure)
    }

    /// Runs the script for `carry` on `slot` under the call budget.
    async fn run(
        &self,
        slot: &Slot,
        carry: &Carry,
        limit: u64,
        now: DateTime<Utc>,
    ) -> Result<Reply, Failure> {
        let ttl = ttl_seconds(slot.month, now);
        let legacy = self.legacy_names();
        let mut conn = self.connection().await?;
        let wait_replicas = self.config.wait_replicas();
        let call = async {
            match wait_replicas {
                0 => script::invocation(&self.script, slot, carry, limit, ttl, legacy)
                    .invoke_async::<Reply>(&mut conn)
                    .await
                    .map_err(Failure::from),
                replicas => {
                    let cmd = script::command(&self.script, slot, carry, limit, ttl, legacy);
                    self.run_replicated(cmd, replicas, &mut conn).await
                }
            }
        };
        let result = match tokio::time::timeout(self.config.call_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(Failure {
                why: "timed out".into(),
                maybe_ran: true,
            }),
        };
        if result.is_err() && self.config.mode == RedisMode::Sentinel {
            conn.recheck();
        }
        result
    }

    /// Untagged key names (releases before cluster support) can only exist off a cluster.
    fn legacy_names(&self) -> bool {
        self.config.mode != RedisMode::Cluster
    }

    /// Runs the script and `WAIT`s until `replicas` replicas have its writes, in one pipeline on
    /// one connection (WAIT covers the writes of the connection it comes on). A count that did
    /// not reach them is not trusted: a failover may lose it. It fails as a call that may have
    /// run, which settles it by id on whichever server is master then.
    async fn run_replicated(
        &self,
        cmd: redis::Cmd,
        replicas: u32,
        conn: &mut RedisLink,
    ) -> Result<Reply, Failure> {
        // WAIT's own timeout, inside the call budget so that its answer still comes in time.
        let wait_ms = (drg_base::infra::units::ms(self.config.call_timeout) * 3 / 4).max(1);
        let mut pipe = redis::pipe();
        pipe.add_command(cmd).cmd("WAIT").arg(replicas).arg(wait_ms);
        let (reply, acked) = match pipe.query_async::<(Reply, u32)>(conn).await {
            // A new master (or a restarted one) does not know the script yet: it did not run.
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.prepare_invoke().load_async(conn).await?;
                pipe.query_async::<(Reply, u32)>(conn).await?
            }
            result => result?,
        };
        if acked < replicas {
            return Err(Failure {
                why: format!("the count reached {acked} of {replicas} replicas in time"),
                maybe_ran: true,
            });
        }
        Ok(reply)
    }

    /// The lease ran dry with the next one on its way: waits for it (at most a call's budget)
    /// rather than each call going to Redis the exact way meanwhile. Looked at again once
    /// registered, so an end in between is not missed.
    async fn await_lease(&self, slot: &Slot) {
        if !slot.tally().lease.awaited() {
            return;
        }
        let ended = slot.lease_ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if slot.tally().lease.awaited() {
            let started = Instant::now();
            let _ = tokio::time::timeout(self.config.call_timeout, ended).await;
            let waited = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.lease_waits.fetch_add(1, Ordering::Relaxed);
            self.lease_waited_us.fetch_add(waited, Ordering::Relaxed);
        }
    }

    /// What one counting call does, decided under the slot's lock: answered from the lease
    /// (perhaps asking for the next one), or a call to Redis, or the fallback.
    fn plan(&self, slot: &Slot, calls: u64, usage: impl Fn(u64) -> Usage) -> Plan {
        let mut tally = slot.tally();
        // A lease is already counted in Redis: it serves even while Redis is down.
        if self.config.batched() && calls == 1 {
            let size = self.config.batch_max;
            let low = tally.lease.wants_refill(size);
            if let Some(left) = tally.lease.take() {
                let allowed = Consumed::Allowed(usage(tally.known.saturating_sub(left)));
                // Low: this call also asks for the next lease (the others keep taking from this
                // one meanwhile), unless Redis is being skipped.
                if !low || matches!(self.breaker.admit(Instant::now()), Admit::Skip) {
                    return Plan::Done(allowed);
                }
                tally.lease.start_request();
                return Plan::Refill(tally.call(self.next_id(), size), allowed);
            }
        }
        match self.breaker.admit(Instant::now()) {
            Admit::Skip => Plan::Fallback,
            // A batch is counted all or none in one call, beside any lease.
            Admit::Call | Admit::Probe if calls > 1 => {
                let mut carry = tally.call(self.next_id(), calls);
                carry.exact = true;
                Plan::Exchange(carry)
            }
            Admit::Call | Admit::Probe => {
                // One lease request per key at a time; meanwhile calls go the exact way.
                let lease = self.config.batch_max;
                let want = if self.config.batched() && lease > 1 && tally.lease.start_request() {
                    lease
                } else {
                    1
                };
                // Local counts are the sync's to send (named in the carried-calls file first):
                // this call counts them against its limit instead.
                Plan::Exchange(tally.call(self.next_id(), want))
            }
        }
    }

    /// Asks Redis for the next lease of `slot` on a call already admitted from the current
    /// one: everything counted goes to the lease (nothing is this call's).
    async fn refill(&self, slot: &Slot, carry: Carry, limit: u64, now: DateTime<Utc>) {
        let _ = self.exchange(slot, carry, limit, now, LeaseTo::Lease).await;
        slot.lease_ended.notify_waiters();
    }

    /// Asks for the next lease without holding up the call that asked: a task of its own on
    /// this runtime (the worker's thread, its own link), counted until it ends. Measured at
    /// ~70,000 lookups a second with leases of 100: one call in 50 waited a round trip through
    /// the saturated worker's run queue (~0.4 ms), which was the lookup's p99. Inline when the
    /// store is not shared or no runtime runs.
    async fn refill_detached(&self, slot: Arc<Slot>, carry: Carry, limit: u64, now: DateTime<Utc>) {
        let (Some(me), Ok(runtime)) = (self.me.upgrade(), tokio::runtime::Handle::try_current())
        else {
            return self.refill(&slot, carry, limit, now).await;
        };
        let running = Refilling::start(me);
        let mut refill = Box::pin(async move {
            running.0.refill(&slot, carry, limit, now).await;
        });
        // Its first step here, so the request leaves for Redis now: a new task would first wait
        // its turn behind every task queued on the saturated worker (~0.8 ms at full load).
        let first = std::future::poll_fn(|cx| Poll::Ready(refill.as_mut().poll(cx))).await;
        if first.is_pending() {
            runtime.spawn(refill);
        }
    }

    /// Warns (at most every ten minutes) when over 5% of the leased calls of the last window
    /// (ten syncs, 1 to 60 s) waited for their key's next lease.
    fn tell_lease_waits(&self) {
        let totals = (
            self.lease_waits.load(Ordering::Relaxed),
            self.lease_waited_us.load(Ordering::Relaxed),
            self.leased_calls.load(Ordering::Relaxed),
        );
        let window = (self.config.sync_every() * 10).clamp(
            std::time::Duration::from_secs(1),
            std::time::Duration::from_secs(60),
        );
        let told = self
            .wait_watch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .check(Instant::now(), totals, window);
        if let Some(t) = told {
            log::warn!(
                "quota store: {} of {} calls served from leases in the last {:.1} s waited for \
                 their key's next lease, {} us on average: batch_max ({}) lasts less than a \
                 lease's round trip at these rates; raise it (docs/scaling.md, Sizing batch_max)",
                t.waits,
                t.leased,
                window.as_secs_f64(),
                t.mean_wait_us,
                self.config.batch_max
            );
        }
    }

    /// Waits (at most a call's budget and a little) for the refills running on their own.
    async fn refills_settled(&self) {
        let deadline = Instant::now() + self.config.call_timeout * 2;
        while self.refills.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    /// One Redis call for `carry`, booked in the slot. A lease it asked for is granted (as
    /// `to` says) under the same lock that ends the request: no call can find the lease empty
    /// and no request in flight in between, and ask for a second one.
    async fn exchange(
        &self,
        slot: &Slot,
        carry: Carry,
        limit: u64,
        now: DateTime<Utc>,
        to: LeaseTo,
    ) -> Result<Reply, Failure> {
        let mut guard = CarryGuard {
            slot,
            carry: Some(carry),
        };
        let result = self.run(slot, guard.carry(), limit, now).await;
        let carry = guard.take();
        let mut tally = slot.tally();
        if carry.leasing() {
            if let Ok(reply) = &result {
                let granted = to.granted(reply.outcome, carry.want);
                if granted > 0 {
                    tally.lease.grant(granted, Instant::now());
                    let own = u64::from(to == LeaseTo::CallFirst);
                    self.leased_calls
                        .fetch_add(granted + own, Ordering::Relaxed);
                }
            }
            tally.lease.end_request();
        }
        match &result {
            Ok(reply) => {
                let own = match reply.outcome {
                    Outcome::Counted => 1,
                    Outcome::Leased => carry.want,
                    Outcome::NotCounted | Outcome::RanBefore => 0,
                };
                let marked = reply.outcome != Outcome::RanBefore
                    && carry.delta() + i64::try_from(own).unwrap_or(i64::MAX) != 0;
                tally.settled(&carry, reply.used, marked, reply.epoch);
                drop(tally);
                self.succeeded();
                if carry.calls > 0 {
                    log::info!(
                        "quota store: added {} locally counted calls to {}",
                        carry.calls,
                        slot.count_key
                    );
                }
                if reply.restored > 0 {
                    self.restored.fetch_add(1, Ordering::Relaxed);
                    log::warn!(
                        "quota store: {} was missing from Redis (flushed or evicted: set \
                         maxmemory-policy noeviction); set back to the {} calls this gateway had \
                         seen",
                        slot.count_key,
                        reply.restored
                    );
                }
                if reply.late > 0 {
                    log::info!(
                        "quota store: {} timed-out calls on {} had reached Redis after all: settled, not counted again",
                        reply.late,
                        slot.count_key
                    );
                }
            }
            Err(f) => {
                tally.unsettled(carry, f.maybe_ran);
                drop(tally);
                self.failed(&f.why);
            }
        }
        result
    }

    /// One run of the rate script under the call budget.
    /// One of the rate scripts on Redis unless the breaker skips it; `None` when Redis did not
    /// answer (the breaker told).
    async fn shared_rate(
        &self,
        script: &redis::Script,
        project: &str,
        config: RateConfig,
        calls: u64,
    ) -> Option<RateStanding> {
        if self.breaker.admit(Instant::now()) == Admit::Skip {
            return None;
        }
        match self.rate_script_call(script, project, config, calls).await {
            Ok(standing) => {
                self.succeeded();
                Some(standing)
            }
            Err(f) => {
                self.failed(&f.why);
                None
            }
        }
    }

    /// Runs one of the rate scripts (take or give back) on `project`'s rate key.
    async fn rate_script_call(
        &self,
        script: &redis::Script,
        project: &str,
        config: RateConfig,
        calls: u64,
    ) -> Result<RateStanding, Failure> {
        let mut conn = self.connection().await?;
        let mut call = script.prepare_invoke();
        call.key(rate::key(project))
            .arg(rate::interval_micros(config))
            .arg(config.burst.max(1))
            .arg(calls.max(1));
        let result = match tokio::time::timeout(
            self.config.call_timeout,
            call.invoke_async::<(u8, u64, u64)>(&mut conn),
        )
        .await
        {
            Ok(result) => result.map_err(Failure::from),
            Err(_) => Err(Failure {
                why: "timed out".into(),
                maybe_ran: true,
            }),
        };
        if result.is_err() && self.config.mode == RedisMode::Sentinel {
            conn.recheck();
        }
        result.map(|reply| rate::standing(reply, config))
    }

    fn fallback(
        &self,
        slot: &Slot,
        limit: u64,
        calls: u64,
        now: DateTime<Utc>,
    ) -> Result<Consumed, QuotaError> {
        if self.config.failure_policy == FailurePolicy::FailClosed {
            return Err(unreachable_closed());
        }
        let usage = |used| Usage {
            used,
            limit,
            month: slot.month,
            now,
        };
        Ok(match slot.tally().count_locally_n(limit, calls) {
            Ok(used) => Consumed::Allowed(usage(used)),
            Err(used) => Consumed::Exceeded(usage(used)),
        })
    }

    /// Pushes local state to Redis: counts made during an outage, batches whose reply never
    /// came, and (batched mode) unused leases past the sync interval (all of them when
    /// `shutting_down`). Returns the locally counted calls still not known to be in Redis.
    /// The background sync calls this every [`RedisConfig::sync_every`].
    pub async fn sync(&self, shutting_down: bool) -> u64 {
        // Here, off the request path: new slots join the lock-free map, old months' slots go.
        let dropped = self.slots.maintain(self.clock.now());
        if dropped > 0 {
            log::debug!("quota store: dropped {dropped} slots of past months");
        }
        if shutting_down {
            self.refills_settled().await;
        } else if self.config.batched() {
            self.tell_lease_waits();
        }
        let slots = self.slots.all();
        self.give_back_leases(&slots, shutting_down);
        let carried = self.send_owed(&slots).await;
        if let Some(pause) = self.carry_pause.filter(|_| carried) {
            tokio::time::sleep(pause).await;
        }
        self.save_carried(&slots, carried::Save::Sync { shutting_down });
        // What a process gone meanwhile left (the old one of an upgrade, at its end).
        self.adopt_carried();
        slots.iter().map(|s| s.tally().local_calls()).sum()
    }
}

impl RedisStore {
    /// Moves the leases' unused calls past the sync interval (all of them when `shutting_down`)
    /// to the give-backs the sync sends. Leases serve while Redis is down: kept then (except at
    /// shutdown).
    fn give_back_leases(&self, slots: &[Arc<Slot>], shutting_down: bool) {
        if !self.config.batched() || !(shutting_down || self.breaker.is_closed()) {
            return;
        }
        let now = Instant::now();
        for slot in slots {
            let mut tally = slot.tally();
            let unused = tally
                .lease
                .give_back(shutting_down, self.config.sync_interval, now);
            tally.give_back(unused);
        }
    }

    /// Sends what the slots owe Redis (calls counted here, give-backs, batches whose reply never
    /// came), one call per slot a round. Each round's calls are named in the carried-calls file
    /// before the first leaves: whatever instant the process dies at, the file names them under
    /// the ids Redis applies once. Nothing the file could not name is sent. Whether any call
    /// carried calls or give-backs of its own.
    async fn send_owed(&self, slots: &[Arc<Slot>]) -> bool {
        let now = self.clock.now();
        let mut carried = false;
        // Bounded: a slot owing more batches than one call carries takes a few rounds.
        for _ in 0..SYNC_CALLS_PER_SLOT {
            if !slots.iter().any(|s| s.tally().owes())
                || self.breaker.admit(Instant::now()) == Admit::Skip
            {
                break;
            }
            let Some(mut round) = self.named_round(slots) else {
                break;
            };
            carried |= round.0.iter().any(|(_, carry)| carry.named);
            if !self.send_round(&mut round, now).await {
                break;
            }
        }
        carried
    }

    /// Sends a round's calls, the first as admitted already; whether all went through (the
    /// rest go back to their slots, unsent, when `round` drops).
    async fn send_round(&self, round: &mut carried::Unsent, now: DateTime<Utc>) -> bool {
        let mut admitted = true;
        while let Some((slot, carry)) = round.0.pop() {
            if !std::mem::take(&mut admitted) && self.breaker.admit(Instant::now()) == Admit::Skip {
                round.0.push((slot, carry));
                return false;
            }
            if self
                .exchange(&slot, carry, 0, now, LeaseTo::Lease)
                .await
                .is_err()
            {
                return false;
            }
        }
        true
    }
}

fn unreachable_closed() -> QuotaError {
    QuotaError("Redis is unreachable and the policy is fail_closed".into())
}

/// Where a lease Redis granted goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseTo {
    /// All of it to the lease: the call was already answered from the last one (a refill).
    Lease,
    /// The call takes the first: the rest to the lease.
    CallFirst,
}

impl LeaseTo {
    /// Calls of a `want` lease request that go to the lease after `outcome`.
    fn granted(self, outcome: Outcome, want: u64) -> u64 {
        match (self, outcome) {
            (LeaseTo::Lease, Outcome::Leased) => want,
            // Near the limit the script counts one call only: it is reserved all the same.
            (LeaseTo::Lease, Outcome::Counted) => 1,
            (LeaseTo::CallFirst, Outcome::Leased) => want.saturating_sub(1),
            _ => 0,
        }
    }
}

/// A refill running on its own, counted in its store from its start until it ends or its task
/// is dropped (a runtime shutting down under it).
struct Refilling(Arc<RedisStore>);

impl Refilling {
    fn start(store: Arc<RedisStore>) -> Self {
        store.refills.fetch_add(1, Ordering::AcqRel);
        Refilling(store)
    }
}

impl Drop for Refilling {
    fn drop(&mut self) {
        self.0.refills.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Puts a carry back as unsettled if the call is dropped before it is booked.
struct CarryGuard<'a> {
    slot: &'a Slot,
    carry: Option<Carry>,
}

impl CarryGuard<'_> {
    fn carry(&self) -> &Carry {
        self.carry.as_ref().expect("carry taken once")
    }

    fn take(&mut self) -> Carry {
        self.carry.take().expect("carry taken once")
    }
}

impl Drop for CarryGuard<'_> {
    fn drop(&mut self) {
        if let Some(carry) = self.carry.take() {
            let mut tally = self.slot.tally();
            let leasing = carry.leasing();
            if leasing {
                tally.lease.end_request();
            }
            // The caller went away: the call was not served, whatever Redis did with it.
            tally.unsettled(carry, true);
            drop(tally);
            // Calls waiting for this lease request would otherwise wait out their budget.
            if leasing {
                self.slot.lease_ended.notify_waiters();
            }
        }
    }
}

#[async_trait]
impl QuotaStore for RedisStore {
    /// A call a lease covers, with more than half of the lease left, is answered here
    /// without a future; anything else (a refill to ask, no lease, a batch) goes to
    /// `consume_n`.
    fn consume_now(
        &self,
        key_id: &str,
        limit: u64,
        calls: u64,
        now: DateTime<Utc>,
    ) -> Option<Result<Consumed, QuotaError>> {
        if !self.config.batched() || calls != 1 {
            return None;
        }
        let month = Month::containing(now);
        let slot = self.slots.get(key_id, month);
        let mut tally = slot.tally();
        if tally.lease.wants_refill(self.config.batch_max) {
            return None;
        }
        let left = tally.lease.take()?;
        Some(Ok(Consumed::Allowed(Usage {
            used: tally.known.saturating_sub(left),
            limit,
            month,
            now,
        })))
    }

    async fn consume_n(
        &self,
        key_id: &str,
        limit: u64,
        calls: u64,
        now: DateTime<Utc>,
    ) -> Result<Consumed, QuotaError> {
        let calls = calls.max(1);
        let month = Month::containing(now);
        let slot = self.slots.get(key_id, month);
        let usage = |used| Usage {
            used,
            limit,
            month,
            now,
        };
        if self.config.batched() && calls == 1 {
            self.await_lease(&slot).await;
        }
        let carry = match self.plan(&slot, calls, usage) {
            Plan::Done(allowed) => return Ok(allowed),
            Plan::Refill(carry, allowed) => {
                self.refill_detached(slot, carry, limit, now).await;
                return Ok(allowed);
            }
            Plan::Fallback => return self.fallback(&slot, limit, calls, now),
            Plan::Exchange(carry) => carry,
        };
        let (want, exact, leasing) = (carry.want, carry.exact, carry.leasing());
        // Admitted against the limit less the local calls Redis may lack: counted in the answer.
        let local = carry.local;
        let result = self
            .exchange(&slot, carry, limit, now, LeaseTo::CallFirst)
            .await;
        let answer = match result {
            Ok(reply) => Ok(match (reply.outcome, reply.used.saturating_add(local)) {
                (Outcome::Leased, used) if exact => Consumed::Allowed(usage(used)),
                (Outcome::Leased, used) => {
                    // This call took the first of the lease (granted in `exchange`).
                    let left = want - 1;
                    Consumed::Allowed(usage(used.saturating_sub(left)))
                }
                (Outcome::Counted, used) => Consumed::Allowed(usage(used)),
                (Outcome::NotCounted | Outcome::RanBefore, used) => Consumed::Exceeded(usage(used)),
            }),
            Err(_) => self.fallback(&slot, limit, calls, now),
        };
        if leasing {
            slot.lease_ended.notify_waiters();
        }
        answer
    }

    async fn usage(
        &self,
        key_id: &str,
        limit: u64,
        now: DateTime<Utc>,
    ) -> Result<Usage, QuotaError> {
        let month = Month::containing(now);
        let slot = self.slots.get(key_id, month);
        let shared = if self.breaker.admit(Instant::now()) == Admit::Skip {
            None
        } else {
            let read = async {
                let mut conn = self.connection().await?;
                let get = async {
                    // The count with its era (`script.rs`): a reading knows its epoch.
                    let (shared, era) = redis::cmd("MGET")
                        .arg(&slot.count_key)
                        .arg(format!("{}e", slot.marker_prefix))
                        .query_async::<(Option<u64>, Option<String>)>(&mut conn)
                        .await?;
                    let epoch = era
                        .as_deref()
                        .and_then(|e| e.split_once(' '))
                        .and_then(|(epoch, _)| epoch.parse().ok())
                        .unwrap_or(0);
                    match shared {
                        // Before this month's first call, the count may still be untagged.
                        None if self.legacy_names() => redis::cmd("GET")
                            .arg(&slot.legacy_count_key)
                            .query_async::<Option<u64>>(&mut conn)
                            .await
                            .map(|n| n.map(|n| (n, 0))),
                        shared => Ok(shared.map(|n| (n, epoch))),
                    }
                };
                match tokio::time::timeout(self.config.call_timeout, get).await {
                    Ok(Ok(v)) => Ok(v),
                    Ok(Err(e)) => Err(Failure::from(e)),
                    Err(_) => Err(Failure {
                        why: "timed out".into(),
                        maybe_ran: true,
                    }),
                }
            };
            match read.await {
                Ok(n) => {
                    self.succeeded();
                    Some(n)
                }
                Err(f) => {
                    self.failed(&f.why);
                    None
                }
            }
        };
        let mut tally = slot.tally();
        let used = match shared {
            Some(Some((n, epoch))) => {
                tally.known = n;
                tally.epoch = epoch;
                n + tally.local_calls()
            }
            // Missing (a new month, or lost): what was seen stays the floor to restore.
            Some(None) => tally.local_calls(),
            None if self.config.failure_policy == FailurePolicy::FailClosed => {
                return Err(unreachable_closed())
            }
            None => tally.known + tally.local_calls(),
        };
        Ok(Usage {
            used,
            limit,
            month,
            now,
        })
    }

    async fn take_rate_n(
        &self,
        project: &Arc<str>,
        config: RateConfig,
        calls: u64,
    ) -> Result<RateStanding, QuotaError> {
        if let Some(standing) = self
            .shared_rate(&self.rate_script, project, config, calls)
            .await
        {
            return Ok(standing);
        }
        if self.config.failure_policy == FailurePolicy::FailClosed {
            return Err(unreachable_closed());
        }
        Ok(self.local_rates.check_n(project, config, calls))
    }

    async fn give_back_rate_n(
        &self,
        project: &Arc<str>,
        config: RateConfig,
        calls: u64,
    ) -> Result<RateStanding, QuotaError> {
        // Where the take went: Redis unless the breaker skips it (then this gateway's own
        // rate). A give-back that fails leaves the rate spent, as before: nothing worse.
        if let Some(standing) = self
            .shared_rate(&self.give_back_script, project, config, calls)
            .await
        {
            return Ok(standing);
        }
        Ok(self.local_rates.give_back_n(project, config, calls))
    }

    fn status(&self) -> serde_json::Value {
        let pending: u64 = self
            .slots
            .all()
            .iter()
            .map(|s| s.tally().local_calls())
            .sum();
        serde_json::json!({
            "store": "redis",
            "connected": self.connected.load(Ordering::Relaxed),
            "breaker_open": self.breaker.is_open(Instant::now()),
            "pending_local_counts": pending,
            "failure_policy": self.config.failure_policy,
            "refusing_calls": self.refusing(),
            "eviction_policy": self.eviction_policy(),
            "counts_restored": self.restored.load(Ordering::Relaxed),
            "lease_waits": self.lease_waits.load(Ordering::Relaxed),
            "lease_waited_us": self.lease_waited_us.load(Ordering::Relaxed),
            "on_eviction_policy": self.config.on_eviction_policy,
        })
    }

    fn refuses_calls(&self) -> bool {
        self.refusing()
    }

    fn unready_for_eviction(&self) -> bool {
        RedisStore::unready_for_eviction(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn keys_live_to_the_end_of_their_month_plus_a_day() {
        let now = t("2026-01-31T23:59:50Z");
        assert_eq!(ttl_seconds(Month::containing(now), now), 86_400 + 10);
        // A late sync of an old month still gets the grace period.
        let later = t("2026-02-10T00:00:00Z");
        assert_eq!(ttl_seconds(Month::containing(now), later), 86_400);
    }
}
