//! Unit and property tests of the destination guard.

use super::*;
use proptest::prelude::*;

fn range(ip: &str) -> Option<Range> {
    classify(ip.parse().unwrap()).map(|j| j.range)
}

fn nobody(_: IpAddr) -> bool {
    false
}

#[test]
fn ranges_of_ipv4() {
    for (ip, want) in [
        ("127.0.0.1", Some(Range::Loopback)),
        ("127.255.1.2", Some(Range::Loopback)),
        ("10.1.2.3", Some(Range::Private)),
        ("172.16.0.1", Some(Range::Private)),
        ("172.31.255.255", Some(Range::Private)),
        ("172.32.0.1", None),
        ("192.168.1.1", Some(Range::Private)),
        ("100.64.0.1", Some(Range::Shared)),
        ("100.127.255.255", Some(Range::Shared)),
        ("100.128.0.1", None),
        ("169.254.169.254", Some(Range::LinkLocal)),
        ("0.0.0.0", Some(Range::Unspecified)),
        ("0.1.2.3", Some(Range::Unspecified)),
        ("224.0.0.1", Some(Range::Multicast)),
        ("255.255.255.255", Some(Range::Broadcast)),
        ("240.0.0.1", Some(Range::Reserved)),
        ("192.0.0.8", Some(Range::Reserved)),
        ("192.0.2.1", Some(Range::Documentation)),
        ("198.51.100.7", Some(Range::Documentation)),
        ("203.0.113.9", Some(Range::Documentation)),
        ("198.18.0.1", Some(Range::Benchmarking)),
        ("8.8.8.8", None),
        ("93.184.216.34", None),
    ] {
        assert_eq!(range(ip), want, "{ip}");
    }
}

#[test]
fn ranges_of_ipv6_and_the_ipv4_inside() {
    for (ip, want) in [
        ("::1", Some(Range::Loopback)),
        ("::", Some(Range::Unspecified)),
        ("fe80::1", Some(Range::LinkLocal)),
        ("fd00::1", Some(Range::Private)),
        ("fc00::1", Some(Range::Private)),
        ("fec0::1", Some(Range::Private)),
        ("ff02::1", Some(Range::Multicast)),
        ("2001:db8::1", Some(Range::Documentation)),
        ("3fff::1", Some(Range::Documentation)),
        ("2001:2::1", Some(Range::Benchmarking)),
        ("100::1", Some(Range::Reserved)),
        ("64:ff9b:1::1", Some(Range::Private)),
        ("2606:4700::1111", None),
        ("::ffff:127.0.0.1", Some(Range::Loopback)),
        ("::ffff:169.254.169.254", Some(Range::LinkLocal)),
        ("::ffff:0:10.0.0.1", Some(Range::Private)),
        ("::127.0.0.1", Some(Range::Loopback)),
        ("64:ff9b::127.0.0.1", Some(Range::Loopback)),
        ("64:ff9b::a9fe:a9fe", Some(Range::LinkLocal)),
        ("2002:7f00:1::", Some(Range::Loopback)),
        ("::ffff:8.8.8.8", None),
        ("64:ff9b::8.8.8.8", None),
        ("2002:808:808::1", None),
        // Teredo: the client 127.0.0.1 inverted (80ff:fffe), a public server; then a private
        // server; then both public.
        ("2001:0:808:808::80ff:fffe", Some(Range::Loopback)),
        ("2001:0:a00:1::f7f7:f7f7", Some(Range::Private)),
        ("2001:0:808:808::f7f7:f7f7", None),
        // ISATAP interface ids carrying 127.0.0.1 and 169.254.169.254, then a public one.
        ("2606:4700:1:2:0:5efe:7f00:1", Some(Range::Loopback)),
        ("2606:4700:1:2:200:5efe:a9fe:a9fe", Some(Range::LinkLocal)),
        ("2606:4700:1:2:0:5efe:808:808", None),
    ] {
        assert_eq!(range(ip), want, "{ip}");
    }
    let j = classify("::ffff:127.0.0.1".parse().unwrap()).unwrap();
    assert_eq!(j.inner, Some(Ipv4Addr::LOCALHOST));
}

#[test]
fn allow_private_opens_private_ranges_only() {
    let open = Policy {
        allow_private: true,
        listeners: vec![],
    };
    let closed = Policy::default();
    let check = |p: &Policy, a: &str| p.check(a.parse().unwrap(), &nobody);
    for ok_with_switch in [
        "127.0.0.1:80",
        "10.0.0.1:443",
        "[fd00::1]:80",
        "[::ffff:192.168.1.1]:80",
    ] {
        assert!(check(&open, ok_with_switch).is_ok(), "{ok_with_switch}");
        let e = check(&closed, ok_with_switch).unwrap_err().to_string();
        assert!(e.contains("needs allow_private: true"), "{e}");
    }
    for never in [
        "169.254.169.254:80",
        "[fe80::1]:80",
        "0.0.0.0:80",
        "224.0.0.1:80",
        "[::ffff:169.254.169.254]:80",
    ] {
        let e = check(&open, never).unwrap_err().to_string();
        assert!(e.contains("never a receiver"), "{never}: {e}");
    }
    assert!(check(&closed, "8.8.8.8:443").is_ok());
    let e = check(&closed, "[::ffff:127.0.0.1]:80")
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "::ffff:127.0.0.1 carries the IPv4 address 127.0.0.1, which is loopback: a receiver there needs allow_private: true"
    );
}

