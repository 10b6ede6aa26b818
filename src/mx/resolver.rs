//! DNS lookups of MX evidence: a time budget per request, a bound on lookups in flight, a
//! bounded TTL-aware cache with negative caching (RFC 2308), and single-flight so concurrent
//! lookups of a name share one query.
//!
//! The budget bounds how long a request waits, not the DNS work: a lookup that overruns keeps
//! going in the background (still holding its slot) and fills the cache for the next request.
//! Slots are few (`max_inflight`) so that names under a slow or silent nameserver, which an
//! attacker can mint by the thousand, cannot pile up tasks and sockets: past the bound a request
//! is answered at once with what a timeout would give (nothing known, fail open).

use std::collections::HashMap;
use std::hash::RandomState;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
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

use crate::domain::mail::{MxEvidence, MxHost};
use crate::domain::neighbourhood::{network, HostNetworks, MAX_HOSTS, MAX_NETS_PER_HOST};
use crate::mx::config::MxConfig;
use crate::mx::neighbourhood::Neighbourhood;
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
    /// `max_inflight` lookups were already running: answered as unknown at once, nothing asked.
    Refused,
    /// No DNS server answers (the breaker is open): answered as unknown at once, nothing asked.
    BreakerOpen,
}

/// A probe waits this long at most for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// Off when no DNS server answers: `failures` lookups in a row without an answer (or a failed
/// probe) open it; a probe that gets any answer closes it.
#[derive(Default)]
struct Breaker {
    open: AtomicBool,
    failures: AtomicU32,
    trips: AtomicU64,
    skipped: AtomicU64,
}

#[derive(Clone)]
struct Cached {
    evidence: Arc<MxEvidence>,
    expires: Instant,
}

