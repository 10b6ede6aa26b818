//! `Rdap`: the domain-age lookups a request makes (from the cache, at once) and the workers that
//! fill the cache in the background; `RdapService`, the background service that runs the
//! workers, saves the cache and refreshes the bootstrap.
//!
//! A request never waits for a registry beyond `budget_ms` (0 by default: never). A miss is
//! queued for its project ([`super::queue`]); the workers, threads of their own since ureq
//! blocks, fetch in turn, paced per server.
//!
//! An age reaches a project's answers by that project's own lookups, never by another's: a
//! project's first lookup of a name is answered as a miss is (no age, at once), even when
//! another project's lookup had it fetched already (nothing is fetched again), and its next
//! lookups have it. So every project is answered the same way for the same asks, and an answer
//! never shows which names other projects looked up.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use drg_base::service::{Service, Shutdown};
use futures_util::FutureExt;

use super::answer::Registration;
use super::bootstrap::Bootstrap;
use super::cache::{AgeCache, Entry, Known};
use super::config::RdapConfig;
use super::fetch::{FetchError, Fetched, Fetcher};
use super::queue::{Job, Next, Offer, Pacing, Queue};
use drg_base::infra::deadlines;
use drg_base::periodic::Ticks;
use drg_domain::age::{AgeRule, DayNumber, DomainAge};
use drg_domain::listed_holds::ListedAge;
use drg_domain::DomainName;
use drg_telemetry::metrics::RdapStats;

/// A name is asked at most this many times of a server that answers "later" (429, 503); then
/// it is given up until `failure_ttl` ends.
const MAX_ATTEMPTS: u32 = 3;

/// Counters since start.
#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    no_server: AtomicU64,
    queue_full: AtomicU64,
    found: AtomicU64,
    not_found: AtomicU64,
    backoffs: AtomicU64,
    errors: Mutex<BTreeMap<&'static str, u64>>,
}

/// The registry's part of `?explain=true` when it gave no age: `failed` (a timeout, a
/// connection that broke, an answer too large or not RDAP: `kind` says which), `refused` (it
/// answered 429, 503 or another refusing status past the retries: `kind`), or `queued` (a fetch
/// is on its way; the lookup did not wait for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct RegistryNote {
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
}

impl RegistryNote {
    fn of_failure(kind: &'static str) -> Self {
        let refused = matches!(kind, "rate_limited" | "unavailable" | "status");
        RegistryNote {
            status: if refused { "refused" } else { "failed" },
            kind: Some(kind),
        }
    }
}

/// Domain ages for the lookups (see the module's documentation).
pub struct Rdap {
    config: RdapConfig,
    bootstrap: ArcSwap<Bootstrap>,
    cache: AgeCache,
    queue: Mutex<Queue>,
    /// Wakes the workers: a name queued, a server's turn come, stopping.
    wake: Condvar,
    /// Wakes lookups waiting within their budget: a fetch ended.
    fetched: tokio::sync::Notify,
    stopping: AtomicBool,
    counters: Counters,
    fetcher: Fetcher,
    /// Which projects asked for which registrable domain (a keyed hash of the pair): bounded,
    /// in memory only; a pair it forgot is one more answer without the age.
    asked: quick_cache::sync::Cache<u64, (), quick_cache::UnitWeighter, ahash::RandomState>,
    asked_keys: foldhash::fast::RandomState,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn today(now: u64) -> DayNumber {
    DayNumber::try_from(now / 86_400).unwrap_or(DayNumber::MAX)
}

/// The TLD of a registrable domain (the bootstrap's key).
fn tld_of(registrable: &str) -> &str {
    registrable.rsplit('.').next().unwrap_or(registrable)
}

impl Rdap {
    /// Reads the bootstrap (the state folder's newer copy when it parses, else the configured
    /// file) and the cache's state file.
    pub fn new(config: &RdapConfig) -> Self {
        let bootstrap = Self::read_bootstrap(config).with_overrides(&config.servers);
        let cache = AgeCache::new(config.cache_entries);
        let longest = (u64::from(config.ttl_days) * 86_400).max(config.negative_ttl.as_secs());
        match cache.load(&config.state_path(), unix_now(), longest) {
            Ok((kept, skipped)) if kept + skipped > 0 => log::info!(
                "rdap: {kept} cached domain ages loaded, {skipped} lines skipped, from {}",
                config.state_path().display()
            ),
            Ok(_) => {}
            Err(e) => log::warn!(
                "rdap: the cache file {} was not read ({e}); starting empty",
                config.state_path().display()
            ),
        }
        Rdap {
            bootstrap: ArcSwap::from_pointee(bootstrap),
            cache,
            queue: Mutex::new(Queue::new(
                config.max_queued,
                config.max_queued_per_project,
                Pacing {
                    interval: config.min_interval,
                    waited_interval: config.waited_interval.min(config.min_interval),
                },
            )),
            wake: Condvar::new(),
            fetched: tokio::sync::Notify::new(),
            stopping: AtomicBool::new(false),
            counters: Counters::default(),
            fetcher: Fetcher::new(config.timeout, config.max_body_bytes, config.max_redirects),
            asked: super::cache::caller_keyed_cache(config.cache_entries.max(1_024)),
            asked_keys: foldhash::fast::RandomState::default(),
            config: config.clone(),
        }
    }

