//! Per-project overrides against the real binary: `PUT /v1/overrides/{domain}` changes that
//! project's answers on GET and batch (a name covering its subdomains), never another
//! project's, survives a restart; bounded by the plan, server keys only, not counted. Two
//! gateways on one PostgreSQL control store (and one Redis for counts): a change made on one
//! answers on the other within a second, and a `FLUSHALL` of Redis changes none of them.

use crate::common;
use crate::postgres::Postgres;
use crate::redis_server::RedisServer;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const ACME: &str = "drg_overrides_acme_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const OTHER: &str = "drg_overrides_other_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const WEB: &str = "drg_overrides_web_key_cccccccccccccccccccccccccccccccc";

/// Projects `acme` (on `team`: 2 overrides at most) and `other`, and a browser key.
fn builder() -> GatewayBuilder {
    Gateway::builder()
        .plan_yaml(
            "team",
            "{ monthly_limit: 100000, max_overrides: 2, max_keys: 5 }",
        )
        .key_in_project("acme-server", ACME, "team", "acme")
        .key_in_project("other-server", OTHER, "team", "other")
        .key("web", WEB, "team", &["https://app.example.com"])
        .data("disposable.txt", "mailinator.com\n")
}

fn put(gw: &Gateway, key: &str, domain: &str, body: Value) -> Response {
    let body = body.to_string();
    send(
        gw,
        "PUT",
        &format!("/v1/overrides/{domain}"),
        Some(key),
        &[],
        Some(body.as_bytes()),
    )
}

fn delete(gw: &Gateway, key: &str, domain: &str) -> Response {
    send(
        gw,
        "DELETE",
        &format!("/v1/overrides/{domain}"),
        Some(key),
        &[],
        None,
    )
}

/// `(reason, risk_score)` of `name` for `key` on GET.
fn answer(gw: &Gateway, key: &str, name: &str) -> (String, u64) {
    let r = gw
        .conn_as(Some(key))
        .get(&format!("/v1/public/domain/{name}"))
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    (
        v["reason"].as_str().unwrap().to_owned(),
        v["risk_score"].as_u64().unwrap(),
    )
}

