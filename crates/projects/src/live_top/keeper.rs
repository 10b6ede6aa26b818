//! The background service of the live top-domains: every `render_interval_ms` it drains the
//! flag buffers into today's summary and, when anything changed (flags, a day leaving the
//! window, the shared counts, the table), re-renders the ranking; every `sync_interval_ms` it
//! shares the counts through Redis (with `quota.store: redis`); every `persist_interval_ms`
//! and at shutdown it writes them to the state file.
//!
//! With Redis the counts are kept in four parts, and the ranking merges all of them:
//! - `own`: flags counted here and not sent yet (with the embedded store: all flags);
//! - `sending`: the batch sent last, not known to be in Redis: resent under its id until Redis
//!   answers (the id makes Redis add it once, see [`super::shared`]);
//! - `acked`: batches Redis took that no read of Redis has shown yet;
//! - `shared`: the window as last read from Redis (every gateway's counts).
//!
//! While Redis is down, `own` keeps counting (bounded like any summary) and the ranking shows
//! the last shared read plus the local counts; nothing is lost or added twice when it is back.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use drg_base::service::{Service, Shutdown};
use prometheus::{Gauge, IntCounterVec};

use super::shared::SharedCounts;
use super::state::StateFile;
use super::{LiveTop, TopDomainsConfig};
use drg_access::quota::Clock;
use drg_base::infra::redis::config::RedisConfig;
use drg_base::periodic::Ticks;
use drg_domain::heavy_hitters::{merge, ranking, Day, Snapshot, SpaceSaving, Window};
use drg_domain::DomainTable;
use drg_telemetry::metrics::Metrics;

/// A batch of local counts on its way to Redis.
struct Batch {
    id: String,
    days: BTreeMap<Day, SpaceSaving>,
}

struct Counts {
    own: Window,
    sending: Option<Batch>,
    acked: Window,
    shared: Window,
    /// Changed since the last save.
    dirty: bool,
    /// Changed since the last render.
    stale: bool,
    /// The table version the ranking was last rendered with.
    rendered_with: Option<String>,
}

impl Counts {
    fn empty(config: &TopDomainsConfig) -> Self {
        let window = || Window::new(config.window_days, config.capacity);
        Counts {
            own: window(),
            sending: None,
            acked: window(),
            shared: window(),
            dirty: false,
            stale: true,
            rendered_with: None,
        }
    }

    /// Every summary the ranking merges.
    fn buckets(&self) -> impl Iterator<Item = (Day, &SpaceSaving)> {
        let sending = self
            .sending
            .iter()
            .flat_map(|b| b.days.iter().map(|(d, s)| (*d, s)));
        self.own
            .buckets()
            .chain(sending)
            .chain(self.acked.buckets())
            .chain(self.shared.buckets())
    }

    fn counters(&self) -> usize {
        self.buckets().map(|(_, s)| s.len()).sum()
    }

    fn expire(&mut self, today: Day) {
        let mut gone = self.own.expire(today) | self.acked.expire(today);
        gone |= self.shared.expire(today);
        if let Some(b) = &mut self.sending {
            let first = self.own.first_day(today);
            let before = b.days.len();
            b.days.retain(|d, _| *d >= first);
            gone |= b.days.len() != before;
        }
        if gone {
            self.dirty = true;
            self.stale = true;
        }
    }

    fn to_file(&self) -> StateFile {
        let snap = |w: &Window| -> Vec<(Day, Snapshot)> {
            w.buckets().map(|(d, s)| (d, s.snapshot())).collect()
        };
        StateFile {
            own: snap(&self.own),
            sending: self.sending.as_ref().map(|b| {
                (
                    b.id.clone(),
                    b.days.iter().map(|(d, s)| (*d, s.snapshot())).collect(),
                )
            }),
            acked: snap(&self.acked),
            shared: snap(&self.shared),
            ..StateFile::new()
        }
    }

    /// Counts from the state file. Without Redis every part becomes this gateway's own.
    fn from_file(config: &TopDomainsConfig, file: StateFile, redis: bool) -> Self {
        let mut c = Counts::empty(config);
        let restore = |w: &mut Window, days: Vec<(Day, Snapshot)>| {
            for (day, snap) in days {
                let s = SpaceSaving::from_snapshot(config.capacity, snap);
                for (name, count, label) in s.iter() {
                    w.add(day, name, count, label);
                }
            }
        };
        restore(&mut c.own, file.own);
        if redis {
            c.sending = file.sending.map(|(id, days)| Batch {
                id,
                days: days
                    .into_iter()
                    .map(|(d, s)| (d, SpaceSaving::from_snapshot(config.capacity, s)))
                    .collect(),
            });
            restore(&mut c.acked, file.acked);
            restore(&mut c.shared, file.shared);
        } else {
            let mut rest = file.acked;
            rest.extend(file.shared);
            rest.extend(file.sending.into_iter().flat_map(|(_, d)| d));
            restore(&mut c.own, rest);
        }
        c
    }
}

/// The metrics of the live top-domains.
struct KeeperMetrics {
    counters: Gauge,
    sync_failures: IntCounterVec,
    saves: IntCounterVec,
}

