//! Reports of wrong verdicts against the real binary: `POST /v1/reports` (202), each project
//! seeing its own with their state, the reporting project's answer unchanged; the operator's
//! grouped view on the admin listener and with `reports list`; `reports accept` writing the
//! allow file with a provenance line while lookups go on (none fails), the table reloading, and
//! every report of that domain and verdict marked accepted; `reports reject`.

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const A: &str = "drg_reports_a_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "drg_reports_b_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const C: &str = "drg_reports_c_key_cccccccccccccccccccccccccccccccccccc";
const WEB: &str = "drg_reports_web_key_dddddddddddddddddddddddddddddddddd";

fn report(gw: &Gateway, key: &str, body: Value) -> Response {
    let body = body.to_string();
    send(
        gw,
        "POST",
        "/v1/reports",
        Some(key),
        &[],
        Some(body.as_bytes()),
    )
}

fn mine(gw: &Gateway, key: &str) -> Vec<Value> {
    let r = send(gw, "GET", "/v1/reports", Some(key), &[], None);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["items"].as_array().unwrap().clone()
}

fn reason(gw: &Gateway, key: &str, name: &str) -> String {
    let r = gw
        .conn_as(Some(key))
        .get(&format!("/v1/public/domain/{name}"))
        .unwrap();
    assert_eq!(r.status, 200);
    r.json()["reason"].as_str().unwrap().to_owned()
}

/// `domain-risk-gateway -c <its config> reports <args>`: (success, stdout, stderr).
fn cli(gw: &Gateway, args: &[&str]) -> (bool, String, String) {
    let conf = gw.dir.path().join("gateway.yaml");
    let out = crate::common::command(BIN)
        .arg("-c")
        .arg(&conf)
        .arg("reports")
        .args(args)
        .output()
        .unwrap();
    outcome(out)
}

