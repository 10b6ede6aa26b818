//! Evidence the gateway can vouch for, against real DNS servers on loopback: resolvers that lie
//! in each common way condemn no company (the table answers alone, and says why on the admin
//! listener), an honest one still finds names that do not exist, and one project's names under
//! silent zones never take another project's MX evidence (nor four busy projects a fifth's; a
//! zone is switched off for everyone only once two projects' lookups timed out under it).

use crate::common;
use crate::dns;

use common::*;
use dns::{DnsServer, Lie, Zone};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

const OTHER_SECRET: &str = "drg_other_project_key_0123456789abcdefghijklm";
const TOP: &str = "top_domains: { render_interval_ms: 50, persist_interval_ms: 200, \
                   state_file: state/top.json }";

/// Made-up organisations: on no list, so only DNS could say anything of them.
fn companies() -> Vec<String> {
    let mut names: Vec<String> = (0..20)
        .map(|i| format!("northwind-traders-{i}.com"))
        .collect();
    names.push("bücher.de".to_owned());
    names
}

fn record(gw: &Gateway, secret: &str, domain: &str) -> Value {
    gw.explain_as(secret, domain)
}

/// A gateway on the shipped lists, asking `dns`, with a second project's key.
fn gateway(dns: std::net::SocketAddr) -> Gateway {
    Gateway::builder()
        .dns(dns)
        .builtin(true)
        .data("disposable.txt", "listed.example\n")
        .key_in_project("other", OTHER_SECRET, "test", "other")
        .mx_yaml("probe_interval_seconds: 1")
        .gateway_yaml(TOP)
        .start()
}

#[test]
fn a_resolver_that_lies_or_is_silent_condemns_no_company() {
    let mut servers: Vec<(&str, std::net::SocketAddr, Option<DnsServer>)> = Vec::new();
    for (what, lie) in [
        ("nxdomain", Lie::NxDomain),
        ("servfail", Lie::ServFail),
        ("empty", Lie::Empty),
    ] {
        let s = DnsServer::lying(lie);
        servers.push((what, s.addr, Some(s)));
    }
    let silent = CountingBlackHole::start();
    servers.push(("silent", silent.addr, None));
    for (what, addr, server) in &servers {
        // The canary questions the server got so far (every check asks gmail.com's MX first).
        let asked = || match server {
            Some(s) => s.count("gmail.com", hickory_proto::rr::RecordType::MX),
            None => silent.questions(),
        };
        let gw = gateway(*addr);
        let state = if *what == "silent" {
            "silent"
        } else {
            "untrusted"
        };
        wait_until(Duration::from_secs(10), || {
            gw.admin_get("/readyz").json()["mx"]["resolver"] == state
        });
        let ready = gw.admin_get("/readyz");
        assert_eq!(ready.status, 200, "{what}: readiness never depends on DNS");
        assert_eq!(
            ready.json()["mx"],
            json!({"resolver": state, "evidence": "off"}),
            "{what}"
        );
        assert_eq!(gw.get("/readyz").json(), json!({"status": "ready"}));
        for secret in [TEST_SECRET, OTHER_SECRET] {
            for name in companies() {
                let r = record(&gw, secret, &name);
                // What a machine without DNS answers: the table alone.
                assert_eq!(
                    (&r["reason"], &r["risk_score"], &r["evidence"]["rule"]),
                    (&json!("safe"), &json!(20), &json!("unknown")),
                    "{what}: {name}: {r}"
                );
            }
            assert_eq!(
                record(&gw, secret, "listed.example")["reason"],
                "disposable"
            );
        }
        assert_eq!(gw.metric("drg_mx_breaker_open"), Some(1.0), "{what}");
        let untrusted = if *what == "silent" { 0.0 } else { 1.0 };
        assert_eq!(
            gw.metric("drg_mx_resolver_untrusted"),
            Some(untrusted),
            "{what}"
        );
        assert_eq!(gw.metric("drg_mx_resolver_trusted"), Some(0.0), "{what}");
        // Two projects asked: the listed name ranks first, no company at all.
        let mut last = Vec::new();
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_until(Duration::from_secs(10), || {
                last = top_domains(&gw, 100);
                last.first().map(String::as_str) == Some("listed.example")
            })
        }));
        assert!(ok.is_ok(), "{what}: ranking {last:?}");
        // The rest is the table's own ranking of listed names: no company among them.
        let puny = "xn--bcher-kva.de".to_owned();
        for name in companies().into_iter().chain([puny]) {
            assert!(!last.contains(&name), "{what}: {name} ranked: {last:?}");
        }
        let warning = if *what == "silent" {
            "no DNS server answers"
        } else {
            "the DNS resolver is not trusted"
        };
        // One WARN for the state, not one per check or per lookup: after two more checks (a
        // fixed wait could end before any under load, and the test pass unchecked).
        let from = asked();
        let more = if server.is_some() { 2 } else { 8 };
        wait_until(Duration::from_secs(20), || asked() >= from + more);
        assert_eq!(gw.log().matches(warning).count(), 1, "{what}: {}", gw.log());
    }
}

