//! Live top-domains rank names on evidence, on the real gateway with a real DNS server on
//! loopback: a name flagged only because DNS found no mail host for it (anyone with a key can
//! make such names up) is not ranked until a second project flags it; list and disposable-MX
//! evidence rank at once.

use crate::common;
use crate::dns;

use common::*;
use dns::{DnsServer, Zone};
use std::collections::HashMap;
use std::time::Duration;

const OTHER_SECRET: &str = "drg_other_project_key_0123456789abcdefghijklm";
const TOP: &str = "top_domains: { render_interval_ms: 50, persist_interval_ms: 200, \
                   state_file: state/top.json }";

fn zones() -> HashMap<String, Zone> {
    let mx = |list: &[(u16, &str)]| Zone {
        mx: list.iter().map(|(p, h)| (*p, h.to_string())).collect(),
        a: None,
        ttl: 300,
    };
    let mut z = HashMap::new();
    // Mail at a disposable-mail service: evidence of its own.
    z.insert("dispo-mx.test".into(), mx(&[(10, "mx1.mailinator.com")]));
    // No mail host at all: `undeliverable`, and nothing else known.
    z.insert("nomail.test".into(), mx(&[]));
    // Any other name is NXDOMAIN: `undeliverable` as well.
    z
}

fn look_up(gw: &Gateway, secret: &str, lookups: &[(&str, usize)]) {
    let mut c = Conn::open_as(gw.addr, Some(secret)).unwrap();
    for (name, n) in lookups {
        for _ in 0..*n {
            let r = c.get(&format!("/v1/public/domain/{name}")).unwrap();
            assert_eq!(r.status, 200, "{name}");
        }
    }
}

/// `(domain, reason)` of the whole ranking.
fn ranking(gw: &Gateway) -> Vec<(String, String)> {
    let r = gw.get("/v1/public/top-domains?limit=100");
    assert_eq!(r.status, 200);
    r.json()["domains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["domain"].as_str().unwrap().to_owned(),
                d["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Waits until the ranking is exactly `want`.
fn wait_for(gw: &Gateway, want: &[(&str, &str)]) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(d, r)| (d.to_string(), r.to_string()))
        .collect();
    let mut last = Vec::new();
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until(Duration::from_secs(15), || {
            last = ranking(gw);
            last == want
        })
    }));
    assert!(
        ok.is_ok(),
        "ranking {last:?}, want {want:?}; log:\n{}",
        gw.log()
    );
}

#[test]
fn names_without_evidence_rank_once_a_second_project_flags_them() {
    let dns = DnsServer::start(zones());
    let providers = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/mx_providers.csv"
    ))
    .unwrap();
    let gw = Gateway::builder()
        .dns(dns.addr)
        .data("mx_providers.csv", &providers)
        .data("disposable.txt", "listed.example\n")
        .key_in_project("other", OTHER_SECRET, "test", "other")
        .gateway_yaml(TOP)
        .start();
    // One project flags made-up names many times, and names with evidence a few times.
    look_up(
        &gw,
        TEST_SECRET,
        &[
            ("made-up.test", 5),
            ("nomail.test", 4),
            ("dispo-mx.test", 2),
            ("listed.example", 1),
        ],
    );
    wait_for(
        &gw,
        &[
            ("dispo-mx.test", "disposable"),
            ("listed.example", "disposable"),
        ],
    );
    // A render that started after the one above: every flag of the lookups above was drained
    // by then, so the made-up names are held back, not late.
    look_up(&gw, TEST_SECRET, &[("listed.example", 2)]);
    wait_for(
        &gw,
        &[
            ("listed.example", "disposable"),
            ("dispo-mx.test", "disposable"),
        ],
    );
    // A second project flags one of them: it ranks with every flag it had.
    look_up(&gw, OTHER_SECRET, &[("made-up.test", 1)]);
    wait_for(
        &gw,
        &[
            ("made-up.test", "undeliverable"),
            ("listed.example", "disposable"),
            ("dispo-mx.test", "disposable"),
        ],
    );
}

#[test]
fn one_project_is_enough_when_so_configured() {
    let dns = DnsServer::start(zones());
    let gw = Gateway::builder()
        .dns(dns.addr)
        .gateway_yaml(
            "top_domains: { render_interval_ms: 50, state_file: state/top.json, \
             no_mx_min_projects: 1 }",
        )
        .start();
    look_up(&gw, TEST_SECRET, &[("made-up.test", 2), ("nomail.test", 1)]);
    wait_for(
        &gw,
        &[
            ("made-up.test", "undeliverable"),
            ("nomail.test", "undeliverable"),
        ],
    );
}
