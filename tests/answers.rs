//! What the API answers is what holds, against the real binary: a `DELETE` right after a write
//! finds it (no `404` that leaves an override or a webhook in force), on the embedded store and
//! on Redis; writes answered `503` while Redis is paused never take effect once it resumes, on
//! either of two gateways, and the audit trail holds none of them; a project's own override
//! reaches its webhook as a `verdict.changed` within seconds; and the contract's rules hold on
//! every route (bodies, preflight, cursors, duplicate keys, public suffixes, webhook URLs, a
//! store away is `503`).

use crate::common;
use crate::postgres::Postgres;
use crate::redis_server::RedisServer;
use crate::webhook::Receiver;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const ACME: &str = "drg_answers_acme_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const OTHER: &str = "drg_answers_other_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

/// Cycles of each loop below (`DRG_ANSWER_CYCLES` runs the issue's 5,000): the race the issue
/// measured came about once in 300 cycles on a release build.
fn cycles(default: usize) -> usize {
    std::env::var("DRG_ANSWER_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Projects `acme` and `other` on a plan of 3 overrides and 3 webhooks, webhooks on (loopback
/// allowed), changes watched and handed over every 100 ms.
fn builder() -> GatewayBuilder {
    Gateway::builder()
        .plan_yaml(
            "team",
            "{ monthly_limit: 1000000, max_overrides: 3, max_webhooks: 3, max_keys: 5 }",
        )
        .key_in_project("acme-server", ACME, "team", "acme")
        .key_in_project("other-server", OTHER, "team", "other")
        // The account routes' per-key rate off: the loops below are one key's thousands.
        .account_rate(0, 1)
        .data("disposable.txt", "mailinator.com\n")
        .gateway_yaml("webhooks: { allow_private: true, timeout_ms: 30000 }")
        .gateway_yaml(
            "changes: { watch_days: { team: 30 }, send_interval_ms: 60000, stable_seconds: 3600 }",
        )
}

/// Whether `f` held within `within`, polled.
fn wait_for(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

fn json_send(gw: &Gateway, method: &str, path: &str, key: &str, body: &Value) -> Response {
    let body = body.to_string();
    send(gw, method, path, Some(key), &[], Some(body.as_bytes()))
}

fn bare(gw: &Gateway, method: &str, path: &str, key: &str) -> Response {
    send(gw, method, path, Some(key), &[], None)
}

/// `PUT` → lookup → `DELETE` of an override `n` times: every `DELETE` answers `204`, and
/// nothing is left in force (the list is empty and the name answers as the table says).
fn override_cycles(gw: &Gateway, n: usize) {
    let mut lookups = gw.conn_as(Some(ACME));
    let mut refused = Vec::new();
    for i in 0..n {
        let name = format!("r{i}.example");
        let path = format!("/v1/overrides/{name}");
        let put = json_send(gw, "PUT", &path, ACME, &json!({"verdict": "block"}));
        assert_eq!(put.status, 201, "cycle {i}: {}", put.text());
        let r = lookups.get(&format!("/v1/public/domain/{name}")).unwrap();
        assert_eq!(
            r.json()["reason"],
            "disposable",
            "cycle {i}: in force at once"
        );
        let del = bare(gw, "DELETE", &path, ACME);
        if del.status != 204 {
            refused.push((i, del.status));
        }
    }
    assert!(refused.is_empty(), "DELETEs not 204: {refused:?}");
    let list = bare(gw, "GET", "/v1/overrides", ACME).json();
    assert_eq!(list["items"], json!([]), "nothing left in force");
    let r = lookups.get("/v1/public/domain/r0.example").unwrap();
    assert_eq!(r.json()["reason"], "safe");
}

/// Create → `DELETE` of a webhook `n` times: every `DELETE` answers `204`, none is left (the
/// plan's three slots stay free).
fn webhook_cycles(gw: &Gateway, receiver: &str, n: usize) {
    let body = json!({"url": receiver, "events": ["verdict.changed"]});
    let mut refused = Vec::new();
    for i in 0..n {
        let made = json_send(gw, "POST", "/v1/webhooks", ACME, &body);
        assert_eq!(made.status, 201, "cycle {i}: {}", made.text());
        let id = made.json()["id"].as_str().unwrap().to_owned();
        let del = bare(gw, "DELETE", &format!("/v1/webhooks/{id}"), ACME);
        if del.status != 204 {
            refused.push((i, del.status));
        }
    }
    assert!(refused.is_empty(), "DELETEs not 204: {refused:?}");
    let list = bare(gw, "GET", "/v1/webhooks", ACME).json();
    assert_eq!(list["items"], json!([]), "nothing left");
}

#[test]
fn a_delete_right_after_a_write_finds_it_on_the_embedded_store() {
    let receiver = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    let gw = builder().start();
    let started = Instant::now();
    override_cycles(&gw, cycles(600));
    webhook_cycles(&gw, &receiver.url(), cycles(600) * 2 / 5);
    eprintln!("embedded store: cycles took {:?}", started.elapsed());
}

#[test]
fn a_delete_right_after_a_write_finds_it_on_redis() {
    let redis = RedisServer::start(false);
    let receiver = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    let gw = builder().redis(&redis.url(), "fail_open").start();
    override_cycles(&gw, cycles(400));
    webhook_cycles(&gw, &receiver.url(), cycles(400) * 2 / 5);
}

/// One write of each kind the issue names: an override set and one removed, a webhook made, a
/// report filed.
fn writes(gw: &Gateway, receiver: &str, i: usize) -> [Response; 4] {
    [
        json_send(
            gw,
            "PUT",
            &format!("/v1/overrides/p{i}.example"),
            ACME,
            &json!({"verdict": "block"}),
        ),
        bare(gw, "DELETE", "/v1/overrides/kept.example", ACME),
        json_send(
            gw,
            "POST",
            "/v1/webhooks",
            ACME,
            &json!({"url": receiver, "events": ["quota.threshold"]}),
        ),
        json_send(
            gw,
            "POST",
            "/v1/reports",
            ACME,
            &json!({"domain": format!("p{i}.example"), "verdict": "disposable"}),
        ),
    ]
}

/// PostgreSQL frozen (`SIGSTOP`) with writes in flight: every one answers `503`, and once it
/// resumes and runs what it was sent, `COMMIT`s included, none takes effect (each carries a
/// deadline its `COMMIT` checks on the database's clock).
#[test]
fn a_503_while_postgres_is_paused_never_takes_effect_later() {
    let redis = RedisServer::start(false);
    let pg = Postgres::start();
    let receiver = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    let on_redis = || {
        builder()
            .redis(&redis.url(), "fail_open")
            .gateway_yaml(&format!(
                "control: {{ url: '{}', call_timeout_ms: 1000 }}",
                pg.url()
            ))
    };
    let (a, b) = (on_redis().start(), on_redis().start());
    let kept = json_send(
        &a,
        "PUT",
        "/v1/overrides/kept.example",
        ACME,
        &json!({"verdict": "block"}),
    );
    assert_eq!(kept.status, 201, "{}", kept.text());
    let trail_before = bare(&a, "GET", "/v1/audit", ACME).json()["items"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(trail_before, 1);
    // The other gateway holds it too before the database stops.
    wait_until(Duration::from_secs(5), || {
        bare(&b, "GET", "/v1/overrides", ACME).json()["items"]
            .as_array()
            .is_some_and(|i| i.len() == 1)
    });

    pg.pause();
    // 50 rounds of the four writes, 200 in all, at once from both gateways.
    let answers: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..50)
            .map(|i| {
                let (gw, url) = (if i % 2 == 0 { &a } else { &b }, receiver.url());
                s.spawn(move || writes(gw, &url, i).map(|r| r.status))
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    pg.resume();
    assert_eq!(answers.len(), 200);
    assert!(
        answers.iter().all(|s| *s == 503),
        "every write answered 503 while PostgreSQL was paused: {answers:?}"
    );
    // Once the database answers again (its backends first run what the paused ones were sent,
    // a read meanwhile answers `503`), a write takes effect; a gateway holding it has polled
    // past every revision a late `COMMIT` could have made.
    let trail_of = |gw: &Gateway| {
        let mut page = None;
        wait_until(Duration::from_secs(30), || {
            let r = bare(gw, "GET", "/v1/audit", ACME);
            page = (r.status == 200).then(|| r.json());
            page.is_some()
        });
        page.unwrap()
    };
    trail_of(&b);
    let r = json_send(
        &b,
        "PUT",
        "/v1/overrides/after.example",
        ACME,
        &json!({"verdict": "allow"}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    for gw in [&a, &b] {
        let mut names = Vec::new();
        wait_until(Duration::from_secs(10), || {
            let list = bare(gw, "GET", "/v1/overrides", ACME).json();
            names = (list["items"].as_array().into_iter().flatten())
                .filter_map(|o| o["domain"].as_str().map(str::to_owned))
                .collect();
            names.iter().any(|n| n == "after.example")
        });
        assert_eq!(
            names,
            ["after.example", "kept.example"],
            "no 503 write in force, none removed"
        );
        let hooks = bare(gw, "GET", "/v1/webhooks", ACME).json();
        assert_eq!(hooks["items"], json!([]), "no webhook made");
        let reports = bare(gw, "GET", "/v1/reports", ACME).json();
        assert_eq!(reports["items"], json!([]), "no report filed");
        let trail = trail_of(gw);
        assert_eq!(
            trail["items"].as_array().map(Vec::len),
            Some(2),
            "the trail holds what took effect, kept and after: {trail}"
        );
    }
}

/// A write sent with `key` as its `Idempotency-Key`.
fn keyed(gw: &Gateway, method: &str, path: &str, key: &str, body: Option<&Value>) -> Response {
    let body = body.map(Value::to_string);
    let extra = [("Idempotency-Key", key)];
    send(
        gw,
        method,
        path,
        Some(ACME),
        &extra,
        body.as_deref().map(str::as_bytes),
    )
}

/// A client that lost an answer retries with the same `Idempotency-Key`: the write is made
/// once and the retry gets the first answer (the same webhook id and secret), marked
/// replayed; the audit trail has one row. The same key on another request is `422`; a key
/// that is no key is `422`, nothing written. Without a key, a retry makes a second webhook
/// (what a client had before).
#[test]
fn a_retry_with_the_same_idempotency_key_applies_once() {
    let gw = builder().start();
    let hook = json!({"url": "http://127.0.0.1:9/h", "events": ["verdict.changed"]});
    // The first answer "lost": the client never read it, and tries again.
    let first = keyed(&gw, "POST", "/v1/webhooks", "retry-1", Some(&hook));
    assert_eq!(first.status, 201, "{}", first.text());
    let again = keyed(&gw, "POST", "/v1/webhooks", "retry-1", Some(&hook));
    assert_eq!(again.status, 201, "{}", again.text());
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.json()["id"], first.json()["id"]);
    assert_eq!(again.json()["secret"], first.json()["secret"]);
    let listed = bare(&gw, "GET", "/v1/webhooks", ACME).json();
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "{listed}");
    // The same key on another request of the project.
    let other = json!({"url": "http://127.0.0.1:9/other", "events": ["verdict.changed"]});
    keyed(&gw, "POST", "/v1/webhooks", "retry-1", Some(&other))
        .assert_error(422, "validation_error");
    // Overrides: a replayed PUT answers its 201, a replayed DELETE its 204 (not 404).
    let path = "/v1/overrides/once.example";
    let block = json!({"verdict": "block"});
    assert_eq!(keyed(&gw, "PUT", path, "put-1", Some(&block)).status, 201);
    let put_again = keyed(&gw, "PUT", path, "put-1", Some(&block));
    assert_eq!(put_again.status, 201);
    assert_eq!(put_again.header("idempotent-replayed"), Some("true"));
    assert_eq!(keyed(&gw, "DELETE", path, "del-1", None).status, 204);
    let del_again = keyed(&gw, "DELETE", path, "del-1", None);
    assert_eq!(del_again.status, 204);
    assert_eq!(del_again.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        bare(&gw, "DELETE", path, ACME).status,
        404,
        "removed once, and gone"
    );
    // A report, once.
    let report = json!({"domain": "mailinator.com", "verdict": "safe"});
    assert_eq!(
        keyed(&gw, "POST", "/v1/reports", "rep-1", Some(&report)).status,
        202
    );
    assert_eq!(
        keyed(&gw, "POST", "/v1/reports", "rep-1", Some(&report)).status,
        202
    );
    let reports = bare(&gw, "GET", "/v1/reports", ACME).json();
    assert_eq!(reports["items"].as_array().unwrap().len(), 1, "{reports}");
    // One audit row each for what was made once.
    let trail = bare(&gw, "GET", "/v1/audit", ACME).json();
    let actions: Vec<&str> = (trail["items"].as_array().unwrap().iter())
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "report.sent",
            "override.removed",
            "override.set",
            "webhook.created"
        ],
        "{trail}"
    );
    // No key at all: a key with a space, or two keys.
    keyed(&gw, "PUT", "/v1/overrides/x.example", "a b", Some(&block))
        .assert_error(422, "validation_error");
    let twice = send(
        &gw,
        "PUT",
        "/v1/overrides/x.example",
        Some(ACME),
        &[("Idempotency-Key", "k1"), ("Idempotency-Key", "k2")],
        Some(block.to_string().as_bytes()),
    );
    twice.assert_error(422, "validation_error");
    assert_eq!(
        bare(&gw, "GET", "/v1/overrides", ACME).json()["items"],
        json!([])
    );
    // Without a key, the retry is a second write.
    json_send(&gw, "POST", "/v1/webhooks", ACME, &hook);
    let listed = bare(&gw, "GET", "/v1/webhooks", ACME).json();
    assert_eq!(listed["items"].as_array().unwrap().len(), 2, "{listed}");
}

/// Replays belong to the caller (issue 93): an `Idempotency-Key` answer was replayed to any
/// key of the project, a webhook's signing secret included, and kept it for a day past the
/// webhook's removal. Now another key of the project sending the same value makes a write of
/// its own; the stored answer keeps no secret, the replay takes it from the webhook, and once
/// the webhook is removed a replay says so (`404`) and shows no secret.
#[test]
fn an_idempotency_key_replays_only_to_the_key_that_made_the_write_and_keeps_no_secret() {
    const SECOND: &str = "drg_answers_acme_second_key_ccccccccccccccccccccccccc";
    let gw = builder()
        .key_in_project("acme-second", SECOND, "team", "acme")
        .start();
    let hook = json!({"url": "http://127.0.0.1:9/h", "events": ["verdict.changed"]});
    let post = |secret: &str| {
        let body = hook.to_string();
        let extra = [("Idempotency-Key", "same-value")];
        send(
            &gw,
            "POST",
            "/v1/webhooks",
            Some(secret),
            &extra,
            Some(body.as_bytes()),
        )
    };
    let first = post(ACME);
    assert_eq!(first.status, 201, "{}", first.text());
    let (id, secret) = (first.json()["id"].clone(), first.json()["secret"].clone());
    assert!(
        secret.as_str().is_some_and(|s| !s.is_empty()),
        "{}",
        first.text()
    );
    // Another key of the project, the same value: its own webhook, not the first's answer.
    let second = post(SECOND);
    assert_eq!(second.status, 201, "{}", second.text());
    assert_eq!(second.header("idempotent-replayed"), None);
    assert_ne!(second.json()["id"], id);
    assert_ne!(second.json()["secret"], secret);
    // The first key's retry: its answer, the secret taken from the webhook.
    let again = post(ACME);
    assert_eq!(again.status, 201, "{}", again.text());
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        (again.json()["id"].clone(), again.json()["secret"].clone()),
        (id.clone(), secret.clone())
    );
    // Removed: a replay has no secret to give.
    let path = format!("/v1/webhooks/{}", id.as_str().unwrap());
    assert_eq!(bare(&gw, "DELETE", &path, ACME).status, 204);
    let after = post(ACME);
    after.assert_error(404, "not_found");
    assert!(
        !after.text().contains(secret.as_str().unwrap()),
        "{}",
        after.text()
    );
    assert!(after.text().contains("removed since"), "{}", after.text());
    let listed = bare(&gw, "GET", "/v1/webhooks", ACME).json();
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "{listed}");
}

#[test]
fn an_override_on_a_watched_domain_reaches_the_projects_webhook_within_two_seconds() {
    let receiver = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    let gw = builder().start();
    let made = json_send(
        &gw,
        "POST",
        "/v1/webhooks",
        ACME,
        &json!({"url": receiver.url(), "events": ["verdict.changed"]}),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    // Watched: looked up by the project (the call writer hands it to the changes service).
    let r = gw
        .conn_as(Some(ACME))
        .get("/v1/public/domain/watched.example")
        .unwrap();
    assert_eq!(r.json()["reason"], "safe");
    wait_until(Duration::from_secs(10), || {
        gw.metric("drg_changes_total{event=\"watched\"}")
            .unwrap_or(0.0)
            >= 1.0
    });
    let set = Instant::now();
    let put = json_send(
        &gw,
        "PUT",
        "/v1/overrides/watched.example",
        ACME,
        &json!({"verdict": "block"}),
    );
    assert_eq!(put.status, 201, "{}", put.text());
    let took = wait_until(Duration::from_secs(10), || {
        receiver
            .deliveries()
            .iter()
            .any(|d| d.json()["changes"].to_string().contains("watched.example"))
    });
    eprintln!("an override reached the project's webhook after {took:?}");
    assert!(
        set.elapsed() < Duration::from_secs(2),
        "{:?}",
        set.elapsed()
    );
    let d = receiver.deliveries().pop().unwrap();
    let change = &d.json()["changes"][0];
    assert_eq!(change["domain"], "watched.example", "{change}");
    assert_eq!(change["to"], "disposable", "{change}");
    assert!(d.header("x-change-id").is_some());
    // Removed: told again, as promptly.
    let removed = Instant::now();
    assert_eq!(
        bare(&gw, "DELETE", "/v1/overrides/watched.example", ACME).status,
        204
    );
    let told_twice = || {
        receiver
            .deliveries()
            .iter()
            .filter(|d| d.json()["changes"].to_string().contains("watched.example"))
            .count()
            >= 2
    };
    if !wait_for(Duration::from_secs(10), told_twice) {
        let changes = bare(&gw, "GET", "/v1/changes", ACME).text();
        panic!("the removal was not told: /v1/changes {changes}");
    }
    assert!(
        removed.elapsed() < Duration::from_secs(2),
        "{:?}",
        removed.elapsed()
    );
}

#[test]
fn the_contracts_rules_hold_on_the_account_routes() {
    let redis = RedisServer::start(false);
    let gw = builder().start();
    // A body where the method takes none: 400, on the new routes too.
    for (method, path) in [
        ("GET", "/v1/reports"),
        ("GET", "/v1/webhooks"),
        ("GET", "/v1/keys"),
        ("GET", "/v1/overrides"),
        ("GET", "/v1/audit"),
        ("DELETE", "/v1/overrides/x.example"),
        ("DELETE", "/v1/webhooks/wh_0123456789abcdef"),
    ] {
        let r = send(&gw, method, path, Some(ACME), &[], Some(b"{}"));
        r.assert_error(400, "bad_request");
    }
    // Preflight on every account route: 204, the route's methods allowed.
    for (path, methods) in [
        ("/v1/overrides", "GET"),
        ("/v1/overrides/x.example", "PUT, DELETE"),
        ("/v1/webhooks", "GET, POST"),
        ("/v1/webhooks/wh_1", "DELETE"),
        ("/v1/reports", "GET, POST"),
        ("/v1/keys/key_1", "DELETE"),
        ("/v1/keys/key_1/rotate", "POST"),
        ("/v1/audit", "GET"),
    ] {
        let r = send(
            &gw,
            "OPTIONS",
            path,
            None,
            &[("Origin", "https://app.example.com")],
            None,
        );
        assert_eq!(r.status, 204, "{path}: {}", r.text());
        assert_eq!(
            r.header("access-control-allow-methods"),
            Some(methods),
            "{path}"
        );
    }
    // A cursor the audit trail never gave: 422, as the other routes refuse theirs.
    bare(&gw, "GET", "/v1/audit?cursor=abc", ACME).assert_error(422, "validation_error");
    // A field given twice.
    let twice = br#"{"label": "ci", "expires_in_days": 1, "expires_in_days": 3650}"#;
    send(&gw, "POST", "/v1/keys", Some(ACME), &[], Some(twice))
        .assert_error(422, "validation_error");
    // A public suffix is no name to override or report.
    for suffix in ["co.uk", "github.io"] {
        let r = json_send(
            &gw,
            "PUT",
            &format!("/v1/overrides/{suffix}"),
            ACME,
            &json!({"verdict": "block"}),
        );
        r.assert_error(422, "validation_error");
        assert!(r.text().contains("public suffix"), "{}", r.text());
        let r = json_send(
            &gw,
            "POST",
            "/v1/reports",
            ACME,
            &json!({"domain": suffix, "verdict": "safe"}),
        );
        r.assert_error(422, "validation_error");
    }
    // Webhook URLs parsed strictly.
    for url in [
        "https://hooks.example.com:0/h",
        "https://hooks.example.com:99999/h",
        // Teredo carrying 169.254.169.254 (inverted): the metadata service, even with
        // allow_private.
        "http://[2001:0:808:808::5601:5601]/h",
        "https://user:pa%3Ass@hooks.example.com/h",
    ] {
        let r = json_send(
            &gw,
            "POST",
            "/v1/webhooks",
            ACME,
            &json!({"url": url, "events": ["verdict.changed"]}),
        );
        r.assert_error(422, "validation_error");
    }
    assert_eq!(
        bare(&gw, "GET", "/v1/webhooks", ACME).json()["items"],
        json!([])
    );

    // A store away: 503 with Retry-After, never 500 (the audit trail in PostgreSQL, stopped).
    drop(redis);
    let pg = Postgres::start();
    let on_pg = builder()
        .gateway_yaml(&format!(
            "control: {{ url: '{}', call_timeout_ms: 1000 }}",
            pg.url()
        ))
        .start();
    assert_eq!(bare(&on_pg, "GET", "/v1/audit", ACME).status, 200);
    pg.stop();
    let r = bare(&on_pg, "GET", "/v1/audit", ACME);
    r.assert_error(503, "service_unavailable");
    assert!(r.header("retry-after").is_some());
}

/// No answer tells a project where the gateway's backends listen: a webhook to the configured
/// upstream, Redis or OTLP collector is answered as one to any other loopback address (`201`
/// with the builder's `allow_private`; before, a `422` naming the setting); the engine's guard
/// holds every one of them and refuses them when a message is sent (`guarded`, and the
/// `drg-webhook` client's tests).
#[test]
fn a_webhook_to_the_gateways_own_backends_is_answered_as_any_other_address() {
    let redis = RedisServer::start(false);
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let otlp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (up, collector) = (upstream.local_addr().unwrap(), otlp.local_addr().unwrap());
    let gw = builder()
        .upstream(up)
        .redis(&redis.url(), "fail_open")
        .gateway_yaml(&format!(
            "tracing: {{ otlp_endpoint: 'http://{collector}/v1/traces' }}"
        ))
        .start();
    let redis_addr = redis
        .url()
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    // The plan's three webhooks, one for each backend.
    for url in [
        format!("http://{up}/v1/check/x"),
        format!("http://{redis_addr}/"),
        format!("http://{collector}/v1/traces"),
    ] {
        let r = json_send(
            &gw,
            "POST",
            "/v1/webhooks",
            ACME,
            &json!({"url": url, "events": ["verdict.changed"]}),
        );
        assert_eq!(r.status, 201, "{url}: {}", r.text());
        assert!(!r.text().contains("gateway."), "{url}: {}", r.text());
    }
}

/// The bytes of the control store's file (the project's records, the audit trail), its
/// journal checkpointed first (a WAL holds up to a thousand pages between checkpoints, whatever
/// the rows).
fn state_bytes(gw: &Gateway) -> u64 {
    let path = gw.dir.path().join("state/control.sqlite");
    let db = rusqlite::Connection::open(&path).unwrap();
    db.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    std::fs::metadata(&path).unwrap().len()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// What a project creates stays bounded (issue 79): override set/remove cycles and as many
/// webhook make/remove cycles from one key, past every bound (100 removal markers, 1,000 audit
/// entries), leave the state folder under 256 KB larger, and cycles after that add nothing a
/// row would (a write rewrites what it changed, so its cost stays what it was: the medians are
/// printed).
#[test]
fn churn_leaves_the_state_and_the_cost_of_a_write_bounded() {
    let receiver = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    let gw = builder().start();
    let other_put = |i: usize| {
        let t = Instant::now();
        let r = json_send(
            &gw,
            "PUT",
            &format!("/v1/overrides/o{}.example", i % 3),
            OTHER,
            &json!({"verdict": "allow"}),
        );
        assert!(r.status == 201 || r.status == 200, "{}", r.text());
        t.elapsed()
    };
    let others_before = median((0..30).map(other_put).collect());
    let before = state_bytes(&gw);
    let hook = json!({"url": receiver.url(), "events": ["verdict.changed"]});
    let mut puts = Vec::new();
    // `from..to` cycles of each kind: four audited writes a cycle.
    let mut cycle = |from: usize, to: usize| {
        for i in from..to {
            let path = format!("/v1/overrides/c{i}.example");
            let t = Instant::now();
            let put = json_send(&gw, "PUT", &path, ACME, &json!({"verdict": "block"}));
            puts.push(t.elapsed());
            assert_eq!(put.status, 201, "{}", put.text());
            assert_eq!(bare(&gw, "DELETE", &path, ACME).status, 204);
        }
        for _ in from..to {
            let made = json_send(&gw, "POST", "/v1/webhooks", ACME, &hook);
            let id = made.json()["id"].as_str().unwrap().to_owned();
            assert_eq!(
                bare(&gw, "DELETE", &format!("/v1/webhooks/{id}"), ACME).status,
                204
            );
        }
    };
    // Past every bound: 1,200 audit entries, 300 removal markers of each kind (the issue's
    // 1,500 cycles with DRG_ANSWER_CYCLES=1500).
    let n = cycles(400).max(400);
    cycle(0, 300);
    let bounded = state_bytes(&gw);
    // 100 more of each: 400 entries and 200 markers a store without bounds keeps (~80 KB).
    cycle(300, n);
    let after_bound = state_bytes(&gw).saturating_sub(bounded);
    assert!(
        after_bound < 24 * 1024,
        "{} cycles past every bound grew the state by {after_bound} bytes",
        n - 300
    );
    let grew = state_bytes(&gw).saturating_sub(before);
    let (first, last) = (
        median(puts[..100].to_vec()),
        median(puts[puts.len() - 100..].to_vec()),
    );
    let others_after = median((0..30).map(other_put).collect());
    eprintln!(
        "{n} cycles of each: state +{grew} bytes (+{after_bound} past the bounds); PUT median \
         first 100 {first:?}, last 100 {last:?}; another project's PUT {others_before:?} -> \
         {others_after:?}"
    );
    let files: Vec<(String, u64)> = std::fs::read_dir(gw.dir.path().join("state"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().len(),
            )
        })
        .collect();
    assert!(
        grew < 256 * 1024,
        "the state grew by {grew} bytes: {files:?}"
    );
    // Times are printed, not asserted (a loaded machine is no regression): the cost a write
    // pays is held by the state's bound above.
    // A page of the trail reads what it returns.
    let t = Instant::now();
    let page = bare(&gw, "GET", "/v1/audit?limit=100", ACME);
    assert_eq!(page.status, 200);
    assert_eq!(page.json()["items"].as_array().unwrap().len(), 100);
    eprintln!("a page of the trail in {:?}", t.elapsed());
}

/// A page of the trail reads only what it returns: with 100,000 rows held (in the control
/// store's `drg_audit`), pages answer from the newest and from a cursor, and the database
/// plans the page's query as a walk of the project's key from the cursor, with no sort of the
/// project's rows (its time is printed, not asserted).
#[test]
fn a_page_of_the_audit_trail_is_quick_with_100000_rows_held() {
    // The schema is the gateway's: one start makes it, then the rows go in.
    let dir = builder().start().stop();
    let mut db = rusqlite::Connection::open(dir.path().join("state/control.sqlite")).unwrap();
    let tx = db.transaction().unwrap();
    for i in 0..100_000i64 {
        tx.execute(
            "INSERT INTO drg_audit (project, id, at, key_id, action, target, detail)
             VALUES ('acme', ?1, '2026-11-01T00:00:00Z', 'acme-server', 'override.set', ?2,
                     'block')",
            rusqlite::params![1_700_000_000_000_000i64 + i, format!("d{i}.example")],
        )
        .unwrap();
    }
    tx.commit().unwrap();
    drop(db);
    let gw = builder().in_dir(dir).start();
    let first = bare(&gw, "GET", "/v1/audit?limit=100", ACME);
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.json()["items"][0]["target"], "d99999.example");
    let cursor = first.json()["next_cursor"].as_str().unwrap().to_owned();
    let mut took = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let page = bare(
            &gw,
            "GET",
            &format!("/v1/audit?limit=100&cursor={cursor}"),
            ACME,
        );
        took.push(t.elapsed());
        assert_eq!(page.json()["items"][0]["target"], "d99899.example");
    }
    let took = median(took);
    eprintln!("a page of 100 with 100,000 rows held: {took:?}");
    let db = rusqlite::Connection::open(gw.dir.path().join("state/control.sqlite")).unwrap();
    let mut plan = db
        .prepare(
            "EXPLAIN QUERY PLAN SELECT id, at, key_id, action, target, detail FROM drg_audit
             WHERE project = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3",
        )
        .unwrap();
    let steps: Vec<String> = plan
        .query_map(rusqlite::params!["acme", i64::MAX, 100], |r| r.get(3))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let said = steps.join("; ");
    assert!(said.starts_with("SEARCH drg_audit USING"), "{said}");
    assert!(said.contains("project=? AND id<?"), "{said}");
    assert!(!said.contains("TEMP B-TREE"), "{said}");
}
