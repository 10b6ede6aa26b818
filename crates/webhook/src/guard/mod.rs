//! Where a webhook may go: the guard that keeps signed POSTs off loopback, private networks,
//! cloud metadata services and the gateway's own listeners, judged on IP addresses (pure: the
//! caller resolves names and says which addresses are this host's).
//!
//! The same [`Policy`] judges the URL's host when the configuration is checked (an address in any
//! spelling; a name passes, it is not resolved then) and every address the name resolves to when
//! a message is sent (`resolve.rs`), so a DNS answer cannot route around the first check.

pub mod host;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub use host::Host;

/// A range that is no receiver's on the public internet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// 127/8, ::1.
    Loopback,
    /// 10/8, 172.16/12, 192.168/16; fc00::/7 (unique local), fec0::/10 (site-local),
    /// 64:ff9b:1::/48 (local-use NAT64).
    Private,
    /// 100.64/10: carrier-grade NAT.
    Shared,
    /// 192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32, 3fff::/20.
    Documentation,
    /// 198.18/15, 2001:2::/48.
    Benchmarking,
    /// 192.0.0/24, 240/4, 100::/64 and the rest of ::/8: not routed.
    Reserved,
    /// 169.254/16, fe80::/10: where cloud metadata services answer.
    LinkLocal,
    /// 0/8, ::.
    Unspecified,
    /// 224/4, ff00::/8.
    Multicast,
    /// 255.255.255.255.
    Broadcast,
}

impl Range {
    /// Whether `allow_private: true` lets a receiver be there. Link-local, unspecified,
    /// multicast and broadcast never: no webhook receiver lives there, and link-local is where
    /// the metadata service hands out the host's cloud credentials.
    pub fn allowed_private(self) -> bool {
        !matches!(
            self,
            Range::LinkLocal | Range::Unspecified | Range::Multicast | Range::Broadcast
        )
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Range::Loopback => "loopback",
            Range::Private => "private",
            Range::Shared => "shared address space (carrier-grade NAT, 100.64.0.0/10)",
            Range::Documentation => "reserved for documentation",
            Range::Benchmarking => "reserved for benchmarking",
            Range::Reserved => "reserved (not routed)",
            Range::LinkLocal => "link-local (where cloud metadata services answer)",
            Range::Unspecified => "unspecified (this host)",
            Range::Multicast => "multicast",
            Range::Broadcast => "broadcast",
        })
    }
}

/// The range an address falls in, and the IPv4 address it was judged by when it carries one
/// (`::ffff:a.b.c.d`, `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`, 6to4 `2002:AABB:CCDD::`, Teredo
/// `2001:0:<server>::<client, inverted>`, an ISATAP interface id `…:5efe:a.b.c.d`): those
/// reach, or are translated or tunnelled to, the IPv4 address inside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judged {
    pub range: Range,
    pub inner: Option<Ipv4Addr>,
}

/// `None`: a public address.
pub fn classify(ip: IpAddr) -> Option<Judged> {
    match ip {
        IpAddr::V4(v4) => range_v4(v4).map(|range| Judged { range, inner: None }),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => range_v4(v4).map(|range| Judged {
                range,
                inner: Some(v4),
            }),
            None => range_v6(v6).map(|range| Judged { range, inner: None }),
        }
        .or_else(|| tunnelled_v4(v6)),
    }
}

fn range_v4(ip: Ipv4Addr) -> Option<Range> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        _ if ip.is_broadcast() => Range::Broadcast,
        (0, ..) => Range::Unspecified,
        (127, ..) => Range::Loopback,
        (10, ..) | (172, 16..=31, _) | (192, 168, _) => Range::Private,
        (100, 64..=127, _) => Range::Shared,
        (169, 254, _) => Range::LinkLocal,
        (192, 0, 0) => Range::Reserved,
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => Range::Documentation,
        (198, 18..=19, _) => Range::Benchmarking,
        (224..=239, ..) => Range::Multicast,
        (240..=255, ..) => Range::Reserved,
        _ => return None,
    })
}

/// The IPv4 address an IPv6 address carries and is routed by (see [`Judged`]).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        // ::ffff:a.b.c.d (mapped) and ::ffff:0:a.b.c.d (translated).
        [0, 0, 0, 0, 0, 0xffff, ..] | [0, 0, 0, 0, 0xffff, 0, ..] => Some(low),
        // ::a.b.c.d (compatible), but :: and ::1, which are IPv6's own.
        [0, 0, 0, 0, 0, 0, 0, 0 | 1] => None,
        [0, 0, 0, 0, 0, 0, ..] => Some(low),
        [0x64, 0xff9b, 0, 0, 0, 0, ..] => Some(low),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo))),
        _ => None,
    }
}

/// The first IPv4 address in a non-public range that a tunnelled IPv6 address carries: a
/// Teredo address (`2001:0::/32`) names its server (bits 32-63) and its client (the last 32
/// bits, inverted); an ISATAP interface id (`0000:5efe` or `0200:5efe`) its router's IPv4
/// address. Judged after the address's own range, so each spelling of loopback is caught.
fn tunnelled_v4(ip: Ipv6Addr) -> Option<Judged> {
    let s = ip.segments();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    let inner: Vec<Ipv4Addr> = match s {
        [0x2001, 0, server_hi, server_lo, _, _, client_hi, client_lo] => {
            vec![v4(!client_hi, !client_lo), v4(server_hi, server_lo)]
        }
        [_, _, _, _, 0 | 0x200, 0x5efe, hi, lo] => vec![v4(hi, lo)],
        _ => return None,
    };
    inner.into_iter().find_map(|v4| {
        range_v4(v4).map(|range| Judged {
            range,
            inner: Some(v4),
        })
    })
}