/// The background service (see the module documentation).
pub struct Keeper {
    live: Arc<LiveTop>,
    table: Arc<ArcSwap<DomainTable>>,
    clock: Arc<dyn Clock>,
    config: TopDomainsConfig,
    state_file: PathBuf,
    shared: Option<SharedCounts>,
    counts: Mutex<Counts>,
    metrics: KeeperMetrics,
    /// Redis failed at the last sync (for one log line per outage, not one per tick).
    failing: AtomicBool,
    batches: AtomicU64,
    /// A random per-process prefix of batch ids.
    id_prefix: u64,
}

impl Keeper {
    /// The live top-domains of `config` (`None` when `top_domains.enabled` is false), and its
    /// service. Loads the state file; a bad one is logged and ignored.
    pub fn new(
        top: &TopDomainsConfig,
        redis: Option<&RedisConfig>,
        table: Arc<ArcSwap<DomainTable>>,
        clock: Arc<dyn Clock>,
        metrics: &Metrics,
    ) -> Result<Option<(Arc<LiveTop>, Keeper)>, prometheus::Error> {
        if !top.enabled {
            return Ok(None);
        }
        let flags = metrics.counter_vec(
            "drg_top_flags_total",
            "Flagged answers counted for top-domains.",
            &[],
        )?;
        let live = Arc::new(
            LiveTop::new(top.capacity, flags.with_label_values::<&str>(&[]))
                .with_min_projects(top.no_mx_min_projects),
        );
        let counts = match StateFile::load(&top.state_file) {
            Some(file) => {
                let c = Counts::from_file(top, file, redis.is_some());
                log::info!(
                    "top-domains: {} counters loaded from {}",
                    c.counters(),
                    top.state_file.display()
                );
                c
            }
            None => Counts::empty(top),
        };
        let keeper = Keeper {
            live: live.clone(),
            table,
            clock,
            config: top.clone(),
            state_file: top.state_file.clone(),
            shared: redis.map(|redis| {
                SharedCounts::new(
                    redis,
                    top.sync_interval.min(Duration::from_secs(5)),
                    top.window_days,
                    top.capacity,
                )
            }),
            counts: Mutex::new(counts),
            metrics: KeeperMetrics {
                counters: metrics.gauge(
                    "drg_top_counters",
                    "Heavy-hitter counters held for top-domains, over all days and parts.",
                )?,
                sync_failures: metrics.counter_vec(
                    "drg_top_sync_failures_total",
                    "Failed Redis steps of the top-domains sharing (`add` or `read`).",
                    &["step"],
                )?,
                saves: metrics.counter_vec(
                    "drg_top_state_saves_total",
                    "Writes of the top-domains state file, by result.",
                    &["result"],
                )?,
            },
            failing: AtomicBool::new(false),
            batches: AtomicU64::new(0),
            id_prefix: getrandom::u64().unwrap_or_else(|_| u64::from(std::process::id())),
        };
        // Counts loaded from the file are served from the first request on.
        keeper.render();
        Ok(Some((live, keeper)))
    }

