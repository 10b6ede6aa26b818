//! What a domain's mail set-up is: its MX hosts, or why it has none (pure data; DNS is in `mx`).

use serde::Serialize;

/// What sort of service runs a domain's mail; it decides `is_corporate_email` and disposable
/// evidence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// Business mailbox hosting (Google Workspace, Microsoft 365, Zoho, ...).
    Mailbox,
    /// A filtering gateway in front of an organisation's mail (Mimecast, Proofpoint, ...).
    SecurityGateway,
    /// Consumer webmail (Gmail, Outlook.com, Yahoo, ...).
    Consumer,
    /// Forwarding services, used by legitimate and throwaway domains alike.
    Forwarder,
    /// Hosts dedicated to disposable mail (Mailinator, Yopmail, ...).
    Disposable,
}

impl ProviderKind {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "mailbox" => ProviderKind::Mailbox,
            "security_gateway" => ProviderKind::SecurityGateway,
            "consumer" => ProviderKind::Consumer,
            "forwarder" => ProviderKind::Forwarder,
            "disposable" => ProviderKind::Disposable,
            _ => return None,
        })
    }
}

/// One MX record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MxHost {
    pub preference: u16,
    /// Lowercase, no trailing dot.
    pub host: Box<str>,
}

impl MxHost {
    /// The host is a name mail can be sent to: at least two labels and not an IP address
    /// (RFC 5321 wants a host name in MX; `localhost` or a literal there is a bogus set-up).
    pub fn is_mail_host_name(&self) -> bool {
        self.host.contains('.')
            && !self.host.contains(':')
            && self.host.parse::<std::net::Ipv4Addr>().is_err()
    }
}

/// Why an MX host cannot take mail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostProblem {
    /// NXDOMAIN: no such host.
    NoSuchHost,
    /// The host exists and has no A or AAAA record.
    NoAddress,
    /// A single label (`localhost`) or an IP literal, where RFC 5321 wants a host name.
    NotAHostName,
    /// 127.0.0.0/8, ::1.
    Loopback,
    /// RFC 1918 (10/8, 172.16/12, 192.168/16), unique-local fc00::/7.
    Private,
    /// 100.64.0.0/10 (carrier-grade NAT).
    Shared,
    /// 169.254.0.0/16, fe80::/10.
    LinkLocal,
    /// 0.0.0.0/8, ::.
    Unspecified,
    /// 224.0.0.0/4, ff00::/8.
    Multicast,
    /// 240.0.0.0/4 and 255.255.255.255.
    Reserved,
}

impl HostProblem {
    /// What is wrong with `ip` as the address of a mail host on the internet, if anything.
    /// Documentation and benchmarking ranges (192.0.2/24, 198.18/15, ...) are not refused:
    /// they never appear in public DNS, and test worlds live in them.
    pub fn of_address(ip: std::net::IpAddr) -> Option<HostProblem> {
        use std::net::IpAddr;
        match ip {
            IpAddr::V4(v4) => {
                let o = v4.octets();
                Some(match o {
                    [0, ..] => HostProblem::Unspecified,
                    [127, ..] => HostProblem::Loopback,
                    [10, ..] | [192, 168, ..] => HostProblem::Private,
                    [172, b, ..] if (16..32).contains(&b) => HostProblem::Private,
                    [100, b, ..] if (64..128).contains(&b) => HostProblem::Shared,
                    [169, 254, ..] => HostProblem::LinkLocal,
                    [a, ..] if (224..240).contains(&a) => HostProblem::Multicast,
                    [a, ..] if a >= 240 => HostProblem::Reserved,
                    _ => return None,
                })
            }
            IpAddr::V6(v6) => {
                if let Some(v4) = v6.to_ipv4_mapped() {
                    return HostProblem::of_address(IpAddr::V4(v4));
                }
                let first = v6.segments()[0];
                Some(if v6.is_unspecified() {
                    HostProblem::Unspecified
                } else if v6.is_loopback() {
                    HostProblem::Loopback
                } else if first & 0xfe00 == 0xfc00 {
                    HostProblem::Private
                } else if first & 0xffc0 == 0xfe80 {
                    HostProblem::LinkLocal
                } else if first & 0xff00 == 0xff00 {
                    HostProblem::Multicast
                } else {
                    return None;
                })
            }
        }
    }
}

/// What DNS said of one MX host's addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostState {
    /// At least one address mail can be sent to.
    Usable,
    /// It cannot take mail, and why (the first problem found).
    Unusable(HostProblem),
    /// DNS failed or was not believed: nothing known.
    Unknown,
}

impl HostState {
    /// The state of a host with these addresses (none: `empty`, what DNS said instead).
    pub fn of_addresses(ips: &[std::net::IpAddr], empty: HostState) -> HostState {
        let mut problem = None;
        for ip in ips {
            match HostProblem::of_address(*ip) {
                None => return HostState::Usable,
                Some(p) => problem = problem.or(Some(p)),
            }
        }
        problem.map_or(empty, HostState::Unusable)
    }
}

