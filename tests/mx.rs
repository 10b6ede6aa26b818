//! MX intelligence end to end: the gateway against a real DNS server on loopback.

use crate::common;
use crate::dns;

use common::*;
use dns::{black_hole, DnsServer, Zone};
use hickory_proto::rr::RecordType;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

fn zones() -> HashMap<String, Zone> {
    let mx = |list: &[(u16, &str)], ttl| Zone {
        mx: list.iter().map(|(p, h)| (*p, h.to_string())).collect(),
        a: None,
        ttl,
    };
    let mut z = HashMap::new();
    z.insert(
        "workspace.test".into(),
        mx(
            &[(5, "alt1.aspmx.l.google.com"), (1, "aspmx.l.google.com")],
            2,
        ),
    );
    z.insert(
        "m365.test".into(),
        mx(&[(0, "m365-test.mail.protection.outlook.com")], 300),
    );
    z.insert("nullmx.test".into(), mx(&[(0, ".")], 300));
    z.insert(
        "selfhosted.test".into(),
        mx(&[(10, "mail.selfhosted.test")], 300),
    );
    z.insert(
        "dispo-mx.test".into(),
        mx(&[(10, "mx1.mailinator.com")], 300),
    );
    z.insert(
        "forwarded.test".into(),
        mx(&[(10, "mx1.improvmx.com")], 300),
    );
    z.insert(
        "gmail-consumer.test".into(),
        mx(&[(5, "gmail-smtp-in.l.google.com")], 300),
    );
    z.insert(
        "aonly.test".into(),
        Zone {
            mx: vec![],
            a: Some(Ipv4Addr::new(192, 0, 2, 1)),
            ttl: 300,
        },
    );
    z.insert("nomail.test".into(), mx(&[], 300));
    // Listing a business provider as a backup costs nothing: mail goes to the own host first.
    z.insert(
        "backup-google.test".into(),
        mx(
            &[(10, "mail.backup-google.test"), (20, "aspmx.l.google.com")],
            300,
        ),
    );
    z.insert(
        "own-forwarder.test".into(),
        mx(
            &[(10, "mail.own-forwarder.test"), (20, "mx1.improvmx.com")],
            300,
        ),
    );
    z
}

fn providers() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/mx_providers.csv"
    ))
    .unwrap()
}

fn record(gw: &Gateway, domain: &str) -> serde_json::Value {
    let r = gw.get(&format!("/v1/public/domain/{domain}"));
    assert_eq!(r.status, 200, "{domain}");
    r.json()
}

#[test]
fn mail_setups_are_classified_from_dns() {
    let server = DnsServer::start(zones());
    let gw = Gateway::builder()
        .dns(server.addr)
        .data("mx_providers.csv", &providers())
        .start();
    // (domain, reason, label, corporate)
    // (domain, reason, label, corporate)
    let cases: [(&str, &str, Option<&str>, bool); 9] = [
        ("workspace.test", "safe", Some("Google Workspace"), true),
        ("m365.test", "safe", Some("Microsoft 365"), true),
        ("selfhosted.test", "safe", None, true),
        ("nullmx.test", "undeliverable", None, false),
        ("does-not-exist.test", "undeliverable", None, false),
        ("nomail.test", "undeliverable", None, false),
        ("aonly.test", "safe", None, false),
        ("dispo-mx.test", "disposable", Some("Mailinator"), false),
        ("gmail-consumer.test", "safe", Some("Gmail"), false),
    ];
    for (domain, reason, label, corporate) in cases {
        let r = record(&gw, domain);
        assert_eq!(r["reason"], reason, "{domain}: {r}");
        assert_eq!(r["mx_provider_label"].as_str(), label, "{domain}: {r}");
        assert_eq!(r["is_corporate_email"], corporate, "{domain}: {r}");
    }
    let s = record(&gw, "nullmx.test");
    assert_eq!(s["risk_score"], 90);
    // Only a recognised business provider where mail goes first lowers the score; own hosts
    // earn the flag (without a risk signal) at the score of an unknown name.
    let unknown = record(&gw, "aonly.test")["risk_score"].clone();
    assert_eq!(unknown, 20);
    assert_eq!(record(&gw, "workspace.test")["risk_score"], 8);
    assert_eq!(record(&gw, "selfhosted.test")["risk_score"], unknown);
    let b = record(&gw, "backup-google.test");
    assert_eq!(
        (
            &b["risk_score"],
            &b["is_corporate_email"],
            &b["mx_provider_label"]
        ),
        (&unknown, &true.into(), &"Google Workspace".into()),
        "{b}"
    );
    let o = record(&gw, "own-forwarder.test");
    assert_eq!(o["is_corporate_email"], false, "{o}");
    // A forwarder raises the score but never flags on its own.
    let f = record(&gw, "forwarded.test");
    assert_eq!(f["reason"], "safe");
    assert_eq!(f["mx_provider_label"], "ImprovMX");
    assert!(
        f["risk_score"].as_u64().unwrap()
            > record(&gw, "aonly.test")["risk_score"].as_u64().unwrap()
    );
}

