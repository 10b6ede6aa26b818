//! DNS lookups of MX evidence: a time budget per request, a bound on lookups in flight, a
//! bounded TTL-aware cache with negative caching (RFC 2308), and single-flight so concurrent
//! lookups of a name share one query.
//!
//! The budget bounds how long a request waits, not the DNS work: a lookup that overruns keeps
//! going in the background (still holding its slot) and fills the cache for the next request.
//! Slots are few (`max_inflight`) so that names under a slow or silent nameserver, which an
//! attacker can mint by the thousand, cannot pile up tasks and sockets: past the bound a request
//! is answered at once with what a timeout would give (nothing known, fail open). Each project
//! holds at most its fair share of them ([`Shares`]), and a zone that timed out is left alone
//! for a while (for the project whose lookup timed out; for everyone once a second project's
//! did: [`ZoneTimeouts`]), so one caller's names never take the others' evidence.
//!
//! What DNS says is believed only from a resolver the canaries vouch for ([`crate::mx::trust`]):
//! that a name has no mail is never concluded from a failure, a timeout, an unchecked or
//! untrusted resolver, or an NXDOMAIN under a TLD the resolver cannot show to exist.

use std::collections::HashMap;
use std::hash::RandomState;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;
use quick_cache::sync::{Cache, DefaultLifecycle};
use quick_cache::{OptionsBuilder, UnitWeighter};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::domain::mail::{HostProblem, HostState, MxEvidence, MxHost};
use crate::domain::neighbour_index::{network, HostNetworks, MAX_HOSTS, MAX_NETS_PER_HOST};
use crate::domain::DomainName;
use crate::infra::breaker::Breaker;
use crate::mx::config::MxConfig;
use crate::mx::neighbourhood::Neighbourhood;
use crate::mx::shares::{ShareSlot, Shares};
use crate::mx::slow_zones::ZoneTimeouts;
use crate::mx::trust::{self, CanaryAnswer, Trust, TrustState};
use crate::ops::metrics::MxStats;

/// How a lookup was answered (shown by `lookup`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheState {
    Hit,
    /// This request started the query.
    Miss,
    /// Another request's query was already in flight.
    Coalesced,
    /// The budget ran out; the query goes on in the background.
    OverBudget,
    /// `max_inflight` lookups were already running, or the project held its share of them:
    /// answered as unknown at once, nothing asked.
    Refused,
    /// MX evidence is off (no DNS server answers, or the resolver is not trusted): answered as
    /// unknown at once, nothing asked.
    Off,
    /// A name under a zone that timed out a moment ago: answered as unknown at once.
    SlowZone,
}

/// A canary lookup waits this long at most: a machine without DNS should have MX evidence off
/// before users notice; a slower resolver is checked again at the next interval.
const CANARY_TIMEOUT: Duration = Duration::from_millis(1_000);

/// How often a streak of unanswered lookups may ask for an early canary check.
const RECHECK_SPACING: Duration = Duration::from_secs(1);

#[derive(Clone)]
struct Cached {
    evidence: Arc<MxEvidence>,
    expires: Instant,
}

type Flight = watch::Receiver<Option<Arc<MxEvidence>>>;

/// What DNS said of one MX host: whether it can take mail, and the networks of its addresses
/// that reverse DNS vouches for (asked only for the neighbourhood).
#[derive(Clone)]
struct HostFacts {
    state: HostState,
    nets: Arc<[String]>,
    /// Reverse DNS was asked for every network (a cached entry without them does not serve a
    /// lookup that wants them all).
    with_networks: bool,
}

/// The hosts that can take mail, with their networks (`facts` in `hosts`' order).
fn usable_hosts(hosts: &[MxHost], facts: Vec<HostFacts>) -> Vec<HostNetworks> {
    hosts
        .iter()
        .zip(facts)
        .filter(|(_, f)| f.state == HostState::Usable)
        .map(|(h, f)| (h.host.clone(), f.nets.to_vec()))
        .collect()
}

/// Which networks of an MX host's addresses a lookup asks reverse DNS to vouch for (a round
/// trip, after the addresses' own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nets {
    /// None (no neighbourhood).
    None,
    /// Only those where the neighbourhood has listed neighbours: the only ones whose key can
    /// judge now. A request waits for these; the rest are vouched for in the background.
    Listed,
    /// All (learning in the background, `mx-snapshot`).
    All,
}

/// SipHash (std's `RandomState`), since the names are the client's choice.
type EvidenceCache =
    Cache<Box<str>, Cached, UnitWeighter, RandomState, DefaultLifecycle<Box<str>, Cached>>;

/// A cache of at most `entries` names. Its shards (a lock each) are sized in whole numbers of
/// entries, so the shards together never exceed the bound.
fn evidence_cache(entries: usize) -> EvidenceCache {
    let entries = entries.max(1);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut shards = (threads * 4).next_power_of_two();
    // Small shards evict too eagerly: quick_cache wants at least 32 entries in each.
    while shards > 1 && entries / shards < 32 {
        shards /= 2;
    }
    let capacity = entries / shards * shards;
    let options = OptionsBuilder::new()
        .shards(shards)
        .estimated_items_capacity(capacity)
        .weight_capacity(capacity as u64)
        .build()
        .expect("both capacities are set");
    Cache::with_options(
        options,
        UnitWeighter,
        RandomState::new(),
        DefaultLifecycle::default(),
    )
}