#[test]
fn reports_reach_the_operator_and_an_accepted_one_reloads_the_table_with_no_failed_request() {
    let gw = Gateway::builder()
        .key_in_project("a", A, "test", "alpha")
        .key_in_project("b", B, "test", "beta")
        .key_in_project("c", C, "test", "gamma")
        .key("web", WEB, "test", &["https://app.example.com"])
        .data("disposable.txt", "shop.example\nother.example\n")
        .gateway_yaml("reports: { max_open_per_project: 2 }")
        .start();
    let r = report(
        &gw,
        A,
        json!({"domain": "Shop.Example", "verdict": "safe", "note": "a paying customer"}),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let sent = r.json();
    assert!(sent["id"].as_str().unwrap().starts_with("r_"), "{sent}");
    assert_eq!(sent["domain"], "shop.example");
    assert_eq!(sent["status"], "open");
    assert_eq!(sent["reported_by"], "a");
    // The reporting project's own answer does not change.
    assert_eq!(reason(&gw, A, "shop.example"), "disposable");
    // Bad ones, a browser key, the bound on open reports.
    report(&gw, A, json!({"domain": "bad..name", "verdict": "safe"}))
        .assert_error(422, "validation_error");
    report(&gw, A, json!({"domain": "x.example", "verdict": "fine"}))
        .assert_error(422, "validation_error");
    report(&gw, WEB, json!({"domain": "x.example", "verdict": "safe"}))
        .assert_error(403, "forbidden");
    assert_eq!(
        report(
            &gw,
            A,
            json!({"domain": "other.example", "verdict": "safe"})
        )
        .status,
        202
    );
    let full = report(
        &gw,
        A,
        json!({"domain": "third.example", "verdict": "disposable"}),
    );
    full.assert_error(409, "conflict");
    // Each project sees its own.
    assert_eq!(mine(&gw, A).len(), 2);
    assert!(mine(&gw, B).is_empty());
    for key in [B, C] {
        let r = report(
            &gw,
            key,
            json!({"domain": "shop.example", "verdict": "safe"}),
        );
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let rejected_id = report(
        &gw,
        C,
        json!({"domain": "fine.example", "verdict": "disposable"}),
    )
    .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // The operator's view: grouped by domain, distinct projects counted.
    wait_until(Duration::from_secs(5), || {
        gw.admin_get("/reports").json()["groups"][0]["safe_projects"] == 3
    });
    let view = gw.admin_get("/reports").json();
    let top = &view["groups"][0];
    assert_eq!(top["domain"], "shop.example", "{view}");
    assert_eq!(top["reports"].as_array().unwrap().len(), 3);
    let (ok, listed, err) = cli(&gw, &["list"]);
    assert!(ok, "{err}");
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed[0]["domain"], "shop.example");
    assert_eq!(listed[0]["safe_projects"], 3);

    // Accepted while lookups go on: none fails, and the table reloads.
    let stop = Arc::new(AtomicBool::new(false));
    let (done, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let addr = gw.addr;
    let load = {
        let (stop, done, failed) = (stop.clone(), done.clone(), failed.clone());
        std::thread::spawn(move || {
            let mut c = Conn::open_as(addr, Some(B)).unwrap();
            while !stop.load(Ordering::Relaxed) {
                // A connection the gateway closed (its request bound) is opened again.
                let r = c.get("/v1/public/domain/other.example").or_else(|_| {
                    c = Conn::open_as(addr, Some(B)).unwrap();
                    c.get("/v1/public/domain/other.example")
                });
                match r {
                    Ok(r) if r.status == 200 => done.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    };
    let id = sent["id"].as_str().unwrap();
    let (ok, out, err) = cli(&gw, &["accept", id]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("allowlist.txt"), "{out}");
    let allow = std::fs::read_to_string(gw.data_path("allowlist.txt")).unwrap();
    let provenance = allow
        .lines()
        .find(|l| l.starts_with("# shop.example:"))
        .unwrap_or_else(|| panic!("{allow}"));
    assert!(
        provenance.contains("3 project(s) (alpha, beta, gamma)"),
        "{provenance}"
    );
    assert!(provenance.contains(id), "{provenance}");
    assert!(allow.lines().any(|l| l == "shop.example"), "{allow}");
    wait_until(Duration::from_secs(10), || {
        reason(&gw, C, "shop.example") == "safe"
    });
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "a lookup failed during the reload"
    );
    assert!(done.load(Ordering::Relaxed) > 10);
    // Every open report of that domain and verdict is accepted; each project sees it.
    wait_until(Duration::from_secs(5), || {
        mine(&gw, B)[0]["status"] == "accepted"
    });
    let a = mine(&gw, A);
    let shop = a.iter().find(|r| r["domain"] == "shop.example").unwrap();
    assert_eq!(shop["status"], "accepted");
    assert!(shop["decided_at"].as_str().is_some());
    // Room again for A: a decided report is no longer open.
    assert_eq!(
        report(
            &gw,
            A,
            json!({"domain": "third.example", "verdict": "disposable"})
        )
        .status,
        202
    );

    // Rejected: only that report; deciding it again is refused.
    let (ok, out, err) = cli(&gw, &["reject", &rejected_id]);
    assert!(ok, "{out}{err}");
    let (ok, _, err) = cli(&gw, &["accept", &rejected_id]);
    assert!(!ok && err.contains("already rejected"), "{err}");
    let (ok, _, err) = cli(&gw, &["accept", "r_nope"]);
    assert!(!ok && err.contains("no report"), "{err}");
    wait_until(Duration::from_secs(5), || {
        mine(&gw, C)
            .iter()
            .any(|r| r["id"] == rejected_id.as_str() && r["status"] == "rejected")
    });
    assert_eq!(
        reason(&gw, C, "fine.example"),
        "safe",
        "a rejection lists nothing"
    );
    // The open view no longer holds the decided domains.
    let open = gw.admin_get("/reports").json();
    let domains: Vec<&str> = open["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["domain"].as_str().unwrap())
        .collect();
    assert!(!domains.contains(&"shop.example"), "{open}");
}