type Flight = watch::Receiver<Option<Arc<MxEvidence>>>;

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
    breaker: Breaker,
    breaker_failures: u32,
    /// The networks of MX hosts (shared by many domains: a small cache answers most).
    host_networks: Cache<Box<str>, (Arc<[String]>, Instant)>,
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
                        provider,
                    )
                }
            }
        } else {
            let mut servers = Vec::new();
            for s in &config.servers {
                let addr: SocketAddr = s.parse().map_err(|_| MxSetupError::BadServer(s.clone()))?;
                let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
                for c in &mut ns.connections {
                    c.port = addr.port();
                }
                servers.push(ns);
            }
            TokioResolver::builder_with_config(ResolverConfig::from_name_servers(servers), provider)
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        opts.timeout = config.query_timeout;
        opts.attempts = 1;
        opts.ndots = 0;
        // Our cache is the one that counts: it holds the classified evidence, not raw records.
        opts.cache_size = 0;
        let dns = builder
            .build()
            .map_err(|e| MxSetupError::System(e.to_string()))?;
        let max_inflight = config.max_inflight.max(1);
        Ok(MxResolver {
            dns,
            cache: evidence_cache(config.cache_entries),
            inflight: Mutex::new(HashMap::new()),
            slots: Arc::new(Semaphore::new(max_inflight)),
            max_inflight,
            lookup_deadline: config.query_timeout * 2,
            query_timeout: config.query_timeout,
            hits: HotCounter::default(),
            breaker: Breaker {
                open: AtomicBool::new(no_system_servers),
                ..Breaker::default()
            },
            breaker_failures: config.breaker_failures.max(1),
            host_networks: Cache::new((config.cache_entries / 8).clamp(64, 20_000)),
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

    /// No DNS server answers: MX evidence is off until a probe gets an answer.
    pub fn breaker_open(&self) -> bool {
        self.breaker.open.load(Ordering::Relaxed)
    }

    /// Whether DNS answered a query, for the breaker.
    fn note_answer(&self, answered: bool) {
        let b = &self.breaker;
        if answered {
            b.failures.store(0, Ordering::Relaxed);
            if b.open.swap(false, Ordering::Relaxed) {
                log::info!("MX lookups: DNS answers again; MX evidence is back on");
            }
        } else if b.failures.fetch_add(1, Ordering::Relaxed) + 1 >= self.breaker_failures {
            self.trip();
        }
    }

    fn trip(&self) {
        if !self.breaker.open.swap(true, Ordering::Relaxed) {
            self.breaker.trips.fetch_add(1, Ordering::Relaxed);
            log::warn!(
                "MX lookups: no DNS server answers; answering from the table alone (no MX \
                 evidence) and probing in the background until one does"
            );
        }
    }

    /// Asks DNS one question (the root's NS) to learn whether any server answers; opens or
    /// closes the breaker accordingly. Run at start and, while open, by the MX service.
    /// The probe holds a slot like any lookup; with every slot taken, lookups are running and
    /// their outcomes keep the breaker up to date, so there is nothing to probe.
    pub async fn probe(&self) -> bool {
        let Ok(_slot) = self.slots.clone().try_acquire_owned() else {
            return !self.breaker_open();
        };
        // Short: on a machine without DNS the breaker should open before users notice; a
        // server slower than this at start is probed again in the background.
        let wait = self.query_timeout.min(PROBE_TIMEOUT);
        let asked = tokio::time::timeout(wait, self.dns.lookup(".", RecordType::NS)).await;
        let answered = matches!(asked, Ok(Ok(_)) | Ok(Err(NetError::Dns(_))));
        if answered {
            self.note_answer(true);
        } else {
            self.trip();
        }
        answered
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
            breaker_open: self.breaker_open(),
            breaker_trips: self.breaker.trips.load(Ordering::Relaxed),
            breaker_skipped: self.breaker.skipped.load(Ordering::Relaxed),
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

    /// The MX evidence of `name` (canonical, no trailing dot), within the request budget.
    pub async fn evidence(self: &Arc<Self>, name: &str) -> (Arc<MxEvidence>, CacheState) {
        self.evidence_within(name, self.budget).await
    }

    /// The MX evidence of `name`, waiting at most `budget`.
    pub async fn evidence_within(
        self: &Arc<Self>,
        name: &str,
        budget: Duration,
    ) -> (Arc<MxEvidence>, CacheState) {
        if let Some(e) = self.cached(name) {
            self.hits.0.fetch_add(1, Ordering::Relaxed);
            return (e, CacheState::Hit);
        }
        if self.breaker_open() {
            self.breaker.skipped.fetch_add(1, Ordering::Relaxed);
            return (self.unknown.clone(), CacheState::BreakerOpen);
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
                let Ok(slot) = self.slots.clone().try_acquire_owned() else {
                    drop(inflight);
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return (self.unknown.clone(), CacheState::Refused);
                };
                let (tx, rx) = watch::channel(None);
                inflight.insert(name.into(), rx.clone());
                let this = self.clone();
                let owned: Box<str> = name.into();
                tokio::spawn(async move { this.run_lookup(&owned, slot, tx).await });
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
        slot: OwnedSemaphorePermit,
        tx: watch::Sender<Option<Arc<MxEvidence>>>,
    ) {
        let _in_flight = FlightGuard {
            resolver: self,
            name,
        };
        let (evidence, ttl) = self.resolve_and_teach(name).await;
        let evidence = Arc::new(evidence);
        // Stored before the flight ends, so a request never finds neither.
        self.store(name, evidence.clone(), ttl);
        let _ = tx.send(Some(evidence));
        drop(slot);
    }
    /// Resolves `name` within the lookup deadline and teaches the neighbourhood index what was
    /// found (before the answer is cached or sent, so the first request sees it learned).
    async fn resolve_and_teach(&self, name: &str) -> (MxEvidence, Duration) {
        let want_networks = self.neighbourhood.is_some();
        let asked =
            tokio::time::timeout(self.lookup_deadline, self.resolve_full(name, want_networks));
        match asked.await {
            Ok((evidence, ttl, hosts)) => {
                if let (Some(n), MxEvidence::Hosts(_)) = (&self.neighbourhood, &evidence) {
                    n.learn(name, &hosts);
                }
                (evidence, ttl)
            }
            Err(_) => {
                log::debug!("MX lookup of {name} overran its deadline");
                self.note_answer(false);
                (MxEvidence::Unknown, self.failure_ttl)
            }
        }
    }

    /// Resolves `name` for the neighbourhood index in the background (a listed name the table
    /// answered): waits for a slot rather than refusing, fills the cache, teaches the index.
    pub async fn learn(&self, name: &str) {
        if self.breaker_open() || self.neighbourhood.is_none() {
            return;
        }
        let Ok(_slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        let (evidence, ttl) = self.resolve_and_teach(name).await;
        self.store(name, Arc::new(evidence), ttl);
    }

    /// What `mx-snapshot` records of `name`: its MX hosts (most preferred first) with their
    /// networks; an empty list when DNS says it has none; `None` when DNS did not answer.
    pub async fn observe(&self, name: &str) -> Option<Vec<HostNetworks>> {
        let asked = tokio::time::timeout(self.lookup_deadline, self.resolve_full(name, true));
        match asked.await {
            Ok((MxEvidence::Unknown, _, _)) | Err(_) => None,
            Ok((_, _, hosts)) => Some(hosts),
        }
    }

    /// MX evidence of `name` and, when asked, the networks of its first [`MAX_HOSTS`] hosts.
    async fn resolve_full(
        &self,
        name: &str,
        want_networks: bool,
    ) -> (MxEvidence, Duration, Vec<HostNetworks>) {
        let (evidence, ttl) = self.resolve(name).await;
        let hosts = evidence.hosts();
        let networks = if want_networks {
            futures_util::future::join_all(
                hosts
                    .iter()
                    .take(MAX_HOSTS)
                    .map(|h| self.networks_of(&h.host)),
            )
            .await
        } else {
            Vec::new()
        };
        let mut out: Vec<HostNetworks> = hosts
            .iter()
            .take(MAX_HOSTS)
            .map(|h| (h.host.clone(), Vec::new()))
            .collect();
        for (slot, nets) in out.iter_mut().zip(networks) {
            slot.1 = nets;
        }
        (evidence, ttl, out)
    }

    /// The networks (IPv4 /24, IPv6 /48) of `host`'s addresses, cached per host.
    async fn networks_of(&self, host: &str) -> Vec<String> {
        if let Some((nets, expires)) = self.host_networks.get(host) {
            if expires > Instant::now() {
                return nets.to_vec();
            }
        }
        if !host.contains('.') {
            return Vec::new();
        }
        let fqdn = format!("{host}.");
        let (a, aaaa) = tokio::join!(
            self.dns.lookup(fqdn.as_str(), RecordType::A),
            self.dns.lookup(fqdn.as_str(), RecordType::AAAA)
        );
        let mut nets: Vec<String> = Vec::new();
        let mut ttl = self.max_ttl;
        let mut failed = false;
        for answer in [a, aaaa] {
            match answer {
                Ok(l) => {
                    ttl = ttl.min(l.valid_until().saturating_duration_since(Instant::now()));
                    for r in l.answers() {
                        let ip = match &r.data {
                            RData::A(a) => std::net::IpAddr::V4(a.0),
                            RData::AAAA(a) => std::net::IpAddr::V6(a.0),
                            _ => continue,
                        };
                        let net = network(ip);
                        if !nets.contains(&net) && nets.len() < MAX_NETS_PER_HOST {
                            nets.push(net);
                        }
                    }
                }
                Err(e) if is_negative(&e) => {}
                Err(_) => failed = true,
            }
        }
        let ttl = if failed && nets.is_empty() {
            self.failure_ttl
        } else {
            self.clamp(ttl, self.max_ttl)
        };
        self.host_networks
            .insert(host.into(), (nets.clone().into(), Instant::now() + ttl));
        nets
    }

    fn clamp(&self, ttl: Duration, max: Duration) -> Duration {
        ttl.clamp(self.min_ttl, max.max(self.min_ttl))
    }

    /// Asks DNS: MX first, then (no MX) A and AAAA for the implicit MX.
    async fn resolve(&self, name: &str) -> (MxEvidence, Duration) {
        let fqdn = format!("{name}.");
        let answer = self.dns.mx_lookup(fqdn.as_str()).await;
        self.note_answer(matches!(&answer, Ok(_) | Err(NetError::Dns(_))));
        match answer {
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
            Err(e) if e.is_nx_domain() => (
                MxEvidence::NoDomain,
                self.clamp(negative_ttl(&e), self.negative_max_ttl),
            ),
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
        }
    }
}

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
        assert_eq!(r.evidence("a.example").await.1, CacheState::OverBudget);
        assert_eq!(r.evidence("b.example").await.1, CacheState::OverBudget);
        // Both go on in the background, each holding its slot: a third name is refused.
        let (e, state) = r.evidence("c.example").await;
        assert_eq!((state, &*e), (CacheState::Refused, &MxEvidence::Unknown));
        // A name in flight joins its lookup and takes no slot (so is not refused).
        assert_eq!(r.evidence("a.example").await.1, CacheState::OverBudget);
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
        assert_eq!(r.evidence("a.example").await.1, CacheState::Hit);
        assert_eq!(r.evidence("d.example").await.1, CacheState::OverBudget);
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
                let (e, state) = r.evidence("busy.example").await;
                assert_eq!((state, &*e), (CacheState::Hit, &busy), "after {i} names");
            }
        }
        let entries = r.stats().cache_entries;
        assert!((900..=1000).contains(&entries), "{entries}");
        // Recent names are kept, as long as their TTL.
        assert_eq!(r.evidence("n19999.example").await.1, CacheState::Hit);
        r.insert("expired.example", MxEvidence::NullMx, Duration::ZERO);
        assert_eq!(
            r.evidence("expired.example").await,
            (r.unknown.clone(), CacheState::OverBudget)
        );
        assert_eq!(r.stats().cache_misses, 1);
    }
}
