//! DNS lookups of MX evidence: a time budget per request, a bounded TTL-aware cache with
//! negative caching (RFC 2308), and single-flight so concurrent lookups of a name share one query.
//!
//! The budget bounds how long a request waits, not the DNS work: a lookup that overruns keeps
//! going in the background and fills the cache for the next request.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;
use tokio::sync::watch;

use crate::config::MxConfig;
use crate::domain::mail::{MxEvidence, MxHost};

const SHARDS: usize = 16;

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
}

struct Cached {
    evidence: Arc<MxEvidence>,
    expires: Instant,
}

type Flight = watch::Receiver<Option<Arc<MxEvidence>>>;

/// Resolver plus cache. Cheap to share (`Arc`).
pub struct MxResolver {
    dns: TokioResolver,
    shards: Vec<Mutex<HashMap<Box<str>, Cached>>>,
    hasher: RandomState,
    inflight: Mutex<HashMap<Box<str>, Flight>>,
    budget: Duration,
    per_shard: usize,
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
        let provider = TokioRuntimeProvider::default();
        let mut builder = if config.servers.is_empty() {
            TokioResolver::builder(provider).map_err(|e| MxSetupError::System(e.to_string()))?
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
        opts.timeout = config.query_timeout();
        opts.attempts = 1;
        opts.ndots = 0;
        // Our cache is the one that counts: it holds the classified evidence, not raw records.
        opts.cache_size = 0;
        let dns = builder
            .build()
            .map_err(|e| MxSetupError::System(e.to_string()))?;
        Ok(MxResolver {
            dns,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            inflight: Mutex::new(HashMap::new()),
            budget: config.budget(),
            per_shard: config.cache_entries.div_ceil(SHARDS).max(1),
            min_ttl: Duration::from_secs(config.min_ttl_seconds),
            max_ttl: Duration::from_secs(config.max_ttl_seconds),
            negative_max_ttl: Duration::from_secs(config.negative_max_ttl_seconds),
            failure_ttl: Duration::from_secs(config.failure_ttl_seconds),
        })
    }

    fn shard(&self, name: &str) -> &Mutex<HashMap<Box<str>, Cached>> {
        &self.shards[self.hasher.hash_one(name) as usize % SHARDS]
    }

    fn cached(&self, name: &str) -> Option<Arc<MxEvidence>> {
        let shard = self.shard(name).lock().unwrap_or_else(|p| p.into_inner());
        shard
            .get(name)
            .filter(|c| c.expires > Instant::now())
            .map(|c| c.evidence.clone())
    }

    fn store(&self, name: &str, evidence: Arc<MxEvidence>, ttl: Duration) {
        let now = Instant::now();
        let mut shard = self.shard(name).lock().unwrap_or_else(|p| p.into_inner());
        if shard.len() >= self.per_shard && !shard.contains_key(name) {
            shard.retain(|_, c| c.expires > now);
            if shard.len() >= self.per_shard {
                // Still full of live entries: drop the one closest to expiry.
                if let Some(victim) = shard
                    .iter()
                    .min_by_key(|(_, c)| c.expires)
                    .map(|(k, _)| k.clone())
                {
                    shard.remove(&victim);
                }
            }
        }
        shard.insert(
            name.into(),
            Cached {
                evidence,
                expires: now + ttl,
            },
        );
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
            return (e, CacheState::Hit);
        }
        let (mut rx, state) = {
            let mut inflight = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            match inflight.get(name) {
                Some(rx) => (rx.clone(), CacheState::Coalesced),
                None => {
                    let (tx, rx) = watch::channel(None);
                    inflight.insert(name.into(), rx.clone());
                    let this = self.clone();
                    let owned: Box<str> = name.into();
                    tokio::spawn(async move {
                        let (evidence, ttl) = this.resolve(&owned).await;
                        let evidence = Arc::new(evidence);
                        this.store(&owned, evidence.clone(), ttl);
                        this.inflight
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .remove(&owned);
                        let _ = tx.send(Some(evidence));
                    });
                    (rx, CacheState::Miss)
                }
            }
        };
        let waited = tokio::time::timeout(budget, rx.wait_for(Option::is_some)).await;
        match waited {
            Ok(Ok(v)) => match v.as_ref() {
                Some(e) => (e.clone(), state),
                None => (Arc::new(MxEvidence::Unknown), CacheState::OverBudget),
            },
            _ => (Arc::new(MxEvidence::Unknown), CacheState::OverBudget),
        }
    }

    fn clamp(&self, ttl: Duration, max: Duration) -> Duration {
        ttl.clamp(self.min_ttl, max.max(self.min_ttl))
    }

    /// Asks DNS: MX first, then (no MX) A and AAAA for the implicit MX.
    async fn resolve(&self, name: &str) -> (MxEvidence, Duration) {
        let fqdn = format!("{name}.");
        match self.dns.mx_lookup(fqdn.as_str()).await {
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
