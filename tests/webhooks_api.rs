//! Each project's own webhooks, the API half, against the real binary: `POST /v1/webhooks`
//! answers the secret once (never listed), `GET` pages them, `DELETE` removes them; events and
//! URLs are checked (private and loopback only with `allow_private`, link-local never; the
//! gateway's own listener and backends answered as any other address, refused when a message is
//! sent); server keys only, per project, bounded by the plan, audited,
//! not counted; off (404, `features.webhooks` false) unless `gateway.webhooks` is set. Two
//! gateways on one PostgreSQL control store: one made on one is listed on the other within a
//! second, and a `FLUSHALL` of their Redis changes none.

use crate::common;
use crate::postgres::Postgres;
use crate::redis_server::RedisServer;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const ACME: &str = "drg_webhooks_acme_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const OTHER: &str = "drg_webhooks_other_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const WEB: &str = "drg_webhooks_web_key_cccccccccccccccccccccccccccccccccc";
/// A token in a URL's path and query: never in the log.
const TOKEN: &str = "T0K3N-in-the-url";

/// Projects `acme` (on `team`: 3 webhooks at most) and `other`, a browser key, webhooks on
/// with `webhooks` (e.g. `{}`, `{allow_private: true}`).
fn builder(webhooks: &str) -> GatewayBuilder {
    Gateway::builder()
        .plan_yaml(
            "team",
            "{ monthly_limit: 100000, max_webhooks: 3, max_keys: 5 }",
        )
        .key_in_project("acme-server", ACME, "team", "acme")
        .key_in_project("other-server", OTHER, "team", "other")
        .key("web", WEB, "team", &["https://app.example.com"])
        .gateway_yaml(&format!("webhooks: {webhooks}"))
}

/// `POST /v1/webhooks` with `body` as `key`.
pub fn create(gw: &Gateway, key: &str, body: Value) -> Response {
    let body = body.to_string();
    send(
        gw,
        "POST",
        "/v1/webhooks",
        Some(key),
        &[],
        Some(body.as_bytes()),
    )
}

fn hook(url: &str, events: &[&str]) -> Value {
    json!({"url": url, "events": events})
}

fn delete(gw: &Gateway, key: &str, id: &str) -> Response {
    send(
        gw,
        "DELETE",
        &format!("/v1/webhooks/{id}"),
        Some(key),
        &[],
        None,
    )
}

/// The ids `key`'s project lists on `gw` (every page).
fn listed(gw: &Gateway, key: &str) -> Vec<String> {
    let r = send(gw, "GET", "/v1/webhooks", Some(key), &[], None);
    assert_eq!(r.status, 200, "{}", r.text());
    let items = r.json()["items"].as_array().unwrap().clone();
    items
        .iter()
        .map(|h| h["id"].as_str().unwrap().to_owned())
        .collect()
}

/// The `(action, target, detail)` of the project's audit trail, newest first.
fn trail(gw: &Gateway, key: &str) -> Vec<(String, String, String)> {
    let r = send(gw, "GET", "/v1/audit", Some(key), &[], None);
    r.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
            (s("action"), s("target"), s("detail"))
        })
        .collect()
}

