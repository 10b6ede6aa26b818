//! The DNS client's side: the MX query and its reading (null MX, NXDOMAIN confirmed by a second
//! resolver, a TLD shown to exist), the resolvers' set-up and TTL clamping.

use super::*;

/// The addresses of `servers` (`ip:port` each).
pub(super) fn name_servers(servers: &[String]) -> Result<Vec<SocketAddr>, MxSetupError> {
    servers
        .iter()
        .map(|s| s.parse().map_err(|_| MxSetupError::BadServer(s.clone())))
        .collect()
}

/// The system's resolvers (`/etc/resolv.conf`), read with hickory's parser.
pub(super) fn system_servers() -> Result<Vec<SocketAddr>, String> {
    let (config, _) =
        hickory_resolver::system_conf::read_system_conf().map_err(|e| e.to_string())?;
    let mut out: Vec<SocketAddr> = Vec::new();
    for ns in config.name_servers() {
        let port = ns.connections.first().map_or(53, |c| c.port);
        let addr = SocketAddr::new(ns.ip, port);
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    if out.is_empty() {
        return Err("no nameserver".into());
    }
    Ok(out)
}

/// The registrable domain a name's lookups are slow under (a silent zone's names share it).
pub(super) fn zone_of(name: &str) -> Option<Box<str>> {
    DomainName::parse(name)
        .ok()
        .and_then(|n| n.registrable().map(Box::from))
}

/// Addresses of a domain's own MX hosts that the MX answer carried in its additional section
/// (RFC 1035 3.3.9: a server adds the exchange's A records when it has them), so a request need
/// not wait a second round trip for them. Kept only for a host under the queried name's own
/// registrable domain: whoever answers for that domain answers for the host anyway, so the
/// glue says nothing its owner could not say with an A record; of any other host, what a
/// server adds is not believed. Glue only ever shows a host usable: a host whose glue shows
/// no usable address is asked (A and AAAA) as before, so "cannot take mail" still rests on the
/// answers to its own questions.
#[derive(Default)]
pub(super) struct Glue(Vec<(Box<str>, Vec<IpAddr>, Duration)>);

impl Glue {
    /// The glue of `hosts` (the MX hosts of `name`) in `additionals`.
    fn of(name: &str, hosts: &[MxHost], additionals: &[Record]) -> Glue {
        let zone = zone_of(name);
        let mut out: Vec<(Box<str>, Vec<IpAddr>, Duration)> = Vec::new();
        if zone.is_none() || additionals.is_empty() {
            return Glue(out);
        }
        for record in additionals {
            let ip = match &record.data {
                RData::A(a) => IpAddr::V4(a.0),
                RData::AAAA(a) => IpAddr::V6(a.0),
                _ => continue,
            };
            let owner = record.name.to_ascii();
            let owner = owner.trim_end_matches('.');
            let Some(host) = hosts
                .iter()
                .take(MAX_HOSTS)
                .find(|h| h.host.eq_ignore_ascii_case(owner))
            else {
                continue;
            };
            if zone_of(&host.host) != zone {
                continue;
            }
            let ttl = Duration::from_secs(u64::from(record.ttl));
            match out.iter_mut().find(|(h, ..)| *h == host.host) {
                Some((_, ips, t)) if ips.len() < MAX_ADDRESSES => {
                    ips.push(ip);
                    *t = (*t).min(ttl);
                }
                Some(_) => {}
                None => out.push((host.host.clone(), vec![ip], ttl)),
            }
        }
        Glue(out)
    }

    /// The glued addresses of `host`, with their TTL.
    pub(super) fn of_host(&self, host: &str) -> Option<(&[IpAddr], Duration)> {
        self.0
            .iter()
            .find(|(h, ..)| &**h == host)
            .map(|(_, ips, ttl)| (ips.as_slice(), *ttl))
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
    /// flag says no server answered the MX query; the glue is what the answer's additional
    /// section gave of the name's own hosts (see [`Glue`]).
    pub(super) async fn resolve(&self, name: &str) -> (MxEvidence, Duration, bool, Glue) {
        let fqdn = format!("{name}.");
        let answer = self.dns.query(fqdn.as_str(), RecordType::MX).await;
        let answered = answer.as_ref().map_or_else(QueryError::answered, |_| true);
        self.note_answer(answered);
        let mut glue = Glue::default();
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
                glue = Glue::of(name, &hosts, lookup.additionals());
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
            Err(e) if e.is_negative() => {
                let neg = e.negative_ttl();
                let (a, aaaa) = tokio::join!(
                    self.dns.query(fqdn.as_str(), RecordType::A),
                    self.dns.query(fqdn.as_str(), RecordType::AAAA)
                );
                match (a, aaaa) {
                    (Ok(l), _) | (_, Ok(l)) => {
                        let ttl = l.valid_until().saturating_duration_since(Instant::now());
                        (
                            MxEvidence::AddressOnly,
                            self.clamp(ttl.min(neg), self.max_ttl),
                        )
                    }
                    (Err(a), Err(b)) if a.is_negative() && b.is_negative() => (
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
        (evidence, ttl, !answered, glue)
    }

    /// What an NXDOMAIN for `name` is worth: `NoDomain` only when the second resolver (if any)
    /// confirms it and the resolver shows the name's TLD to exist; else nothing known.
    pub(super) async fn no_domain(
        &self,
        name: &str,
        fqdn: &str,
        e: &QueryError,
    ) -> (MxEvidence, Duration) {
        if !self.confirmed_absent(fqdn, RecordType::MX).await {
            log::debug!("MX lookup of {name}: NXDOMAIN not confirmed by the second resolver");
            (MxEvidence::Unknown, self.failure_ttl)
        } else if self.tld_exists(name).await {
            (
                MxEvidence::NoDomain,
                self.clamp(e.negative_ttl(), self.negative_max_ttl),
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
        matches!(confirm.query(fqdn, rtype).await, Err(e) if e.is_nx_domain())
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
            self.dns.query(fqdn.as_str(), RecordType::SOA).await,
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

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_resolver::proto::rr::rdata::{A, AAAA};
    use hickory_resolver::proto::rr::Name;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn host(h: &str) -> MxHost {
        MxHost {
            preference: 10,
            host: h.into(),
        }
    }

    fn a(owner: &str, ip: [u8; 4], ttl: u32) -> Record {
        let ip = Ipv4Addr::from(ip);
        Record::from_rdata(Name::from_ascii(owner).unwrap(), ttl, RData::A(A(ip)))
    }

    #[test]
    fn glue_is_kept_for_the_names_own_hosts_only() {
        let hosts = [host("mail.acme.test"), host("mx.thirdparty.test")];
        let v6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
        let additionals = [
            a("MAIL.acme.test.", [192, 0, 2, 10], 300),
            Record::from_rdata(
                Name::from_ascii("mail.acme.test.").unwrap(),
                60,
                RData::AAAA(AAAA(v6)),
            ),
            // Another domain's host: what the answer says of it is not believed.
            a("mx.thirdparty.test.", [127, 0, 0, 1], 300),
            // A name that is no MX host of the answer.
            a("www.acme.test.", [192, 0, 2, 11], 300),
        ];
        let glue = Glue::of("sub.acme.test", &hosts, &additionals);
        let (ips, ttl) = glue.of_host("mail.acme.test").unwrap();
        assert_eq!(
            ips,
            [IpAddr::V4(Ipv4Addr::new(192, 0, 2, 10)), IpAddr::V6(v6)]
        );
        assert_eq!(ttl, Duration::from_secs(60));
        assert!(glue.of_host("mx.thirdparty.test").is_none());
        assert!(glue.of_host("www.acme.test").is_none());
        // At most MAX_ADDRESSES addresses a host.
        let many: Vec<Record> = (0..10)
            .map(|i| a("mail.acme.test.", [192, 0, 2, i], 300))
            .collect();
        let glue = Glue::of("acme.test", &hosts, &many);
        assert_eq!(
            glue.of_host("mail.acme.test").unwrap().0.len(),
            MAX_ADDRESSES
        );
        // A name with no registrable domain keeps nothing.
        assert!(Glue::of("test", &hosts, &additionals)
            .of_host("mail.acme.test")
            .is_none());
    }
}