/// A counter alone on its cache line: every cache hit bumps it, from every worker thread, and
/// it must not slow down the fields next to it.
#[derive(Default)]
#[repr(align(128))]
struct HotCounter(AtomicU64);

/// Resolver plus cache. Cheap to share (`Arc`).
pub struct MxResolver {
    dns: TokioResolver,
    /// S3-FIFO eviction (`quick_cache`): storing a name into a full cache costs O(1) amortised,
    /// whatever its size, and a flood of one-off names cannot push out the names asked often.
    /// Expiry is checked on read; an expired entry waits for its refresh or its eviction.
    cache: EvidenceCache,
    inflight: Mutex<HashMap<Box<str>, Flight>>,
    slots: Arc<Semaphore>,
    max_inflight: usize,
    /// How long a lookup may hold its slot, whatever DNS does (MX, then A and AAAA).
    lookup_deadline: Duration,
    query_timeout: Duration,
    hits: HotCounter,
    trust: TrustState,
    canaries: Vec<String>,
    /// Lookups in a row that no server answered (reset by any answer).
    /// The shared breaker, as a streak of unanswered lookups: when `breaker_failures` in a row
    /// open it, the canaries are asked now and it is closed again (a timeout never switches MX
    /// evidence off by itself, so nothing here is skipped while it is open).
    failures: Breaker,
    /// Set when the streak opened the breaker: the canaries are asked now.
    recheck: AtomicBool,
    /// Becomes true once the canaries were first asked (a negative answer found before then
    /// waits for their verdict).
    checked: watch::Sender<bool>,
    shares: Arc<Shares>,
    /// Registrable domains whose lookups timed out: which projects', until when.
    slow_zones: Cache<Box<str>, ZoneTimeouts>,
    /// Whether a TLD exists, as this resolver shows it, until when.
    tlds: Cache<Box<str>, (bool, Instant)>,
    /// The second resolver that must confirm an NXDOMAIN (`mx.confirm_servers`), if any.
    confirm: Option<TokioResolver>,
    /// What DNS says of MX hosts' addresses, and their networks (shared by many domains: a
    /// small cache answers most).
    host_facts: Cache<Box<str>, (HostFacts, Instant)>,
    neighbourhood: Option<Arc<Neighbourhood>>,
    misses: AtomicU64,
    refused: AtomicU64,
    /// The fail-open answer, shared so that refusing or timing out allocates nothing.
    unknown: Arc<MxEvidence>,
    budget: Duration,
    min_ttl: Duration,
    max_ttl: Duration,
    negative_max_ttl: Duration,
    failure_ttl: Duration,
}

/// The resolver configuration of `servers` (`ip:port` each).
fn name_servers(servers: &[String]) -> Result<ResolverConfig, MxSetupError> {
    let mut out = Vec::new();
    for s in servers {
        let addr: SocketAddr = s.parse().map_err(|_| MxSetupError::BadServer(s.clone()))?;
        let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
        for c in &mut ns.connections {
            c.port = addr.port();
        }
        out.push(ns);
    }
    Ok(ResolverConfig::from_name_servers(out))
}

/// The options of every resolver the gateway builds.
fn set_options(opts: &mut ResolverOpts, config: &MxConfig) {
    opts.timeout = config.query_timeout;
    opts.attempts = 1;
    opts.ndots = 0;
    // Our cache is the one that counts: it holds the classified evidence, not raw records.
    opts.cache_size = 0;
}

/// The resolver could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum MxSetupError {
    #[error("DNS servers: '{0}' is not ip:port")]
    BadServer(String),
    #[error("system DNS configuration (resolv.conf): {0}")]
    System(String),
}

/// Takes a finished (or abandoned) lookup out of the in-flight map, also if it panicked, so the
/// name is not left looking busy forever.
struct FlightGuard<'r> {
    resolver: &'r MxResolver,
    name: &'r str,
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        self.resolver
            .inflight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(self.name);
    }
}

impl MxResolver {
    pub fn new(config: &MxConfig) -> Result<Self, MxSetupError> {
        let provider = TokioRuntimeProvider::default();
        let mut no_system_servers = false;
        let mut builder = if config.servers.is_empty() {
            match TokioResolver::builder(provider.clone()) {
                Ok(b) => b,
                // An offline or minimal machine: start with evidence off, not refuse to start.
                Err(e) => {
                    log::warn!("MX lookups: no system DNS configuration ({e}); MX evidence is off");
                    no_system_servers = true;
                    TokioResolver::builder_with_config(
                        ResolverConfig::from_name_servers(Vec::new()),
                        provider.clone(),
                    )
                }
            }
        } else {
            TokioResolver::builder_with_config(name_servers(&config.servers)?, provider.clone())
        };
        set_options(builder.options_mut(), config);
        let dns = builder
            .build()
            .map_err(|e| MxSetupError::System(e.to_string()))?;
        let confirm = if config.confirm_servers.is_empty() {
            None
        } else {
            let mut b = TokioResolver::builder_with_config(
                name_servers(&config.confirm_servers)?,
                provider,
            );
            set_options(b.options_mut(), config);
            Some(b.build().map_err(|e| MxSetupError::System(e.to_string()))?)
        };
        let max_inflight = config.max_inflight.max(1);
        let trust = if no_system_servers {
            Trust::Silent
        } else {
            Trust::Unchecked
        };
        Ok(MxResolver {
            dns,
            confirm,
            cache: evidence_cache(config.cache_entries),
            inflight: Mutex::new(HashMap::new()),
            slots: Arc::new(Semaphore::new(max_inflight)),
            max_inflight,
            lookup_deadline: config.query_timeout * 2,
            query_timeout: config.query_timeout,
            hits: HotCounter::default(),
            trust: TrustState::new(trust),
            canaries: config.canaries.clone(),
            failures: Breaker::new(
                config.breaker_failures,
                RECHECK_SPACING,
                RECHECK_SPACING,
                Instant::now(),
            ),
            recheck: AtomicBool::new(false),
            checked: watch::Sender::new(false),
            shares: Arc::new(Shares::new(
                config.max_inflight_per_project.clamp(1, max_inflight),
                max_inflight,
            )),
            slow_zones: Cache::new(4_096),
            tlds: Cache::new(1_024),
            host_facts: Cache::new((config.cache_entries / 8).clamp(64, 20_000)),
            neighbourhood: None,
            misses: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            unknown: Arc::new(MxEvidence::Unknown),
            budget: config.budget,
            min_ttl: config.min_ttl,
            max_ttl: config.max_ttl,
            negative_max_ttl: config.negative_max_ttl,
            failure_ttl: config.failure_ttl,
        })
    }