#[test]
fn answers_are_cached_until_their_ttl_passes() {
    let server = DnsServer::start(zones());
    let gw = Gateway::builder().dns(server.addr).start();
    let first_query = Instant::now();
    record(&gw, "workspace.test");
    record(&gw, "workspace.test");
    record(&gw, "m365.test");
    record(&gw, "m365.test");
    assert_eq!(server.count("workspace.test", RecordType::MX), 1);
    assert_eq!(server.count("m365.test", RecordType::MX), 1);
    // Negative answers are cached too (RFC 2308).
    record(&gw, "does-not-exist.test");
    record(&gw, "does-not-exist.test");
    assert_eq!(server.count("does-not-exist.test", RecordType::MX), 1);
    // workspace.test has a 2 s TTL: the answer is served until then, and a request after it
    // sends one new query.
    wait_until(Duration::from_secs(20), || {
        record(&gw, "workspace.test");
        server.count("workspace.test", RecordType::MX) > 1
    });
    // (first_query was taken before the first answer, so it is earlier than its expiry.)
    assert!(first_query.elapsed() >= Duration::from_millis(1900));
    assert_eq!(server.count("workspace.test", RecordType::MX), 2);
    assert_eq!(server.count("m365.test", RecordType::MX), 1);
}

#[test]
fn concurrent_lookups_of_one_name_send_one_query() {
    let server = DnsServer::start(zones());
    let gw = Gateway::builder().dns(server.addr).start();
    let addr = gw.addr;
    let clients: Vec<_> = (0..100)
        .map(|_| {
            thread::spawn(move || {
                let r = Conn::open(addr)
                    .unwrap()
                    .get("/v1/public/domain/selfhosted.test")
                    .unwrap();
                assert_eq!(r.status, 200);
                r.json()["is_corporate_email"].as_bool().unwrap()
            })
        })
        .collect();
    let corporate = clients
        .into_iter()
        .map(|c| c.join().unwrap())
        .filter(|c| *c)
        .count();
    assert_eq!(server.count("selfhosted.test", RecordType::MX), 1);
    // Requests that arrived within the budget all got the evidence.
    assert!(corporate > 0);
}

