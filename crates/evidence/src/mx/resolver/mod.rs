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
//!
//! The parts: this file holds the resolver, its cache and counters; `lookup.rs` a request's
//! lookup and the background ones; `hosts.rs` the MX hosts' addresses and networks; `dns.rs` the
//! MX query and the resolvers' set-up; `canaries.rs` the resolver's trust.

mod canaries;
mod dns;
mod hosts;
mod lookup;

pub use lookup::Observed;

use ahash::RandomState;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use hickory_resolver::proto::rr::{RData, Record, RecordType};
use quick_cache::sync::{Cache, DefaultLifecycle};
use quick_cache::{OptionsBuilder, UnitWeighter};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::mx::config::MxConfig;
use crate::mx::neighbourhood::Neighbourhood;
use crate::mx::shares::{ShareSlot, Shares};
use crate::mx::slow_zones::ZoneTimeouts;
use crate::mx::trust::{self, CanaryAnswer, Trust, TrustState};
use drg_base::infra::breaker::Breaker;
use drg_base::infra::deadlines;
use drg_base::infra::dns::{DnsClient, QueryError};
use drg_domain::mail::{HostProblem, HostState, MxEvidence, MxHost, ProviderKind};
use drg_domain::neighbour_index::{network, HostNetworks, MAX_HOSTS, MAX_NETS_PER_HOST};
use drg_domain::table::DomainTable;
use drg_domain::DomainName;
use drg_telemetry::metrics::MxStats;

use canaries::RECHECK_SPACING;
use dns::{name_servers, system_servers, zone_of};
use hosts::{taught_hosts, HostFacts, Nets, Resolved, MAX_ADDRESSES};

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

#[derive(Clone)]
struct Cached {
    evidence: Arc<MxEvidence>,
    expires: Instant,
}

type Flight = watch::Receiver<Option<Arc<MxEvidence>>>;

/// aHash with per-process random keys, since the names are the client's choice: resistant to
/// collisions built without the keys, ~4 times cheaper than SipHash on a name.
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
    dns: DnsClient,
    /// S3-FIFO eviction (`quick_cache`): storing a name into a full cache costs O(1) amortised,
    /// whatever its size, and a flood of one-off names cannot push out the names asked often.
    /// Expiry is checked on read; an expired entry waits for its refresh or its eviction.
    cache: EvidenceCache,
    inflight: Mutex<HashMap<Box<str>, Flight, RandomState>>,
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
    confirm: Option<DnsClient>,
    /// What DNS says of MX hosts' addresses, and their networks (shared by many domains: a
    /// small cache answers most).
    host_facts: Cache<Box<str>, (HostFacts, Instant)>,
    neighbourhood: Option<Arc<Neighbourhood>>,
    /// The domain table, whose mail providers name the hosts of shared services: such a host
    /// exists, so its addresses are not asked (with the neighbourhood on or off).
    table: Option<Arc<ArcSwap<DomainTable>>>,
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

impl MxResolver {
    pub fn new(config: &MxConfig) -> Result<Self, MxSetupError> {
        let servers = if config.servers.is_empty() {
            match system_servers() {
                Ok(servers) => servers,
                // An offline or minimal machine: start with evidence off, not refuse to start.
                Err(e) => {
                    log::warn!("MX lookups: no system DNS configuration ({e}); MX evidence is off");
                    Vec::new()
                }
            }
        } else {
            name_servers(&config.servers)?
        };
        let no_system_servers = servers.is_empty();
        let dns = DnsClient::new(servers, config.query_timeout);
        let confirm = if config.confirm_servers.is_empty() {
            None
        } else {
            Some(DnsClient::new(
                name_servers(&config.confirm_servers)?,
                config.query_timeout,
            ))
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
            inflight: Mutex::new(HashMap::default()),
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
            table: None,
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

    /// Knows the hosts of recognised shared services (Google, Microsoft, the forwarders) by
    /// `table`'s mail providers, as reloads change them: their addresses are never asked.
    pub fn with_providers(mut self, table: Arc<ArcSwap<DomainTable>>) -> Self {
        self.table = Some(table);
        self
    }

    /// Whether `host` is run by a recognised mailbox provider, security gateway, forwarder or
    /// consumer service: such a host exists and gives no neighbourhood key
    /// ([`drg_domain::neighbour_index::keys_of`]), so its addresses and networks need not be
    /// asked. Without the table (a resolver made alone), every host is asked.
    fn is_shared_service(&self, host: &str) -> bool {
        self.table.as_ref().is_some_and(|t| {
            t.load()
                .providers()
                .kind_of(host)
                .is_some_and(|k| k != ProviderKind::Disposable)
        })
    }

    /// The neighbourhood index, when it is on.
    pub fn neighbourhood(&self) -> Option<&Arc<Neighbourhood>> {
        self.neighbourhood.as_ref()
    }

    /// The cached evidence of `name`, if live: no query, no counter (verdict changes judge
    /// watched names from what the cache holds).
    pub fn peek(&self, name: &str) -> Option<Arc<MxEvidence>> {
        self.cached(name)
    }

    fn cached(&self, name: &str) -> Option<Arc<MxEvidence>> {
        self.cache
            .get(name)
            .filter(|c| c.expires > Instant::now())
            .map(|c| c.evidence)
    }

    /// How long the cached answer of `name` has left, if it has one.
    fn cache_left(&self, name: &str) -> Option<Duration> {
        self.cache
            .get(name)
            .map(|c| c.expires.saturating_duration_since(Instant::now()))
            .filter(|left| !left.is_zero())
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
