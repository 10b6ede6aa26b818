//! What DNS says of a domain's MX hosts: their addresses (usable or why not) and the networks
//! reverse DNS vouches for, cached per host; a request waits only for the networks that can judge.

use super::*;

/// What DNS said of one MX host: whether it can take mail, and the networks of its addresses
/// that reverse DNS vouches for (asked only for the neighbourhood).
#[derive(Clone)]
pub(super) struct HostFacts {
    state: HostState,
    nets: Arc<[String]>,
    /// Reverse DNS was asked for every network (a cached entry without them does not serve a
    /// lookup that wants them all).
    with_networks: bool,
    /// The networks a request did not ask for (no listed neighbour then), or whose reverse DNS
    /// did not answer: a cached entry serves a request only while none of them has gained one,
    /// and never a lookup that wants them all.
    skipped: Arc<[String]>,
    /// The usable host's addresses, when both its A and AAAA questions were answered: a
    /// lookup wanting more networks asks reverse DNS of these, not the addresses again.
    addresses: Option<Arc<[IpAddr]>>,
}

impl HostFacts {
    /// DNS answered whether this host can take mail: its addresses. Its reverse DNS decides
    /// only its networks' vouching.
    pub(super) fn answered(&self) -> bool {
        self.state != HostState::Unknown
    }

    /// Networks of this host whose reverse DNS was not answered (or, for a request's lookup,
    /// not asked): their vouching is unknown.
    pub(super) fn networks_open(&self) -> bool {
        !self.skipped.is_empty()
    }

    /// A host that is asked nothing: usable with no key (a shared service), or not a host name.
    fn settled(state: HostState) -> HostFacts {
        HostFacts {
            state,
            nets: Arc::from([]),
            with_networks: true,
            skipped: Arc::from([]),
            addresses: None,
        }
    }
}

/// The hosts the neighbourhood is taught (`facts` in `hosts`' order): those that can take mail,
/// with their networks, and those whose addresses DNS did not answer, by name alone. The MX
/// answer settles which hosts a name's mail goes to; a host whose addresses are silent hides
/// neither the others nor itself (taught without it, it would later look like a host the name
/// moved to). One DNS showed unable to take mail teaches nothing: anyone can name one.
pub(super) fn taught_hosts(hosts: &[MxHost], facts: Vec<HostFacts>) -> Vec<HostNetworks> {
    hosts
        .iter()
        .zip(facts)
        .filter_map(|(h, f)| match f.state {
            HostState::Usable => Some((h.host.clone(), f.nets.to_vec())),
            HostState::Unknown => Some((h.host.clone(), Vec::new())),
            HostState::Unusable(_) => None,
        })
        .collect()
}

/// What one resolution found (see [`MxResolver::resolve_full`]).
pub(super) struct Resolved {
    pub evidence: MxEvidence,
    pub ttl: Duration,
    /// The hosts the neighbourhood is taught ([`taught_hosts`]).
    pub hosts: Vec<HostNetworks>,
    /// No server answered the MX query.
    pub unanswered: bool,
    /// Every network was vouched for: nothing left to teach in the background.
    pub complete: bool,
    /// Some network's reverse DNS went unanswered (or was not asked, for a request), or some
    /// host's addresses: its vouching is unknown, and the name is asked again for it. An answer
    /// teaches what it settles: a failure leaves only what it hid unknown, never the hosts
    /// and their parent.
    pub networks_open: bool,
    /// Some host's addresses went unanswered (it is taught by name).
    pub silent_host: bool,
}

/// Which networks of an MX host's addresses a lookup asks reverse DNS to vouch for (a round
/// trip, after the addresses' own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Nets {
    /// None (no neighbourhood).
    None,
    /// Only those where the neighbourhood has listed neighbours: the only ones whose key can
    /// judge now. A request waits for these; the rest are vouched for in the background.
    Listed,
    /// All (learning in the background, `mx-snapshot`).
    All,
}

/// Addresses of one MX host (and PTR names of one address) considered at most.
pub(super) const MAX_ADDRESSES: usize = 4;