    /// The bootstrap in service at start: the copy last fetched from `bootstrap_url` when it
    /// parses, else `bootstrap_file`; neither readable: none (only `servers` are asked), said
    /// once at WARN, since a domain's age is never worth refusing to start.
    fn read_bootstrap(config: &RdapConfig) -> Bootstrap {
        let fetched = Self::fetched_bootstrap_path(config);
        let shipped = config.bootstrap_path();
        let mut why = Vec::new();
        let mut usable = Vec::new();
        for path in [&fetched, &shipped] {
            let text = match std::fs::read_to_string(path) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && path == &fetched => continue,
                Err(e) => {
                    why.push(format!("{}: {e}", path.display()));
                    continue;
                }
            };
            match Bootstrap::parse(&text, config.allow_plain_http) {
                Ok(b) => usable.push(b),
                Err(e) => why.push(format!("{}: {e}", path.display())),
            }
        }
        // The newer of the fetched copy and the shipped file (an upgrade may ship a newer one).
        // RFC 3339 times in UTC compare as text.
        let newest = usable
            .into_iter()
            .rev()
            .max_by(|a, b| a.publication().cmp(&b.publication()));
        match newest {
            Some(b) => {
                for w in &why {
                    log::warn!("rdap: bootstrap not used ({w})");
                }
                b
            }
            None => {
                log::warn!(
                    "rdap: no bootstrap ({}); only gateway.rdap.servers are asked",
                    why.join("; ")
                );
                Bootstrap::default()
            }
        }
    }

    /// The copy of the bootstrap fetched from `bootstrap_url`, beside the cache's state file.
    fn fetched_bootstrap_path(config: &RdapConfig) -> PathBuf {
        config.state_path().with_file_name("rdap_dns.json")
    }

    /// How age weighs in a verdict (`young_days`, `established_days`).
    pub fn age_rule(&self) -> AgeRule {
        AgeRule {
            young_days: self.config.young_days,
            established_days: self.config.established_days,
        }
    }

