//! `GET /metrics` on the admin listener: exact counts after known traffic, reload results, and
//! nothing of a key in the output.

use crate::common;
// Only the server is used here.
use crate::dns;

use crate::redis_server;

use common::*;
use dns::{DnsServer, Zone};
use redis_server::RedisServer;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

const NARROW: &str = "drg_narrow_key_dddddddddddddddddddddddddddddddddd";
const NARROW_ID: &str = "narrowkey42";
const LOOKUP: &str = "/v1/public/domain/example.org";

/// Every sample of the exposition: `name{labels}` -> value (labels as printed, sorted by name).
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("sample line");
            (series.to_owned(), value.parse().expect("sample value"))
        })
        .collect()
}

/// The samples of one metric, keyed by their label set.
fn series(all: &BTreeMap<String, f64>, name: &str) -> BTreeMap<String, f64> {
    all.iter()
        .filter_map(|(k, v)| {
            let labels = k.strip_prefix(name)?;
            (labels.is_empty() || labels.starts_with('{')).then(|| (labels.to_owned(), *v))
        })
        .collect()
}

fn expected(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn scrape(gw: &Gateway) -> (String, BTreeMap<String, f64>) {
    let r = gw.admin_get("/metrics");
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type").unwrap().starts_with("text/plain"),
        "{:?}",
        r.header("content-type")
    );
    let text = String::from_utf8(r.body).unwrap();
    let all = samples(&text);
    (text, all)
}

/// Scrapes until `done` holds (or 5 s passed, for the caller's assertion to show the difference).
fn scrape_until(
    gw: &Gateway,
    mut done: impl FnMut(&BTreeMap<String, f64>) -> bool,
) -> (String, BTreeMap<String, f64>) {
    let mut last = scrape(gw);
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until(Duration::from_secs(5), || {
            last = scrape(gw);
            done(&last.1)
        })
    }));
    last
}

