//! `X-Dataset-Version` on every answer (local, error, proxied, after a reload) and the evidence
//! of `?explain=true` and `lookup`, against the real binary.

use crate::common;
// Only the server is used here.
use crate::dns;

use common::*;
use dns::{DnsServer, Zone};
use std::collections::HashMap;
use std::time::Duration;

/// `g<generation>-<six hex digits>`, split in its two parts.
fn version(r: &Response, what: &str) -> (u64, String) {
    let v = r
        .header("x-dataset-version")
        .unwrap_or_else(|| panic!("{what}: no X-Dataset-Version in {:?}", r.headers));
    let (g, hash) = v
        .strip_prefix('g')
        .and_then(|v| v.split_once('-'))
        .unwrap_or_else(|| panic!("{what}: {v}"));
    assert!(
        hash.len() == 6 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{what}: {v}"
    );
    (g.parse().unwrap(), hash.to_owned())
}

const BROWSER_SECRET: &str = "drg_browser_key_0123456789abcdefghijklmnopqrstuv";
const TINY_SECRET: &str = "drg_tiny_plan_key_0123456789abcdefghijklmnopqrst";

#[test]
fn every_answer_carries_the_dataset_version_and_the_backend_cannot_set_it() {
    let up = Upstream::start(Duration::ZERO);
    let gw = Gateway::builder()
        .data("disposable.txt", "dispo.example\n")
        .key("browser", BROWSER_SECRET, "test", &["https://app.example"])
        .key("tiny", TINY_SECRET, "tiny", &[])
        .plan("tiny", 1)
        .upstream(up.addr)
        .start();
    let local = gw.get("/v1/public/domain/dispo.example");
    assert_eq!(local.status, 200);
    let (generation, hash) = version(&local, "local answer");
    assert_eq!(generation, 1, "the table loaded at start");
    let ours = format!("g1-{hash}");

    let mut anon = gw.conn_as(None);
    let mut tiny = gw.conn_as(Some(TINY_SECRET));
    let mut browser = gw.conn_as(Some(BROWSER_SECRET));
    let evil = [("Origin", "https://evil.example")];
    let app = [("Origin", "https://app.example")];
    let answers = [
        ("422", gw.get("/v1/public/domain/not_a_domain"), 422),
        (
            "bad explain",
            gw.get("/v1/public/domain/a.com?explain=1"),
            422,
        ),
        ("404", gw.get("/nowhere"), 404),
        ("top-domains", gw.get("/v1/public/top-domains"), 200),
        ("usage", gw.get("/v1/usage"), 200),
        ("proxied", gw.get("/v1/check/user@example.com"), 200),
        ("healthz", anon.get("/healthz").unwrap(), 200),
        ("readyz", anon.get("/readyz").unwrap(), 200),
        ("openapi", anon.get("/v1/openapi.json").unwrap(), 200),
        (
            "preflight",
            anon.request("OPTIONS", "/v1/public/domain/a.com", &app)
                .unwrap(),
            204,
        ),
        ("401", anon.get("/v1/public/domain/a.com").unwrap(), 401),
        (
            "403",
            browser
                .request("GET", "/v1/public/domain/a.com", &evil)
                .unwrap(),
            403,
        ),
        ("tiny 1", tiny.get("/v1/public/domain/a.com").unwrap(), 200),
        ("429", tiny.get("/v1/public/domain/a.com").unwrap(), 429),
    ];
    for (what, r, status) in &answers {
        assert_eq!(
            r.status,
            *status,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.header("x-dataset-version"), Some(&*ours), "{what}");
        assert_eq!(
            r.headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case("x-dataset-version"))
                .count(),
            1,
            "{what}: one value only: {:?}",
            r.headers
        );
    }
    // The proxied answer did come from the backend, which sends a version of its own.
    assert_eq!(up.requests().len(), 1);
    let direct = Conn::open_as(up.addr, None)
        .unwrap()
        .get("/v1/check/user@example.com")
        .unwrap();
    assert_eq!(direct.header("x-dataset-version"), Some("g999-backend"));
    // A browser may read it.
    let r = browser
        .request("GET", "/v1/public/domain/a.com", &app)
        .unwrap();
    assert_eq!(r.status, 200);
    let exposed = r.header("access-control-expose-headers").unwrap();
    assert!(exposed.contains("X-Dataset-Version"), "{exposed}");
    // The operator sees the same version on the admin listener.
    let ready = gw.admin_get("/readyz").json();
    assert_eq!(ready["dataset_version"], ours, "{ready}");
}