#[test]
fn the_gateways_own_listeners_are_refused_in_any_form() {
    let policy = Policy {
        allow_private: true,
        listeners: vec![
            Listener::parse("gateway.listen", "0.0.0.0:8080").unwrap(),
            Listener::parse("gateway.admin.listen", "127.0.0.1:9180").unwrap(),
        ],
    };
    assert_eq!(
        Listener::parse("gateway.admin.listen", "unix:/run/a.sock"),
        None
    );
    let this_host = |ip: IpAddr| ip == IpAddr::from([192, 168, 1, 5]);
    let refused = |host: &str, port: u16| match policy.check_host(host, port, &this_host) {
        Err(Refused::OwnListener { key, .. }) => Some(key),
        _ => None,
    };
    for host in [
        "127.0.0.1",
        "2130706433",
        "0x7f.1",
        "[::ffff:127.0.0.1]",
        "0.0.0.0",
        "[::]",
    ] {
        assert_eq!(refused(host, 9180), Some("gateway.admin.listen"), "{host}");
    }
    for host in [
        "127.0.0.1",
        "127.0.0.2",
        "[::1]",
        "192.168.1.5",
        "0300.0250.1.5",
    ] {
        assert_eq!(refused(host, 8080), Some("gateway.listen"), "{host}");
    }
    // Another address or port is not the gateway (with allow_private, loopback is fine).
    assert_eq!(refused("127.0.0.2", 9180), None);
    assert_eq!(refused("192.168.1.6", 8080), None);
    assert!(policy.check_host("127.0.0.1", 9181, &this_host).is_ok());
    // A name is left for send time.
    assert_eq!(
        policy.check_host("localhost", 9180, &this_host),
        Ok(Host::Name("localhost".into()))
    );
    let e = policy.check_host("0x7f.1", 9180, &this_host).unwrap_err();
    assert_eq!(
        e.to_string(),
        "127.0.0.1:9180 is the gateway's own listener gateway.admin.listen: never a receiver, even with allow_private"
    );
    assert_eq!(
        policy.check_host("%31", 80, &this_host),
        Err(Refused::NotAHost("%31".into()))
    );
}

proptest! {
    /// An IPv4 address is judged the same alone, mapped, compatible or behind NAT64.
    #[test]
    fn an_ipv4_address_inside_ipv6_is_judged_as_itself(addr in any::<u32>()) {
        let v4 = Ipv4Addr::from(addr);
        let alone = classify(IpAddr::V4(v4)).map(|j| j.range);
        let o = v4.octets();
        let hi = u16::from_be_bytes([o[0], o[1]]);
        let lo = u16::from_be_bytes([o[2], o[3]]);
        for v6 in [
            v4.to_ipv6_mapped(),
            Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, hi, lo),
            Ipv6Addr::new(0, 0, 0, 0, 0xffff, 0, hi, lo),
        ] {
            prop_assert_eq!(classify(IpAddr::V6(v6)).map(|j| j.range), alone, "{}", v6);
        }
        if addr > 1 {
            let compatible = Ipv6Addr::new(0, 0, 0, 0, 0, 0, hi, lo);
            prop_assert_eq!(classify(IpAddr::V6(compatible)).map(|j| j.range), alone);
        }
    }

    /// However an IPv4 host is spelled in a URL, the policy says what it says of the dotted form.
    #[test]
    fn every_spelling_gets_the_dotted_forms_verdict(addr in any::<u32>(), hex in any::<bool>(), private in any::<bool>()) {
        let policy = Policy { allow_private: private, listeners: vec![] };
        let dotted = Ipv4Addr::from(addr).to_string();
        let number = if hex { format!("0x{addr:x}") } else { addr.to_string() };
        let mapped = format!("[{}]", Ipv4Addr::from(addr).to_ipv6_mapped());
        let want = policy.check_host(&dotted, 80, &nobody).is_ok();
        prop_assert_eq!(policy.check_host(&number, 80, &nobody).is_ok(), want, "{}", number);
        prop_assert_eq!(policy.check_host(&mapped, 80, &nobody).is_ok(), want, "{}", mapped);
    }

    /// A listener is refused on its port whatever else the policy allows.
    #[test]
    fn a_listener_is_always_refused(addr in any::<u32>(), port in 1u16.., private in any::<bool>()) {
        let at = SocketAddr::from((Ipv4Addr::from(addr), port));
        let policy = Policy { allow_private: private, listeners: vec![Listener { key: "gateway.listen", addr: at }] };
        let refused = matches!(policy.check(at, &nobody), Err(Refused::OwnListener { .. }));
        prop_assert!(refused);
        let mapped = SocketAddr::from((Ipv4Addr::from(addr).to_ipv6_mapped(), port));
        let refused = matches!(policy.check(mapped, &nobody), Err(Refused::OwnListener { .. }));
        prop_assert!(refused);
    }
}