fn range_v6(ip: Ipv6Addr) -> Option<Range> {
    let s = ip.segments();
    Some(match s {
        _ if ip.is_unspecified() => Range::Unspecified,
        _ if ip.is_loopback() => Range::Loopback,
        [first, ..] if first & 0xff00 == 0xff00 => Range::Multicast,
        [first, ..] if first & 0xffc0 == 0xfe80 => Range::LinkLocal,
        [first, ..] if first & 0xffc0 == 0xfec0 || first & 0xfe00 == 0xfc00 => Range::Private,
        [0x64, 0xff9b, 1, ..] => Range::Private,
        [0x2001, 0xdb8, ..] => Range::Documentation,
        [0x3fff, second, ..] if second & 0xf000 == 0 => Range::Documentation,
        [0x2001, 2, 0, ..] => Range::Benchmarking,
        [0x100, 0, 0, 0, ..] => Range::Reserved,
        [first, ..] if first & 0xff00 == 0 => Range::Reserved,
        _ => return None,
    })
}

/// One of the gateway's own listeners (`ip:port`; a Unix socket is no URL's), or an address the
/// gateway talks to (its upstream, Redis, ...): never a receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listener {
    /// Its configuration key, for messages: `gateway.listen`, `gateway.admin.listen`.
    pub key: &'static str,
    pub addr: SocketAddr,
}

impl Listener {
    /// `None` when `text` is no `ip:port` (a Unix socket, or a mistake reported by its own key).
    pub fn parse(key: &'static str, text: &str) -> Option<Listener> {
        text.parse().ok().map(|addr| Listener { key, addr })
    }

    /// Whether a connection to `dest` reaches this listener. `is_local` says whether an address
    /// is one of this host's; it is asked only for a listener on every address (`0.0.0.0`, `::`,
    /// which takes IPv4 too), and only on the listener's port.
    pub fn reached_by(&self, dest: SocketAddr, is_local: &dyn Fn(IpAddr) -> bool) -> bool {
        if dest.port() != self.addr.port() {
            return false;
        }
        let (to, at) = (dest.ip().to_canonical(), self.addr.ip().to_canonical());
        // A connection to 0.0.0.0 or :: goes to this host.
        to == at
            || to.is_unspecified()
            || (at.is_unspecified() && (to.is_loopback() || is_local(to)))
    }
}

/// Why a destination is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The host as written (messages name it already).
    #[error("neither a DNS name nor an IP address")]
    NotAHost(String),
    #[error("{}{}", judged_text(addr, judged), hint(judged.range))]
    Range { addr: IpAddr, judged: Judged },
    #[error("{addr} is {}: never a receiver, even with allow_private", own(key))]
    OwnListener { addr: SocketAddr, key: &'static str },
}

/// What an address of the gateway's own is: a listener (`gateway.listen`), or what a setting
/// points it at (`gateway.quota.redis.url`).
fn own(key: &str) -> String {
    if key.ends_with("listen") {
        format!("the gateway's own listener {key}")
    } else {
        format!("where the gateway's {key} points")
    }
}

fn judged_text(addr: &IpAddr, j: &Judged) -> String {
    match j.inner {
        Some(v4) => format!("{addr} carries the IPv4 address {v4}, which is {}", j.range),
        None => format!("{addr} is {}", j.range),
    }
}

fn hint(range: Range) -> &'static str {
    if range.allowed_private() {
        ": a receiver there needs allow_private: true"
    } else {
        ": never a receiver, even with allow_private"
    }
}

/// What may receive webhooks: public addresses; with `allow_private` also loopback, private and
/// reserved ranges ([`Range::allowed_private`]); never one of `listeners`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    pub allow_private: bool,
    pub listeners: Vec<Listener>,
}

impl Policy {
    /// Judges one address to connect to (see [`Listener::reached_by`] for `is_local`).
    pub fn check(
        &self,
        dest: SocketAddr,
        is_local: &dyn Fn(IpAddr) -> bool,
    ) -> Result<(), Refused> {
        if let Some(l) = self.listeners.iter().find(|l| l.reached_by(dest, is_local)) {
            return Err(Refused::OwnListener {
                addr: dest,
                key: l.key,
            });
        }
        match classify(dest.ip()) {
            Some(judged) if !(self.allow_private && judged.range.allowed_private()) => {
                Err(Refused::Range {
                    addr: dest.ip(),
                    judged,
                })
            }
            _ => Ok(()),
        }
    }

    /// Judges a URL's host and port as configured: an address in any spelling is checked, a name
    /// passes (its addresses are checked when a message is sent; nothing is resolved here).
    pub fn check_host(
        &self,
        host: &str,
        port: u16,
        is_local: &dyn Fn(IpAddr) -> bool,
    ) -> Result<Host, Refused> {
        let parsed = host::parse(host).ok_or_else(|| Refused::NotAHost(host.to_owned()))?;
        if let Host::Ip(ip) = parsed {
            self.check(SocketAddr::new(ip, port), is_local)?;
        }
        Ok(parsed)
    }
}

#[cfg(test)]
mod tests;