/// Waits until the admin `/readyz` says this of the resolver.
fn wait_resolver(gw: &Gateway, state: &str) {
    wait_until(Duration::from_secs(10), || {
        gw.admin_get("/readyz").json()["mx"]["resolver"] == state
    });
}

fn honest_zones() -> HashMap<String, Zone> {
    let mut z = HashMap::new();
    z.insert(
        "selfhosted.test".to_owned(),
        Zone {
            mx: vec![(10, "mail.selfhosted.test".to_owned())],
            a: None,
            ttl: 300,
        },
    );
    z.insert(
        "nomail.test".to_owned(),
        Zone {
            mx: vec![],
            a: None,
            ttl: 300,
        },
    );
    z
}

#[test]
fn an_honest_resolver_still_finds_names_that_do_not_exist() {
    let dns = DnsServer::start(honest_zones());
    let gw = gateway(dns.addr);
    wait_until(Duration::from_secs(10), || {
        gw.admin_get("/readyz").json()["mx"] == json!({"resolver": "trusted", "evidence": "on"})
    });
    assert_eq!(gw.metric("drg_mx_resolver_trusted"), Some(1.0));
    for name in ["does-not-exist.test", "nomail.test"] {
        let r = record(&gw, TEST_SECRET, name);
        assert_eq!(
            (&r["reason"], &r["risk_score"]),
            (&json!("undeliverable"), &json!(90)),
            "{name}: {r}"
        );
    }
    let r = record(&gw, TEST_SECRET, "selfhosted.test");
    assert_eq!(
        (&r["reason"], &r["is_corporate_email"]),
        (&json!("safe"), &json!(true)),
        "{r}"
    );
    assert!(
        gw.log().contains("shows the canaries' MX records"),
        "{}",
        gw.log()
    );
}

/// A filtering (or split-horizon) resolver answers NXDOMAIN for particular names and MX hosts
/// while the canaries look fine; with `mx.confirm_servers`, a second resolver must say NXDOMAIN
/// too before anything is `undeliverable`. A name that exists nowhere still is.
#[test]
fn a_filtering_resolvers_nxdomain_is_not_taken_where_a_second_resolver_confirms() {
    let zone = |mx: &str| Zone {
        mx: vec![(10, mx.to_owned())],
        a: None,
        ttl: 300,
    };
    // The filter knows neither the blocked name nor the blocked MX host.
    let mut filtered = honest_zones();
    // (`nothere`: the test server gives this MX host no address of its own accord.)
    filtered.insert(
        "uses-blocked-host.test".into(),
        zone("nothere.blocked-host.test"),
    );
    let filter = DnsServer::start(filtered.clone());
    let mut full = filtered;
    full.insert(
        "blocked-by-filter.test".into(),
        zone("mail.blocked-by-filter.test"),
    );
    full.insert(
        "nothere.blocked-host.test".into(),
        Zone {
            mx: vec![],
            a: Some(std::net::Ipv4Addr::new(198, 51, 100, 7)),
            ttl: 300,
        },
    );
    let unfiltered = DnsServer::start(full);
    let gw = Gateway::builder()
        .dns(filter.addr)
        .mx_yaml(&format!("confirm_servers: [\"{}\"]", unfiltered.addr))
        .start();
    wait_resolver(&gw, "trusted");
    for name in ["blocked-by-filter.test", "uses-blocked-host.test"] {
        let r = record(&gw, TEST_SECRET, name);
        assert_eq!(r["reason"], "safe", "{name}: {r}");
    }
    assert!(unfiltered.count("blocked-by-filter.test", hickory_proto::rr::RecordType::MX) >= 1);
    let gone = record(&gw, TEST_SECRET, "does-not-exist.test");
    assert_eq!(gone["reason"], "undeliverable", "{gone}");
    // Without a second resolver, the filter's word is taken (as documented).
    let alone = Gateway::builder().dns(filter.addr).start();
    wait_resolver(&alone, "trusted");
    for name in ["blocked-by-filter.test", "uses-blocked-host.test"] {
        let r = record(&alone, TEST_SECRET, name);
        assert_eq!(r["reason"], "undeliverable", "{name}: {r}");
    }
}