    /// Teach `neighbourhood` what every lookup finds (and resolve MX hosts' addresses for it).
    pub fn with_neighbourhood(mut self, neighbourhood: Arc<Neighbourhood>) -> Self {
        self.neighbourhood = Some(neighbourhood);
        self
    }

    /// The neighbourhood index, when it is on.
    pub fn neighbourhood(&self) -> Option<&Arc<Neighbourhood>> {
        self.neighbourhood.as_ref()
    }

    /// MX evidence is off: no DNS server answers, or the canaries say the resolver lies.
    pub fn evidence_off(&self) -> bool {
        self.trust.get().evidence_off()
    }

    /// What the gateway thinks of its resolver now.
    pub fn trust(&self) -> Trust {
        self.trust.get()
    }

    /// Whether DNS answered a lookup. A streak of `breaker_failures` without an answer asks for
    /// the canaries at once (see [`take_recheck`](Self::take_recheck)); it never switches MX
    /// evidence off by itself: one slow zone is that zone's problem.
    fn note_answer(&self, answered: bool) {
        if answered {
            self.failures.succeeded();
        } else if self.failures.failed(Instant::now()) {
            self.failures.succeeded();
            self.recheck.store(true, Ordering::Relaxed);
        }
    }

    /// Lookups went unanswered in a row since the last check: check the canaries now.
    pub fn take_recheck(&self) -> bool {
        self.recheck.swap(false, Ordering::Relaxed)
    }

    /// The least time between two early checks.
    pub fn recheck_spacing(&self) -> Duration {
        RECHECK_SPACING
    }

    /// Asks DNS for the canaries' MX records (all at once, no lookup slot taken: a full pool
    /// must not keep the resolver from being judged) and sets the resolver's standing. Leaving
    /// trust drops every cached answer (what a lying resolver said must not outlive it);
    /// each change is logged once.
    pub async fn check_canaries(&self) -> Trust {
        let wait = self.query_timeout.min(CANARY_TIMEOUT);
        let answers = futures_util::future::join_all(self.canaries.iter().map(|c| async move {
            let fqdn = format!("{}.", c.trim_end_matches('.'));
            match tokio::time::timeout(wait, self.dns.mx_lookup(fqdn.as_str())).await {
                Ok(Ok(l))
                    if l.answers()
                        .iter()
                        .any(|r| matches!(&r.data, RData::MX(mx) if !mx.exchange.is_root())) =>
                {
                    CanaryAnswer::Mail
                }
                Ok(Ok(_)) => CanaryAnswer::Negative,
                Ok(Err(e)) if is_negative(&e) => CanaryAnswer::Negative,
                Ok(Err(NetError::Dns(_))) => CanaryAnswer::Failed,
                Ok(Err(_)) | Err(_) => CanaryAnswer::Silent,
            }
        }))
        .await;
        let now = trust::trust_of(&answers);
        let was = self.trust.set(now);
        self.checked.send_replace(true);
        if now != Trust::Trusted && was == Trust::Trusted {
            self.cache.clear();
            self.host_facts.clear();
            self.tlds.clear();
        }
        if now != was {
            self.log_change(was, now, &answers);
        }
        if now != Trust::Silent {
            self.failures.succeeded();
        }
        now
    }

    fn log_change(&self, was: Trust, now: Trust, answers: &[CanaryAnswer]) {
        let without: Vec<&str> = self
            .canaries
            .iter()
            .zip(answers)
            .filter(|(_, a)| **a != CanaryAnswer::Mail)
            .map(|(c, _)| c.as_str())
            .collect();
        match now {
            Trust::Silent => log::warn!(
                "MX lookups: no DNS server answers; answering from the table alone (no MX \
                 evidence) and probing in the background until one does"
            ),
            Trust::Untrusted => log::warn!(
                "MX lookups: the DNS resolver is not trusted: {} of {} canary names came back \
                 without MX records ({}); answering from the table alone (no MX evidence) and \
                 checking it again in the background",
                without.len(),
                answers.len(),
                without.join(", ")
            ),
            Trust::Trusted if was == Trust::Unchecked => {
                log::info!("MX lookups: the DNS resolver shows the canaries' MX records; MX evidence is on")
            }
            Trust::Trusted => log::info!("MX lookups: DNS answers again; MX evidence is back on"),
            Trust::Unchecked => {}
        }
    }

