//! A request's lookup: the budget, the cache, single-flight and the slots (fair shares, slow
//! zones); and the background lookups that teach the MX neighbourhood.

use super::*;

/// Takes a finished (or abandoned) lookup out of the in-flight map, also if it panicked, so the
/// name is not left looking busy forever.
pub(super) struct FlightGuard<'r> {
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

/// A zone that timed out is left alone at least this long.
pub(super) const SLOW_ZONE_MIN: Duration = Duration::from_secs(1);

impl MxResolver {
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
        let waited = deadlines::timeout(budget, rx.wait_for(Option::is_some)).await;
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
    pub(super) async fn run_lookup(
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
    pub(super) async fn resolve_and_teach(
        &self,
        name: &str,
        background: bool,
    ) -> (MxEvidence, Duration, bool, bool) {
        let nets = match (&self.neighbourhood, background) {
            (None, _) => Nets::None,
            (Some(_), true) => Nets::All,
            (Some(_), false) => Nets::Listed,
        };
        let full = self.resolve_full(name, nets);
        match deadlines::timeout(self.lookup_deadline, full).await {
            Ok(r) if r.evidence.is_undeliverable() && !self.believes_negatives().await => {
                (MxEvidence::Unknown, self.failure_ttl, false, false)
            }
            Ok(Resolved {
                evidence: MxEvidence::Unknown,
                ttl,
                unanswered,
                ..
            }) => (MxEvidence::Unknown, ttl, unanswered, false),
            Ok(Resolved {
                evidence,
                ttl,
                hosts,
                complete,
                ..
            }) => {
                // A set-up whose hosts cannot take mail is remembered with no key: it teaches
                // nothing, and is not resolved again and again to learn that.
                let taught = matches!(
                    evidence,
                    MxEvidence::Hosts(_) | MxEvidence::UnusableHosts(_)
                );
                if let (Some(n), true) = (&self.neighbourhood, taught) {
                    // An answer without all its networks teaches a domain the index does not
                    // know yet; one it knows keeps its full keys until the background pass. A
                    // host whose addresses timed out is taught by name (`taught_hosts`): left
                    // out, it would later be a host the name "moved" to.
                    if complete || !n.knows_name(name) {
                        n.learn(name, &hosts);
                    }
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

    /// Resolves `name` for the neighbourhood index in the background (a listed name the table
    /// answered, or a name a request was answered for without all its networks): waits for a
    /// slot rather than refusing, fills the cache, teaches the index. A name with a cached
    /// answer is not asked again (one MX query per TTL): of one with MX hosts, only their
    /// networks are; DNS's word that it has none (NXDOMAIN, no MX) has nothing more to teach.
    ///
    /// Returns how long to leave `name` alone: for DNS's answer that it has no MX hosts
    /// (NXDOMAIN, no MX, a null MX), its time left in the cache, at most `failure_ttl`;
    /// `failure_ttl` while the resolver's answers are not believed. A name with hosts, or whose
    /// lookup failed, is asked again at its next lookup, as before: networks whose reverse DNS
    /// did not answer this time may the next, and so may DNS (holding those too, the detection
    /// benchmark's first answers caught fewer throwaways).
    pub async fn learn(&self, name: &str) -> Option<Duration> {
        let nb = self.neighbourhood.as_ref()?;
        if self.evidence_off() {
            // Nothing is believed now: asked again once the resolver may be trusted again.
            return Some(self.failure_ttl);
        }
        let _slot = self.slots.clone().acquire_owned().await.ok()?;
        let settled_empty = match self.cached(name) {
            Some(cached) if !cached.hosts().is_empty() => {
                self.teach_networks(name, cached.hosts()).await;
                false
            }
            Some(cached) if settles_without_hosts(&cached) => true,
            _ => {
                let (evidence, ttl, ..) = self.resolve_and_teach(name, true).await;
                let settled_empty = settles_without_hosts(&evidence);
                self.store(name, Arc::new(evidence), ttl);
                settled_empty
            }
        };
        if !settled_empty || nb.knows_name(name) {
            return None;
        }
        self.cache_left(name).map(|left| left.min(self.failure_ttl))
    }

    /// Vouches for every network of `hosts` (the MX hosts of `name`, cached) and teaches them.
    pub(super) async fn teach_networks(&self, name: &str, hosts: &[MxHost]) {
        let Some(n) = &self.neighbourhood else { return };
        let facts = futures_util::future::join_all(
            hosts
                .iter()
                .take(MAX_HOSTS)
                .map(|h| self.host_facts_of(&h.host, Nets::All, None)),
        )
        .await;
        // Networks whose reverse DNS did not answer are left out, hosts whose addresses did
        // not are taught by name (`taught_hosts`).
        let taught = taught_hosts(hosts, facts);
        if !taught.is_empty() {
            n.learn(name, &taught);
        }
    }

    /// What `mx-snapshot` and the look record of `name` (see [`Observed`]): its MX hosts (most preferred first)
    /// with the networks reverse DNS vouched for; an empty list when DNS says it has none;
    /// `None` when DNS did not answer the MX question. The MX answer settles where the name's
    /// mail goes: a host whose addresses did not answer is there by name, and reverse DNS that
    /// did not answer leaves those networks out (`Observed::networks_open`: ask again).
    pub async fn observe(&self, name: &str) -> Option<Observed> {
        let full = self.resolve_full(name, Nets::All);
        match deadlines::timeout(self.lookup_deadline, full).await {
            Ok(Resolved {
                evidence: MxEvidence::Unknown,
                ..
            })
            | Err(_) => None,
            Ok(r) => Some(Observed {
                hosts: r.hosts,
                networks_open: r.networks_open,
                silent_host: r.silent_host,
            }),
        }
    }
}

/// DNS answered that `evidence`'s name has no MX host to learn from (not a failure, which may
/// answer otherwise at the next try).
fn settles_without_hosts(evidence: &MxEvidence) -> bool {
    evidence.hosts().is_empty() && !matches!(evidence, MxEvidence::Unknown)
}

/// What a look saw of a listed name (see [`MxResolver::observe`]).
#[derive(Debug, Clone)]
pub struct Observed {
    /// Its MX hosts that can take mail, most preferred first, with the networks reverse DNS
    /// vouched for, and those whose addresses went unanswered, by name.
    pub hosts: Vec<HostNetworks>,
    /// Some network's reverse DNS or some host's addresses went unanswered: what they hid is
    /// unknown, the name is asked again for it (its hosts and parent are taught meanwhile).
    pub networks_open: bool,
    /// Some host's addresses went unanswered (a lookup that waited out DNS's timeout: the
    /// look's pace does not take it for the resolver's speed).
    pub silent_host: bool,
}