#[test]
fn an_nxdomain_under_a_tld_the_resolver_cannot_show_is_not_evidence() {
    // It shows the canaries, so it is trusted, but it says NXDOMAIN for every other name,
    // TLDs included: a split-horizon resolver that knows a few public names.
    let dns = DnsServer::lying(Lie::NxDomainButCanaries);
    let gw = gateway(dns.addr);
    wait_resolver(&gw, "trusted");
    for name in companies() {
        let r = record(&gw, TEST_SECRET, &name);
        assert_eq!(
            (&r["reason"], &r["risk_score"]),
            (&json!("safe"), &json!(20)),
            "{name}: {r}"
        );
    }
    // The TLD was asked once and remembered, not once per name.
    assert_eq!(dns.count("com", hickory_proto::rr::RecordType::SOA), 1);
}

#[test]
fn a_resolver_that_starts_lying_is_caught_and_what_it_said_is_dropped() {
    // An honest server first; then it answers NXDOMAIN for everything.
    let dns = DnsServer::start(honest_zones());
    let gw = gateway(dns.addr);
    wait_resolver(&gw, "trusted");
    assert_eq!(
        record(&gw, TEST_SECRET, "selfhosted.test")["is_corporate_email"],
        true
    );
    dns.set_lie(Some(Lie::NxDomain));
    wait_resolver(&gw, "untrusted");
    // The cached answer of the honest days is dropped with the trust: the table answers.
    let r = record(&gw, TEST_SECRET, "selfhosted.test");
    assert_eq!(
        (&r["reason"], &r["is_corporate_email"]),
        (&json!("safe"), &json!(false)),
        "{r}"
    );
    assert_eq!(
        record(&gw, TEST_SECRET, "fresh-name.test")["reason"],
        "safe"
    );
}

#[test]
fn one_projects_silent_names_leave_other_projects_their_mx_evidence() {
    let mut zones = HashMap::new();
    for i in 0..30 {
        zones.insert(
            format!("company{i}.test"),
            Zone {
                mx: vec![(10, "aspmx.l.google.com".to_owned())],
                a: None,
                ttl: 300,
            },
        );
    }
    let dns = DnsServer::start(zones);
    let gw = Gateway::builder()
        .dns(dns.addr)
        .data("mx_providers.csv", &dns::shipped_providers())
        .key_in_project("other", OTHER_SECRET, "test", "other")
        .mx_yaml("max_inflight: 64")
        .mx_yaml("max_inflight_per_project: 16")
        .mx_yaml("query_timeout_ms: 3000")
        .start();
    wait_resolver(&gw, "trusted");
    // 1,000 names, each under a zone of its own whose nameservers never answer: the batch
    // returns within its budget, its lookups go on hanging in the background.
    let names: Vec<String> = (0..1000)
        .map(|i| format!("n{i}.blackhole{i}.test"))
        .collect();
    let r = post_batch(&gw, TEST_SECRET, &names);
    let (status, body) = (r.status, r.json());
    let held = gw.metric("drg_mx_lookups_in_flight").unwrap();
    assert!((1.0..=16.0).contains(&held), "{held} lookups in flight");
    // While they hang, the other project's names get their evidence.
    for i in 0..30 {
        let r = record(&gw, OTHER_SECRET, &format!("company{i}.test"));
        assert_eq!(
            r["mx_provider_label"], "Google Workspace",
            "company{i}: {r}"
        );
        assert_eq!(r["is_corporate_email"], true, "company{i}: {r}");
    }
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 1000);
    // Answered from the table: nothing known of them, nothing condemned.
    assert!(results.iter().all(|r| r["reason"] == "safe"), "{body}");
    // The batch held at most its share: the rest of its names were refused a slot at once.
    assert!(gw.metric("drg_mx_lookups_refused_total").unwrap() >= 900.0);
    // A zone that timed out is its own problem: MX evidence stays on for everyone.
    assert_eq!(gw.metric("drg_mx_breaker_open"), Some(0.0));
}

const BUSY_SECRETS: [&str; 4] = [
    "drg_busy_project_one_key_0123456789abcdefghijk",
    "drg_busy_project_two_key_0123456789abcdefghijk",
    "drg_busy_project_three_key_0123456789abcdefghi",
    "drg_busy_project_four_key_0123456789abcdefghij",
];
const FIFTH_SECRET: &str = "drg_fifth_project_key_0123456789abcdefghijklm";
const THIRD_SECRET: &str = "drg_third_project_key_0123456789abcdefghijklm";

