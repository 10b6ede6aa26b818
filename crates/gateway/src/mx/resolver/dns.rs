//! The DNS client's side: the MX query and its reading (null MX, NXDOMAIN confirmed by a second
//! resolver, a TLD shown to exist), the resolvers' set-up and TTL clamping.

use super::*;

/// The resolver configuration of `servers` (`ip:port` each).
pub(super) fn name_servers(servers: &[String]) -> Result<ResolverConfig, MxSetupError> {
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
pub(super) fn set_options(opts: &mut ResolverOpts, config: &MxConfig) {
    opts.timeout = config.query_timeout;
    opts.attempts = 1;
    opts.ndots = 0;
    // Our cache is the one that counts: it holds the classified evidence, not raw records.
    opts.cache_size = 0;
}

/// The registrable domain a name's lookups are slow under (a silent zone's names share it).
pub(super) fn zone_of(name: &str) -> Option<Box<str>> {
    DomainName::parse(name)
        .ok()
        .and_then(|n| n.registrable().map(Box::from))
}

pub(super) fn is_negative(e: &NetError) -> bool {
    e.is_nx_domain() || e.is_no_records_found()
}

/// The negative-caching TTL the server gave (SOA minimum), or zero (then clamped to the minimum).
pub(super) fn negative_ttl(e: &NetError) -> Duration {
    match e {
        NetError::Dns(DnsError::NoRecordsFound(nr)) => {
            Duration::from_secs(u64::from(nr.negative_ttl.unwrap_or(0)))
        }
        _ => Duration::ZERO,
    }
}

impl MxResolver {
    pub(super) fn clamp(&self, ttl: Duration, max: Duration) -> Duration {
        ttl.clamp(self.min_ttl, max.max(self.min_ttl))
    }

    /// Asks DNS: MX first, then (no MX) A and AAAA for the implicit MX. What each outcome
    /// means for one name: MX hosts are evidence; NXDOMAIN is evidence only under a TLD this
    /// resolver shows to exist; NODATA for MX, A and AAAA alike is "no mail host"; SERVFAIL,
    /// REFUSED, a timeout or anything else is nothing known (cached for `failure_ttl`). The
    /// flag says no server answered the MX query.
    pub(super) async fn resolve(&self, name: &str) -> (MxEvidence, Duration, bool) {
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
    pub(super) async fn no_domain(
        &self,
        name: &str,
        fqdn: &str,
        e: &NetError,
    ) -> (MxEvidence, Duration) {
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
    pub(super) async fn confirmed_absent(&self, fqdn: &str, rtype: RecordType) -> bool {
        let Some(confirm) = &self.confirm else {
            return true;
        };
        matches!(confirm.lookup(fqdn, rtype).await, Err(e) if e.is_nx_domain())
    }

    /// Whether the TLD of `name` exists as this resolver shows it: its SOA record comes back.
    /// Cached per TLD (a day when it does, `failure_ttl` when it does not).
    pub(super) async fn tld_exists(&self, name: &str) -> bool {
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