/// `(reason, risk_score)` of each name for `key` on the batch route.
fn batch(gw: &Gateway, key: &str, names: &[&str]) -> Vec<(String, u64)> {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let r = post_batch(gw, key, &names);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["reason"].as_str().unwrap().to_owned(),
                v["risk_score"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn pair(reason: &str, score: u64) -> (String, u64) {
    (reason.to_owned(), score)
}

#[test]
fn an_override_changes_its_projects_answers_only_and_survives_a_restart() {
    let gw = builder().start();
    assert_eq!(answer(&gw, ACME, "shop.example").0, "safe");
    let r = put(
        &gw,
        ACME,
        "shop.example",
        json!({"verdict": "block", "note": "chargebacks, ticket 4411"}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let item = r.json();
    assert_eq!(item["domain"], "shop.example");
    assert_eq!(item["verdict"], "block");
    assert_eq!(item["set_by"], "acme-server");
    // Set again (a PUT replaces the whole override): 200.
    let r = put(
        &gw,
        ACME,
        "shop.example",
        json!({"verdict": "block", "note": "chargebacks, ticket 4411"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // A listed name allowed, keeping what the table says of it.
    let r = put(
        &gw,
        ACME,
        "mailinator.com",
        json!({"verdict": "allow", "note": "our QA inbox"}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let blocked = pair("disposable", 100);
    let allowed = pair("safe", 0);
    assert_eq!(answer(&gw, ACME, "shop.example"), blocked);
    assert_eq!(answer(&gw, ACME, "eu.shop.example"), blocked, "subdomains");
    assert_eq!(answer(&gw, ACME, "mailinator.com"), allowed);
    assert_eq!(
        batch(
            &gw,
            ACME,
            &["shop.example", "mailinator.com", "eu.shop.example"]
        ),
        [blocked.clone(), allowed.clone(), blocked.clone()]
    );
    // Never another project's.
    assert_eq!(answer(&gw, OTHER, "shop.example").0, "safe");
    assert_eq!(answer(&gw, OTHER, "mailinator.com").0, "disposable");
    assert_eq!(
        batch(&gw, OTHER, &["shop.example", "mailinator.com"])
            .iter()
            .map(|p| p.0.as_str())
            .collect::<Vec<_>>(),
        ["safe", "disposable"]
    );
    // `?explain=true` names the rule, the note, who and when.
    let r = gw
        .conn_as(Some(ACME))
        .get("/v1/public/domain/eu.shop.example?explain=true")
        .unwrap();
    let ev = &r.json()["evidence"];
    assert_eq!(ev["rule"], "project_block", "{ev}");
    assert_eq!(ev["override"]["domain"], "shop.example");
    assert_eq!(ev["override"]["note"], "chargebacks, ticket 4411");
    assert_eq!(ev["override"]["set_by"], "acme-server");
    assert!(ev["override"]["set_at"].as_str().unwrap().ends_with('Z'));

    // The plan's bound (2), a bad name, a bad body, a browser key.
    let full = put(&gw, ACME, "third.example", json!({"verdict": "allow"}));
    full.assert_error(409, "conflict");
    assert!(full.text().contains("max_overrides: 2"));
    put(&gw, ACME, "bad..name", json!({"verdict": "allow"})).assert_error(422, "validation_error");
    put(&gw, ACME, "x.example", json!({"verdict": "maybe"})).assert_error(422, "validation_error");
    put(
        &gw,
        ACME,
        "x.example",
        json!({"verdict": "allow", "extra": 1}),
    )
    .assert_error(422, "validation_error");
    put(&gw, WEB, "x.example", json!({"verdict": "allow"})).assert_error(403, "forbidden");
    let r = send(&gw, "GET", "/v1/overrides", Some(WEB), &[], None);
    r.assert_error(403, "forbidden");

    // The list, paged by name.
    let page = send(&gw, "GET", "/v1/overrides?limit=1", Some(ACME), &[], None).json();
    assert_eq!(page["items"][0]["domain"], "mailinator.com");
    assert_eq!(page["next_cursor"], "mailinator.com");
    let rest = send(
        &gw,
        "GET",
        "/v1/overrides?cursor=mailinator.com",
        Some(ACME),
        &[],
        None,
    )
    .json();
    assert_eq!(rest["items"][0]["domain"], "shop.example");
    assert_eq!(rest["next_cursor"], Value::Null);
    let theirs = send(&gw, "GET", "/v1/overrides", Some(OTHER), &[], None).json();
    assert_eq!(theirs["items"], json!([]));
    // Not counted: the month holds the lookups only.
    let usage = gw.conn_as(Some(ACME)).get("/v1/usage").unwrap().json();
    let month = usage["month_count"].as_u64().unwrap();

    // A restart keeps them.
    let dir = gw.stop();
    let gw = builder().in_dir(dir).start();
    assert_eq!(answer(&gw, ACME, "shop.example"), blocked);
    assert_eq!(answer(&gw, ACME, "mailinator.com"), allowed);
    // Removed: 204, then 404; the answer is the table's again.
    assert_eq!(delete(&gw, ACME, "shop.example").status, 204);
    delete(&gw, ACME, "shop.example").assert_error(404, "not_found");
    assert_eq!(answer(&gw, ACME, "shop.example").0, "safe");
    assert_eq!(
        put(&gw, ACME, "third.example", json!({"verdict": "allow"})).status,
        201,
        "room again"
    );
    let usage = gw.conn_as(Some(ACME)).get("/v1/usage").unwrap().json();
    assert_eq!(usage["month_count"].as_u64().unwrap(), month + 3);
    assert!(!gw.log().contains(ACME), "no key in the log");
}

#[test]
fn on_postgres_an_override_reaches_the_other_gateway_within_a_second_and_redis_holds_none() {
    let redis = RedisServer::start(false);
    let pg = Postgres::start();
    let shared = || {
        builder()
            .redis(&redis.url(), "fail_open")
            .gateway_yaml(&format!("control: {{ url: '{}' }}", pg.url()))
    };
    let (a, b) = (shared().start(), shared().start());
    assert_eq!(answer(&b, ACME, "shop.example").0, "safe");
    let blocked = pair("disposable", 100);
    let r = put(&a, ACME, "shop.example", json!({"verdict": "block"}));
    assert_eq!(r.status, 201, "{}", r.text());
    let set = Instant::now();
    assert_eq!(
        answer(&a, ACME, "shop.example"),
        blocked,
        "at once where set"
    );
    wait_until(Duration::from_secs(5), || {
        batch(&b, ACME, &["shop.example"])[0] == blocked
    });
    let took = set.elapsed();
    eprintln!("an override set on one gateway answered on the other after {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert_eq!(answer(&b, OTHER, "shop.example").0, "safe");
    assert_eq!(
        put(&b, ACME, "mailinator.com", json!({"verdict": "allow"})).status,
        201
    );
    // The plan's bound holds across gateways.
    put(&a, ACME, "third.example", json!({"verdict": "allow"})).assert_error(409, "conflict");
    // One audit trail for the project across the gateways.
    assert_eq!(actions(&b), ["override.set", "override.set"]);

    // Redis holds counts only: losing everything there changes no override, and a gateway
    // started after the flush (with its own, empty state folder) reads them from PostgreSQL.
    let mut c = redis.client().get_connection().unwrap();
    let rows: i64 = redis::cmd("EXISTS")
        .arg("drg:{overrides}:rows")
        .query(&mut c)
        .unwrap();
    assert_eq!(rows, 0, "no override on Redis");
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    let fresh = shared().start();
    wait_until(Duration::from_secs(5), || {
        answer(&fresh, ACME, "shop.example") == blocked
    });
    assert_eq!(answer(&fresh, ACME, "mailinator.com"), pair("safe", 0));
    for gw in [&a, &b] {
        assert_eq!(answer(gw, ACME, "shop.example"), blocked);
    }
    // A removal on the new gateway reaches the others and stays.
    assert_eq!(delete(&fresh, ACME, "shop.example").status, 204);
    wait_until(Duration::from_secs(5), || {
        [&a, &b]
            .iter()
            .all(|g| answer(g, ACME, "shop.example").0 == "safe")
    });
    std::thread::sleep(Duration::from_millis(1_000));
    assert_eq!(answer(&a, ACME, "shop.example").0, "safe");
    assert_eq!(overrides_of(&b), ["mailinator.com"]);
}

/// Rows a project's overrides hold in the control store (the state folder's SQLite file).
fn rows(gw: &Gateway, project: &str) -> i64 {
    let db = rusqlite::Connection::open_with_flags(
        gw.dir.path().join("state/control.sqlite"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    db.query_row(
        "SELECT count(*) FROM drg_records WHERE kind = 'overrides' AND project = ?1",
        [project],
        |r| r.get(0),
    )
    .unwrap()
}

/// A project's churn leaves nothing behind: 400 set-and-remove cycles of new names leave as
/// many rows as 200 did (none but those in force: a removal drops its row, and no marker is
/// kept for copies to agree), and the bound still counts only overrides in force. (Before,
/// every removal left a marker, up to the plan's bound: +464 KB for 1,000; 400 cycles would
/// leave 400 rows.) Past the stores' bounds:
/// `answers::churn_leaves_the_state_and_the_cost_of_a_write_bounded`; what the cycles cost over
/// time is `benches/account/overrides.py`'s.
#[test]
fn set_and_remove_cycles_leave_no_row_behind() {
    let gw = builder().account_rate(0, 1).start();
    assert_eq!(
        put(&gw, ACME, "kept.example", json!({"verdict": "block"})).status,
        201
    );
    let mut at_half = 0;
    for i in 0..400 {
        let name = format!("c{i}.example");
        let r = put(&gw, ACME, &name, json!({"verdict": "allow"}));
        assert_eq!(r.status, 201, "{i}: {}", r.text());
        assert_eq!(delete(&gw, ACME, &name).status, 204, "{i}");
        if i + 1 == 200 {
            at_half = rows(&gw, "acme");
        }
    }
    assert_eq!(at_half, 1, "the one in force");
    assert_eq!(rows(&gw, "acme"), at_half);
    // The plan's bound (2) counts what is in force: one more fits, then no more.
    assert_eq!(
        put(&gw, ACME, "second.example", json!({"verdict": "allow"})).status,
        201
    );
    put(&gw, ACME, "third.example", json!({"verdict": "allow"})).assert_error(409, "conflict");
}

/// The domains of `acme`'s overrides in force on `gw`.
fn overrides_of(gw: &Gateway) -> Vec<String> {
    let r = send(gw, "GET", "/v1/overrides", Some(ACME), &[], None).json();
    let mut out: Vec<String> = (r["items"].as_array().unwrap().iter())
        .map(|o| o["domain"].as_str().unwrap().to_owned())
        .collect();
    out.sort();
    out
}

/// The actions of the project's audit trail as `gw` reads it, newest first.
fn actions(gw: &Gateway) -> Vec<String> {
    let trail = send(gw, "GET", "/v1/audit", Some(ACME), &[], None).json();
    trail["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap().to_owned())
        .collect()
}

/// The audit trail lists every change made through the API (keys made, rotated and revoked,
/// overrides set and removed, reports sent): who (the key id), what, when, newest first, for
/// the project only; a browser key gets 403.
#[test]
fn the_audit_trail_lists_every_change_through_the_api() {
    let gw = builder().start();
    let made = send(
        &gw,
        "POST",
        "/v1/keys",
        Some(ACME),
        &[],
        Some(br#"{"label":"ci"}"#),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    let id = made.json()["id"].as_str().unwrap().to_owned();
    let rotated = send(
        &gw,
        "POST",
        &format!("/v1/keys/{id}/rotate"),
        Some(ACME),
        &[],
        Some(br#"{"overlap_hours":0}"#),
    );
    assert_eq!(rotated.status, 201, "{}", rotated.text());
    let next = rotated.json()["id"].as_str().unwrap().to_owned();
    let revoke = send(
        &gw,
        "DELETE",
        &format!("/v1/keys/{next}"),
        Some(ACME),
        &[],
        None,
    );
    assert_eq!(revoke.status, 204, "{}", revoke.text());
    assert_eq!(
        put(&gw, ACME, "shop.example", json!({"verdict": "block"})).status,
        201
    );
    assert_eq!(delete(&gw, ACME, "shop.example").status, 204);
    let body = json!({"domain": "shop.example", "verdict": "safe"}).to_string();
    let sent = send(
        &gw,
        "POST",
        "/v1/reports",
        Some(ACME),
        &[],
        Some(body.as_bytes()),
    );
    assert_eq!(sent.status, 202, "{}", sent.text());
    // A refused change is not one.
    put(&gw, ACME, "bad..name", json!({"verdict": "block"})).assert_error(422, "validation_error");

    let trail = send(&gw, "GET", "/v1/audit", Some(ACME), &[], None);
    assert_eq!(trail.status, 200, "{}", trail.text());
    let items = trail.json()["items"].as_array().unwrap().clone();
    let actions: Vec<(&str, &str)> = items
        .iter()
        .map(|e| (e["action"].as_str().unwrap(), e["target"].as_str().unwrap()))
        .collect();
    let report_id = sent.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        actions,
        [
            ("report.sent", report_id.as_str()),
            ("override.removed", "shop.example"),
            ("override.set", "shop.example"),
            ("key.revoked", next.as_str()),
            ("key.rotated", id.as_str()),
            ("key.created", id.as_str()),
        ]
    );
    assert!(items.iter().all(|e| e["key_id"] == "acme-server"));
    assert!(items[0]["at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(items[2]["detail"], "block");
    assert_eq!(items[4]["detail"], format!("successor {next}"));
    // Paged, newest first.
    let first = send(&gw, "GET", "/v1/audit?limit=2", Some(ACME), &[], None).json();
    let cursor = first["next_cursor"].as_str().unwrap().to_owned();
    let rest = send(
        &gw,
        "GET",
        &format!("/v1/audit?limit=10&cursor={cursor}"),
        Some(ACME),
        &[],
        None,
    )
    .json();
    assert_eq!(rest["items"].as_array().unwrap().len(), 4);
    assert_eq!(rest["items"][0]["action"], "override.set");
    // Another project's trail, a browser key.
    let theirs = send(&gw, "GET", "/v1/audit", Some(OTHER), &[], None).json();
    assert_eq!(theirs["items"], json!([]));
    send(&gw, "GET", "/v1/audit", Some(WEB), &[], None).assert_error(403, "forbidden");
}