#[test]
fn metrics_count_requests_denials_upstream_errors_and_reloads() {
    let gw = Gateway::builder()
        .plan("tiny", 1)
        .key(NARROW_ID, NARROW, "tiny", &["https://app.example.com"])
        .data("disposable.txt", "dispo-a.com\n")
        .data(
            "domains.csv",
            "domain,reason,risk_score\nrole.example,role_account,60\n",
        )
        .start();

    // Known traffic: 200, 401, 422, 502 (the default dead upstream), 404, 403, 429.
    assert_eq!(gw.get(LOOKUP).status, 200);
    assert_eq!(gw.get("/healthz").status, 200);
    assert_eq!(gw.conn_as(None).get(LOOKUP).unwrap().status, 401);
    assert_eq!(gw.get("/v1/public/domain/a_b.com").status, 422);
    assert_eq!(gw.get("/v1/check/jane%40example.com").status, 502);
    assert_eq!(gw.get("/nowhere").status, 404);
    let mut narrow = gw.conn_as(Some(NARROW));
    let evil = [("Origin", "https://evil.example")];
    assert_eq!(narrow.request("GET", LOOKUP, &evil).unwrap().status, 403);
    let app = [("Origin", "https://app.example.com")];
    assert_eq!(narrow.request("GET", LOOKUP, &app).unwrap().status, 200);
    assert_eq!(narrow.request("GET", LOOKUP, &app).unwrap().status, 429);

    let want_requests = expected(&[
        (r#"{route="domain",status="200"}"#, 2.0),
        (r#"{route="domain",status="401"}"#, 1.0),
        (r#"{route="domain",status="403"}"#, 1.0),
        (r#"{route="domain",status="422"}"#, 1.0),
        (r#"{route="domain",status="429"}"#, 1.0),
        (r#"{route="health",status="200"}"#, 1.0),
        (r#"{route="check",status="502"}"#, 1.0),
        (r#"{route="not_found",status="404"}"#, 1.0),
        // The harness's readiness probe, answered once by this process before it returns.
        (r#"{route="ready",status="200"}"#, 1.0),
    ]);
    // A request is counted once it is finished, which may be just after its answer arrived.
    // (The harness's probes before the start's first read of the control store answered
    // `503 control_store_loading`: how many is the machine's.)
    let requests = |all: &BTreeMap<String, f64>| {
        let mut s = series(all, "drg_requests_total");
        s.remove(r#"{route="ready",status="503"}"#);
        s
    };
    let (text, all) = scrape_until(&gw, |all| requests(all) == want_requests);
    assert_eq!(requests(&all), want_requests, "{text}");
    let durations = series(&all, "drg_request_duration_seconds_count");
    assert_eq!(durations[r#"{route="domain"}"#], 6.0, "{text}");
    assert_eq!(durations[r#"{route="check"}"#], 1.0);
    assert_eq!(durations[r#"{route="usage"}"#], 0.0);
    assert_eq!(
        series(&all, "drg_denials_total"),
        expected(&[
            (r#"{reason="forbidden"}"#, 1.0),
            (r#"{reason="quota_exceeded"}"#, 1.0),
            (r#"{reason="rate_limited"}"#, 0.0),
            (r#"{reason="unauthorized"}"#, 1.0),
        ])
    );
    assert_eq!(
        series(&all, "drg_upstream_errors_total"),
        expected(&[
            (r#"{kind="bad_response"}"#, 0.0),
            (r#"{kind="connect_error"}"#, 0.0),
            (r#"{kind="connect_refused"}"#, 1.0),
            (r#"{kind="reset"}"#, 0.0),
            (r#"{kind="timeout"}"#, 0.0),
        ])
    );
    assert_eq!(all["drg_upstream_duration_seconds_count"], 0.0);
    assert_eq!(all["drg_table_names"], 2.0, "{text}");
    assert_eq!(all["drg_table_generation"], 1.0, "{text}");
    assert_eq!(all["drg_quota_slots_full_total"], 0.0, "{text}");
    assert_eq!(all["drg_quota_refused_calls_total"], 0.0, "{text}");
    assert_eq!(all["drg_quota_slots"], 65_536.0, "{text}");
    assert!(all["drg_quota_slots_used"] <= 2.0, "{text}");
    assert_eq!(all["drg_keys"], 2.0);
    assert_eq!(all["drg_quota_store_up"], 1.0);
    assert_eq!(all["drg_quota_breaker_open"], 0.0);
    let build = format!(
        r#"drg_build_info{{git_hash="{}",version="{}"}}"#,
        drg_gateway::cli::GIT_HASH,
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(all.get(&build), Some(&1.0), "{text}");
    assert!(all.contains_key("drg_downstream_open_connections"));
    assert_eq!(
        series(&all, "drg_client_error_log_lines_total").len(),
        5,
        "one series per client-error category: {text}"
    );
    // MX lookups are off in this gateway: no MX series.
    assert!(!text.contains("drg_mx_"), "{text}");
    // Loaded at start: a last-success time per source, no reload yet.
    let loaded = series(&all, "drg_reload_last_success_timestamp_seconds");
    assert_eq!(loaded.len(), 2, "{text}");
    assert!(loaded.values().all(|t| *t > 1.7e9));
    assert!(series(&all, "drg_reloads_total")
        .values()
        .all(|n| *n == 0.0));

    // Nothing of a key: no id as a label value, no secret.
    for needle in [TEST_SECRET, NARROW, NARROW_ID, "\"test\""] {
        assert!(!text.contains(needle), "{needle} in the metrics");
    }

    // A good reload of the table, then a broken one, then a refused keys file (emptied).
    write_atomic(
        &gw.data_path("disposable.txt"),
        "dispo-a.com\ndispo-b.com\n",
    );
    wait_until(Duration::from_secs(5), || {
        scrape(&gw).1[r#"drg_reloads_total{result="ok",source="table"}"#] == 1.0
    });
    write_atomic(
        &gw.data_path("domains.csv"),
        "domain,reason,risk_score\nbroken.example,spam,1\n",
    );
    wait_until(Duration::from_secs(5), || {
        scrape(&gw).1[r#"drg_reloads_total{result="error",source="table"}"#] == 1.0
    });
    std::fs::File::create(gw.dir.path().join("keys.yaml")).unwrap();
    wait_until(Duration::from_secs(5), || {
        scrape(&gw).1[r#"drg_reloads_total{result="error",source="keys"}"#] == 1.0
    });
    let (text, all) = scrape(&gw);
    assert_eq!(
        series(&all, "drg_reloads_total"),
        expected(&[
            (r#"{result="error",source="keys"}"#, 1.0),
            (r#"{result="error",source="table"}"#, 1.0),
            (r#"{result="ok",source="keys"}"#, 0.0),
            (r#"{result="ok",source="table"}"#, 1.0),
            (r#"{result="refused",source="keys"}"#, 0.0),
            (r#"{result="refused",source="table"}"#, 0.0),
        ]),
        "{text}"
    );
    // The table reloaded once: its last success moved past the keys'.
    let loaded = series(&all, "drg_reload_last_success_timestamp_seconds");
    assert!(loaded[r#"{source="table"}"#] > loaded[r#"{source="keys"}"#]);
    assert_eq!(all["drg_table_names"], 3.0, "{text}");
    assert_eq!(all["drg_table_generation"], 2.0, "one reload taken: {text}");
}

#[test]
fn upstream_answers_and_timeouts_are_measured() {
    let up = Upstream::start(Duration::ZERO);
    let gw = Gateway::builder().upstream(up.addr).start();
    assert_eq!(gw.get("/v1/check/example.com").status, 200);
    let (text, all) = scrape_until(&gw, |all| {
        all.get(r#"drg_requests_total{route="check",status="200"}"#) == Some(&1.0)
    });
    assert_eq!(all["drg_upstream_duration_seconds_count"], 1.0, "{text}");
    assert!(series(&all, "drg_upstream_errors_total")
        .values()
        .all(|n| *n == 0.0));

    // Slower than the 1 s read timeout the harness configures.
    let slow = Upstream::start(Duration::from_millis(1500));
    let gw = Gateway::builder().upstream(slow.addr).start();
    assert_eq!(gw.get("/v1/check/example.com").status, 504);
    let (text, all) = scrape_until(&gw, |all| {
        all.get(r#"drg_requests_total{route="check",status="504"}"#) == Some(&1.0)
    });
    assert_eq!(
        all[r#"drg_upstream_errors_total{kind="timeout"}"#], 1.0,
        "{text}"
    );
    assert_eq!(all["drg_upstream_duration_seconds_count"], 0.0);
}

#[test]
fn mx_lookups_and_cache_are_counted() {
    let zone = Zone {
        mx: vec![(10, "mail.selfhosted.test".to_owned())],
        a: None,
        ttl: 300,
    };
    let server = DnsServer::start(HashMap::from([("selfhosted.test".to_owned(), zone)]));
    let gw = Gateway::builder().dns(server.addr).start();
    for _ in 0..2 {
        assert_eq!(gw.get("/v1/public/domain/selfhosted.test").status, 200);
    }
    let (text, all) = scrape_until(&gw, |all| {
        all.get("drg_mx_cache_hits_total") == Some(&1.0)
            && all.get("drg_mx_lookups_in_flight") == Some(&0.0)
    });
    assert_eq!(all["drg_mx_cache_misses_total"], 1.0, "{text}");
    assert_eq!(all["drg_mx_cache_hits_total"], 1.0, "{text}");
    assert_eq!(all["drg_mx_cache_entries"], 1.0, "{text}");
    assert_eq!(all["drg_mx_lookups_refused_total"], 0.0, "{text}");
    assert_eq!(all["drg_mx_lookups_in_flight"], 0.0, "{text}");
}

#[test]
fn the_redis_quota_store_state_is_exported() {
    let mut redis = RedisServer::start(false);
    let gw = Gateway::builder().redis(&redis.url(), "fail_open").start();
    assert_eq!(gw.get(LOOKUP).status, 200);
    let (text, all) = scrape_until(&gw, |all| all.get("drg_quota_store_up") == Some(&1.0));
    assert_eq!(all["drg_quota_store_up"], 1.0, "{text}");
    assert_eq!(all["drg_quota_breaker_open"], 0.0, "{text}");
    assert_eq!(all["drg_quota_pending_local_counts"], 0.0, "{text}");

    redis.kill();
    for _ in 0..5 {
        assert_eq!(gw.get(LOOKUP).status, 200);
    }
    let (text, all) = scrape_until(&gw, |all| all.get("drg_quota_store_up") == Some(&0.0));
    assert_eq!(all["drg_quota_store_up"], 0.0, "{text}");
    assert_eq!(all["drg_quota_breaker_open"], 1.0, "{text}");
    assert_eq!(all["drg_quota_pending_local_counts"], 5.0, "{text}");
}
