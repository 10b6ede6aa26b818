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
    /// DNS failed or did not answer in time: nothing is known.
    Unknown,
}

impl MxEvidence {
    /// Mail to this domain cannot be delivered.
    pub fn is_undeliverable(&self) -> bool {
        matches!(
            self,
            MxEvidence::NullMx | MxEvidence::NoMailHost | MxEvidence::NoDomain
        )
    }

    pub fn hosts(&self) -> &[MxHost] {
        match self {
            MxEvidence::Hosts(h) => h,
            _ => &[],
        }
    }
}
