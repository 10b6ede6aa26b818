//! Projects: keys of one project share its monthly count exactly (both quota stores, under
//! concurrency), in `/v1/usage`, the RateLimit headers and the 429; a key without `project` is
//! its own project, as in keys files written before projects existed.

use crate::common;
use crate::redis_server;

use std::collections::BTreeMap;

use common::*;
use redis_server::RedisServer;

const WEB: &str = "drg_acme_web_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const SERVER: &str = "drg_acme_server_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const SOLO: &str = "drg_solo_key_cccccccccccccccccccccccccccccccccccccccc";
const LOOKUP: &str = "/v1/public/domain/example.org";
const LIMIT: u64 = 150;

fn builder() -> GatewayBuilder {
    // `starter` allows 5 keys per project by its name's defaults.
    Gateway::builder()
        .plan("starter", LIMIT)
        .key_in_project("web", WEB, "starter", "acme")
        .key_in_project("server", SERVER, "starter", "acme")
        .key("solo", SOLO, "starter", &[])
}

/// Clients alternate between the two keys of the project; 2 x 8 x 16 = 256 calls for 150.
fn hammer_project(gw: &Gateway) -> BTreeMap<u16, usize> {
    let mut counts = hammer(&[gw.addr], WEB, LOOKUP, 8, 16);
    for (status, n) in hammer(&[gw.addr], SERVER, LOOKUP, 8, 16) {
        *counts.entry(status).or_insert(0) += n;
    }
    counts
}

fn usage(gw: &Gateway, secret: &str) -> (serde_json::Value, Response) {
    let r = gw.conn_as(Some(secret)).get("/v1/usage").unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    (r.json(), r)
}

/// `r` of the `RateLimit` header: calls remaining.
fn remaining(r: &Response) -> u64 {
    let h = r.header("ratelimit").expect("RateLimit header");
    h.split(";r=")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn assert_shared_count(gw: &Gateway) {
    // Run both keys' clients at once: the two hammers in two threads.
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| hammer(&[gw.addr], WEB, LOOKUP, 8, 16));
        let b = s.spawn(|| hammer(&[gw.addr], SERVER, LOOKUP, 8, 16));
        (a.join().unwrap(), b.join().unwrap())
    });
    let mut counts = a.clone();
    for (status, n) in &b {
        *counts.entry(*status).or_insert(0) += n;
    }
    assert_eq!(
        counts,
        [(200, LIMIT as usize), (429, 256 - LIMIT as usize)].into(),
        "web {a:?}, server {b:?}"
    );
    assert!(
        a.contains_key(&200) && b.contains_key(&200),
        "both keys were served"
    );
    for secret in [WEB, SERVER] {
        let (u, r) = usage(gw, secret);
        assert_eq!(u["month_count"], LIMIT, "{u}");
        assert_eq!(u["monthly_limit"], LIMIT, "{u}");
        assert_eq!(u["plan"], "starter");
        assert_eq!(remaining(&r), 0);
        let denied = gw.conn_as(Some(secret)).get(LOOKUP).unwrap();
        denied.assert_error(429, "quota_exceeded");
        assert_eq!(remaining(&denied), 0);
    }
    // A key without `project` is its own project: untouched by acme's calls.
    let (u, r) = usage(gw, SOLO);
    assert_eq!(u["month_count"], 0, "{u}");
    assert_eq!(remaining(&r), LIMIT);
    let ok = gw.conn_as(Some(SOLO)).get(LOOKUP).unwrap();
    assert_eq!(ok.status, 200);
    assert_eq!(remaining(&ok), LIMIT - 1);
    assert_eq!(usage(gw, SOLO).0["month_count"], 1);
    // And so is the harness's test key, written without `project` like every file before.
    assert_eq!(gw.get(LOOKUP).status, 200);
}

#[test]
fn two_keys_of_a_project_share_one_exact_count_in_the_embedded_store() {
    let gw = builder().start();
    assert_shared_count(&gw);
}

#[test]
fn two_keys_of_a_project_share_one_exact_count_in_redis() {
    let redis = RedisServer::start(false);
    let gw = builder().redis(&redis.url(), "fail_closed").start();
    assert_shared_count(&gw);
    // One counter for the project, named by the project (not by either key).
    let month = chrono::Utc::now().format("%Y-%m");
    assert_eq!(
        redis.int(&["GET", &format!("q:{{acme}}:{month}")]),
        Some(LIMIT as i64)
    );
    assert_eq!(
        redis.int(&["EXISTS", &format!("q:{{web}}:{month}")]),
        Some(0)
    );
    assert_eq!(
        redis.int(&["EXISTS", &format!("q:{{server}}:{month}")]),
        Some(0)
    );
}

#[test]
fn the_count_of_a_project_survives_a_restart() {
    let gw = builder().start();
    let counts = hammer_project(&gw);
    assert_eq!(counts[&200], LIMIT as usize);
    let dir = gw.stop();
    let gw = builder().in_dir(dir).start();
    for secret in [WEB, SERVER] {
        assert_eq!(usage(&gw, secret).0["month_count"], LIMIT);
    }
}

#[test]
fn a_keys_file_that_breaks_project_rules_is_refused_at_start() {
    // Two plans in one project.
    let gw = Gateway::builder()
        .plan("starter", 10)
        .plan("pro", 10)
        .key_in_project("a", WEB, "starter", "acme")
        .key_in_project("b", SERVER, "pro", "acme");
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| gw.start()));
    let msg = match out {
        Ok(_) => panic!("a project on two plans must not start"),
        Err(e) => e.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    assert!(
        msg.contains("project 'acme' is on plan 'pro' here but on plan 'starter' for key 'a'"),
        "{msg}"
    );
    // More keys than the plan's max_keys (free: 1).
    let gw = Gateway::builder()
        .plan("free", 10)
        .key_in_project("a", WEB, "free", "acme")
        .key_in_project("b", SERVER, "free", "acme");
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| gw.start()));
    let msg = match out {
        Ok(_) => panic!("a project over max_keys must not start"),
        Err(e) => e.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    assert!(
        msg.contains("project 'acme' has 2 keys but its plan 'free' allows 1 (max_keys)"),
        "{msg}"
    );
}