/// An MX host that cannot take mail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnusableHost {
    pub preference: u16,
    pub host: Box<str>,
    pub problem: HostProblem,
}

/// What DNS says about a domain's mail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "hosts", rename_all = "snake_case")]
pub enum MxEvidence {
    /// MX records naming mail hosts.
    Hosts(Vec<MxHost>),
    /// A null MX (RFC 7505: a single MX `.`): the domain accepts no mail.
    NullMx,
    /// No MX, but an address record: mail goes to that address (RFC 5321 implicit MX).
    AddressOnly,
    /// No MX and no address record: nowhere to deliver.
    NoMailHost,
    /// NXDOMAIN: the domain does not exist.
    NoDomain,
    /// MX records whose every host cannot take mail: it does not exist, has no address, is not
    /// a host name, or its only addresses are loopback, private, shared, link-local,
    /// multicast, reserved or unspecified ones (each host with what is wrong with it).
    UnusableHosts(Vec<UnusableHost>),
    /// DNS failed or did not answer in time: nothing is known.
    Unknown,
}

impl MxEvidence {
    /// Mail to this domain cannot be delivered.
    pub fn is_undeliverable(&self) -> bool {
        matches!(
            self,
            MxEvidence::NullMx
                | MxEvidence::NoMailHost
                | MxEvidence::NoDomain
                | MxEvidence::UnusableHosts(_)
        )
    }

    /// The MX hosts' problems, when none of them can take mail (`hosts` most preferred first,
    /// each with what DNS said of its addresses); `None` when one can, or cannot be told.
    pub fn unusable(hosts: &[MxHost], states: &[HostState]) -> Option<MxEvidence> {
        if hosts.is_empty() || hosts.len() != states.len() {
            return None;
        }
        let problems: Option<Vec<UnusableHost>> = hosts
            .iter()
            .zip(states)
            .map(|(h, state)| match state {
                HostState::Unusable(problem) => Some(UnusableHost {
                    preference: h.preference,
                    host: h.host.clone(),
                    problem: *problem,
                }),
                HostState::Usable | HostState::Unknown => None,
            })
            .collect();
        problems.map(MxEvidence::UnusableHosts)
    }

    pub fn hosts(&self) -> &[MxHost] {
        match self {
            MxEvidence::Hosts(h) => h,
            _ => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    fn problem(ip: &str) -> Option<HostProblem> {
        HostProblem::of_address(ip.parse::<IpAddr>().unwrap())
    }

    #[test]
    fn addresses_mail_cannot_reach_are_named_and_public_ones_pass() {
        for (ip, want) in [
            ("127.0.0.1", HostProblem::Loopback),
            ("10.1.2.3", HostProblem::Private),
            ("172.20.0.1", HostProblem::Private),
            ("192.168.0.1", HostProblem::Private),
            ("100.64.0.1", HostProblem::Shared),
            ("169.254.9.9", HostProblem::LinkLocal),
            ("0.0.0.0", HostProblem::Unspecified),
            ("224.0.0.1", HostProblem::Multicast),
            ("240.0.0.1", HostProblem::Reserved),
            ("255.255.255.255", HostProblem::Reserved),
            ("::1", HostProblem::Loopback),
            ("::", HostProblem::Unspecified),
            ("fd00::1", HostProblem::Private),
            ("fe80::1", HostProblem::LinkLocal),
            ("::ffff:10.0.0.1", HostProblem::Private),
        ] {
            assert_eq!(problem(ip), Some(want), "{ip}");
        }
        for ip in [
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "192.0.2.10",
            "2001:db8::1",
            "2a00:1450::1",
        ] {
            assert_eq!(problem(ip), None, "{ip}");
        }
    }

    #[test]
    fn a_set_up_is_unusable_only_when_every_host_is() {
        let hosts = vec![
            MxHost {
                preference: 10,
                host: "a.example".into(),
            },
            MxHost {
                preference: 20,
                host: "b.example".into(),
            },
        ];
        let lo = HostState::Unusable(HostProblem::Loopback);
        let gone = HostState::Unusable(HostProblem::NoSuchHost);
        assert!(matches!(
            MxEvidence::unusable(&hosts, &[lo, gone]),
            Some(MxEvidence::UnusableHosts(h)) if h.len() == 2 && h[1].problem == HostProblem::NoSuchHost
        ));
        assert_eq!(MxEvidence::unusable(&hosts, &[lo, HostState::Usable]), None);
        assert_eq!(
            MxEvidence::unusable(&hosts, &[lo, HostState::Unknown]),
            None
        );
        // Hosts not all checked: nothing is said.
        assert_eq!(MxEvidence::unusable(&hosts, &[lo]), None);
        let ips: Vec<IpAddr> = vec![
            "127.0.0.1".parse().unwrap(),
            "93.184.216.34".parse().unwrap(),
        ];
        assert_eq!(
            HostState::of_addresses(&ips, HostState::Unknown),
            HostState::Usable
        );
        assert_eq!(HostState::of_addresses(&ips[..1], HostState::Unknown), lo);
    }
}
