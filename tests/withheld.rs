//! A removal outlives the shared Redis's loss whichever gateway comes back first: gateway B is
//! stopped, A revokes a key, removes an override and a webhook, A stops, Redis loses its data
//! (`FLUSHALL`), B starts first. The override and the webhook live in the control store
//! (PostgreSQL), which the flush does not touch: B serves what A left, with nothing to put back
//! or withhold. The API-made keys still live on the shared Redis: a copy from the state folder is
//! never put back on its own (it may lack revocations made while its gateway was away): it puts
//! back its tombstones only and withholds the rest, which the operator's `restore-withheld` puts
//! back once every gateway has started again, less every revocation the others published.

use crate::common;
use crate::keys_api::{lookup, made_by, revoke};
use crate::postgres::Postgres;
use crate::redis_server::RedisServer;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const SERVER: &str = "drg_withheld_server_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
/// Generous: a poll is 200 to 400 ms, but the machine may be loaded.
const WITHIN: Duration = Duration::from_secs(20);

/// Project `acme` on `team`, the quota and API-made keys on `redis`, overrides and webhooks on
/// `pg`.
fn builder(redis: &RedisServer, pg: &Postgres) -> GatewayBuilder {
    Gateway::builder()
        .plan_yaml(
            "team",
            "{ monthly_limit: 100000, max_keys: 6, max_overrides: 5, max_webhooks: 5 }",
        )
        .key_in_project("server", SERVER, "team", "acme")
        .redis(&redis.url(), "fail_open")
        .gateway_yaml("keys_api: { shared_poll_ms: 200 }")
        .gateway_yaml("webhooks: {}")
        .gateway_yaml(&format!("control: {{ url: '{}' }}", pg.url()))
}

fn send_json(gw: &Gateway, method: &str, path: &str, body: Option<Value>) -> Response {
    let body = body.map(|b| b.to_string());
    send(
        gw,
        method,
        path,
        Some(SERVER),
        &[],
        body.as_deref().map(str::as_bytes),
    )
}

fn block(gw: &Gateway, domain: &str) {
    let r = send_json(
        gw,
        "PUT",
        &format!("/v1/overrides/{domain}"),
        Some(json!({"verdict": "block"})),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

fn hook(gw: &Gateway, url: &str) -> String {
    let body = json!({"url": url, "events": ["verdict.changed"]});
    let r = send_json(gw, "POST", "/v1/webhooks", Some(body));
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()["id"].as_str().unwrap().to_owned()
}

/// What `gw` answers for project acme: (blocked names of `names`, webhook ids listed).
fn state(gw: &Gateway, names: &[&str]) -> (Vec<String>, Vec<String>) {
    let blocked = names
        .iter()
        .filter(|n| {
            let r = send_json(gw, "GET", &format!("/v1/public/domain/{n}"), None);
            r.json()["reason"] == "disposable"
        })
        .map(|n| n.to_string())
        .collect();
    let r = send_json(gw, "GET", "/v1/webhooks", None);
    let mut hooks: Vec<String> = (r.json()["items"].as_array().cloned().unwrap_or_default())
        .iter()
        .filter_map(|h| h["id"].as_str().map(str::to_owned))
        .collect();
    hooks.sort();
    (blocked, hooks)
}

/// Waits until `gw` logs `text`.
fn logged(gw: &Gateway, text: &str) {
    let deadline = Instant::now() + WITHIN;
    while !gw.log().contains(text) {
        assert!(Instant::now() < deadline, "no {text:?} in:\n{}", gw.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until `check` holds, then that it holds for a few polls (a restore would undo it
/// within one).
fn holds(what: &str, check: impl Fn() -> bool) {
    wait_until(WITHIN, &check);
    let until = Instant::now() + Duration::from_millis(1_500);
    while Instant::now() < until {
        assert!(check(), "{what} changed back");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `domain-risk-gateway -c <gw's config> restore-withheld`: its standard output.
fn restore_withheld(gw: &Gateway) -> String {
    let out = Command::new(BIN)
        .arg("-c")
        .arg(gw.dir.path().join("gateway.yaml"))
        .arg("restore-withheld")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    said
}

#[test]
fn removals_outlive_a_lost_redis_when_the_gateway_that_missed_them_comes_back_first() {
    let redis = RedisServer::start(false);
    let pg = Postgres::start();
    let (a, b) = (builder(&redis, &pg).start(), builder(&redis, &pg).start());
    let (gone, gone_secret) = made_by(&a, SERVER, "revoked while B is away");
    let (_, kept_secret) = made_by(&a, SERVER, "kept");
    block(&a, "removed.example");
    block(&a, "kept.example");
    let removed_hook = hook(&a, "https://removed.example/h");
    let kept_hook = hook(&a, "https://kept.example/h");
    let names = ["kept.example", "removed.example"];
    let mut all_hooks = vec![kept_hook.clone(), removed_hook.clone()];
    all_hooks.sort();
    let everything = (names.map(str::to_owned).to_vec(), all_hooks);
    // B's copies hold everything when it stops.
    wait_until(WITHIN, || {
        lookup(&b, &gone_secret) == 200 && state(&b, &names) == everything
    });
    std::thread::sleep(Duration::from_millis(1_000));
    let b_dir = b.stop();
    assert_eq!(revoke(&a, SERVER, &gone).status, 204);
    let r = send_json(&a, "DELETE", "/v1/overrides/removed.example", None);
    assert_eq!(r.status, 204, "{}", r.text());
    let r = send_json(&a, "DELETE", &format!("/v1/webhooks/{removed_hook}"), None);
    assert_eq!(r.status, 204, "{}", r.text());
    let a_dir = a.stop();
    let mut c = redis.client().get_connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();

    // B comes back first: nothing it missed is in force; its keys are withheld, and the
    // overrides and webhooks are the control store's, as A left them.
    let b = builder(&redis, &pg).in_dir(b_dir).start();
    let kept = (vec!["kept.example".to_owned()], vec![kept_hook.clone()]);
    holds("B's answers", || {
        lookup(&b, &gone_secret) == 401
            && lookup(&b, &kept_secret) == 401
            && state(&b, &names) == kept
    });
    logged(&b, "keys: the shared key store lost its data while");
    let told = b.admin_get("/readyz").json()["withheld"].clone();
    assert_eq!(told, json!(["keys.withheld.json"]));
    assert!(!b.log().contains("overrides: the shared store"));
    // A returns: its removals go into the store with it.
    let a = builder(&redis, &pg).in_dir(a_dir).start();
    logged(&a, "withheld");
    // The operator's word on B, whose copy is the older: only what was not removed comes back.
    let said = restore_withheld(&b);
    assert!(said.contains("put back"), "{said}");
    assert!(b.admin_get("/readyz").json().get("withheld").is_none());
    for gw in [&a, &b] {
        holds("the restored state", || {
            lookup(gw, &gone_secret) == 401
                && lookup(gw, &kept_secret) == 200
                && state(gw, &names) == kept
        });
    }
    // A second run puts nothing back twice; A's own copy adds nothing removed.
    assert!(restore_withheld(&b).contains("nothing withheld"));
    restore_withheld(&a);
    for gw in [&a, &b] {
        holds("the state after A's copy", || {
            lookup(gw, &gone_secret) == 401 && state(gw, &names) == kept
        });
    }
}
