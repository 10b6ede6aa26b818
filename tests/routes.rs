//! Local routes of the real gateway: lookups, top-domains, errors, health, keep-alive.

use crate::common;
use common::*;

const DISPOSABLE: &str = "# test list\nmailinator.com\nyopmail.com\nxn--5nx.cc\n";
const RECORDS: &str = "domain,reason,risk_score,mx_provider_label,flag_weight\n\
                       team.example,role_account,60,,5\n\
                       dead.example,undeliverable,90,,\n\
                       corp.example,safe,3,Google Workspace,\n";

fn gateway() -> Gateway {
    Gateway::builder()
        .data("disposable.txt", DISPOSABLE)
        .data("allowlist.txt", "126.com\n")
        .data("free_providers.txt", "gmail.com\n126.com\n")
        .data("domains.csv", RECORDS)
        .start()
}

#[test]
fn domain_lookup_answers_the_six_fields() {
    let gw = gateway();
    let r = gw.get("/v1/public/domain/mailinator.com");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("application/json; charset=utf-8")
    );
    assert_eq!(
        r.json(),
        serde_json::json!({
            "domain": "mailinator.com", "risk_score": 100, "reason": "disposable",
            "is_free_provider": false, "is_corporate_email": false, "mx_provider_label": null
        })
    );
    let sub = gw.get("/v1/public/domain/x.y.mailinator.com").json();
    assert_eq!(sub["reason"], "disposable");
    assert_eq!(sub["risk_score"], 95);
    assert_eq!(sub["domain"], "x.y.mailinator.com");

    let free = gw.get("/v1/public/domain/gmail.com").json();
    assert_eq!(free["reason"], "safe");
    assert_eq!(free["is_free_provider"], true);

    let allowed = gw.get("/v1/public/domain/126.com").json();
    assert_eq!(allowed["reason"], "safe");
    assert_eq!(allowed["risk_score"], 5);

    let role = gw.get("/v1/public/domain/team.example").json();
    assert_eq!(role["reason"], "role_account");
    assert_eq!(role["risk_score"], 60);
    assert_eq!(
        gw.get("/v1/public/domain/dead.example").json()["reason"],
        "undeliverable"
    );
    assert_eq!(
        gw.get("/v1/public/domain/corp.example").json()["mx_provider_label"],
        "Google Workspace"
    );
    let unknown = gw.get("/v1/public/domain/example.org").json();
    assert_eq!(unknown["reason"], "safe");
    assert_eq!(unknown["risk_score"], 20);
}

#[test]
fn names_are_normalised_and_idn_answered_in_punycode() {
    let gw = gateway();
    for (path, canonical) in [
        ("MailInator.COM.", "mailinator.com"),
        ("mailinator%2Ecom", "mailinator.com"),
        ("b%C3%BCcher.de", "xn--bcher-kva.de"),
        ("B%C3%9CCHER.DE", "xn--bcher-kva.de"),
        // U+7075 `.cc`: on the list in punycode, queried in Unicode.
        ("%E7%81%B5.cc", "xn--5nx.cc"),
    ] {
        let r = gw.get(&format!("/v1/public/domain/{path}"));
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.json()["domain"], canonical, "{path}");
    }
    assert_eq!(
        gw.get("/v1/public/domain/%E7%81%B5.cc").json()["reason"],
        "disposable"
    );
}

#[test]
fn invalid_domains_get_422_with_a_reason() {
    let gw = gateway();
    let long_label = "a".repeat(64);
    let long_name = vec!["a".repeat(60); 5].join(".");
    for (path, needle) in [
        ("", "empty"),
        ("localhost", "single label"),
        ("a..com", "empty label"),
        ("-a.com", "hyphen"),
        ("a_b.com", "'_'"),
        ("a%20b.com", "' '"),
        ("192.168.0.1", "numeric"),
        ("user%40example.com", "/v1/check"),
        (&format!("{long_label}.com"), "63"),
        (&format!("{long_name}.com"), "253"),
        ("%FF.com", "UTF-8"),
        ("a/b.com", "'/'"),
    ] {
        gw.get(&format!("/v1/public/domain/{path}"))
            .assert_invalid(needle, path);
    }
}

#[test]
fn top_domains_ranks_flagged_entries_and_honours_limit() {
    let gw = gateway();
    let v = gw.get("/v1/public/top-domains").json();
    let names: Vec<_> = v["domains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["domain"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        names,
        [
            "team.example",
            "mailinator.com",
            "xn--5nx.cc",
            "yopmail.com",
            "dead.example"
        ]
    );
    assert_eq!(v["count"], 5);
    for d in v["domains"].as_array().unwrap() {
        assert_ne!(d["reason"], "safe");
        assert_eq!(d.as_object().unwrap().len(), 3, "{d}");
    }
    let two = gw.get("/v1/public/top-domains?limit=2").json();
    assert_eq!(two["count"], 2);
    assert_eq!(two["domains"].as_array().unwrap().len(), 2);
    for bad in ["0", "1001", "x"] {
        gw.get(&format!("/v1/public/top-domains?limit={bad}"))
            .assert_error(422, "validation_error");
    }
}

#[test]
fn unknown_routes_wrong_methods_and_health() {
    let gw = gateway();
    gw.get("/").assert_error(404, "not_found");
    gw.get("/v1/nothing").assert_error(404, "not_found");
    let mut c = gw.conn();
    let r = c
        .request(
            "POST",
            "/v1/public/domain/a.com",
            &[("Content-Length", "0")],
        )
        .unwrap();
    r.assert_error(405, "method_not_allowed");
    assert_eq!(r.header("allow"), Some("GET, OPTIONS"));
    let r = gw.get("/healthz");
    assert_eq!((r.status, r.json()["status"].clone()), (200, "ok".into()));
    let r = gw.get("/readyz");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["status"], "ready");
}

#[test]
fn local_answers_keep_the_connection_open() {
    let gw = gateway();
    let mut c = gw.conn();
    let paths = [
        ("/v1/public/domain/mailinator.com", 200),
        ("/v1/public/domain/a_b.com", 422),
        ("/nowhere", 404),
        ("/v1/public/top-domains?limit=1", 200),
        ("/healthz", 200),
        ("/v1/check/", 422),
        ("/v1/public/domain/gmail.com", 200),
    ];
    for _ in 0..3 {
        for (p, status) in paths {
            let r = c.get(p).unwrap_or_else(|e| panic!("{p}: {e}"));
            assert_eq!(r.status, status, "{p}");
            assert!(r.header("content-length").is_some(), "{p}");
            assert_ne!(r.header("connection"), Some("close"), "{p}");
        }
    }
    assert!(!c.is_closed());
}

#[test]
fn readyz_reports_draining_after_sigterm() {
    let mut gw = gateway();
    assert_eq!(gw.get("/readyz").status, 200);
    gw.signal("TERM");
    // During the 1 s drain the gateway still accepts and answers, but is not ready.
    let r = wait_for_draining(&gw);
    assert_eq!(r.json()["status"], "draining");
    assert_eq!(gw.get("/v1/public/domain/mailinator.com").status, 200);
    assert!(
        gw.wait_exit(std::time::Duration::from_secs(10)),
        "gateway did not exit"
    );
}

/// Polls the public `/readyz` until it answers 503 (the drain began) and returns that answer.
fn wait_for_draining(gw: &Gateway) -> Response {
    let mut last = None;
    wait_until(std::time::Duration::from_secs(5), || {
        let r = gw.conn().get("/readyz").unwrap();
        let draining = r.status == 503;
        last = Some(r);
        draining
    });
    last.unwrap()
}
