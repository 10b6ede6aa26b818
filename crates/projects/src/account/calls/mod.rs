//! Call logs and daily stats per project, behind `GET /v1/logs` and `GET /v1/stats`.
//!
//! The request path only builds a [`Call`] and offers it to a bounded queue ([`CallSink`]): a
//! full queue drops the call and counts it, so a slow store never holds a request up. A
//! background [`CallWriter`] takes the waiting calls every `batch_interval_ms` and stores them
//! in one batch, and sweeps entries past their plan's retention. Two stores implement
//! [`CallStore`]: an embedded SQLite file (`embedded.rs`, the default) and Redis streams and
//! per-day hashes (`redis.rs`, with `quota.store: redis`). Only domains are ever stored, never an
//! email's local part.

mod chunk;
pub mod config;
pub mod embedded;
pub mod redis;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use base64::Engine;
use chrono::{DateTime, NaiveDate, TimeDelta, Utc};
use crossbeam_queue::SegQueue;
use drg_base::service::{Service, Shutdown};
use prometheus::IntCounter;
use serde::Serialize;

use drg_access::keys::{KeyEntry, KeyStore};
use drg_access::quota::Clock;
use drg_base::periodic::Ticks;
use drg_domain::record::RiskScore;
use drg_domain::Reason;
use drg_telemetry::lifecycle::InFlight;

pub use config::CallsConfig;

/// Days in the `/v1/stats` chart (today, UTC, and the 29 before it).
pub const CHART_DAYS: u32 = 30;
/// Daily counts are kept this many days (the chart's, plus a margin for clocks of several
/// gateways that disagree around midnight).
pub const STATS_KEPT_DAYS: u32 = CHART_DAYS + 2;
/// Most calls one batch stores (a tick's calls are written in several batches). Small: the
/// writer runs at a low priority, but a thread that holds a core keeps it until it blocks,
/// yields or the next scheduler tick (up to 4 ms); at 60k calls a second, one 200 ms batch of
/// 12k calls took ~5 ms of a pinned worker's core and doubled the lookup's p99. Batches of 512
/// (~0.1 ms each) let the workers in between.
const MAX_BATCH: usize = 512;

/// What storing one tick's calls did: how many were stored, and each failed batch's size and
/// error (a failed batch loses its own calls only).
#[derive(Debug, Default)]
pub struct Written {
    pub stored: u64,
    pub lost: Vec<(u64, CallsError)>,
}

/// Why the call store failed.
#[derive(Debug, thiserror::Error)]
pub enum CallsError {
    #[error("calls store {path}: {source}")]
    Sqlite {
        path: String,
        source: rusqlite::Error,
    },
    #[error("calls store {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("calls store (redis): {0}")]
    Redis(#[from] ::redis::RedisError),
    #[error("calls store: {0}")]
    Task(String),
    #[error("calls metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// What a call answered: the record's score and reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub risk_score: RiskScore,
    pub reason: Reason,
}

impl Verdict {
    /// `blocked_count` counts every answer that is not `safe`.
    pub fn blocked(&self) -> bool {
        self.reason != Reason::Safe
    }
}

/// One answered call, as the writer receives it.
#[derive(Debug, Clone)]
pub struct Call {
    pub project: Arc<str>,
    /// The project's log retention (the plan of the key that called), for stores that expire
    /// whole logs.
    pub retention: Duration,
    /// The looked-up domain, or the domain of the checked address: never a local part.
    pub email_domain: Box<str>,
    /// `None`: a `/v1/check` answer without a readable score and reason; counted in the
    /// stats, not logged.
    pub verdict: Option<Verdict>,
    /// Answered by the gateway itself (a lookup), not relayed (`/v1/check`): only these are
    /// watched for verdict changes, since only these verdicts the gateway can judge again.
    pub lookup: bool,
    pub at: DateTime<Utc>,
    /// The project's count of calls waiting for the writer (its share of the queue): counted
    /// when the call is queued, given back when the writer takes it. `None`: not shared.
    pub queued: Option<Arc<AtomicUsize>>,
}

/// One entry of `/v1/logs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogItem {
    pub id: String,
    pub email_domain: String,
    pub risk_score: RiskScore,
    pub reason: Reason,
    /// RFC 3339, UTC, milliseconds.
    pub created_at: String,
}