#[test]
fn a_webhook_is_made_with_its_secret_once_listed_without_it_and_removed() {
    let gw = builder("{}").start();
    let url = format!("https://hooks.example.com/in/{TOKEN}?sig={TOKEN}");
    let r = create(
        &gw,
        ACME,
        hook(&url, &["verdict.changed", "quota.threshold"]),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let made = r.json();
    let id = made["id"].as_str().unwrap().to_owned();
    let secret = made["secret"].as_str().unwrap().to_owned();
    assert!(
        id.len() == 19 && id.starts_with("wh_") && id[3..].bytes().all(|b| b.is_ascii_hexdigit()),
        "{id}"
    );
    assert!(
        secret.len() == 70 && secret.starts_with("whsec_"),
        "{secret}"
    );
    assert_eq!(made["url"], url.as_str());
    assert_eq!(
        made["events"],
        json!(["verdict.changed", "quota.threshold"])
    );
    assert_eq!(made["created_by"], "acme-server");
    assert!(made["created_at"].as_str().unwrap().ends_with('Z'));

    // Listed, never with its secret; not another project's.
    let page = send(&gw, "GET", "/v1/webhooks", Some(ACME), &[], None);
    assert_eq!(page.status, 200, "{}", page.text());
    assert!(!page.text().contains(&secret));
    let item = &page.json()["items"][0];
    assert_eq!(item["id"], id.as_str());
    assert_eq!(item["url"], url.as_str());
    assert!(item.get("secret").is_none(), "{item}");
    assert!(listed(&gw, OTHER).is_empty());
    delete(&gw, OTHER, &id).assert_error(404, "not_found");

    // Paged (by the second each was made: these two may share one).
    let second = create(&gw, ACME, hook("https://b.example/h", &["quota.threshold"]));
    assert_eq!(second.status, 201, "{}", second.text());
    let second = second.json()["id"].as_str().unwrap().to_owned();
    let first = send(&gw, "GET", "/v1/webhooks?limit=1", Some(ACME), &[], None).json();
    let cursor = first["next_cursor"].as_str().unwrap().to_owned();
    assert_eq!(first["items"][0]["id"], cursor.as_str());
    let rest = send(
        &gw,
        "GET",
        &format!("/v1/webhooks?limit=1&cursor={cursor}"),
        Some(ACME),
        &[],
        None,
    )
    .json();
    let mut both = [cursor, rest["items"][0]["id"].as_str().unwrap().to_owned()];
    both.sort();
    let mut made = [id.clone(), second.clone()];
    made.sort();
    assert_eq!(both, made);
    let last = send(
        &gw,
        "GET",
        &format!("/v1/webhooks?cursor={}", both[1]),
        Some(ACME),
        &[],
        None,
    );
    assert_eq!(last.json(), json!({"items": [], "next_cursor": null}));
    send(&gw, "GET", "/v1/webhooks?limit=0", Some(ACME), &[], None)
        .assert_error(422, "validation_error");

    // Not counted.
    let month = |gw: &Gateway| gw.conn_as(Some(ACME)).get("/v1/usage").unwrap().json();
    let usage = month(&gw);
    assert_eq!(usage["month_count"], 0, "{usage}");
    assert_eq!(usage["features"]["webhooks"], true);

    // Removed: 204, then 404; ids that are no webhook's are 404 too.
    assert_eq!(delete(&gw, ACME, &id).status, 204);
    delete(&gw, ACME, &id).assert_error(404, "not_found");
    delete(&gw, ACME, "wh_not-an-id").assert_error(404, "not_found");
    assert_eq!(listed(&gw, ACME), std::slice::from_ref(&second));

    // Kept across a restart.
    let dir = gw.stop();
    let gw = builder("{}").in_dir(dir).start();
    assert_eq!(listed(&gw, ACME), [second]);
    assert!(
        !gw.log().contains(TOKEN),
        "a URL's path or query is never logged"
    );
    assert!(!gw.log().contains(&secret));
}

#[test]
fn bodies_urls_keys_and_the_plan_are_checked() {
    let gw = builder("{}").start();
    let ok = "https://hooks.example.com/drg";
    for (body, needle) in [
        (hook(ok, &[]), "events: at least one"),
        (hook(ok, &["key.created"]), "unknown variant"),
        (
            hook(ok, &["quota.threshold", "quota.threshold"]),
            "listed twice",
        ),
        (
            json!({"url": ok, "events": ["quota.threshold"], "secret": "mine"}),
            "unknown field",
        ),
        (
            hook("ftp://hooks.example.com/", &["quota.threshold"]),
            "not an http",
        ),
        (
            hook(&format!("{ok}/{}", "a".repeat(2_100)), &["quota.threshold"]),
            "at most 2048",
        ),
        (
            hook("http://127.0.0.1:9000/h", &["quota.threshold"]),
            "url: host '127.0.0.1' may not receive webhooks: a public address is needed",
        ),
        (
            hook(&format!("https://10.1.2.3/{TOKEN}"), &["quota.threshold"]),
            "url: host '10.1.2.3' may not receive webhooks",
        ),
        (
            hook(
                "http://169.254.169.254/latest/meta-data",
                &["quota.threshold"],
            ),
            "url: host '169.254.169.254' may not receive webhooks",
        ),
    ] {
        let r = create(&gw, ACME, body.clone());
        r.assert_invalid(needle, &body.to_string());
        assert!(!r.text().contains(TOKEN), "the host only: {}", r.text());
    }
    // Server keys only.
    create(&gw, WEB, hook(ok, &["quota.threshold"])).assert_error(403, "forbidden");
    send(&gw, "GET", "/v1/webhooks", Some(WEB), &[], None).assert_error(403, "forbidden");
    delete(&gw, WEB, "wh_0123456789abcdef").assert_error(403, "forbidden");
    send(&gw, "GET", "/v1/webhooks", None, &[], None).assert_error(401, "unauthorized");
    // The plan's bound (3 in force), room again once one is removed.
    let ids: Vec<String> = (0..3)
        .map(|i| {
            let r = create(
                &gw,
                ACME,
                hook(&format!("https://h{i}.example/"), &["quota.threshold"]),
            );
            assert_eq!(r.status, 201, "{}", r.text());
            r.json()["id"].as_str().unwrap().to_owned()
        })
        .collect();
    let full = create(&gw, ACME, hook(ok, &["quota.threshold"]));
    assert_eq!(full.assert_error(409, "conflict"), "max_webhooks: 3");
    assert_eq!(
        create(&gw, OTHER, hook(ok, &["quota.threshold"])).status,
        201,
        "per project"
    );
    assert_eq!(delete(&gw, ACME, &ids[0]).status, 204);
    assert_eq!(
        create(&gw, ACME, hook(ok, &["verdict.changed"])).status,
        201,
        "room again"
    );

    // The audit trail: what was made (the host, never the path) and removed, not what was
    // refused.
    let t = trail(&gw, ACME);
    let actions: Vec<&str> = t.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        actions,
        [
            "webhook.created",
            "webhook.removed",
            "webhook.created",
            "webhook.created",
            "webhook.created",
        ]
    );
    assert_eq!(t[1].1, ids[0]);
    assert_eq!(
        (t[4].1.as_str(), t[4].2.as_str()),
        (ids[0].as_str(), "h0.example")
    );
    assert_eq!(t[0].2, "hooks.example.com");
}