    fn cached(&self, name: &str) -> Option<Arc<MxEvidence>> {
        self.cache
            .get(name)
            .filter(|c| c.expires > Instant::now())
            .map(|c| c.evidence)
    }

    fn store(&self, name: &str, evidence: Arc<MxEvidence>, ttl: Duration) {
        let expires = Instant::now() + ttl;
        self.cache.insert(name.into(), Cached { evidence, expires });
    }

    /// Caches `evidence` for `name` for `ttl`, as if DNS had answered: no query is sent. For
    /// benchmarks of the cache and for tools.
    pub fn insert(&self, name: &str, evidence: MxEvidence, ttl: Duration) {
        self.store(name, Arc::new(evidence), ttl);
    }

    /// Counters and load, read without stopping lookups (one atomic load each, and a read
    /// lock per cache shard for the entry count).
    pub fn stats(&self) -> MxStats {
        let free = self.slots.available_permits();
        MxStats {
            in_flight: self.max_inflight.saturating_sub(free) as u64,
            refused: self.refused.load(Ordering::Relaxed),
            cache_hits: self.hits.0.load(Ordering::Relaxed),
            cache_misses: self.misses.load(Ordering::Relaxed),
            cache_entries: self.cache.len() as u64,
            breaker_open: self.evidence_off(),
            resolver: self.trust().as_str(),
            breaker_trips: self.trust.trips.load(Ordering::Relaxed),
            breaker_skipped: self.trust.skipped.load(Ordering::Relaxed),
            neighbourhood: self.neighbourhood.as_ref().map(|n| n.stats()),
        }
    }

    /// How long one request waits for MX evidence (`mx.budget_ms`).
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Lookups in flight at most (`mx.max_inflight`).
    pub fn max_inflight(&self) -> usize {
        self.max_inflight
    }

    /// Lookups one project may hold at once (`mx.max_inflight_per_project`).
    pub fn project_share(&self) -> usize {
        self.shares.limit()
    }

    /// The MX evidence of `name` (canonical, no trailing dot), within the request budget, for
    /// `project` (whose share of the slots a new lookup takes).
    pub async fn evidence(
        self: &Arc<Self>,
        name: &str,
        project: &str,
    ) -> (Arc<MxEvidence>, CacheState) {
        self.evidence_within(name, self.budget, project).await
    }