/// A page of `/v1/logs`, newest first; `next` is the store's position after the last item
/// (before encoding as a cursor), `None` at the end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    pub items: Vec<LogItem>,
    pub next: Option<String>,
}

impl Page {
    /// A page of `items`; when `more` entries follow, the next page starts after the last one.
    pub fn of(items: Vec<LogItem>, more: bool) -> Page {
        let next = more.then(|| items.last().map(|i| i.id.clone())).flatten();
        Page { items, next }
    }
}

/// One day of `/v1/stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DayCount {
    #[serde(serialize_with = "iso_date")]
    pub date: NaiveDate,
    pub total_requests: u64,
    pub blocked_count: u64,
}

fn iso_date<S: serde::Serializer>(d: &NaiveDate, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&d.format("%Y-%m-%d"))
}

/// Where calls are kept.
#[async_trait]
pub trait CallStore: Send + Sync {
    /// Stores one batch: log entries for calls with a verdict, daily counts for all.
    async fn write(&self, calls: Vec<Call>) -> Result<(), CallsError>;

    /// True when the store does its work on threads of its own, so the thread that hands it
    /// calls may run at a low priority. A store whose connection runs on the caller's runtime
    /// (Redis: the link's driver task is spawned where it is first used) must say false, or the
    /// reads of `/v1/logs` and `/v1/stats` would wait on a low-priority thread too.
    fn works_on_own_threads(&self) -> bool {
        false
    }

    /// Stores one tick's calls, in batches of at most `MAX_BATCH`, one after another.
    async fn write_all(&self, calls: Vec<Call>) -> Written {
        let mut written = Written::default();
        let mut rest = calls.into_iter();
        loop {
            let batch: Vec<Call> = rest.by_ref().take(MAX_BATCH).collect();
            if batch.is_empty() {
                return written;
            }
            let n = batch.len() as u64;
            match self.write(batch).await {
                Ok(()) => written.stored += n,
                Err(e) => written.lost.push((n, e)),
            }
        }
    }

    /// Up to `limit` entries of `project` older than position `before` (the newest when
    /// `None`) and created at or after `since`, newest first. `Ok(None)`: `before` is not a
    /// position of this store.
    async fn page(
        &self,
        project: &str,
        before: Option<&str>,
        limit: usize,
        since: DateTime<Utc>,
    ) -> Result<Option<Page>, CallsError>;

    /// The daily counts of `project` from `first` to `last` (days without calls may be absent).
    async fn days(
        &self,
        project: &str,
        first: NaiveDate,
        last: NaiveDate,
    ) -> Result<Vec<DayCount>, CallsError>;

    /// Deletes log entries created before each project's cutoff (and, for projects no key
    /// names any more, before `oldest`), and daily counts before `first_day`. Returns how many
    /// log entries it deleted.
    async fn sweep(
        &self,
        cutoffs: &[(Arc<str>, DateTime<Utc>)],
        oldest: DateTime<Utc>,
        first_day: NaiveDate,
    ) -> Result<u64, CallsError>;
}

/// The counters of the call logs (registered on the gateway's metrics).
#[derive(Clone)]
pub struct CallMetrics {
    pub written: IntCounter,
    pub dropped: IntCounter,
    /// Dropped because their project held its share of the queue (also in `dropped`).
    pub over_share: IntCounter,
    pub store_errors: IntCounter,
    pub expired: IntCounter,
}

impl CallMetrics {
    pub fn register(metrics: &drg_telemetry::metrics::Metrics) -> Result<Self, prometheus::Error> {
        let one = |name: &str, help: &str| {
            metrics
                .counter_vec(name, help, &[])
                .map(|c| c.with_label_values::<&str>(&[]))
        };
        Ok(CallMetrics {
            written: one(
                "drg_calls_written_total",
                "Calls stored for /v1/logs and /v1/stats.",
            )?,
            dropped: one(
                "drg_calls_dropped_total",
                "Calls not stored: the writer's queue was full, or the store failed the batch.",
            )?,
            over_share: one(
                "drg_calls_over_share_total",
                "Calls not stored because their project held its share of the writer's queue (calls.queue_per_project; also counted in drg_calls_dropped_total).",
            )?,
            store_errors: one(
                "drg_calls_store_errors_total",
                "Failed calls store operations (batch writes, reads, sweeps).",
            )?,
            expired: one(
                "drg_calls_expired_total",
                "Log entries deleted by the sweep because their plan's retention had passed.",
            )?,
        })
    }
}