#[test]
fn a_failed_proxy_answer_carries_the_version_too() {
    // The default upstream refuses connections: 502.
    let gw = Gateway::builder().start();
    let r = gw.get("/v1/check/user@example.com");
    assert_eq!(r.status, 502);
    assert_eq!(version(&r, "502").0, 1);
}

#[test]
fn the_version_changes_with_each_reload_and_only_the_content_changes_the_hash() {
    let gw = Gateway::builder()
        .data("disposable.txt", "dispo.example\n")
        .start();
    let now = |gw: &Gateway| version(&gw.get("/v1/public/domain/a.com"), "lookup");
    let (g1, h1) = now(&gw);
    assert_eq!(g1, 1);
    write_atomic(
        &gw.data_path("disposable.txt"),
        "dispo.example\nnew-dispo.example\n",
    );
    wait_until(Duration::from_secs(5), || now(&gw).0 == 2);
    let (_, h2) = now(&gw);
    assert_ne!(h1, h2, "new content, new hash");
    assert_eq!(
        gw.get("/v1/public/domain/new-dispo.example").json()["reason"],
        "disposable"
    );
    // Back to the first content: a new generation, the first hash.
    write_atomic(&gw.data_path("disposable.txt"), "dispo.example\n");
    wait_until(Duration::from_secs(5), || now(&gw).0 == 3);
    assert_eq!(now(&gw).1, h1);
}

fn explained(gw: &Gateway, domain: &str) -> serde_json::Value {
    let r = gw.get(&format!("/v1/public/domain/{domain}?explain=true"));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

#[test]
fn explain_names_the_rule_the_entry_and_its_source_line() {
    let gw = Gateway::builder()
        .data("disposable.txt", "# ours\ndispo.example\n")
        .data("block.conf", "one.example\nthrowaway.example\n")
        .data("allowlist.txt", "kept.example\n")
        .data("broad.txt", "webmail.example\nthrowaway.example\n")
        .data(
            "domains.csv",
            "domain,reason,risk_score\n# a comment\nteam.example,role_account,60\n",
        )
        .data_yaml("blocklists: [block.conf]")
        .data_yaml("broad_free_lists: [broad.txt]")
        .start();
    let ev = |d: &str| explained(&gw, d)["evidence"].clone();
    let e = ev("dispo.example");
    assert_eq!(
        (&e["rule"], &e["matched"], &e["via_parent"]),
        (&"blocklist".into(), &"dispo.example".into(), &false.into()),
        "{e}"
    );
    assert_eq!(
        (&e["source"], &e["line"]),
        (&"disposable.txt".into(), &2.into()),
        "{e}"
    );
    // A subdomain of a blocklisted parent names the parent; on a broad free list too, the
    // blocklist wins.
    let body = explained(&gw, "a.b.throwaway.example");
    assert_eq!(body["reason"], "disposable");
    assert_eq!(body["is_free_provider"], false);
    let e = &body["evidence"];
    assert_eq!(e["rule"], "blocklist", "{e}");
    assert_eq!(e["matched"], "throwaway.example");
    assert_eq!(e["via_parent"], true);
    assert_eq!(
        (&e["source"], &e["line"]),
        (&"block.conf".into(), &2.into()),
        "{e}"
    );
    let e = ev("mx.kept.example");
    assert_eq!(
        (&e["rule"], &e["matched"], &e["source"], &e["line"]),
        (
            &"allowlist".into(),
            &"kept.example".into(),
            &"allowlist.txt".into(),
            &1.into()
        ),
        "{e}"
    );
    let e = ev("team.example");
    assert_eq!(
        (&e["rule"], &e["source"], &e["line"]),
        (&"record".into(), &"domains.csv".into(), &3.into()),
        "{e}"
    );
    let e = ev("webmail.example");
    assert_eq!(
        (&e["rule"], &e["source"], &e["line"]),
        (
            &"broad_free_provider".into(),
            &"broad.txt".into(),
            &1.into()
        ),
        "{e}"
    );
    let e = ev("nothing.example");
    assert_eq!(e["rule"], "unknown");
    assert!(e["source"].is_null() && e["mx"].is_null(), "{e}");
    // Without explain (or with explain=false), exactly the six fields.
    for q in ["", "?explain=false"] {
        let body = gw
            .get(&format!("/v1/public/domain/dispo.example{q}"))
            .json();
        let keys: Vec<&String> = body.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 6, "{q}: {body}");
        assert!(body.get("evidence").is_none(), "{q}");
    }
    // The full paths of the data folder are not shown.
    let dir = gw.dir.path().display().to_string();
    assert!(!explained(&gw, "dispo.example").to_string().contains(&dir));
}