#[test]
fn lookups_in_flight_are_bounded_and_the_rest_fail_open_at_once() {
    const MAX_INFLIGHT: usize = 4;
    const NAMES: usize = 16;
    // Each answer takes 1 s, within the 1.5 s query timeout, so a slot is held until the answer.
    let server = DnsServer::start_slow(zones(), Duration::from_millis(1000));
    let gw = Gateway::builder()
        .dns(server.addr)
        .data("mx_providers.csv", &providers())
        .mx_yaml(&format!("max_inflight: {MAX_INFLIGHT}"))
        .start();
    let addr = gw.addr;
    let start = Arc::new(Barrier::new(NAMES));
    let clients: Vec<_> = (0..NAMES)
        .map(|i| {
            let start = start.clone();
            thread::spawn(move || {
                let mut c = Conn::open(addr).unwrap();
                start.wait();
                let r = c.get(&format!("/v1/public/domain/slow{i}.test")).unwrap();
                (r.status, r.json())
            })
        })
        .collect();
    for c in clients {
        let (status, r) = c.join().unwrap();
        assert_eq!(status, 200, "{r}");
        // Fail open: what a timeout gives, not a 5xx and not a wait for DNS.
        assert_eq!(
            (&r["reason"], &r["risk_score"], &r["is_corporate_email"]),
            (&"safe".into(), &20.into(), &false.into()),
            "{r}"
        );
    }
    let held = server.most_held();
    assert!((1..=MAX_INFLIGHT).contains(&held), "{held} queries at once");
    // Every name either took a slot (its query reaches DNS, from the background should the
    // request have given up first) or was refused one, which is counted and answered at once.
    let refused = gw.metric("drg_mx_lookups_refused_total").unwrap() as usize;
    assert!(refused >= 1, "no lookup was refused");
    wait_until(Duration::from_secs(20), || {
        let queried = (0..NAMES)
            .filter(|i| server.count(&format!("slow{i}.test"), RecordType::MX) > 0)
            .count();
        queried + refused == NAMES
    });
    // Still healthy, and the slots come back: a name it has not seen gets its evidence.
    assert_eq!(gw.get("/healthz").status, 200);
    wait_until(Duration::from_secs(20), || {
        record(&gw, "workspace.test")["mx_provider_label"] == "Google Workspace"
    });
    assert!(server.most_held() <= MAX_INFLIGHT);
}