/// The calls waiting for the writer: a lock-free list bounded by a count. The writer polls it
/// every tick, so offering a call wakes nobody: a push and two counter updates, about half
/// what a tokio channel's permit, push and waker check cost the request path.
struct Queue {
    calls: SegQueue<Call>,
    /// Calls pushed and not yet taken (counted before the push, so it may run ahead).
    len: AtomicUsize,
    capacity: usize,
    /// One project's calls waiting at most.
    per_project: usize,
}

/// The request path's end of the queue. Cheap to clone.
#[derive(Clone)]
pub struct CallSink {
    queue: Arc<Queue>,
    dropped: IntCounter,
    over_share: IntCounter,
}

impl CallSink {
    /// Offers a call to the writer; never waits. A project past its share of the queue has
    /// its own call dropped (counted), so a few big batches cannot push other projects' calls
    /// out; a full queue drops it too.
    pub fn record(&self, call: Call) {
        let queue = &*self.queue;
        if let Some(mine) = &call.queued {
            if mine.fetch_add(1, Ordering::Relaxed) >= queue.per_project {
                mine.fetch_sub(1, Ordering::Relaxed);
                self.over_share.inc();
                self.dropped.inc();
                return;
            }
        }
        if queue.len.fetch_add(1, Ordering::Relaxed) >= queue.capacity {
            queue.len.fetch_sub(1, Ordering::Relaxed);
            if let Some(mine) = &call.queued {
                mine.fetch_sub(1, Ordering::Relaxed);
            }
            self.dropped.inc();
            return;
        }
        queue.calls.push(call);
    }
}

/// What the gateway holds when call logs are on: the queue and the store it reads.
#[derive(Clone)]
pub struct Calls {
    pub sink: CallSink,
    pub store: Arc<dyn CallStore>,
    pub metrics: CallMetrics,
    /// Most bytes of a `/v1/check` answer read for its verdict.
    pub check_body_max_bytes: usize,
}

/// The log retention of a key's project.
pub fn retention_of(key: &KeyEntry) -> Duration {
    key.log_retention
}

/// The configured store, queue and writer; `None` with `gateway.calls.enabled: false`. The
/// store follows the quota's: the SQLite file with `quota.store: local`, Redis with `redis`.
pub fn from_config(
    config: &CallsConfig,
    quota: &drg_access::quota::config::QuotaConfig,
    metrics: &drg_telemetry::metrics::Metrics,
    keys: Arc<ArcSwap<KeyStore>>,
    clock: Arc<dyn Clock>,
) -> Result<Option<(Calls, CallWriter)>, CallsError> {
    if !config.enabled {
        return Ok(None);
    }
    let store: Arc<dyn CallStore> = match quota.store {
        drg_access::quota::config::QuotaStoreKind::Local => {
            let path = config
                .path
                .clone()
                .unwrap_or_else(|| config::DEFAULT_FILE_NAME.into());
            let store = embedded::EmbeddedStore::open(&path, config.max_per_project)?;
            log::info!("call logs: {}", path.display());
            Arc::new(store)
        }
        drg_access::quota::config::QuotaStoreKind::Redis => Arc::new(redis::RedisCallStore::new(
            &quota.redis,
            config.max_per_project,
        )?),
    };
    let metrics = CallMetrics::register(metrics)?;
    Ok(Some(open(config, store, metrics, keys, clock)))
}

/// Builds the queue, its writer service, and the gateway's handle.
pub fn open(
    config: &CallsConfig,
    store: Arc<dyn CallStore>,
    metrics: CallMetrics,
    keys: Arc<ArcSwap<KeyStore>>,
    clock: Arc<dyn Clock>,
) -> (Calls, CallWriter) {
    let queue = Arc::new(Queue {
        calls: SegQueue::new(),
        len: AtomicUsize::new(0),
        capacity: config.queue_capacity,
        per_project: config.queue_per_project.max(1),
    });
    let calls = Calls {
        sink: CallSink {
            queue: queue.clone(),
            dropped: metrics.dropped.clone(),
            over_share: metrics.over_share.clone(),
        },
        store: store.clone(),
        metrics: metrics.clone(),
        check_body_max_bytes: config.check_body_max_bytes,
    };
    let writer = CallWriter {
        queue,
        store,
        metrics,
        keys,
        clock,
        batch_interval: config.batch_interval,
        sweep_interval: config.sweep_interval,
        settle: None,
        observer: None,
    };
    (calls, writer)
}