/// `n` names under `zone`'s subdomains, each with a Google Workspace MX.
fn companies_under(zone: &str, n: usize) -> HashMap<String, Zone> {
    (0..n)
        .map(|i| {
            let zone_of_name = Zone {
                mx: vec![(10, "aspmx.l.google.com".to_owned())],
                a: None,
                ttl: 300,
            };
            (format!("company{i}.{zone}"), zone_of_name)
        })
        .collect()
}

/// With the shipped limits (256 slots, 64 a project), four projects whose batches hang under
/// silent zones used to hold every slot, and a fifth got no MX evidence at all; the shares are
/// now fair over the projects asking, and a project that holds slots leaves some free.
#[test]
fn four_busy_projects_leave_a_fifth_its_mx_evidence() {
    let dns = DnsServer::start(companies_under("fifth.test", 20));
    let mut builder = Gateway::builder()
        .dns(dns.addr)
        .data("mx_providers.csv", &dns::shipped_providers())
        .key_in_project("fifth", FIFTH_SECRET, "test", "fifth")
        // The busy projects' lookups hang for 20 s: long after the fifth's are done.
        .mx_yaml("query_timeout_ms: 10000");
    for (i, secret) in BUSY_SECRETS.iter().enumerate() {
        builder = builder.key_in_project(&format!("busy{i}"), secret, "test", &format!("busy{i}"));
    }
    let gw = builder.start();
    wait_resolver(&gw, "trusted");
    for (p, secret) in BUSY_SECRETS.iter().enumerate() {
        let names: Vec<String> = (0..100)
            .map(|i| format!("n{i}.blackhole{p}x{i}.test"))
            .collect();
        assert_eq!(post_batch(&gw, secret, &names).status, 200);
    }
    let held = gw.metric("drg_mx_lookups_in_flight").unwrap();
    assert!(held >= 200.0, "the busy projects hold {held} slots");
    for i in 0..20 {
        let r = record(&gw, FIFTH_SECRET, &format!("company{i}.fifth.test"));
        assert_eq!(
            r["mx_provider_label"], "Google Workspace",
            "company{i}: {r}"
        );
    }
}

/// One project's timeouts under a zone leave that zone alone for that project only; a second
/// project's make it everyone's. Before, the first project's switched it off for everyone.
#[test]
fn a_zones_slowness_is_judged_from_more_than_one_project() {
    let dns = DnsServer::start(companies_under("mixed.test", 4));
    let gw = Gateway::builder()
        .dns(dns.addr)
        .data("mx_providers.csv", &dns::shipped_providers())
        .key_in_project("other", OTHER_SECRET, "test", "other")
        .key_in_project("third", THIRD_SECRET, "test", "third")
        .mx_yaml("query_timeout_ms: 300")
        .start();
    wait_resolver(&gw, "trusted");
    let label = |secret: &str, name: &str| record(&gw, secret, name)["mx_provider_label"].clone();
    // Waits until the lookup under the silent name has timed out (its slot given back).
    let timed_out = |secret: &str, name: &str| {
        let _ = record(&gw, secret, name);
        wait_until(Duration::from_secs(10), || {
            gw.metric("drg_mx_lookups_in_flight") == Some(0.0)
        });
    };
    timed_out(TEST_SECRET, "blackhole1.mixed.test");
    assert_eq!(
        label(TEST_SECRET, "company0.mixed.test"),
        Value::Null,
        "the zone is left alone for the project whose lookup timed out"
    );
    assert_eq!(
        label(OTHER_SECRET, "company1.mixed.test"),
        "Google Workspace",
        "one project's timeouts do not switch the zone off for another"
    );
    timed_out(OTHER_SECRET, "blackhole2.mixed.test");
    assert_eq!(
        label(THIRD_SECRET, "company2.mixed.test"),
        Value::Null,
        "two projects' timeouts switch it off for everyone"
    );
}

/// A nameserver that never answers, counting the datagrams it got (resends included: a silent
/// check sends at least one per canary).
struct CountingBlackHole {
    addr: std::net::SocketAddr,
    got: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl CountingBlackHole {
    fn start() -> CountingBlackHole {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        let got = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = got.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while socket.recv_from(&mut buf).is_ok() {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
        CountingBlackHole { addr, got }
    }

    fn questions(&self) -> usize {
        self.got.load(std::sync::atomic::Ordering::SeqCst)
    }
}