impl MxResolver {
    /// MX evidence of `name` and the hosts to teach, with their networks (asked only as `nets`
    /// says). The first [`MAX_HOSTS`] hosts are asked for their addresses: a set-up of no more
    /// hosts than that, none of which can take mail, is [`MxEvidence::UnusableHosts`]; a host
    /// DNS shows unable to take mail teaches the neighbourhood nothing (anyone can name one),
    /// one whose addresses went unanswered is taught by its name ([`taught_hosts`]).
    pub(super) async fn resolve_full(&self, name: &str, nets: Nets) -> Resolved {
        let (evidence, ttl, unanswered, glue) = self.resolve(name).await;
        let hosts = evidence.hosts();
        let facts = futures_util::future::join_all(
            hosts
                .iter()
                .take(MAX_HOSTS)
                .map(|h| self.host_facts_of(&h.host, nets, glue.of_host(&h.host))),
        )
        .await;
        let states: Vec<HostState> = facts.iter().map(|f| f.state).collect();
        let complete = nets != Nets::Listed || facts.iter().all(|f| f.with_networks);
        let silent_host = !facts.iter().all(HostFacts::answered);
        let networks_open = silent_host || facts.iter().any(HostFacts::networks_open);
        let taught = taught_hosts(hosts, facts);
        let resolved = |evidence, hosts, complete| Resolved {
            evidence,
            ttl,
            hosts,
            unanswered,
            complete,
            networks_open,
            silent_host,
        };
        match MxEvidence::unusable(hosts, &states) {
            Some(unusable) => resolved(unusable, Vec::new(), true),
            None => resolved(evidence, taught, complete),
        }
    }

    /// [`host_facts`](Self::host_facts), except for a host of a recognised shared service (the
    /// table's mail providers know them): it exists and gives no key, so nothing is asked; and
    /// a host whose glue (the MX answer's additional section) shows a usable address, taken
    /// from it with no question.
    pub(super) async fn host_facts_of(
        &self,
        host: &str,
        nets: Nets,
        glue: Option<(&[IpAddr], Duration)>,
    ) -> HostFacts {
        if self.is_shared_service(host) {
            return HostFacts::settled(HostState::Usable);
        }
        if let Some((ips, ttl)) = glue {
            if HostState::of_addresses(ips, HostState::Unknown) == HostState::Usable {
                return self.glued_facts(host, ips, ttl, nets).await;
            }
        }
        self.host_facts(host, nets).await
    }

    /// The facts of a host whose glue shows a usable address: its AAAA (or A) not asked, so
    /// the networks are those of the glue and the entry never serves a lookup wanting them all
    /// (the background pass asks the addresses themselves).
    async fn glued_facts(
        &self,
        host: &str,
        ips: &[IpAddr],
        ttl: Duration,
        want: Nets,
    ) -> HostFacts {
        if let Some((facts, expires)) = self.host_facts.get(host) {
            if expires > Instant::now() && self.serves(&facts, want) {
                return facts;
            }
        }
        let (nets, skipped) = self.vouched_networks(host, ips.to_vec(), want).await;
        let facts = HostFacts {
            state: HostState::Usable,
            nets: nets.into(),
            with_networks: false,
            skipped: skipped.into(),
            addresses: None,
        };
        let ttl = self.clamp(ttl, self.max_ttl);
        self.host_facts
            .insert(host.into(), (facts.clone(), Instant::now() + ttl));
        facts
    }

