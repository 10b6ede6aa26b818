//! Privacy relays and masked-email services, against the real binary: every shipped relay
//! domain answers `safe` with `rule: relay` and its service, also when a blocklist names it; an
//! operator's own relay list works the same; relays are never free providers and never ranked.

use crate::common;

use std::path::Path;

use common::*;
use serde_json::Value;

/// The shipped relay list: (domain, service).
fn shipped_relays() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/relays.txt");
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (name, service) = l.split_once('#').unwrap_or((l, ""));
            let name = name.trim();
            (!name.is_empty()).then(|| (name.to_owned(), service.trim().to_owned()))
        })
        .collect()
}

fn lookup(gw: &Gateway, domain: &str, explain: bool) -> Value {
    let q = if explain { "?explain=true" } else { "" };
    let r = gw.get(&format!("/v1/public/domain/{domain}{q}"));
    assert_eq!(
        r.status,
        200,
        "{domain}: {}",
        String::from_utf8_lossy(&r.body)
    );
    r.json()
}

#[test]
fn every_shipped_relay_is_safe_by_rule_relay_even_on_a_blocklist() {
    let relays = shipped_relays();
    assert!(relays.len() >= 20, "{}", relays.len());
    // Every relay on a blocklist and on the broad free list too, and the built-in list on
    // (it names most of them).
    let listed: String = relays.iter().map(|(d, _)| format!("{d}\n")).collect();
    let gw = Gateway::builder()
        .builtin(true)
        .data(
            "relays.txt",
            &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("data/relays.txt"))
                .unwrap(),
        )
        .data("disposable.txt", &listed)
        .data("broad.txt", &listed)
        .data("my-relays.txt", "relay.example.org   # Our own relay\n")
        .data_yaml("broad_free_lists: [broad.txt]")
        .data_yaml("relay_lists: [my-relays.txt]")
        .start();
    for (domain, service) in &relays {
        let v = lookup(&gw, domain, true);
        assert_eq!(v["reason"], "safe", "{domain}: {v}");
        assert_eq!(v["risk_score"], 30, "{domain}: {v}");
        assert_eq!(v["is_free_provider"], false, "{domain}: {v}");
        assert_eq!(v["evidence"]["rule"], "relay", "{domain}: {v}");
        assert_eq!(v["evidence"]["source"], "relays.txt", "{domain}: {v}");
        assert_eq!(v["evidence"]["service"], service.as_str(), "{domain}: {v}");
        assert!(
            !service.is_empty(),
            "{domain}: every shipped relay names its service"
        );
    }
    // Sub-domains of a relay (33mail: <user>.33mail.com) are the relay's.
    let v = lookup(&gw, "someone.33mail.com", true);
    assert_eq!(
        (&v["evidence"]["rule"], &v["evidence"]["via_parent"]),
        (&Value::from("relay"), &Value::from(true)),
        "{v}"
    );
    // The default body keeps exactly its six fields.
    let plain = lookup(&gw, "duck.com", false);
    assert_eq!(plain.as_object().unwrap().len(), 6, "{plain}");
    assert_eq!(plain["mx_provider_label"], "DuckDuckGo Email Protection");
    // An operator's own list.
    let own = lookup(&gw, "relay.example.org", true);
    assert_eq!(own["evidence"]["rule"], "relay", "{own}");
    assert_eq!(own["evidence"]["service"], "Our own relay", "{own}");
    // Never ranked among the flagged.
    let top = gw.get("/v1/public/top-domains?limit=1000").json();
    let ranked: Vec<&str> = top["domains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["domain"].as_str().unwrap())
        .collect();
    for (domain, _) in &relays {
        assert!(!ranked.contains(&domain.as_str()), "{domain} ranked");
    }
    // The overlaps are reported, and a plain blocklisted name is still disposable.
    assert_eq!(lookup(&gw, "mailinator.com", false)["reason"], "disposable");
    wait_until(std::time::Duration::from_secs(10), || {
        gw.log().contains("relay over blocklist")
    });
}