    /// The MX evidence of `name`, waiting at most `budget`; a lookup it starts holds one slot
    /// of `project`'s share until it ends (in the background too).
    pub async fn evidence_within(
        self: &Arc<Self>,
        name: &str,
        budget: Duration,
        project: &str,
    ) -> (Arc<MxEvidence>, CacheState) {
        if let Some(e) = self.cached(name) {
            self.hits.0.fetch_add(1, Ordering::Relaxed);
            return (e, CacheState::Hit);
        }
        if self.evidence_off() {
            self.trust.skipped.fetch_add(1, Ordering::Relaxed);
            return (self.unknown.clone(), CacheState::Off);
        }
        let zone = zone_of(name);
        if zone.as_deref().is_some_and(|z| {
            (self.slow_zones.get(z)).is_some_and(|t| t.skips(project, Instant::now()))
        }) {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return (self.unknown.clone(), CacheState::SlowZone);
        }
        let (mut rx, state) = {
            let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(rx) = inflight.get(name) {
                self.misses.fetch_add(1, Ordering::Relaxed);
                (rx.clone(), CacheState::Coalesced)
            } else if let Some(e) = self.cached(name) {
                // A lookup of this name finished between the first look and taking the lock.
                self.hits.0.fetch_add(1, Ordering::Relaxed);
                return (e, CacheState::Hit);
            } else {
                self.misses.fetch_add(1, Ordering::Relaxed);
                let taken = self
                    .shares
                    .try_take(project)
                    .and_then(|share| Some((share, self.slots.clone().try_acquire_owned().ok()?)));
                let Some((share, slot)) = taken else {
                    drop(inflight);
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return (self.unknown.clone(), CacheState::Refused);
                };
                let (tx, rx) = watch::channel(None);
                inflight.insert(name.into(), rx.clone());
                let this = self.clone();
                let owned: Box<str> = name.into();
                tokio::spawn(async move { this.run_lookup(&owned, zone, (slot, share), tx).await });
                (rx, CacheState::Miss)
            }
        };
        let waited = tokio::time::timeout(budget, rx.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(v)) => match v.as_ref() {
                Some(e) => (e.clone(), state),
                None => (self.unknown.clone(), CacheState::OverBudget),
            },
            _ => (self.unknown.clone(), CacheState::OverBudget),
        }
    }

    /// One lookup, run to its end whether or not anyone still waits for it; `slot` is held
    /// until then, so lookups in the background count against `max_inflight` too.
    async fn run_lookup(
        &self,
        name: &str,
        zone: Option<Box<str>>,
        slot: (OwnedSemaphorePermit, ShareSlot),
        tx: watch::Sender<Option<Arc<MxEvidence>>>,
    ) {
        let _in_flight = FlightGuard {
            resolver: self,
            name,
        };
        let (evidence, ttl, timed_out, incomplete) = self.resolve_and_teach(name, false).await;
        if let (true, Some(zone)) = (timed_out, zone) {
            // The project's next names under it are answered at once, unknown, for a while;
            // everyone's once another project's timed out there too. A lost update between two
            // timeouts ending at once costs one more lookup, never a wrong answer.
            let now = Instant::now();
            let mut timeouts = self.slow_zones.get(&zone).unwrap_or_default();
            timeouts.timed_out(
                slot.1.project(),
                now,
                now + self.failure_ttl.max(SLOW_ZONE_MIN),
            );
            self.slow_zones.insert(zone, timeouts);
        }
        let evidence = Arc::new(evidence);
        // Stored before the flight ends, so a request never finds neither.
        self.store(name, evidence.clone(), ttl);
        // The networks this answer did not wait for: vouched for and taught off the request's
        // path, from the hosts just cached (no second MX query).
        if let (true, Some(n)) = (incomplete, &self.neighbourhood) {
            n.complete_later(name);
        }
        let _ = tx.send(Some(evidence));
        drop(slot);
    }
    /// Resolves `name` within the lookup deadline and teaches the neighbourhood index what was
    /// found (before the answer is cached or sent, so the first request sees it learned). That
    /// a name has no mail is kept only from a trusted resolver; the flag says it timed out.
    /// The last flag: networks were left to vouch for in the background
    /// ([`Neighbourhood::complete_later`], once the answer is cached).
    async fn resolve_and_teach(
        &self,
        name: &str,
        background: bool,
    ) -> (MxEvidence, Duration, bool, bool) {
        let nets = match (&self.neighbourhood, background) {
            (None, _) => Nets::None,
            (Some(_), true) => Nets::All,
            (Some(_), false) => Nets::Listed,
        };
        let asked = tokio::time::timeout(self.lookup_deadline, self.resolve_full(name, nets));
        match asked.await {
            Ok((evidence, _, _, _, _))
                if evidence.is_undeliverable() && !self.believes_negatives().await =>
            {
                (MxEvidence::Unknown, self.failure_ttl, false, false)
            }
            Ok((MxEvidence::Unknown, ttl, _, unanswered, _)) => {
                (MxEvidence::Unknown, ttl, unanswered, false)
            }
            Ok((evidence, ttl, hosts, _, complete)) => {
                // A set-up whose hosts cannot take mail is remembered with no key: it teaches
                // nothing, and is not resolved again and again to learn that.
                let taught = matches!(
                    evidence,
                    MxEvidence::Hosts(_) | MxEvidence::UnusableHosts(_)
                );
                if let (Some(n), true) = (&self.neighbourhood, taught) {
                    n.learn(name, &hosts);
                }
                (evidence, ttl, false, taught && !complete)
            }
            Err(_) => {
                log::debug!("MX lookup of {name} overran its deadline");
                self.note_answer(false);
                (MxEvidence::Unknown, self.failure_ttl, true, false)
            }
        }
    }

    /// Whether the resolver is trusted to say a name has no mail. Just after start, before the
    /// canaries were first asked, their verdict is awaited (briefly).
    async fn believes_negatives(&self) -> bool {
        if self.trust() == Trust::Unchecked {
            let mut checked = self.checked.subscribe();
            let _ = tokio::time::timeout(CANARY_TIMEOUT * 2, checked.wait_for(|c| *c)).await;
        }
        self.trust().believes_negatives()
    }

    /// Resolves `name` for the neighbourhood index in the background (a listed name the table
    /// answered, or a name a request was answered for without all its networks): waits for a
    /// slot rather than refusing, fills the cache, teaches the index. A name whose MX hosts
    /// are cached is not asked again (one MX query per TTL): only its hosts' networks are.
    pub async fn learn(&self, name: &str) {
        if self.evidence_off() || self.neighbourhood.is_none() {
            return;
        }
        let Ok(_slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        if let Some(cached) = self.cached(name).filter(|e| !e.hosts().is_empty()) {
            self.teach_networks(name, cached.hosts()).await;
            return;
        }
        let (evidence, ttl, ..) = self.resolve_and_teach(name, true).await;
        self.store(name, Arc::new(evidence), ttl);
    }

    /// Vouches for every network of `hosts` (the MX hosts of `name`, cached) and teaches them.
    async fn teach_networks(&self, name: &str, hosts: &[MxHost]) {
        let Some(n) = &self.neighbourhood else { return };
        let facts = futures_util::future::join_all(
            hosts
                .iter()
                .take(MAX_HOSTS)
                .map(|h| self.host_facts_of(&h.host, Nets::All)),
        )
        .await;
        let usable = usable_hosts(hosts, facts);
        if !usable.is_empty() {
            n.learn(name, &usable);
        }
    }

    /// What `mx-snapshot` records of `name`: its MX hosts (most preferred first) with their
    /// networks; an empty list when DNS says it has none; `None` when DNS did not answer.
    pub async fn observe(&self, name: &str) -> Option<Vec<HostNetworks>> {
        let asked = tokio::time::timeout(self.lookup_deadline, self.resolve_full(name, Nets::All));
        match asked.await {
            Ok((MxEvidence::Unknown, ..)) | Err(_) => None,
            Ok((_, _, hosts, _, _)) => Some(hosts),
        }
    }

    /// MX evidence of `name` and the hosts that can take mail with their networks (asked only
    /// as `nets` says); the flags say no server answered the MX query, and every network was
    /// vouched for (complete: nothing left to teach in the background). The first
    /// [`MAX_HOSTS`] hosts are asked for their addresses: a set-up of no more hosts than that,
    /// none of which can take mail, is [`MxEvidence::UnusableHosts`]; a host that does not
    /// resolve to a usable address teaches the neighbourhood nothing (anyone can name one).
    async fn resolve_full(
        &self,
        name: &str,
        nets: Nets,
    ) -> (MxEvidence, Duration, Vec<HostNetworks>, bool, bool) {
        let (evidence, ttl, unanswered) = self.resolve(name).await;
        let hosts = evidence.hosts();
        let facts = futures_util::future::join_all(
            hosts
                .iter()
                .take(MAX_HOSTS)
                .map(|h| self.host_facts_of(&h.host, nets)),
        )
        .await;
        let states: Vec<HostState> = facts.iter().map(|f| f.state).collect();
        let complete = nets != Nets::Listed || facts.iter().all(|f| f.with_networks);
        let usable = usable_hosts(hosts, facts);
        match MxEvidence::unusable(hosts, &states) {
            Some(unusable) => (unusable, ttl, Vec::new(), unanswered, true),
            None => (evidence, ttl, usable, unanswered, complete),
        }
    }

    /// [`host_facts`](Self::host_facts), except for a host of a recognised shared service (the
    /// neighbourhood's table knows them): it exists and gives no key, so nothing is asked.
    async fn host_facts_of(&self, host: &str, nets: Nets) -> HostFacts {
        if self
            .neighbourhood
            .as_ref()
            .is_some_and(|n| n.is_shared_service(host))
        {
            return HostFacts {
                state: HostState::Usable,
                nets: Arc::from([]),
                with_networks: true,
            };
        }
        self.host_facts(host, nets).await
    }

    /// What DNS says of `host`'s addresses (A and AAAA) and, as `want` says, the networks
    /// (IPv4 /24, IPv6 /48) of those that reverse DNS vouches for; cached per host. That a
    /// host does not exist or has no address is believed only from a trusted resolver.
    async fn host_facts(&self, host: &str, want: Nets) -> HostFacts {
        if let Some((facts, expires)) = self.host_facts.get(host) {
            if expires > Instant::now() && (facts.with_networks || want != Nets::All) {
                return facts;
            }
        }
        if !host.contains('.') || host.parse::<IpAddr>().is_ok() {
            return HostFacts {
                state: HostState::Unusable(HostProblem::NotAHostName),
                nets: Arc::from([]),
                with_networks: true,
            };
        }
        let fqdn = format!("{host}.");
        let (a, aaaa) = tokio::join!(
            self.dns.lookup(fqdn.as_str(), RecordType::A),
            self.dns.lookup(fqdn.as_str(), RecordType::AAAA)
        );
        let mut ttl = self.max_ttl;
        let (mut failed, mut nx) = (false, false);
        let mut ips: Vec<IpAddr> = Vec::new();
        for answer in [a, aaaa] {
            match answer {
                Ok(l) => {
                    ttl = ttl.min(l.valid_until().saturating_duration_since(Instant::now()));
                    ips.extend(l.answers().iter().filter_map(|r| match &r.data {
                        RData::A(a) => Some(IpAddr::V4(a.0)),
                        RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                        _ => None,
                    }));
                }
                Err(e) if is_negative(&e) => {
                    nx |= e.is_nx_domain();
                    ttl = ttl.min(negative_ttl(&e));
                }
                Err(_) => failed = true,
            }
        }
        let unbelieved = failed
            || !self.trust().believes_negatives()
            || (nx && ips.is_empty() && !self.confirmed_absent(&fqdn, RecordType::A).await);
        let empty = if unbelieved {
            HostState::Unknown
        } else if nx {
            HostState::Unusable(HostProblem::NoSuchHost)
        } else {
            HostState::Unusable(HostProblem::NoAddress)
        };
        let state = HostState::of_addresses(&ips, empty);
        let (nets, with_networks) = if state == HostState::Usable {
            self.vouched_networks(host, ips, want).await
        } else {
            (Vec::new(), want != Nets::None)
        };
        let ttl = if state == HostState::Unknown {
            self.failure_ttl
        } else {
            self.clamp(ttl, self.max_ttl)
        };
        let facts = HostFacts {
            state,
            nets: nets.into(),
            with_networks,
        };
        self.host_facts
            .insert(host.into(), (facts.clone(), Instant::now() + ttl));
        facts
    }

    /// The networks of `ips` (`host`'s addresses) that reverse DNS vouches for, as `want` asks,
    /// and whether every one was asked (none skipped for having no listed neighbour).
    async fn vouched_networks(
        &self,
        host: &str,
        ips: Vec<IpAddr>,
        want: Nets,
    ) -> (Vec<String>, bool) {
        let mut nets: Vec<String> = Vec::new();
        if want == Nets::None {
            return (nets, false);
        }
        let mut complete = true;
        for ip in ips.into_iter().take(MAX_ADDRESSES) {
            let net = network(ip);
            if nets.contains(&net)
                || nets.len() >= MAX_NETS_PER_HOST
                || HostProblem::of_address(ip).is_some()
            {
                continue;
            }
            // A request waits for reverse DNS only where the network's key could judge now;
            // the others are vouched for in the background (`complete_later`).
            if want == Nets::Listed
                && !self
                    .neighbourhood
                    .as_ref()
                    .is_some_and(|n| n.network_has_listed(&net))
            {
                complete = false;
                continue;
            }
            // An A record points anywhere its owner likes; the network counts only when the
            // address's owner names this host's domain in its reverse DNS.
            if self.vouches(ip, host).await {
                nets.push(net);
            }
        }
        (nets, complete)
    }

    /// Forward-confirmed reverse DNS for `host`: a PTR name of `ip` is `host` itself, or a
    /// name under `host`'s registrable domain whose own addresses include `ip`. The PTR record
    /// belongs to whoever owns the address, not to whoever points an A record at it.
    async fn vouches(&self, ip: IpAddr, host: &str) -> bool {
        let Ok(ptr) = self.dns.reverse_lookup(ip).await else {
            return false;
        };
        let names: Vec<String> = ptr
            .answers()
            .iter()
            .filter_map(|r| match &r.data {
                RData::PTR(p) => Some(p.0.to_ascii().trim_end_matches('.').to_ascii_lowercase()),
                _ => None,
            })
            .take(MAX_ADDRESSES)
            .collect();
        if names.iter().any(|n| n == host) {
            return true;
        }
        let zone = zone_of(host);
        for name in names {
            if zone.is_none() || zone_of(&name) != zone {
                continue;
            }
            let kind = if ip.is_ipv4() {
                RecordType::A
            } else {
                RecordType::AAAA
            };
            let Ok(forward) = self.dns.lookup(format!("{name}.").as_str(), kind).await else {
                continue;
            };
            let confirmed = forward.answers().iter().any(|r| match &r.data {
                RData::A(a) => IpAddr::V4(a.0) == ip,
                RData::AAAA(a) => IpAddr::V6(a.0) == ip,
                _ => false,
            });
            if confirmed {
                return true;
            }
        }
        false
    }

    fn clamp(&self, ttl: Duration, max: Duration) -> Duration {
        ttl.clamp(self.min_ttl, max.max(self.min_ttl))
    }

    /// Asks DNS: MX first, then (no MX) A and AAAA for the implicit MX. What each outcome
    /// means for one name: MX hosts are evidence; NXDOMAIN is evidence only under a TLD this
    /// resolver shows to exist; NODATA for MX, A and AAAA alike is "no mail host"; SERVFAIL,
    /// REFUSED, a timeout or anything else is nothing known (cached for `failure_ttl`). The
    /// flag says no server answered the MX query.
    async fn resolve(&self, name: &str) -> (MxEvidence, Duration, bool) {
        let fqdn = format!("{name}.");
        let answer = self.dns.mx_lookup(fqdn.as_str()).await;
        let answered = matches!(&answer, Ok(_) | Err(NetError::Dns(_)));
        self.note_answer(answered);
        let (evidence, ttl) = match answer {
            Ok(lookup) => {
                let ttl = lookup
                    .valid_until()
                    .saturating_duration_since(Instant::now());
                let mut hosts: Vec<MxHost> = lookup
                    .answers()
                    .iter()
                    .filter_map(|r| match &r.data {
                        RData::MX(mx) => Some(MxHost {
                            preference: mx.preference,
                            host: mx
                                .exchange
                                .to_ascii()
                                .trim_end_matches('.')
                                .to_ascii_lowercase()
                                .into(),
                        }),
                        _ => None,
                    })
                    .collect();
                hosts.sort_by(|a, b| a.preference.cmp(&b.preference).then(a.host.cmp(&b.host)));
                let evidence = if hosts.len() == 1 && hosts[0].host.is_empty() {
                    MxEvidence::NullMx
                } else if hosts.is_empty() {
                    MxEvidence::Unknown
                } else {
                    MxEvidence::Hosts(hosts)
                };
                (evidence, self.clamp(ttl, self.max_ttl))
            }
            Err(e) if e.is_nx_domain() => self.no_domain(name, &fqdn, &e).await,
            Err(e) if e.is_no_records_found() => {
                let neg = negative_ttl(&e);
                let (a, aaaa) = tokio::join!(
                    self.dns.lookup(fqdn.as_str(), RecordType::A),
                    self.dns.lookup(fqdn.as_str(), RecordType::AAAA)
                );
                match (a, aaaa) {
                    (Ok(l), _) | (_, Ok(l)) => {
                        let ttl = l.valid_until().saturating_duration_since(Instant::now());
                        (
                            MxEvidence::AddressOnly,
                            self.clamp(ttl.min(neg), self.max_ttl),
                        )
                    }
                    (Err(a), Err(b)) if is_negative(&a) && is_negative(&b) => (
                        MxEvidence::NoMailHost,
                        self.clamp(neg, self.negative_max_ttl),
                    ),
                    _ => (MxEvidence::Unknown, self.failure_ttl),
                }
            }
            Err(e) => {
                log::debug!("MX lookup of {name} failed: {e}");
                (MxEvidence::Unknown, self.failure_ttl)
            }
        };
        (evidence, ttl, !answered)
    }

    /// What an NXDOMAIN for `name` is worth: `NoDomain` only when the second resolver (if any)
    /// confirms it and the resolver shows the name's TLD to exist; else nothing known.
    async fn no_domain(&self, name: &str, fqdn: &str, e: &NetError) -> (MxEvidence, Duration) {
        if !self.confirmed_absent(fqdn, RecordType::MX).await {
            log::debug!("MX lookup of {name}: NXDOMAIN not confirmed by the second resolver");
            (MxEvidence::Unknown, self.failure_ttl)
        } else if self.tld_exists(name).await {
            (
                MxEvidence::NoDomain,
                self.clamp(negative_ttl(e), self.negative_max_ttl),
            )
        } else {
            log::debug!("MX lookup of {name}: NXDOMAIN under a TLD the resolver does not show");
            (MxEvidence::Unknown, self.failure_ttl)
        }
    }

    /// Whether the second resolver (`mx.confirm_servers`) also says `fqdn` does not exist;
    /// true when there is none. Any other answer, a failure included, is no confirmation.
    async fn confirmed_absent(&self, fqdn: &str, rtype: RecordType) -> bool {
        let Some(confirm) = &self.confirm else {
            return true;
        };
        matches!(confirm.lookup(fqdn, rtype).await, Err(e) if e.is_nx_domain())
    }

    /// Whether the TLD of `name` exists as this resolver shows it: its SOA record comes back.
    /// Cached per TLD (a day when it does, `failure_ttl` when it does not).
    async fn tld_exists(&self, name: &str) -> bool {
        let tld = name.rsplit('.').next().unwrap_or(name);
        if let Some((exists, until)) = self.tlds.get(tld) {
            if until > Instant::now() {
                return exists;
            }
        }
        let fqdn = format!("{tld}.");
        let exists = matches!(
            self.dns.lookup(fqdn.as_str(), RecordType::SOA).await,
            Ok(l) if l.answers().iter().any(|r| matches!(r.data, RData::SOA(_)))
        );
        let ttl = if exists {
            Duration::from_secs(86_400)
        } else {
            self.failure_ttl
        };
        self.tlds.insert(tld.into(), (exists, Instant::now() + ttl));
        exists
    }
}

