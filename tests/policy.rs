//! Traffic policy against the real binary: a plan's per-second rate (GCRA) beside its monthly
//! quota, on the embedded store and shared by two gateways on one Redis; shadow mode.

use crate::common;
use crate::redis_server;

use std::time::{Duration, Instant};

use common::*;
use redis_server::RedisServer;

const KEY: &str = "drg_policy_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const MONTH_KEY: &str = "drg_policy_month_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const LOOKUP: &str = "/v1/public/domain/example.org";

fn month_count(gw: &Gateway, secret: &str) -> u64 {
    let r = gw.conn_as(Some(secret)).get("/v1/usage").unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["month_count"].as_u64().unwrap()
}

#[test]
fn a_burst_over_the_rate_gets_429_rate_limited_then_the_rate_recovers() {
    let gw = Gateway::builder()
        .plan_yaml(
            "metered",
            "{ monthly_limit: 1000, rate_per_second: 5, burst: 10 }",
        )
        .key_in_project("k", KEY, "metered", "acme")
        .start();
    let mut c = gw.conn_as(Some(KEY));
    let answers: Vec<Response> = (0..20).map(|_| c.get(LOOKUP).unwrap()).collect();
    let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
    // The whole burst passes; at 5/s, at most one more refills while 20 calls go by.
    assert!(statuses[..10].iter().all(|s| *s == 200), "{statuses:?}");
    let ok = statuses.iter().filter(|s| **s == 200).count();
    assert!((10..=11).contains(&ok), "{statuses:?}");
    let first = &answers[0];
    let policy = first.header("ratelimit-policy").unwrap();
    assert!(policy.starts_with("\"monthly\";q=1000;w="), "{policy}");
    assert!(policy.ends_with(", \"rate\";q=5;w=1;burst=10"), "{policy}");
    let now = first.header("ratelimit").unwrap();
    assert!(now.contains(", \"rate\";r=9;t=1"), "{now}");
    let refused = answers.iter().find(|r| r.status == 429).unwrap();
    refused.assert_error(429, "rate_limited");
    assert!(
        refused.json()["message"]
            .as_str()
            .unwrap()
            .contains("per second"),
        "{}",
        refused.json()
    );
    // 200 ms apart at 5/s: the next call conforms within 200 ms, said as 1 s (rounded up).
    assert_eq!(refused.header("retry-after"), Some("1"));
    let rate_now = refused.header("ratelimit").unwrap();
    assert!(rate_now.contains("\"rate\";r=0;t="), "{rate_now}");
    // Refused calls are not counted in the month.
    assert_eq!(month_count(&gw, KEY), ok as u64);
    assert_eq!(
        gw.metric("drg_denials_total{reason=\"rate_limited\"}"),
        Some((20 - ok) as f64)
    );
    // After Retry-After, the rate lets calls through again.
    std::thread::sleep(Duration::from_millis(1_100));
    let again: Vec<u16> = (0..4).map(|_| c.get(LOOKUP).unwrap().status).collect();
    assert_eq!(again, [200; 4], "5 refilled in a second");
}

#[test]
fn two_gateways_on_one_redis_hold_the_rate_together_and_each_alone_when_it_is_gone() {
    let redis = RedisServer::start(false);
    let builder = || {
        Gateway::builder()
            .plan_yaml(
                "metered",
                "{ monthly_limit: 100000, rate_per_second: 2, burst: 20 }",
            )
            .key_in_project("k", KEY, "metered", "acme")
            .redis(&redis.url(), "fail_open")
    };
    let (a, b) = (builder().start(), builder().start());
    // 60 calls at once over both: alone, each gateway would pass its own burst of 20 (40).
    let started = Instant::now();
    let counts = hammer(&[a.addr, b.addr], KEY, LOOKUP, 6, 10);
    let elapsed = started.elapsed().as_secs_f64();
    let ok = counts.get(&200).copied().unwrap_or(0);
    let refill = (2.0 * elapsed).ceil() as usize;
    assert!(
        (20..=20 + refill + 1).contains(&ok),
        "{counts:?} in {elapsed:.2}s"
    );
    assert_eq!(
        counts.get(&429).copied().unwrap_or(0),
        60 - ok,
        "{counts:?}"
    );
    assert!(redis.int(&["PTTL", "q:{acme}:rate"]).unwrap() > 0);
    // Both count the month in Redis: only the calls served.
    assert_eq!(month_count(&a, KEY), ok as u64);

    // Redis gone, fail_open: each gateway limits on its own (a burst each, then 429).
    drop(redis);
    wait_until(Duration::from_secs(10), || {
        a.metric("drg_quota_store_up") == Some(0.0)
    });
    std::thread::sleep(Duration::from_millis(500));
    let mut c = a.conn_as(Some(KEY));
    let alone: Vec<u16> = (0..25).map(|_| c.get(LOOKUP).unwrap().status).collect();
    let served = alone.iter().filter(|s| **s == 200).count();
    assert!((20..=22).contains(&served), "{alone:?}");
    assert_eq!(alone.last(), Some(&429), "{alone:?}");
}

#[test]
fn a_fail_closed_store_that_is_gone_refuses_rate_checked_calls_with_503() {
    let mut redis = RedisServer::start(false);
    let gw = Gateway::builder()
        .plan_yaml(
            "metered",
            "{ monthly_limit: 1000, rate_per_second: 5, burst: 10 }",
        )
        .key_in_project("k", KEY, "metered", "acme")
        .redis(&redis.url(), "fail_closed")
        .start();
    assert_eq!(gw.conn_as(Some(KEY)).get(LOOKUP).unwrap().status, 200);
    redis.kill();
    let r = gw.conn_as(Some(KEY)).get(LOOKUP).unwrap();
    r.assert_error(503, "service_unavailable");
}