    fn today(&self) -> Day {
        let days = self.clock.now().timestamp().div_euclid(86_400);
        Day::try_from(days).unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the buffered flags into today's summary and drops days that left the window.
    fn drain(&self) {
        let today = self.today();
        let pending = self.live.drain();
        let mut c = self.lock();
        if !pending.is_empty() {
            for shard in &pending {
                for (name, n, label) in shard.iter() {
                    c.own.add(today, name, n, label);
                }
            }
            c.dirty = true;
            c.stale = true;
        }
        c.expire(today);
    }

    /// Re-ranks and re-renders when the counts or the table changed.
    fn render(&self) {
        let table = self.table.load();
        let version = table.version().as_str();
        let mut c = self.lock();
        if !c.stale && c.rendered_with.as_deref() == Some(version) {
            return;
        }
        let tallies = merge(c.buckets(), self.config.capacity);
        let top = (!tallies.is_empty()).then(|| ranking(&table, &tallies));
        self.live.publish(top);
        self.metrics.counters.set(c.counters() as f64);
        c.stale = false;
        c.rendered_with = Some(version.to_owned());
    }

    /// Sends the local counts to Redis, then reads the window back.
    async fn sync(&self, shared: &SharedCounts) {
        let (id, payload) = {
            let mut c = self.lock();
            if c.sending.is_none() && !c.own.is_empty() {
                let n = self.batches.fetch_add(1, Ordering::Relaxed);
                let days = c.own.take();
                c.sending = Some(Batch {
                    id: format!("{:016x}{n:x}", self.id_prefix),
                    days,
                });
                c.dirty = true;
            }
            match &c.sending {
                Some(b) => (
                    Some(b.id.clone()),
                    b.days
                        .iter()
                        .map(|(d, s)| {
                            let names = s.iter().map(|(n, c, l)| (n.to_owned(), c, l)).collect();
                            (*d, names)
                        })
                        .collect::<Vec<_>>(),
                ),
                None => (None, Vec::new()),
            }
        };
        if let Some(id) = id {
            if let Err(e) = shared.add(&id, &payload).await {
                self.failed("add", &e);
                return;
            }
            let mut c = self.lock();
            if let Some(batch) = c.sending.take() {
                for (day, s) in batch.days {
                    for (name, count, label) in s.iter() {
                        c.acked.add(day, name, count, label);
                    }
                }
            }
            c.dirty = true;
        }
        let today = self.today();
        let first = self.lock().own.first_day(today);
        match shared.read(first, today).await {
            Ok(days) => {
                let mut c = self.lock();
                let mut window = Window::new(self.config.window_days, self.config.capacity);
                for (day, s) in days {
                    window.put(day, s);
                }
                c.shared = window;
                c.acked = Window::new(self.config.window_days, self.config.capacity);
                c.dirty = true;
                c.stale = true;
                if self.failing.swap(false, Ordering::Relaxed) {
                    log::info!("top-domains: sharing through Redis resumed");
                }
            }
            Err(e) => self.failed("read", &e),
        }
    }

    fn failed(&self, step: &str, e: &redis::RedisError) {
        self.metrics.sync_failures.with_label_values(&[step]).inc();
        if !self.failing.swap(true, Ordering::Relaxed) {
            log::warn!(
                "top-domains: Redis {step} failed ({e}); counting locally, retrying every {:?}",
                self.config.sync_interval
            );
        }
    }

    /// Writes the counts to the state file if they changed (off the worker threads).
    async fn save(&self) {
        let state = {
            let mut c = self.lock();
            if !c.dirty {
                return;
            }
            c.dirty = false;
            c.to_file()
        };
        let path = self.state_file.clone();
        let result = tokio::task::spawn_blocking(move || state.save(&path)).await;
        let ok = match result {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                log::error!("{e}");
                false
            }
            Err(e) => {
                log::error!("top-domains state save task failed: {e}");
                false
            }
        };
        if !ok {
            self.lock().dirty = true;
        }
        self.metrics
            .saves
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
    }
}

#[async_trait]
impl Service for Keeper {
    async fn run(&self, mut shutdown: Shutdown) {
        let mut ticks = Ticks::new(self.config.render_interval);
        let mut last_sync: Option<Instant> = None;
        let mut last_save = Instant::now();
        while ticks.next(&mut shutdown).await.is_some() {
            self.drain();
            if let Some(shared) = &self.shared {
                if last_sync.is_none_or(|t| t.elapsed() >= self.config.sync_interval) {
                    self.sync(shared).await;
                    last_sync = Some(Instant::now());
                }
            }
            self.render();
            if last_save.elapsed() >= self.config.persist_interval {
                self.save().await;
                last_save = Instant::now();
            }
        }
        self.drain();
        if let Some(shared) = &self.shared {
            self.sync(shared).await;
        }
        self.save().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drg_domain::heavy_hitters::Label;
    use drg_domain::Reason;

    const L: Label = Label {
        reason: Reason::Disposable,
        score: 100,
    };

    fn snap(name: &str, n: u64) -> Vec<(Day, Snapshot)> {
        vec![(
            10,
            Snapshot {
                total: n,
                counters: vec![(name.into(), n, 0, L)],
            },
        )]
    }

    fn file() -> StateFile {
        StateFile {
            own: snap("own.com", 1),
            sending: Some(("b1".into(), snap("sending.com", 2))),
            acked: snap("acked.com", 3),
            shared: snap("shared.com", 4),
            ..StateFile::new()
        }
    }

    fn flags(c: &Counts) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = merge(c.buckets(), 100)
            .into_iter()
            .map(|t| (t.name.to_owned(), t.flags))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn the_state_file_restores_every_part_and_without_redis_all_become_own() {
        let config = TopDomainsConfig::default();
        let with_redis = Counts::from_file(&config, file(), true);
        assert_eq!(with_redis.sending.as_ref().map(|b| &*b.id), Some("b1"));
        assert_eq!(with_redis.own.counters(), 1);
        let back = with_redis.to_file();
        assert_eq!(back.sending, file().sending);
        assert_eq!(back.shared, file().shared);

        let local = Counts::from_file(&config, file(), false);
        assert!(local.sending.is_none());
        assert_eq!(local.own.counters(), 4);
        assert_eq!(flags(&local), flags(&with_redis));
        assert_eq!(
            flags(&local),
            [
                ("acked.com".into(), 3),
                ("own.com".into(), 1),
                ("sending.com".into(), 2),
                ("shared.com".into(), 4)
            ]
        );
    }

    #[test]
    fn days_leaving_the_window_are_dropped_from_every_part() {
        let config = TopDomainsConfig {
            window_days: 3,
            ..TopDomainsConfig::default()
        };
        let mut c = Counts::from_file(&config, file(), true);
        c.dirty = false;
        c.expire(12);
        assert_eq!(flags(&c).len(), 4);
        assert!(!c.dirty);
        c.expire(13);
        assert!(flags(&c).is_empty());
        assert!(c.dirty && c.stale);
    }
}