/// The registrable domain a name's lookups are slow under (a silent zone's names share it).
fn zone_of(name: &str) -> Option<Box<str>> {
    DomainName::parse(name)
        .ok()
        .and_then(|n| n.registrable().map(Box::from))
}

/// Addresses of one MX host (and PTR names of one address) considered at most.
const MAX_ADDRESSES: usize = 4;

/// A zone that timed out is left alone at least this long.
const SLOW_ZONE_MIN: Duration = Duration::from_secs(1);

fn is_negative(e: &NetError) -> bool {
    e.is_nx_domain() || e.is_no_records_found()
}

/// The negative-caching TTL the server gave (SOA minimum), or zero (then clamped to the minimum).
fn negative_ttl(e: &NetError) -> Duration {
    match e {
        NetError::Dns(DnsError::NoRecordsFound(nr)) => {
            Duration::from_secs(u64::from(nr.negative_ttl.unwrap_or(0)))
        }
        _ => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    /// A resolver whose DNS server never answers (a socket nobody reads), and that socket.
    fn silent(max_inflight: usize, cache_entries: usize) -> (Arc<MxResolver>, UdpSocket) {
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let config = MxConfig {
            servers: vec![sink.local_addr().unwrap().to_string()],
            max_inflight,
            cache_entries,
            budget: Duration::from_millis(20),
            query_timeout: Duration::from_millis(1000),
            ..MxConfig::default()
        };
        (Arc::new(MxResolver::new(&config).unwrap()), sink)
    }

    #[tokio::test]
    async fn past_max_inflight_lookups_are_refused_at_once_and_counted() {
        let (r, _sink) = silent(2, 100);
        assert_eq!(r.evidence("a.example", "p").await.1, CacheState::OverBudget);
        // Another project's (a project holding a slot leaves one free for the others).
        assert_eq!(r.evidence("b.example", "q").await.1, CacheState::OverBudget);
        // Both go on in the background, each holding its slot: a third name is refused.
        let (e, state) = r.evidence("c.example", "p").await;
        assert_eq!((state, &*e), (CacheState::Refused, &MxEvidence::Unknown));
        // A name in flight joins its lookup and takes no slot (so is not refused).
        assert_eq!(r.evidence("a.example", "p").await.1, CacheState::OverBudget);
        let s = r.stats();
        assert_eq!(
            (s.in_flight, s.refused, s.cache_misses, s.cache_hits),
            (2, 1, 4, 0)
        );
        // The silent server's queries time out: the slots come back and the failures are cached.
        let deadline = Instant::now() + Duration::from_secs(20);
        while r.stats().in_flight > 0 {
            assert!(Instant::now() < deadline, "{:?}", r.stats());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(r.evidence("a.example", "p").await.1, CacheState::Hit);
        assert_eq!(r.evidence("d.example", "p").await.1, CacheState::OverBudget);
        let s = r.stats();
        assert_eq!((s.refused, s.cache_hits, s.cache_entries), (1, 1, 2));
    }

    #[tokio::test]
    async fn the_cache_keeps_its_bound_and_its_busy_names_and_serves_live_answers_only() {
        let (r, _sink) = silent(4, 1000);
        let hour = Duration::from_secs(3600);
        let busy = MxEvidence::Hosts(vec![MxHost {
            preference: 1,
            host: "aspmx.l.google.com".into(),
        }]);
        r.insert("busy.example", busy.clone(), hour);
        for i in 0..20_000 {
            r.insert(&format!("n{i}.example"), MxEvidence::NoDomain, hour);
            if i % 50 == 0 {
                let (e, state) = r.evidence("busy.example", "p").await;
                assert_eq!((state, &*e), (CacheState::Hit, &busy), "after {i} names");
            }
        }
        let entries = r.stats().cache_entries;
        assert!((900..=1000).contains(&entries), "{entries}");
        // Recent names are kept, as long as their TTL.
        assert_eq!(r.evidence("n19999.example", "p").await.1, CacheState::Hit);
        r.insert("expired.example", MxEvidence::NullMx, Duration::ZERO);
        assert_eq!(
            r.evidence("expired.example", "p").await,
            (r.unknown.clone(), CacheState::OverBudget)
        );
        assert_eq!(r.stats().cache_misses, 1);
    }
}