#[test]
fn a_silent_dns_server_costs_at_most_the_budget_and_fails_open() {
    // DNS gives up after 30 s: an answer before that is the budget's fail-open, not DNS's. The
    // server answers nothing for a minute (but the gateway's probe at once: it is alive).
    let slow = DnsServer::start_slow(zones(), Duration::from_secs(60));
    let gw = Gateway::builder()
        .dns(slow.addr)
        .mx_yaml("query_timeout_ms: 30000")
        .start();
    let started = Instant::now();
    let r = record(&gw, "whatever.test");
    let took = started.elapsed();
    assert_eq!(r["reason"], "safe");
    assert_eq!(r["mx_provider_label"], serde_json::Value::Null);
    assert_eq!(r["is_corporate_email"], false);
    // The lookup still waits for DNS, holding its slot, after the request was answered.
    assert_eq!(gw.metric("drg_mx_lookups_in_flight"), Some(1.0));
    // budget_ms is 300 in the test config: the request waited for it (a timer never fires
    // early); the upper bound is the behaviour, far from both the budget and DNS's 30 s.
    assert!(took >= Duration::from_millis(250), "{took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    // Table hits never ask DNS: no lookup is even started (misses count every one, refused
    // ones included).
    let gw2 = Gateway::builder()
        .dns(black_hole())
        .data("disposable.txt", "listed.test\n")
        .start();
    assert_eq!(record(&gw2, "listed.test")["reason"], "disposable");
    assert_eq!(gw2.metric("drg_mx_cache_misses_total"), Some(0.0));
    assert_eq!(gw2.metric("drg_mx_cache_hits_total"), Some(0.0));
}

#[test]
fn an_own_hosts_address_in_the_mx_answer_saves_a_round_trip_and_never_condemns() {
    // Every answer leaves 400 ms after its question: one round trip takes at least 400 ms,
    // two take at least 800.
    let rtt = Duration::from_millis(400);
    let own = |host: &str| Zone {
        mx: vec![(10, host.to_owned())],
        a: None,
        ttl: 300,
    };
    let mut z = zones();
    // Its own host, whose address the MX answer carries (the server adds what it knows).
    z.insert("glued.test".into(), own("mail.glued.test"));
    z.insert("minimal.test".into(), own("mail.minimal.test"));
    // Another domain's host: the address the answer carries for it is not believed.
    z.insert("elsewhere.test".into(), own("mail.thirdparty.test"));
    // Its own host on loopback: the glue shows no usable address, so the host is asked.
    z.insert("loop-glued.test".into(), own("mail.loop-glued.test"));
    z.insert(
        "mail.loop-glued.test".into(),
        Zone {
            mx: vec![],
            a: Some(Ipv4Addr::LOCALHOST),
            ttl: 300,
        },
    );
    let server = DnsServer::start_slow(z, rtt);
    let gw = Gateway::builder()
        .dns(server.addr)
        .mx_yaml("budget_ms: 5000")
        .mx_yaml("query_timeout_ms: 5000")
        .start();
    let timed = |name: &str| {
        let started = Instant::now();
        let r = record(&gw, name);
        (r, started.elapsed())
    };
    let (r, took) = timed("glued.test");
    assert_eq!(r["reason"], "safe");
    assert_eq!(r["is_corporate_email"], true);
    assert!(took >= rtt && took < 2 * rtt, "one round trip: {took:?}");
    let (r, took) = timed("elsewhere.test");
    assert_eq!(r["is_corporate_email"], true);
    assert!(took >= 2 * rtt, "the host's address asked: {took:?}");
    let (r, took) = timed("loop-glued.test");
    assert_eq!(r["reason"], "undeliverable");
    assert!(took >= 2 * rtt, "the host's address asked: {took:?}");
    // A resolver that sends minimal answers: the address is asked, as before.
    server.set_glue(false);
    let (r, took) = timed("minimal.test");
    assert_eq!(r["is_corporate_email"], true);
    assert!(took >= 2 * rtt, "the host's address asked: {took:?}");
}

#[test]
fn a_shared_services_hosts_are_never_asked_their_addresses_with_the_neighbourhood_on_or_off() {
    // A company on Microsoft 365 (a host of its own under outlook.com) or Google Workspace is
    // answered after its MX alone: such hosts exist, whether or not the neighbourhood is on.
    // With it off, the resolver used to ask their A and AAAA, a second round trip for every
    // new company on Microsoft 365 (the mix's p99 doubled).
    let rtt = Duration::from_millis(400);
    let mut z = zones();
    z.insert(
        "elsewhere.test".into(),
        Zone {
            mx: vec![(10, "mail.thirdparty.test".into())],
            a: None,
            ttl: 300,
        },
    );
    for neighbourhood in [true, false] {
        let server = DnsServer::start_slow(z.clone(), rtt);
        let mut builder = Gateway::builder()
            .dns(server.addr)
            .data("mx_providers.csv", &providers())
            .mx_yaml("budget_ms: 5000")
            .mx_yaml("query_timeout_ms: 5000");
        if !neighbourhood {
            builder = builder.mx_yaml("neighbourhood: { enabled: false }");
        }
        let gw = builder.start();
        for (domain, label) in [
            ("m365.test", "Microsoft 365"),
            ("workspace.test", "Google Workspace"),
        ] {
            let started = Instant::now();
            let r = record(&gw, domain);
            let took = started.elapsed();
            assert_eq!(r["mx_provider_label"], label, "{domain}: {r}");
            assert_eq!(r["is_corporate_email"], true, "{domain}: {r}");
            assert!(
                took >= rtt && took < 2 * rtt,
                "{domain}, neighbourhood {neighbourhood}: one round trip, took {took:?}"
            );
        }
        // Another domain's host is still asked (the answer's address for it is not believed).
        let r = record(&gw, "elsewhere.test");
        assert_eq!(r["is_corporate_email"], true, "{r}");
        assert!(server.count("mail.thirdparty.test", RecordType::A) >= 1);
        for host in [
            "m365-test.mail.protection.outlook.com",
            "aspmx.l.google.com",
            "alt1.aspmx.l.google.com",
        ] {
            for rtype in [RecordType::A, RecordType::AAAA] {
                assert_eq!(
                    server.count(host, rtype),
                    0,
                    "{host} {rtype}, neighbourhood {neighbourhood}"
                );
            }
        }
    }
}

#[test]
fn an_answer_too_big_for_udp_is_asked_again_over_tcp() {
    let mut z = zones();
    z.insert(
        "big.test".into(),
        Zone {
            mx: vec![(1, "aspmx.l.google.com".into())],
            a: None,
            ttl: 300,
        },
    );
    let server = DnsServer::start(z);
    let gw = Gateway::builder()
        .dns(server.addr)
        .data("mx_providers.csv", &providers())
        .start();
    let r = record(&gw, "big.test");
    assert_eq!(r["mx_provider_label"], "Google Workspace", "{r}");
    assert_eq!(r["is_corporate_email"], true);
    assert_eq!(server.count("big.test", RecordType::MX), 1);
}

#[test]
fn lookup_shows_the_mx_evidence() {
    let server = DnsServer::start(zones());
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::write(dir.path().join("data/mx_providers.csv"), providers()).unwrap();
    std::fs::write(dir.path().join("keys.yaml"), "keys: []\n").unwrap();
    let conf = dir.path().join("gateway.yaml");
    // `lookup <domain>` on a config whose `mx:` section adds `extra`: its output.
    let lookup = |extra: &str, domain: &str| {
        std::fs::write(
            &conf,
            format!(
                "gateway:\n  data: {{ dir: data, builtin_disposable: false }}\n  mx: {{ servers: [\"{}\"]{extra} }}\n",
                server.addr
            ),
        )
        .unwrap();
        run_ok(&["-c", conf.to_str().unwrap(), "lookup", domain])
    };
    let text = lookup("", "workspace.test");
    assert!(text.contains("\"is_corporate_email\": true"), "{text}");
    assert!(text.contains("1 aspmx.l.google.com"), "{text}");
    assert!(text.contains("provider: Google Workspace (Mailbox), host aspmx.l.google.com matched suffix aspmx.l.google.com"), "{text}");
    assert!(text.contains("(Miss)"), "{text}");
    // With the neighbourhood off, the command knows a shared service's host as `serve` does: a
    // company on Microsoft 365 costs its MX query alone.
    let text = lookup(", neighbourhood: { enabled: false }", "m365.test");
    assert!(
        text.contains("\"mx_provider_label\": \"Microsoft 365\""),
        "{text}"
    );
    assert_eq!(server.count("m365.test", RecordType::MX), 1, "{text}");
    for rtype in [RecordType::A, RecordType::AAAA] {
        assert_eq!(
            server.count("m365-test.mail.protection.outlook.com", rtype),
            0,
            "{rtype}: {text}"
        );
    }
}

#[test]
fn max_inflight_must_allow_one_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("gateway.yaml");
    std::fs::write(&conf, "gateway:\n  mx:\n    max_inflight: 0\n").unwrap();
    let out = crate::common::command(BIN)
        .args(["check-config", "-c", conf.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("gateway.mx.max_inflight: 0 is outside 1..=1000000"),
        "{err}"
    );
}

/// A mail host whose one address is private is unusable only when DNS answered both families:
/// with its AAAA question failing (SERVFAIL), the usable address may be the one not heard, so
/// the host is unknown and the domain is not `undeliverable` from a failure (issue 66).
#[test]
fn a_private_address_with_the_other_family_failing_is_not_undeliverable() {
    let host = |a| Zone {
        mx: vec![],
        a: Some(a),
        ttl: 300,
    };
    let mx = |h: &str| Zone {
        mx: vec![(10, h.to_owned())],
        a: None,
        ttl: 300,
    };
    let private = Ipv4Addr::new(10, 1, 2, 3);
    let zones = HashMap::from([
        ("private-only.test".to_owned(), mx("mail.private-only.test")),
        ("mail.private-only.test".to_owned(), host(private)),
        (
            "half-heard.test".to_owned(),
            mx("mail.v6fail.half-heard.test"),
        ),
        ("mail.v6fail.half-heard.test".to_owned(), host(private)),
    ]);
    let server = DnsServer::start(zones);
    // Minimal answers: the resolver asks each host's families itself.
    server.set_glue(false);
    let gw = Gateway::builder().dns(server.addr).start();
    let both = record(&gw, "private-only.test");
    assert_eq!(both["reason"], "undeliverable", "{both}");
    let half = record(&gw, "half-heard.test");
    assert_eq!(half["reason"], "safe", "{half}");
    assert!(
        server.count("mail.v6fail.half-heard.test", RecordType::AAAA) >= 1,
        "the AAAA question was asked and failed"
    );
}