#[test]
fn allow_private_lets_loopback_in_never_link_local_and_never_tells_where_the_backends_are() {
    // The gateway's backends: the `/v1/check` upstream here (Redis, DNS, OTLP and RDAP are
    // guarded the same way), and its own listener.
    let backend = Upstream::start(Duration::ZERO);
    let gw = builder("{ allow_private: true, timeout_ms: 2000, max_attempts: 3 }")
        .upstream(backend.addr)
        .start();
    let other = DeadPort::new();
    let own = format!("http://{}/v1/usage", gw.addr);
    let upstream = format!("http://{}/hook", backend.addr);
    let elsewhere = format!("http://{}/hook", other.addr);
    // A backend answers as any other loopback address does: no status or text tells a
    // project where the gateway's backends listen (before: `422` naming
    // `gateway.upstream.address` and `gateway.listen`). They are refused when a message is
    // sent, by the engine's guard.
    for url in [&elsewhere, &upstream, &own] {
        let r = create(&gw, ACME, hook(url, &["verdict.changed"]));
        assert_eq!(r.status, 201, "{url}: {}", r.text());
        assert!(!r.text().contains("gateway."), "{url}: {}", r.text());
    }
    assert_eq!(
        create(&gw, ACME, hook("http://10.0.0.7/h", &["verdict.changed"])).status,
        409,
        "the plan's bound of 3 webhooks, not the address"
    );
    let link_local = create(&gw, OTHER, hook("http://[fe80::1]/", &["verdict.changed"]));
    link_local.assert_invalid(
        "url: host '[fe80::1]' may not receive webhooks",
        "link-local stays refused",
    );
    assert!(
        !link_local.text().contains("allow_private"),
        "{}",
        link_local.text()
    );
    assert!(backend.requests().is_empty(), "nothing reached the backend");
    // Without allow_private every loopback address gets the same words, the backends' too.
    let closed = builder("{}").upstream(backend.addr).start();
    let texts: Vec<String> = [&elsewhere, &upstream]
        .iter()
        .map(|url| {
            let r = create(&closed, ACME, hook(url, &["verdict.changed"]));
            r.assert_error(422, "validation_error").to_string()
        })
        .collect();
    assert_eq!(texts[0], texts[1]);
    assert_eq!(
        texts[0],
        "\"url: host '127.0.0.1' may not receive webhooks: a public address is needed\""
    );
}

