//! A URL's host as the resolver will take it: a DNS name, or an IP address in any form a URL
//! parser or `inet_aton` accepts (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`), so that no
//! spelling of an address passes for a name.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What a URL's host names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A DNS name (lower case), resolved only when an alert is sent.
    Name(String),
    Ip(IpAddr),
}

/// The host of a URL (as `http::Uri::host` gives it: IPv6 in brackets); `None` when it is
/// neither a DNS name nor an IP address.
pub fn parse(host: &str) -> Option<Host> {
    if let Some(inner) = host.strip_prefix('[') {
        // No zone (`%25eth0`) and no IPvFuture: neither names a receiver.
        let v6: Ipv6Addr = inner.strip_suffix(']')?.parse().ok()?;
        return Some(Host::Ip(IpAddr::V6(v6)));
    }
    let lower = host.to_ascii_lowercase();
    // A trailing dot only roots the name; `127.0.0.1.` is still that address to some resolvers.
    let bare = lower.strip_suffix('.').unwrap_or(&lower);
    if is_dns_name(bare) {
        return Some(Host::Name(lower));
    }
    // Not a name: an address in some spelling, or nothing a receiver can be at.
    inet_aton(bare).map(|v4| Host::Ip(IpAddr::V4(v4)))
}

/// Labels of letters, digits, `-` and `_` (1-63 bytes, no `-` at either end), 253 bytes at most,
/// the last one not a number: URL parsers and `getaddrinfo` read a host ending in a number as an
/// IPv4 address (WHATWG's "ends in a number"), so such a host is never a name here.
fn is_dns_name(name: &str) -> bool {
    if name.is_empty() || name.len() > 253 {
        return false;
    }
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    name.split('.').all(label_ok) && !name.rsplit('.').next().is_some_and(is_number)
}

/// A label that reads as a number: decimal digits, or `0x` and hex digits (none included).
fn is_number(label: &str) -> bool {
    let hex = label
        .strip_prefix("0x")
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    hex || label.bytes().all(|b| b.is_ascii_digit())
}

/// An IPv4 address the way `inet_aton` reads one: one to four parts separated by dots, each
/// decimal, octal (leading `0`) or hex (`0x`); the last part fills the bytes left (`127.1` is
/// 127.0.0.1, `2130706433` too), the others one byte each.
pub fn inet_aton(text: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.len() > 4 {
        return None;
    }
    let values = parts
        .iter()
        .map(|p| number(p))
        .collect::<Option<Vec<u32>>>()?;
    let (last, head) = values.split_last()?;
    if head.iter().any(|v| *v > 255) {
        return None;
    }
    let last_bits = 8 * (4 - head.len() as u32);
    if last_bits < 32 && *last >= 1 << last_bits {
        return None;
    }
    let high = head
        .iter()
        .enumerate()
        .fold(0u32, |acc, (i, v)| acc | (v << (24 - 8 * i as u32)));
    Some(Ipv4Addr::from(high | last))
}

/// One part of [`inet_aton`]; `None` when empty, not a number of its base, or past 32 bits.
fn number(part: &str) -> Option<u32> {
    let (digits, radix) = match part.strip_prefix("0x").or(part.strip_prefix("0X")) {
        // `0x` alone is 0 to glibc and to URL parsers.
        Some("") => return Some(0),
        Some(hex) => (hex, 16),
        None if part.len() > 1 && part.starts_with('0') => (&part[1..], 8),
        None => (part, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u32::from_str_radix(digits, radix).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(host: &str) -> Option<IpAddr> {
        match parse(host) {
            Some(Host::Ip(ip)) => Some(ip),
            _ => None,
        }
    }

    #[test]
    fn every_spelling_of_loopback_is_an_address() {
        for host in [
            "127.0.0.1",
            "127.0.0.1.",
            "2130706433",
            "0x7f000001",
            "0X7F000001",
            "0x7f.0.0.1",
            "0x7f.1",
            "0177.0.0.1",
            "0177.0.0.01",
            "127.1",
            "127.0.1",
            "0x7f.0x0.0x0.0x1",
            "017700000001",
            "0x00000000007f000001",
        ] {
            assert_eq!(ip(host), Some("127.0.0.1".parse().unwrap()), "{host}");
        }
        assert_eq!(
            ip("[::ffff:127.0.0.1]"),
            Some("::ffff:7f00:1".parse().unwrap())
        );
        assert_eq!(ip("[::1]"), Some("::1".parse().unwrap()));
        assert_eq!(ip("0x"), Some("0.0.0.0".parse().unwrap()));
    }

    #[test]
    fn names_stay_names_and_the_rest_is_nothing() {
        for name in [
            "localhost",
            "hooks.example.com",
            "a-b.c_d.example",
            "x.0x7f.io",
            "1.2.3.com",
        ] {
            assert_eq!(parse(name), Some(Host::Name(name.to_owned())), "{name}");
        }
        assert_eq!(
            parse("Hooks.Example."),
            Some(Host::Name("hooks.example.".into()))
        );
        for nothing in [
            "",
            ".",
            "1.2.3.4.5",
            "256.0.0.1",
            "1.2.3.256",
            "1.2.65536",
            "1.16777216",
            "4294967296",
            "08.0.0.1",
            "0x1g.0.0.1",
            "foo.123",
            "foo.0x1f",
            "-a.example",
            "a..b",
            "%31%32%37.0.0.1",
            "[::1",
            "[fe80::1%25eth0]",
            "[v1.x]",
            "1.2.3.4 ",
        ] {
            assert_eq!(parse(nothing), None, "{nothing:?}");
        }
    }

    /// A part of `inet_aton` written in one of its three bases.
    fn spelled(value: u32, base: u8) -> String {
        match base {
            0 => value.to_string(),
            1 => format!("0{value:o}"),
            _ => format!("0x{value:x}"),
        }
    }

    proptest! {
        #[test]
        fn any_address_in_any_shape_and_base_reads_back(
            addr in any::<u32>(),
            shape in 1usize..=4,
            bases in proptest::collection::vec(0u8..3, 4),
        ) {
            let b = addr.to_be_bytes();
            let values: Vec<u32> = match shape {
                1 => vec![addr],
                2 => vec![b[0].into(), addr & 0x00ff_ffff],
                3 => vec![b[0].into(), b[1].into(), addr & 0xffff],
                _ => b.iter().map(|x| u32::from(*x)).collect(),
            };
            let text: Vec<String> = values.iter().zip(&bases).map(|(v, base)| spelled(*v, *base)).collect();
            let text = text.join(".");
            prop_assert_eq!(ip(&text), Some(IpAddr::V4(Ipv4Addr::from(addr))), "{}", text);
        }

        #[test]
        fn a_name_ending_in_letters_is_never_an_address(
            labels in proptest::collection::vec("[a-z0-9]{1,10}", 0..4),
            tld in "[a-z][a-z0-9]{0,5}",
        ) {
            let mut name = labels.join(".");
            if !name.is_empty() {
                name.push('.');
            }
            name.push_str(&tld);
            prop_assert_eq!(parse(&name), Some(Host::Name(name.clone())));
        }

        #[test]
        fn parsing_never_panics(host in "[\\[\\]0-9a-fxX.:%-]{0,40}") {
            let _ = parse(&host);
        }
    }
}