/// Calls taken off the queue between two chances for a worker to have the core.
const DRAIN_PIECE: usize = 2_048;

/// What else wants each tick's calls (verdict changes watch the lookups): told on the writer's
/// thread, before the calls are stored; must not wait.
pub trait CallObserver: Send + Sync {
    fn observe(&self, calls: &[Call]);
}

/// Takes the waiting calls every interval and stores them in batches; sweeps expired entries.
pub struct CallWriter {
    queue: Arc<Queue>,
    store: Arc<dyn CallStore>,
    metrics: CallMetrics,
    keys: Arc<ArcSwap<KeyStore>>,
    clock: Arc<dyn Clock>,
    batch_interval: Duration,
    sweep_interval: Duration,
    /// The requests in flight at shutdown, and how long the last drain waits for them.
    settle: Option<(InFlight, Duration)>,
    observer: Option<Arc<dyn CallObserver>>,
}

impl CallWriter {
    /// `observer` is told each tick's calls before they are stored.
    pub fn observed_by(&mut self, observer: Arc<dyn CallObserver>) {
        self.observer = Some(observer);
    }

    /// The last drain waits (at most `within`) until the requests in flight at shutdown are
    /// answered, as the quota's last sync does: their calls reach the logs and stats too.
    pub fn settle_with(&mut self, in_flight: InFlight, within: Duration) {
        self.settle = Some((in_flight, within));
    }

    /// At shutdown: keeps draining while requests are still in flight (within the settle
    /// time), then takes what is left.
    async fn last_drain(&self) {
        if let Some((in_flight, within)) = &self.settle {
            let deadline = tokio::time::Instant::now() + *within;
            while in_flight.open() > 0 && tokio::time::Instant::now() < deadline {
                self.drain().await;
                let tick = self.batch_interval.min(Duration::from_millis(50));
                tokio::time::sleep(tick).await;
            }
            let open = in_flight.open();
            if open > 0 {
                log::warn!(
                    "call logs: last drain with {open} connections still open after {within:?}"
                );
            }
        }
        self.drain().await;
    }

    /// Stores the calls waiting when it starts. Calls that arrive meanwhile wait for the next
    /// tick: taking them too kept the writer going without end under steady traffic, in
    /// transactions of the few calls that came during the last one (each transaction rewrites
    /// a handful of pages: about 1.6 KB written per call at 5,000 calls a second, instead of
    /// about 50 bytes).
    async fn drain(&self) {
        let queue = &*self.queue;
        let waiting = queue.len.load(Ordering::Relaxed);
        let mut calls = Vec::with_capacity(waiting);
        while calls.len() < waiting {
            match queue.calls.pop() {
                Some(call) => {
                    queue.len.fetch_sub(1, Ordering::Relaxed);
                    if let Some(mine) = &call.queued {
                        mine.fetch_sub(1, Ordering::Relaxed);
                    }
                    calls.push(call);
                }
                // Counted, not pushed yet: it is taken at the next tick.
                None => break,
            }
            if calls.len() % DRAIN_PIECE == 0 {
                // A tick's calls (~20k at 100k calls a second) took this thread ~0.9 ms in one
                // go, a stall for a worker sharing its core: a runnable one goes first now.
                std::thread::yield_now();
            }
        }
        if calls.is_empty() {
            return;
        }
        if let Some(observer) = &self.observer {
            observer.observe(&calls);
        }
        let written = self.store.write_all(calls).await;
        self.metrics.written.inc_by(written.stored);
        for (n, e) in written.lost {
            self.metrics.store_errors.inc();
            self.metrics.dropped.inc_by(n);
            log::error!("{e} ({n} calls dropped)");
        }
    }