#[test]
fn explain_names_the_builtin_list() {
    let gw = Gateway::builder().builtin(true).start();
    let e = explained(&gw, "x.mailinator.com")["evidence"].clone();
    assert_eq!(e["rule"], "blocklist", "{e}");
    assert_eq!(e["matched"], "mailinator.com");
    assert_eq!(e["source"], "builtin (mailchecker)");
    assert!(e["line"].is_null(), "{e}");
}

#[test]
fn lookup_prints_the_same_evidence() {
    let gw = Gateway::builder()
        .data("block.conf", "one.example\nthrowaway.example\n")
        .data_yaml("blocklists: [block.conf]")
        .start();
    let api = explained(&gw, "x.throwaway.example")["evidence"].clone();
    let out = crate::common::command(BIN)
        .args([
            "-c",
            gw.conf.to_str().unwrap(),
            "lookup",
            "x.throwaway.example",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("rule: blocklist, via parent domain throwaway.example (block.conf:2)"),
        "{text}"
    );
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("evidence: "))
        .unwrap_or_else(|| panic!("no evidence line: {text}"));
    let cli: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(cli, api);
    assert!(text.contains("dataset: g1-"), "{text}");
}

#[test]
fn explain_shows_the_mx_hosts_and_the_pattern_that_decided() {
    let zone = |host: &str| Zone {
        mx: vec![(10, host.to_owned())],
        a: None,
        ttl: 300,
    };
    let server = DnsServer::start(HashMap::from([
        ("dispo-mx.test".to_owned(), zone("mx1.mailinator.com")),
        ("own.test".to_owned(), zone("mail.own.test")),
    ]));
    let gw = Gateway::builder()
        .dns(server.addr)
        .data(
            "mx_providers.csv",
            "match,pattern,label,kind\nsuffix,mailinator.com,Mailinator,disposable\n",
        )
        .start();
    let body = explained(&gw, "dispo-mx.test");
    assert_eq!(body["reason"], "disposable");
    assert_eq!(
        body["evidence"],
        serde_json::json!({
            "rule": "mx",
            "matched": null,
            "via_parent": false,
            "source": null,
            "line": null,
            "mx": {"status": "hosts", "hosts": [{"preference": 10, "host": "mx1.mailinator.com"}]},
            "mx_provider": {
                "label": "Mailinator",
                "kind": "disposable",
                "host": "mx1.mailinator.com",
                "pattern": "suffix mailinator.com"
            }
        })
    );
    // Hosts no pattern knows are shown, but did not decide.
    let e = explained(&gw, "own.test")["evidence"].clone();
    assert_eq!(e["rule"], "unknown", "{e}");
    assert_eq!(e["mx"]["hosts"][0]["host"], "mail.own.test", "{e}");
    assert!(e["mx_provider"].is_null(), "{e}");
}