    /// What DNS says of `host`'s addresses (A and AAAA) and, as `want` says, the networks
    /// (IPv4 /24, IPv6 /48) of those that reverse DNS vouches for; cached per host. That a
    /// host does not exist or has no address is believed only from a trusted resolver.
    pub(super) async fn host_facts(&self, host: &str, want: Nets) -> HostFacts {
        let mut known = None;
        if let Some((facts, expires)) = self.host_facts.get(host) {
            if expires > Instant::now() {
                if self.serves(&facts, want) {
                    return facts;
                }
                known = facts.addresses.clone().map(|ips| (ips, expires));
            }
        }
        if let Some((ips, expires)) = known {
            return self.networks_of_known(host, ips, expires, want).await;
        }
        if !host.contains('.') || host.parse::<IpAddr>().is_ok() {
            return HostFacts::settled(HostState::Unusable(HostProblem::NotAHostName));
        }
        let fqdn = format!("{host}.");
        let (a, aaaa) = tokio::join!(
            self.dns.query(fqdn.as_str(), RecordType::A),
            self.dns.query(fqdn.as_str(), RecordType::AAAA)
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
                Err(e) if e.is_negative() => {
                    nx |= e.is_nx_domain();
                    ttl = ttl.min(e.negative_ttl());
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
        let state = match HostState::of_addresses(&ips, empty) {
            // The other family did not answer: it may hold the usable address. Unknown, never
            // unusable from a failure.
            HostState::Unusable(_) if failed => HostState::Unknown,
            state => state,
        };
        let addresses = (state == HostState::Usable && !failed).then(|| Arc::from(ips.clone()));
        let (nets, skipped) = if state == HostState::Usable {
            self.vouched_networks(host, ips, want).await
        } else {
            (Vec::new(), Vec::new())
        };
        let with_networks = want != Nets::None && skipped.is_empty();
        let ttl = if state == HostState::Unknown {
            self.failure_ttl
        } else {
            self.clamp(ttl, self.max_ttl)
        };
        let facts = HostFacts {
            state,
            nets: nets.into(),
            with_networks,
            skipped: skipped.into(),
            addresses,
        };
        self.host_facts
            .insert(host.into(), (facts.clone(), Instant::now() + ttl));
        facts
    }

    /// The facts of a usable host whose addresses are known (and still valid until `expires`):
    /// only the networks `want` asks for are asked.
    async fn networks_of_known(
        &self,
        host: &str,
        ips: Arc<[IpAddr]>,
        expires: Instant,
        want: Nets,
    ) -> HostFacts {
        let (nets, skipped) = self.vouched_networks(host, ips.to_vec(), want).await;
        let facts = HostFacts {
            state: HostState::Usable,
            nets: nets.into(),
            with_networks: want != Nets::None && skipped.is_empty(),
            skipped: skipped.into(),
            addresses: Some(ips),
        };
        self.host_facts
            .insert(host.into(), (facts.clone(), expires));
        facts
    }

    /// Whether cached `facts` serve a lookup that wants `want`: all networks need an entry
    /// that asked for all; a request's, one none of whose skipped networks has gained a listed
    /// neighbour since.
    fn serves(&self, facts: &HostFacts, want: Nets) -> bool {
        match want {
            _ if facts.with_networks => true,
            Nets::None => true,
            Nets::All => false,
            Nets::Listed => !facts.skipped.iter().any(|net| {
                self.neighbourhood
                    .as_ref()
                    .is_some_and(|n| n.network_has_listed(net))
            }),
        }
    }

    /// The networks of `ips` (`host`'s addresses) that reverse DNS vouches for, as `want` asks,
    /// and those not asked for (no listed neighbour: a request's lookup skips them).
    pub(super) async fn vouched_networks(
        &self,
        host: &str,
        ips: Vec<IpAddr>,
        want: Nets,
    ) -> (Vec<String>, Vec<String>) {
        let (mut nets, mut skipped): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
        if want == Nets::None {
            return (nets, skipped);
        }
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
                if !skipped.contains(&net) {
                    skipped.push(net);
                }
                continue;
            }
            // An A record points anywhere its owner likes; the network counts only when the
            // address's owner names this host's domain in its reverse DNS. Unanswered: not
            // known either way, asked again by the next lookup that wants it.
            match self.vouches(ip, host).await {
                Some(true) => nets.push(net),
                Some(false) => {}
                None if !skipped.contains(&net) => skipped.push(net),
                None => {}
            }
        }
        (nets, skipped)
    }

    /// Forward-confirmed reverse DNS for `host`: a PTR name of `ip` is `host` itself, or a
    /// name under `host`'s registrable domain whose own addresses include `ip`. The PTR record
    /// belongs to whoever owns the address, not to whoever points an A record at it. `None`:
    /// not known (a question DNS did not answer, and nothing confirmed).
    pub(super) async fn vouches(&self, ip: IpAddr, host: &str) -> Option<bool> {
        let ptr = match self.dns.reverse(ip).await {
            Ok(ptr) => ptr,
            Err(e) if e.is_negative() => return Some(false),
            Err(_) => return None,
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
            return Some(true);
        }
        let zone = zone_of(host);
        let mut unsure = false;
        for name in names {
            if zone.is_none() || zone_of(&name) != zone {
                continue;
            }
            let kind = if ip.is_ipv4() {
                RecordType::A
            } else {
                RecordType::AAAA
            };
            let forward = match self.dns.query(format!("{name}.").as_str(), kind).await {
                Ok(forward) => forward,
                Err(e) => {
                    unsure |= !e.is_negative();
                    continue;
                }
            };
            let confirmed = forward.answers().iter().any(|r| match &r.data {
                RData::A(a) => IpAddr::V4(a.0) == ip,
                RData::AAAA(a) => IpAddr::V6(a.0) == ip,
                _ => false,
            });
            if confirmed {
                return Some(true);
            }
        }
        (!unsure).then_some(false)
    }
}