#[test]
fn off_unless_configured_the_routes_answer_404() {
    let gw = Gateway::builder()
        .plan("team", 1000)
        .key_in_project("acme-server", ACME, "team", "acme")
        .start();
    let usage = gw.conn_as(Some(ACME)).get("/v1/usage").unwrap().json();
    assert_eq!(usage["features"]["webhooks"], false, "{usage}");
    send(&gw, "GET", "/v1/webhooks", Some(ACME), &[], None).assert_error(404, "not_found");
    create(&gw, ACME, hook("https://a.example/", &["quota.threshold"]))
        .assert_error(404, "not_found");
    delete(&gw, ACME, "wh_0123456789abcdef").assert_error(404, "not_found");
    // A bad section is refused, naming the key.
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("gateway.yaml");
    std::fs::write(
        &conf,
        "gateway:\n  webhooks: { timeout_ms: 5, retries: 1 }\n",
    )
    .unwrap();
    let out = crate::common::command(BIN)
        .args(["check-config", "-c"])
        .arg(&conf)
        .output()
        .unwrap();
    let (ok, stdout, stderr) = outcome(out);
    assert!(!ok, "{stdout}{stderr}");
    assert!(
        (stdout.clone() + &stderr).contains("retries"),
        "{stdout}{stderr}"
    );
}

#[test]
fn on_postgres_a_webhook_reaches_the_other_gateway_within_a_second_and_redis_holds_none() {
    let redis = RedisServer::start(false);
    let pg = Postgres::start();
    let on_redis = || {
        builder("{}")
            .redis(&redis.url(), "fail_open")
            .gateway_yaml(&format!("control: {{ url: '{}' }}", pg.url()))
    };
    let (a, b) = (on_redis().start(), on_redis().start());
    assert!(listed(&b, ACME).is_empty());
    let r = create(&a, ACME, hook("https://a.example/h", &["quota.threshold"]));
    assert_eq!(r.status, 201, "{}", r.text());
    let made = Instant::now();
    let first = r.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(
        listed(&a, ACME),
        std::slice::from_ref(&first),
        "at once where made"
    );
    wait_until(Duration::from_secs(5), || {
        listed(&b, ACME) == [first.clone()]
    });
    let took = made.elapsed();
    eprintln!("a webhook made on one gateway was listed on the other after {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    assert!(listed(&b, OTHER).is_empty());
    let r = create(&b, ACME, hook("https://b.example/h", &["verdict.changed"]));
    assert_eq!(r.status, 201, "{}", r.text());
    let second = r.json()["id"].as_str().unwrap().to_owned();
    // The plan's bound holds across gateways.
    assert_eq!(
        create(&a, ACME, hook("https://c.example/", &["verdict.changed"])).status,
        201
    );
    create(&b, ACME, hook("https://d.example/", &["verdict.changed"]))
        .assert_error(409, "conflict");

    // Redis holds counts only: losing everything there changes no webhook, and a gateway
    // started after the flush (with its own, empty state folder) reads them from PostgreSQL.
    let mut c = redis.client().get_connection().unwrap();
    let rows: i64 = redis::cmd("EXISTS")
        .arg("drg:{webhooks}:rows")
        .query(&mut c)
        .unwrap();
    assert_eq!(rows, 0, "no webhook on Redis");
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    let fresh = on_redis().start();
    wait_until(Duration::from_secs(5), || listed(&fresh, ACME).len() == 3);
    for id in [&first, &second] {
        assert!(listed(&fresh, ACME).contains(id), "{id}");
    }
    // A removal on the new gateway reaches the others and stays.
    assert_eq!(delete(&fresh, ACME, &first).status, 204);
    wait_until(Duration::from_secs(5), || {
        [&a, &b].iter().all(|g| !listed(g, ACME).contains(&first))
    });
    std::thread::sleep(Duration::from_millis(1_000));
    assert!(!listed(&a, ACME).contains(&first));
    delete(&b, ACME, &first).assert_error(404, "not_found");
}