#[test]
fn shadow_mode_answers_200_with_the_would_reject_header_and_an_exact_count() {
    let gw = Gateway::builder()
        .plan_yaml(
            "trial",
            "{ monthly_limit: 1000, rate_per_second: 1, burst: 3, mode: shadow }",
        )
        .plan_yaml("capped", "{ monthly_limit: 5, mode: shadow }")
        .key_in_project("r", KEY, "trial", "rated")
        .key_in_project("m", MONTH_KEY, "capped", "monthly")
        .gateway_yaml("access_log: { enabled: true, path: access.log }")
        .start();
    let mut c = gw.conn_as(Some(KEY));
    let rated: Vec<Response> = (0..8).map(|_| c.get(LOOKUP).unwrap()).collect();
    assert!(rated.iter().all(|r| r.status == 200));
    let marks: Vec<Option<&str>> = rated
        .iter()
        .map(|r| r.header("x-ratelimit-would-reject"))
        .collect();
    assert_eq!(marks[..3], [None, None, None], "the burst of 3");
    assert!(
        marks[3..].iter().all(|m| *m == Some("rate_limited")),
        "{marks:?}"
    );
    assert_eq!(month_count(&gw, KEY), 8, "every call served is counted");

    let mut c = gw.conn_as(Some(MONTH_KEY));
    let capped: Vec<Response> = (0..8).map(|_| c.get(LOOKUP).unwrap()).collect();
    assert!(capped.iter().all(|r| r.status == 200));
    let marks: Vec<Option<&str>> = capped
        .iter()
        .map(|r| r.header("x-ratelimit-would-reject"))
        .collect();
    assert_eq!(marks[..5], [None; 5]);
    assert_eq!(marks[5..], [Some("quota_exceeded"); 3]);
    assert!(capped[7].header("ratelimit").unwrap().contains("r=0;"));
    let u = gw.conn_as(Some(MONTH_KEY)).get("/v1/usage").unwrap().json();
    assert_eq!(
        (u["month_count"].as_u64(), u["monthly_limit"].as_u64()),
        (Some(8), Some(5)),
        "{u}"
    );

    assert_eq!(
        gw.metric("drg_would_reject_total{reason=\"quota_exceeded\"}"),
        Some(3.0)
    );
    assert_eq!(
        gw.metric("drg_would_reject_total{reason=\"rate_limited\"}"),
        Some(5.0)
    );
    assert_eq!(
        gw.metric("drg_denials_total{reason=\"quota_exceeded\"}"),
        Some(0.0)
    );
    let log_path = gw.dir.path().join("access.log");
    wait_until(Duration::from_secs(5), || {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .matches("\"would_reject\":\"quota_exceeded\"")
            .count()
            == 3
    });
}

/// A 1,000-name batch the month refuses, then single calls the month refuses: none of them
/// spends the per-second rate (before, the batch left the project `429 rate_limited` for ~50 s).
fn refused_calls_spend_no_rate(gw: &Gateway, redis: Option<&RedisServer>) {
    let names: Vec<String> = (0..1000).map(|i| format!("n{i}.example")).collect();
    let body = serde_json::json!({ "domains": names }).to_string();
    let batch = |gw: &Gateway| {
        send(
            gw,
            "POST",
            "/v1/public/domains",
            Some(KEY),
            &[],
            Some(body.as_bytes()),
        )
    };
    let refused = batch(gw);
    refused.assert_error(429, "quota_exceeded");
    let rate_after = refused.header("ratelimit").unwrap().to_owned();
    assert!(rate_after.contains("\"rate\";r=20;"), "{rate_after}");
    // The month has room for single calls: they pass at once, within the burst.
    let mut c = gw.conn_as(Some(KEY));
    for i in 0..5 {
        let r = c.get(LOOKUP).unwrap();
        assert_eq!(
            r.status,
            200,
            "call {i}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let now = r.header("ratelimit").unwrap();
        assert!(now.contains(&format!("\"rate\";r={};", 19 - i)), "{now}");
    }
    // Month used up: calls refused for the month, never for the rate, and they spend none.
    for _ in 0..30 {
        let r = c.get(LOOKUP).unwrap();
        r.assert_error(429, "quota_exceeded");
        assert!(r.header("ratelimit").unwrap().contains("\"rate\";r=15;"));
    }
    assert_eq!(month_count(gw, KEY), 5);
    assert_eq!(
        gw.metric("drg_denials_total{reason=\"quota_exceeded\"}"),
        Some(31.0)
    );
    assert_eq!(
        gw.metric("drg_denials_total{reason=\"rate_limited\"}"),
        Some(0.0)
    );
    if let Some(redis) = redis {
        // Five calls taken at 1/s leave the shared key at most 5 s ahead.
        let pttl = redis.int(&["PTTL", "q:{acme}:rate"]).unwrap();
        assert!((1..=5_100).contains(&pttl), "{pttl} ms");
    }
}

const REFUSED_PLAN: &str = "{ monthly_limit: 5, rate_per_second: 1, burst: 20 }";

#[test]
fn a_call_refused_for_the_month_spends_no_rate() {
    let gw = Gateway::builder()
        .plan_yaml("metered", REFUSED_PLAN)
        .key_in_project("k", KEY, "metered", "acme")
        .start();
    refused_calls_spend_no_rate(&gw, None);
}

#[test]
fn a_call_refused_for_the_month_spends_no_rate_on_redis() {
    let redis = RedisServer::start(false);
    let gw = Gateway::builder()
        .plan_yaml("metered", REFUSED_PLAN)
        .key_in_project("k", KEY, "metered", "acme")
        .redis(&redis.url(), "fail_open")
        .start();
    refused_calls_spend_no_rate(&gw, Some(&redis));
}