    async fn sweep(&self) {
        let now = self.clock.now();
        let keys = self.keys.load();
        let mut cutoffs: Vec<(Arc<str>, DateTime<Utc>)> = Vec::new();
        let mut longest = Duration::ZERO;
        for key in keys.entries() {
            let retention = retention_of(key);
            longest = longest.max(retention);
            let cutoff = now - delta(retention);
            match cutoffs.iter_mut().find(|(p, _)| *p == key.project) {
                // Keys of one project share its plan; should they not, the longest wins.
                Some((_, c)) => *c = (*c).min(cutoff),
                None => cutoffs.push((key.project.clone(), cutoff)),
            }
        }
        let oldest = now - delta(longest.max(drg_access::plan::name_defaults("business").1));
        let first_day = now.date_naive() - TimeDelta::days(i64::from(STATS_KEPT_DAYS));
        match self.store.sweep(&cutoffs, oldest, first_day).await {
            Ok(n) => self.metrics.expired.inc_by(n),
            Err(e) => {
                self.metrics.store_errors.inc();
                log::error!("{e} (sweep)");
            }
        }
    }
}

#[async_trait]
impl Service for CallWriter {
    async fn run(&self, mut shutdown: Shutdown) {
        // This service's own thread: taking a tick's calls off the queue (~20k at 100k calls a
        // second) waits for the workers' gaps like the writing does, unless the store's own
        // connection lives on this thread's runtime.
        if self.store.works_on_own_threads()
            && !drg_base::infra::priority::lower_this_thread(
                drg_base::infra::priority::Priority::Low,
            )
        {
            log::debug!("could not lower the call log service's priority");
        }
        let mut ticks = Ticks::new(self.batch_interval);
        let mut last_sweep: Option<tokio::time::Instant> = None;
        while ticks.next(&mut shutdown).await.is_some() {
            self.drain().await;
            if last_sweep.is_none_or(|t| t.elapsed() >= self.sweep_interval) {
                last_sweep = Some(tokio::time::Instant::now());
                self.sweep().await;
            }
        }
        self.last_drain().await;
    }
}

fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