    /// How long a lookup the neighbourhood would flag waits for the domain's age.
    pub fn neighbourhood_budget(&self) -> std::time::Duration {
        self.config.neighbourhood_budget
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the cache says of `registrable`: `None` when it holds nothing fresh, `Some(None)`
    /// when it knows the domain has no date to give. A registration date past its time is
    /// still given (a domain's registration does not change while it exists) and fetched again
    /// for `project`.
    fn cached(&self, registrable: &str, now: u64, project: &str) -> Option<Option<DomainAge>> {
        let entry = self.cache.entry(registrable)?;
        let fresh = entry.expires > now;
        match entry.known {
            Known::Registered(day) => {
                if !fresh {
                    self.schedule(registrable, project, false);
                }
                Some(Some(DomainAge::on(day, today(now))))
            }
            _ if fresh => Some(None),
            _ => None,
        }
    }

    /// What `?explain=true` says of the registry when the answer has no age for `name`: the
    /// last fetch failed or was refused (and why), or a fetch is on its way; `None` when the
    /// registry answered (a date, none to give, not known) or was never asked.
    pub fn registry_note(&self, name: &DomainName) -> Option<RegistryNote> {
        let registrable = name.registrable()?;
        match self.cache.entry(registrable) {
            Some(Entry {
                known: Known::Failed(kind),
                expires,
            }) if expires > unix_now() => Some(RegistryNote::of_failure(kind)),
            Some(Entry {
                known: Known::Registered(_) | Known::Undated | Known::NotFound,
                ..
            }) => None,
            _ => self.lock().is_busy(registrable).then_some(RegistryNote {
                status: "queued",
                kind: None,
            }),
        }
    }

    /// Whether `name`'s age is on its way from a registry not known to fail (see
    /// [`drg_domain::classify::pending`]): its TLD has an RDAP server, the cache holds no
    /// answer for it (a date would have been given; no date, not found or a fresh failure is
    /// all the registry will say for now), and that server's last fetch was answered (or it
    /// was never asked). A name the queue could not take (a bound reached) waits as a queued
    /// one does: the bound is the gateway's own, not the registry's failure, and its next
    /// lookup offers it again.
    pub fn awaits(&self, name: &DomainName) -> bool {
        let Some(registrable) = name.registrable() else {
            return false;
        };
        let bootstrap = self.bootstrap.load();
        let Some(server) = bootstrap.servers(tld_of(registrable)).first() else {
            return false;
        };
        if self
            .cache
            .entry(registrable)
            .is_some_and(|e| e.expires > unix_now() || matches!(e.known, Known::Registered(_)))
        {
            return false;
        }
        !self.lock().failing(server)
    }

    /// Whether `project` asked for `registrable` before; notes that it has now.
    fn asked_before(&self, registrable: &str, project: &str) -> bool {
        use std::hash::BuildHasher;
        let pair = self.asked_keys.hash_one((registrable, project));
        if self.asked.get(&pair).is_some() {
            return true;
        }
        self.asked.insert(pair, ());
        false
    }

    /// What the cache knows of `name`'s age, with no side effect (nothing queued, no project
    /// marked as having asked, no counter): `None` when it knows nothing (never asked, or a
    /// failure), `Some(None)` when the registry gave no date, `Some(Some(age))` when it did.
    /// Verdict changes judge watched names with it.
    pub fn known_age(&self, name: &DomainName) -> Option<Option<DomainAge>> {
        let registrable = name.registrable()?;
        let now = unix_now();
        let entry = self.cache.entry(registrable)?;
        match entry.known {
            Known::Registered(day) => Some(Some(DomainAge::on(day, today(now)))),
            _ if entry.expires > now => Some(None),
            _ => None,
        }
    }

    /// What the cache says of a listed name's registration, for weighing whether it held its
    /// key (`drg_domain::listed_holds`), with no side effect: a date, nothing a registry will
    /// tell (no date, no server, a registry known to fail), or a date on its way.
    pub fn listed_age(&self, name: &DomainName) -> ListedAge {
        match self.known_age(name) {
            Some(Some(age)) => ListedAge::Registered(age.age_days),
            Some(None) => ListedAge::Unknown,
            None if self.awaits(name) => ListedAge::OnItsWay,
            None => ListedAge::Unknown,
        }
    }

    /// Queues `name`'s registrable domain for a background fetch on `line` when the cache
    /// knows nothing of it (never asked, or a failure past its time): no answer waits for it,
    /// the line's bound applies as a project's does.
    pub fn fetch_later(&self, name: &DomainName, line: &str) {
        if let (Some(registrable), None) = (name.registrable(), self.known_age(name)) {
            self.schedule(registrable, line, false);
        }
    }

    /// The age of `name`'s registrable domain from the cache, at once; a miss is queued for a
    /// background fetch on `project`'s line. A project's first lookup of a name is a miss even
    /// when the cache holds it (another project's lookup had it fetched): the answer does not
    /// depend on who else asked.
    pub fn age(&self, name: &DomainName, project: &str) -> Option<DomainAge> {
        let registrable = name.registrable()?;
        let now = unix_now();
        let first = !self.asked_before(registrable, project);
        if let Some(known) = self.cached(registrable, now, project) {
            if first && known.is_some() {
                // As if fetched for this lookup: nothing is queued, the next lookup has it.
                self.counters.misses.fetch_add(1, Relaxed);
                return None;
            }
            self.counters.hits.fetch_add(1, Relaxed);
            return known;
        }
        self.schedule(registrable, project, false);
        None
    }

    /// As [`Rdap::age`], waiting at most `budget_ms` for the fetch of a miss.
    pub async fn age_within(&self, name: &DomainName, project: &str) -> Option<DomainAge> {
        self.age_within_budget(name, project, self.config.budget)
            .await
    }

    /// As [`Rdap::age`], waiting at most `budget` for the fetch of a miss.
    pub async fn age_within_budget(
        &self,
        name: &DomainName,
        project: &str,
        budget: std::time::Duration,
    ) -> Option<DomainAge> {
        if budget.is_zero() {
            return self.age(name, project);
        }
        let registrable = name.registrable()?;
        // A lookup that may wait is answered what the fetch it would wait for gives: the
        // cache's age at once, whoever had it fetched.
        self.asked_before(registrable, project);
        if let Some(known) = self.cached(registrable, unix_now(), project) {
            self.counters.hits.fetch_add(1, Relaxed);
            return known;
        }
        if !self.schedule(registrable, project, true) {
            return None;
        }
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            // Registered before the cache is read again, so a fetch ending in between wakes it.
            let notified = self.fetched.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(known) = self.cached(registrable, unix_now(), project) {
                return known;
            }
            if deadlines::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    /// Queues `registrable` for `project` (ahead of the names no answer waits for, when
    /// `waited`); false when it will not be fetched (no server for its TLD, a bound reached).
    fn schedule(&self, registrable: &str, project: &str, waited: bool) -> bool {
        let tld = tld_of(registrable);
        let bootstrap = self.bootstrap.load();
        let Some(server) = bootstrap.servers(tld).first() else {
            self.counters.no_server.fetch_add(1, Relaxed);
            return false;
        };
        self.counters.misses.fetch_add(1, Relaxed);
        let job = Job {
            name: registrable.into(),
            tld: tld.into(),
            server: server.clone(),
            project: project.into(),
            attempts: 0,
            waited,
        };
        match self.lock().offer(job) {
            Offer::Queued => {
                self.wake.notify_one();
                true
            }
            Offer::Already => true,
            Offer::Full | Offer::ProjectFull => {
                self.counters.queue_full.fetch_add(1, Relaxed);
                false
            }
        }
    }

    /// Starts the fetching threads.
    pub fn start_workers(self: &Arc<Self>) -> Vec<std::thread::JoinHandle<()>> {
        (0..self.config.concurrency)
            .filter_map(|i| {
                let me = self.clone();
                std::thread::Builder::new()
                    .name(format!("rdap-{i}"))
                    .spawn(move || me.work())
                    .map_err(|e| log::error!("rdap: a worker thread did not start: {e}"))
                    .ok()
            })
            .collect()
    }

    /// Stops the workers (each ends after its fetch in flight).
    pub fn stop(&self) {
        // Under the lock: a worker between its check of the flag and its wait cannot miss it.
        let _queue = self.lock();
        self.stopping.store(true, Relaxed);
        self.wake.notify_all();
    }

    /// The next job, waiting for one; `None` when stopping.
    fn next_job(&self) -> Option<Job> {
        let mut queue = self.lock();
        loop {
            if self.stopping.load(Relaxed) {
                return None;
            }
            let now = Instant::now();
            let wait = match queue.next(now) {
                Next::Fetch(job) => return Some(job),
                Next::WaitUntil(at) => at.saturating_duration_since(now),
                Next::Empty => Duration::from_secs(1),
            };
            queue = self
                .wake
                .wait_timeout(queue, wait.max(Duration::from_millis(1)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn work(&self) {
        while let Some(job) = self.next_job() {
            let now = unix_now();
            let bootstrap = self.bootstrap.load_full();
            // A panic in a fetch (a parser bug on a hostile answer) must not leave the name busy
            // for ever, nor its server in flight: it counts as a failed fetch.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.fetcher.fetch(&bootstrap, &job, today(now))
            }))
            .unwrap_or_else(|_| Err(FetchError::Transport("the fetch panicked".into())));
            self.record(job, result, now);
            self.fetched.notify_waiters();
            // A job given back, or a server's turn freed: another worker may take it.
            self.wake.notify_one();
        }
    }

    /// Caches what a fetch told and settles the job with the queue.
    fn record(&self, job: Job, result: Result<Fetched, FetchError>, now: u64) {
        let c = &self.config;
        let ttl = u64::from(c.ttl_days) * 86_400;
        let (known, expires) = match &result {
            Ok(Fetched::Found(Registration::On(day))) => (Known::Registered(*day), now + ttl),
            Ok(Fetched::Found(Registration::Undated)) => (Known::Undated, now + ttl),
            Ok(Fetched::NotFound) => (Known::NotFound, now + c.negative_ttl.as_secs()),
            Err(e) => (Known::Failed(e.kind()), now + c.failure_ttl.as_secs()),
        };
        match &result {
            Ok(Fetched::Found(_)) => self.counters.found.fetch_add(1, Relaxed),
            Ok(Fetched::NotFound) => self.counters.not_found.fetch_add(1, Relaxed),
            Err(e) => {
                let mut errors = self
                    .counters
                    .errors
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                *errors.entry(e.kind()).or_default() += 1;
                0
            }
        };
        let mut queue = self.lock();
        match result {
            Err(e) if e.backs_off() => {
                self.counters.backoffs.fetch_add(1, Relaxed);
                let asked = matches!(
                    e,
                    FetchError::RateLimited { .. } | FetchError::Unavailable { .. }
                );
                let give_back = asked && job.attempts + 1 < MAX_ATTEMPTS;
                let mut job = job;
                job.attempts += 1;
                let name = job.name.clone();
                let (wait, kept) = queue.back_off(
                    job,
                    Instant::now(),
                    e.retry_after(),
                    c.max_backoff,
                    give_back,
                );
                if !kept {
                    self.cache_failure(&name, known, expires);
                }
                log::debug!(
                    "rdap: {name}'s server backs off for {}s ({e})",
                    wait.as_secs()
                );
            }
            Err(e) => {
                log::debug!("rdap: {} not known ({e})", job.name);
                self.cache_failure(&job.name, known, expires);
                queue.done(&job, false);
            }
            Ok(_) => {
                self.cache.insert(&job.name, Entry { known, expires });
                queue.done(&job, true);
            }
        }
    }

    /// A failed fetch: a date known before stays (until `expires`, then asked again); else the
    /// failure is kept so the name is not asked again before `expires`.
    fn cache_failure(&self, name: &str, failed: Known, expires: u64) {
        let known = match self.cache.entry(name).map(|e| e.known) {
            Some(old @ Known::Registered(_)) => old,
            _ => failed,
        };
        self.cache.insert(name, Entry { known, expires });
    }

    /// Writes the cache to its state file.
    pub fn save(&self) {
        let path = self.config.state_path();
        match self.cache.save(&path, unix_now()) {
            Ok(n) => log::debug!("rdap: {n} domain ages saved to {}", path.display()),
            Err(e) => log::warn!("rdap: the cache was not saved to {} ({e})", path.display()),
        }
    }

    /// Fetches `bootstrap_url` and takes it when it parses and names at least half the TLDs
    /// of the bootstrap in service; the copy is kept in the state folder. Blocking.
    fn refresh_bootstrap(&self, url: &str) -> Result<usize, String> {
        let agent = ureq::Agent::config_builder()
            .tls_config(drg_base::infra::http::system_tls())
            .timeout_global(Some(self.config.timeout * 4))
            .max_redirects(2)
            .https_only(!self.config.allow_plain_http)
            .proxy(None)
            .accept_encoding("identity")
            .build()
            .new_agent();
        let mut body = Vec::new();
        use std::io::Read;
        agent
            .get(url)
            .call()
            .map_err(|e| e.to_string())?
            .into_body()
            .into_reader()
            .take(8 << 20)
            .read_to_end(&mut body)
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8(body).map_err(|_| "not UTF-8".to_owned())?;
        let fresh =
            Bootstrap::parse(&text, self.config.allow_plain_http).map_err(|e| e.to_string())?;
        let before = self.bootstrap.load().len();
        if fresh.len() * 2 < before {
            return Err(format!(
                "it names {} TLDs, fewer than half of the {before} in service",
                fresh.len()
            ));
        }
        let path = Self::fetched_bootstrap_path(&self.config);
        drg_base::infra::fsutil::write_atomic(&path, 0o600, text.as_bytes())
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let n = fresh.len();
        self.bootstrap
            .store(Arc::new(fresh.with_overrides(&self.config.servers)));
        Ok(n)
    }

    /// Counters and the queue, for `/metrics`.
    pub fn stats(&self) -> RdapStats {
        let queue = self.lock();
        let n = |c: &AtomicU64| c.load(Relaxed);
        let c = &self.counters;
        RdapStats {
            cache_hits: n(&c.hits),
            cache_misses: n(&c.misses),
            no_server: n(&c.no_server),
            queue_full: n(&c.queue_full),
            found: n(&c.found),
            not_found: n(&c.not_found),
            backoffs: n(&c.backoffs),
            errors: c
                .errors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(k, v)| (*k, *v))
                .collect(),
            queued: queue.waiting() as u64,
            servers_backing_off: queue.backing_off(Instant::now()) as u64,
            cache_entries: self.cache.len() as u64,
            bootstrap_tlds: self.bootstrap.load().len() as u64,
        }
    }
}

/// The background service: the workers, the cache saved every `save_interval` and at
/// shutdown, the bootstrap refreshed from `bootstrap_url`.
pub struct RdapService(pub Arc<Rdap>);

#[async_trait]
impl Service for RdapService {
    async fn run(&self, mut shutdown: Shutdown) {
        let rdap = &self.0;
        // Not joined at the end: a worker may be in a fetch for up to its timeout, and the
        // process is ending; the cache is saved first.
        let _workers = rdap.start_workers();
        let mut ticks = Ticks::new(Duration::from_secs(1));
        let mut last_save = Instant::now();
        let mut last_refresh = None::<Instant>;
        let mut refreshing: Option<tokio::task::JoinHandle<Result<usize, String>>> = None;
        let refresh_every = Duration::from_secs(rdap.config.bootstrap_refresh_hours * 3_600);
        while ticks.next(&mut shutdown).await.is_some() {
            if last_save.elapsed() >= rdap.config.save_interval {
                let me = rdap.clone();
                let _ = tokio::task::spawn_blocking(move || me.save()).await;
                last_save = Instant::now();
            }
            let Some(url) = rdap.config.bootstrap_url.clone() else {
                continue;
            };
            // The download runs beside the loop, so a stop never waits for it.
            if refreshing.as_ref().is_some_and(|h| h.is_finished()) {
                match refreshing.take().map(|h| h.now_or_never()) {
                    Some(Some(Ok(Ok(n)))) => log::info!("rdap: bootstrap from {url}: {n} TLDs"),
                    Some(Some(Ok(Err(why)))) => log::warn!(
                        "rdap: the bootstrap from {url} was not taken ({why}); the one in service stays"
                    ),
                    _ => {}
                }
            }
            if refreshing.is_none() && last_refresh.is_none_or(|t| t.elapsed() >= refresh_every) {
                last_refresh = Some(Instant::now());
                let me = rdap.clone();
                refreshing = Some(tokio::task::spawn_blocking(move || {
                    me.refresh_bootstrap(&url)
                }));
            }
        }
        rdap.stop();
        let me = rdap.clone();
        let _ = tokio::task::spawn_blocking(move || me.save()).await;
    }
}
