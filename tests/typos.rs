//! Typos of the big providers, against the real binary and a real DNS server on loopback:
//! `did_you_mean` in the evidence and the `X-Did-You-Mean` header, the six-field body unchanged,
//! no suggestion for a domain receiving mail on hosts of its own, and none for the shipped
//! organisation domains.

use crate::common;
use crate::dns;

use std::collections::HashMap;
use std::path::Path;

use common::*;
use dns::{DnsServer, Zone};
use drg_domain::{classify, DomainName};
use drg_gateway::config::Settings;

/// A browser key (with origins), as a signup form holds.
const BROWSER: &str = "drg_browser_key_for_typo_tests_0123456789abcdefgh";

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

fn zones() -> HashMap<String, Zone> {
    let mx = |host: &str| Zone {
        mx: vec![(10, host.to_owned())],
        a: None,
        ttl: 300,
    };
    let mut z = HashMap::new();
    // A real company one edit from gmail.com, with its own mail host: not "corrected".
    z.insert("gmai.co".into(), mx("mail.gmai.co"));
    // A typo domain whose mail goes to a throwaway service: still a typo.
    z.insert("gmial.com".into(), mx("mx1.mailinator.com"));
    z
}

#[test]
fn typos_get_a_suggestion_in_evidence_and_header_unless_they_have_their_own_mail() {
    let server = DnsServer::start(zones());
    let gw = Gateway::builder()
        .dns(server.addr)
        .data("free_providers.txt", &repo_file("data/free_providers.txt"))
        .data("mx_providers.csv", &repo_file("data/mx_providers.csv"))
        .data("disposable.txt", "hotmial.com\nthrowaway-inbox.com\n")
        .key("form", BROWSER, "test", &["https://signup.example"])
        .start();
    // Blocklisted typo (no DNS asked), throwaway-MX typo, and a typo with no domain at all.
    for (typo, provider) in [
        ("hotmial.com", "hotmail.com"),
        ("gmial.com", "gmail.com"),
        ("outlok.com", "outlook.com"),
    ] {
        let r = gw.get(&format!("/v1/public/domain/{typo}?explain=true"));
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-did-you-mean"), Some(provider), "{typo}");
        assert_eq!(r.json()["evidence"]["did_you_mean"], provider, "{typo}");
        // Without explain: the same header, and the body keeps exactly its six fields.
        let plain = gw.get(&format!("/v1/public/domain/{typo}"));
        assert_eq!(plain.header("x-did-you-mean"), Some(provider), "{typo}");
        assert_eq!(plain.json().as_object().unwrap().len(), 6, "{typo}");
    }
    // The company at gmai.co has its own working MX: no suggestion.
    let r = gw.get("/v1/public/domain/gmai.co?explain=true");
    assert_eq!(r.header("x-did-you-mean"), None);
    assert!(
        r.json()["evidence"].get("did_you_mean").is_none(),
        "{}",
        r.json()
    );
    // Providers themselves and unrelated names, listed or not: none.
    for name in [
        "gmail.com",
        "example.org",
        "mail.com",
        "throwaway-inbox.com",
    ] {
        let r = gw.get(&format!("/v1/public/domain/{name}?explain=true"));
        assert_eq!(r.header("x-did-you-mean"), None, "{name}");
    }
    // Browsers may read it (signup forms call from the page with a browser key).
    let r = gw
        .conn_as(Some(BROWSER))
        .request(
            "GET",
            "/v1/public/domain/hotmial.com",
            &[("Origin", "https://signup.example")],
        )
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-did-you-mean"), Some("hotmail.com"));
    let exposed = r
        .header("access-control-expose-headers")
        .unwrap_or_default();
    assert!(exposed.contains("X-Did-You-Mean"), "{exposed}");
}

#[test]
fn no_shipped_organisation_domain_gets_a_suggestion() {
    let settings =
        Settings::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/gateway.yaml")).unwrap();
    let table = settings.gateway.data_sources().build().unwrap();
    let orgs = repo_file("tests/fixtures/org_domains.txt");
    let mut checked = 0;
    for d in orgs
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let name = DomainName::parse(d).unwrap();
        let v = classify(&table, &name, None);
        assert_eq!(v.did_you_mean, None, "{d}");
        checked += 1;
    }
    assert!(checked > 300, "{checked}");
}