/// The `since` of a read: entries older than the retention are never shown, swept or not.
pub fn visible_since(now: DateTime<Utc>, retention: Duration) -> DateTime<Utc> {
    now.checked_sub_signed(delta(retention))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// The chart of `/v1/stats`: every day from 29 days ago to today (UTC), oldest first, days
/// without calls at zero.
pub fn chart(today: NaiveDate, counted: &[DayCount]) -> Vec<DayCount> {
    (0..CHART_DAYS)
        .rev()
        .map(|back| {
            let date = today - TimeDelta::days(i64::from(back));
            counted
                .iter()
                .find(|c| c.date == date)
                .copied()
                .unwrap_or(DayCount {
                    date,
                    total_requests: 0,
                    blocked_count: 0,
                })
        })
        .collect()
}

/// The first day of the chart that ends `today`.
pub fn chart_start(today: NaiveDate) -> NaiveDate {
    today - TimeDelta::days(i64::from(CHART_DAYS - 1))
}

/// Bytes of a cursor's project tag.
const CURSOR_TAG_LEN: usize = 8;

/// The tag binding a cursor to its project: the first bytes of a SHA-256 of the name, so a
/// cursor does not spell the project out and another project's cursor is told apart.
fn cursor_tag(project: &str) -> [u8; CURSOR_TAG_LEN] {
    use sha2::Digest;
    let digest = sha2::Sha256::new()
        .chain_update(b"drg-logs-cursor\0")
        .chain_update(project.as_bytes())
        .finalize();
    let mut tag = [0; CURSOR_TAG_LEN];
    tag.copy_from_slice(&digest[..CURSOR_TAG_LEN]);
    tag
}

/// A cursor: the project's tag and the store's position, base64url-encoded (opaque to clients,
/// free of characters a query string would need to escape). Both stores' positions are per
/// project (ids of the project's own log), so a cursor says nothing of other projects' traffic.
pub fn encode_cursor(project: &str, position: &str) -> String {
    let mut bytes = Vec::with_capacity(CURSOR_TAG_LEN + position.len());
    bytes.extend_from_slice(&cursor_tag(project));
    bytes.extend_from_slice(position.as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The store position of a cursor this API gave `project`; `None` for anything else (garbage,
/// or a cursor given to another project).
pub fn decode_cursor(project: &str, cursor: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .ok()?;
    let (tag, position) = bytes.split_at_checked(CURSOR_TAG_LEN)?;
    if tag != cursor_tag(project) {
        return None;
    }
    String::from_utf8(position.to_vec()).ok()
}

/// The verdict in a `/v1/check` answer: its top-level `risk_score` (an integer 0..=100) and
/// `reason` (one of the contract's), or `None` if the body has no such pair.
pub fn upstream_verdict(body: &[u8]) -> Option<Verdict> {
    #[derive(serde::Deserialize)]
    struct Answer {
        risk_score: Option<serde_json::Number>,
        reason: Option<String>,
    }
    let a: Answer = serde_json::from_slice(body).ok()?;
    let score = a.risk_score?;
    let score = score.as_u64().or_else(|| {
        score
            .as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0)
            .map(|f| f as u64)
    })?;
    let risk_score = RiskScore::try_from(score)
        .ok()
        .filter(|s| *s <= drg_domain::record::MAX_SCORE)?;
    let reason = a.reason?.parse().ok()?;
    Some(Verdict { risk_score, reason })
}

/// `created_at` as the API shows it.
pub fn created_at(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

/// Counts per project and day of a batch: `(project, day, total, blocked)`.
pub fn daily_counts(calls: &[Call]) -> Vec<(Arc<str>, NaiveDate, u64, u64)> {
    let mut out: Vec<(Arc<str>, NaiveDate, u64, u64)> = Vec::new();
    // The day of the call before, as the UTC seconds it spans: a batch's calls are nearly all
    // of one day, so most are placed by two comparisons, not a calendar conversion each.
    let mut last: Option<(i64, i64, NaiveDate)> = None;
    for call in calls {
        let secs = call.at.timestamp();
        let day = match last {
            Some((start, end, day)) if (start..end).contains(&secs) => day,
            _ => {
                let day = call.at.date_naive();
                let start = secs - secs.rem_euclid(86_400);
                last = Some((start, start + 86_400, day));
                day
            }
        };
        let blocked = u64::from(call.verdict.is_some_and(|v| v.blocked()));
        match out
            .iter_mut()
            .find(|(p, d, _, _)| *d == day && (Arc::ptr_eq(p, &call.project) || *p == call.project))
        {
            Some(entry) => {
                entry.2 += 1;
                entry.3 += blocked;
            }
            None => out.push((call.project.clone(), day, 1, blocked)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn day(s: &str) -> NaiveDate {
        s.parse().unwrap()
    }

    #[test]
    fn upstream_verdicts_need_a_score_and_a_known_reason() {
        let v = |s: &str| upstream_verdict(s.as_bytes());
        assert_eq!(
            v(r#"{"email":"x","risk_score":95,"reason":"disposable","extra":[1]}"#),
            Some(Verdict {
                risk_score: 95,
                reason: Reason::Disposable
            })
        );
        assert_eq!(
            v(r#"{"risk_score":12.0,"reason":"safe"}"#).map(|v| v.risk_score),
            Some(12)
        );
        for bad in [
            r#"{"risk_score":101,"reason":"safe"}"#,
            r#"{"risk_score":-1,"reason":"safe"}"#,
            r#"{"risk_score":1.5,"reason":"safe"}"#,
            r#"{"risk_score":"10","reason":"safe"}"#,
            r#"{"risk_score":10,"reason":"weird"}"#,
            r#"{"risk_score":10}"#,
            r#"{"reason":"safe"}"#,
            r#"[1,2]"#,
            "not json",
            r#"{"risk_score":10,"reason":"safe""#,
        ] {
            assert_eq!(v(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_chart_has_thirty_days_oldest_first_with_gaps_at_zero() {
        let counted = [
            DayCount {
                date: day("2026-11-22"),
                total_requests: 3,
                blocked_count: 1,
            },
            DayCount {
                date: day("2026-10-24"),
                total_requests: 2,
                blocked_count: 2,
            },
        ];
        let c = chart(day("2026-11-22"), &counted);
        assert_eq!(c.len(), 30);
        assert_eq!(c[0].date, day("2026-10-24"));
        assert_eq!(c[0].total_requests, 2);
        assert_eq!(c[29], counted[0]);
        assert_eq!(c[15].total_requests, 0);
        assert_eq!(chart_start(day("2026-11-22")), day("2026-10-24"));
        assert_eq!(
            serde_json::to_string(&c[29]).unwrap(),
            r#"{"date":"2026-11-22","total_requests":3,"blocked_count":1}"#
        );
    }

    #[test]
    fn cursors_round_trip_and_refuse_garbage_and_other_projects() {
        for p in ["17", "1732290000000-3"] {
            let c = encode_cursor("acme", p);
            assert!(c
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
            assert_eq!(decode_cursor("acme", &c).as_deref(), Some(p));
            assert_eq!(decode_cursor("acme2", &c), None);
            assert_eq!(decode_cursor("", &c), None);
        }
        assert_eq!(decode_cursor("acme", "***"), None);
        // A bare position (the cursors of earlier builds) is not a cursor.
        let bare = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode("17");
        assert_eq!(decode_cursor("acme", &bare), None);
        assert_eq!(decode_cursor("acme", ""), None);
    }

    /// The grouping before the day was kept from call to call: a calendar date per call.
    fn daily_counts_by_date(calls: &[Call]) -> Vec<(Arc<str>, NaiveDate, u64, u64)> {
        let mut out: Vec<(Arc<str>, NaiveDate, u64, u64)> = Vec::new();
        for call in calls {
            let day = call.at.date_naive();
            let blocked = u64::from(call.verdict.is_some_and(|v| v.blocked()));
            match out
                .iter_mut()
                .find(|(p, d, _, _)| *d == day && *p == call.project)
            {
                Some(entry) => {
                    entry.2 += 1;
                    entry.3 += blocked;
                }
                None => out.push((call.project.clone(), day, 1, blocked)),
            }
        }
        out
    }

    proptest::proptest! {
        /// Calls around midnights (and before 1970), of projects shared or only equal by
        /// name, are counted on the days their dates say.
        #[test]
        fn daily_counts_agree_with_each_calls_date(
            calls in proptest::collection::vec(
                (0..4usize, -3 * 86_400..3 * 86_400i64, proptest::option::of(0..4usize)),
                0..40,
            ),
            midnight in proptest::sample::select(vec![0i64, 1_795_478_400, -86_400 * 400]),
        ) {
            let shared: Arc<str> = "shared".into();
            let calls: Vec<Call> = calls
                .into_iter()
                .map(|(p, offset, reason)| Call {
                    project: match p {
                        0 | 1 => shared.clone(),
                        2 => "shared".into(),
                        _ => "other".into(),
                    },
                    retention: Duration::from_secs(60),
                    email_domain: "a.com".into(),
                    verdict: reason.map(|r| Verdict { risk_score: 1, reason: Reason::ALL[r] }),
                    lookup: true,
                    at: DateTime::from_timestamp(midnight + offset, 0).unwrap(),
                    queued: None,
                })
                .collect();
            proptest::prop_assert_eq!(daily_counts(&calls), daily_counts_by_date(&calls));
        }
    }

    #[test]
    fn daily_counts_group_by_project_and_utc_day() {
        let call = |p: &str, at: &str, reason: Option<Reason>| Call {
            project: p.into(),
            retention: Duration::from_secs(60),
            email_domain: "a.com".into(),
            verdict: reason.map(|reason| Verdict {
                risk_score: 1,
                reason,
            }),
            lookup: true,
            at: at.parse().unwrap(),
            queued: None,
        };
        let counts = daily_counts(&[
            call("a", "2026-11-22T23:59:59Z", Some(Reason::Safe)),
            call("a", "2026-11-22T01:00:00Z", Some(Reason::Disposable)),
            call("a", "2026-11-23T00:00:00Z", None),
            call("b", "2026-11-22T10:00:00Z", Some(Reason::RoleAccount)),
        ]);
        assert_eq!(
            counts,
            vec![
                ("a".into(), day("2026-11-22"), 2, 1),
                ("a".into(), day("2026-11-23"), 1, 0),
                ("b".into(), day("2026-11-22"), 1, 1),
            ]
        );
    }

    #[test]
    fn created_at_is_rfc3339_utc_with_milliseconds() {
        assert_eq!(
            created_at("2026-11-22T10:00:01.5Z".parse().unwrap()),
            "2026-11-22T10:00:01.500Z"
        );
    }
}
