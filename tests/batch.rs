//! `POST /v1/public/domains` against the real binary: names answered in order by the single
//! lookup's rules (invalid ones in their place), every name one call taken at once (a batch
//! larger than what remains is refused whole and counts nothing, on the embedded store and on a
//! real Redis, in the month and in the rate), call logs, stats and live top-domains seeing every
//! name, the limits as JSON errors, CORS, HTTP/2, and the MX of a batch resolved concurrently
//! against a slow real DNS server.

use crate::certs;
use crate::common;
use crate::dns;
use crate::redis_server;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const BATCH: &str = "/v1/public/domains";
/// A key on a plan with a per-second rate.
const METERED: &str = "drg_metered_key_for_batch_tests_0123456789abcdefg";
const DISPOSABLE: &str = "mailinator.com\nyopmail.com\n";
const TOP: &str = "top_domains: { render_interval_ms: 50, persist_interval_ms: 200, \
                   sync_interval_ms: 100, state_file: state/top.json }";

fn post(gw: &Gateway, path: &str, body: &Value) -> Response {
    let body = body.to_string();
    send(
        gw,
        "POST",
        path,
        Some(TEST_SECRET),
        &[],
        Some(body.as_bytes()),
    )
}

fn month_count(gw: &Gateway) -> u64 {
    let r = send(gw, "GET", "/v1/usage", Some(TEST_SECRET), &[], None);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()["month_count"].as_u64().unwrap()
}

fn single(gw: &Gateway, name: &str, query: &str) -> Value {
    let r = send(
        gw,
        "GET",
        &format!("/v1/public/domain/{name}{query}"),
        Some(TEST_SECRET),
        &[],
        None,
    );
    assert_eq!(r.status, 200);
    r.json()
}

#[test]
fn names_are_answered_in_order_by_the_single_lookups_rules_and_each_is_seen() {
    let gw = Gateway::builder()
        .plan("test", 1_000)
        .data("disposable.txt", DISPOSABLE)
        .data("free_providers.txt", "gmail.com\n")
        .gateway_yaml(TOP)
        .start();
    let names = [
        "mailinator.com",
        "Gmail.com",
        "not a domain!",
        "x.yopmail.com",
        "mailinator.com",
        "",
        "example.org",
    ];
    let r = post(&gw, BATCH, &json!({ "domains": names }));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("application/json"));
    // Every name is one call, valid or not; the headers say what is left after the batch.
    let ratelimit = r.header("ratelimit").unwrap();
    let left = format!("\"monthly\";r={};", 1_000 - names.len());
    assert!(ratelimit.starts_with(&left), "{ratelimit}");
    let body = r.json();
    assert_eq!(body["count"], names.len());
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), names.len());
    for (i, sent) in names.iter().enumerate() {
        let got = &results[i];
        if [2, 5].contains(&i) {
            assert_eq!(got["domain"], *sent, "invalid names are echoed as sent");
            assert_eq!(got["error"], "validation_error");
            assert!(got["detail"].as_str().is_some_and(|d| !d.is_empty()));
        } else {
            assert_eq!(
                *got,
                single(&gw, sent, ""),
                "{sent}: as the single lookup says"
            );
        }
    }
    assert_eq!(results[0]["reason"], "disposable");
    assert_eq!(results[1]["domain"], "gmail.com");
    assert_eq!(results[3]["reason"], "disposable", "a listed parent");
    // 7 batch calls and 5 single lookups.
    assert_eq!(month_count(&gw), 12);

    // `?explain=true`: each record with its evidence, as the single lookup explains it.
    let r = post(
        &gw,
        &format!("{BATCH}?explain=true"),
        &json!({ "domains": ["x.yopmail.com", "bad..name"] }),
    );
    assert_eq!(r.status, 200);
    let results = r.json()["results"].as_array().unwrap().clone();
    assert_eq!(results[0], single(&gw, "x.yopmail.com", "?explain=true"));
    assert!(results[0]["evidence"].is_object());
    assert_eq!(results[1]["error"], "validation_error");
    let r = post(
        &gw,
        &format!("{BATCH}?explain=maybe"),
        &json!({ "domains": ["a.com"] }),
    );
    r.assert_error(422, "validation_error");

    // Call logs and stats see every name answered with a record (the invalid ones are not
    // lookups of anything).
    let logged = || {
        let r = send(
            &gw,
            "GET",
            "/v1/logs?limit=100",
            Some(TEST_SECRET),
            &[],
            None,
        );
        r.json()["items"].as_array().unwrap().len()
    };
    // 5 + 1 valid names in batches, 5 + 1 single lookups.
    wait_until(Duration::from_secs(10), || logged() == 12);
    assert_eq!(logged(), 12);
    let stats = send(&gw, "GET", "/v1/stats", Some(TEST_SECRET), &[], None).json();
    let today = stats["chart"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(today["total_requests"], 12, "{today}");

    // Live top-domains ranks what batches flagged.
    let top = || {
        let r = send(
            &gw,
            "GET",
            "/v1/public/top-domains",
            Some(TEST_SECRET),
            &[],
            None,
        );
        r.json()["domains"].as_array().unwrap().clone()
    };
    wait_until(Duration::from_secs(10), || {
        top()
            .first()
            .is_some_and(|d| d["domain"] == "mailinator.com")
    });
    assert_eq!(top()[0]["domain"], "mailinator.com", "{:?}", top());
    assert_eq!(gw.metric("drg_batch_names_total"), Some(9.0));
    assert!(gw
        .metric("drg_requests_total{route=\"batch\",status=\"200\"}")
        .is_some_and(|n| n >= 2.0));
}

#[test]
fn a_batch_larger_than_what_remains_is_refused_whole_and_counts_nothing() {
    let gw = Gateway::builder().plan("test", 10).start();
    let names = |n: usize| json!({ "domains": (0..n).map(|i| format!("n{i}.example")).collect::<Vec<_>>() });
    assert_eq!(post(&gw, BATCH, &names(7)).status, 200);
    assert_eq!(month_count(&gw), 7);
    let refused = post(&gw, BATCH, &names(4));
    refused.assert_error(429, "quota_exceeded");
    let v = refused.json();
    assert_eq!(v["remaining"], 3, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("4 names"), "{v}");
    assert!(refused
        .header("ratelimit")
        .unwrap()
        .starts_with("\"monthly\";r=3;"));
    assert!(refused.header("retry-after").is_some());
    assert_eq!(
        month_count(&gw),
        7,
        "nothing of the refused batch was counted"
    );
    assert_eq!(post(&gw, BATCH, &names(3)).status, 200, "what fits passes");
    assert_eq!(month_count(&gw), 10);
    post(&gw, BATCH, &names(1)).assert_error(429, "quota_exceeded");
}

#[test]
fn on_redis_a_batch_is_taken_whole_or_refused_whole_and_its_rate_too() {
    let redis = redis_server::RedisServer::start(false);
    for extra in ["", "batch_max: 5"] {
        let gw = Gateway::builder()
            .plan("test", 10)
            .redis_with(&redis.url(), "fail_open", extra)
            .start();
        let body = json!({ "domains": ["a.example", "b.example", "c.example", "d.example", "e.example", "f.example"] });
        // Two gateways' worth of calls on one Redis count: a fresh Redis per mode.
        let _ = Command::new("redis-cli")
            .args(["-u", &redis.url(), "FLUSHALL"])
            .output()
            .expect("redis-cli is installed by the test command");
        assert_eq!(post(&gw, BATCH, &body).status, 200, "{extra}");
        // A single call (in batched mode it takes a lease of 5, counted in Redis).
        assert_eq!(
            send(
                &gw,
                "GET",
                "/v1/public/domain/x.example",
                Some(TEST_SECRET),
                &[],
                None
            )
            .status,
            200
        );
        let refused = post(&gw, BATCH, &body);
        refused.assert_error(429, "quota_exceeded");
        let used = month_count(&gw);
        assert!(
            (7..=10).contains(&used),
            "{extra}: the refused batch added nothing ({used})"
        );
        let two = json!({ "domains": ["a.example", "b.example"] });
        // 7 counted (plus a lease's unused calls in batched mode): 2 more fit when no lease
        // holds them.
        if extra.is_empty() {
            assert_eq!(post(&gw, BATCH, &two).status, 200);
            assert_eq!(month_count(&gw), 9);
        }
        drop(gw);
    }
    // The plan's rate: a batch takes its names from the burst, all or none.
    let gw = Gateway::builder()
        .plan_yaml(
            "metered",
            "{ monthly_limit: 1000, rate_per_second: 1, burst: 5 }",
        )
        .key_in_project("k", METERED, "metered", "acme")
        .redis(&redis.url(), "fail_open")
        .start();
    let four =
        json!({ "domains": ["a.example", "b.example", "c.example", "d.example"] }).to_string();
    let batch = || {
        send(
            &gw,
            "POST",
            BATCH,
            Some(METERED),
            &[],
            Some(four.as_bytes()),
        )
    };
    assert_eq!(batch().status, 200);
    let over = batch();
    over.assert_error(429, "rate_limited");
    assert!(over.header("retry-after").is_some());
    let usage = send(&gw, "GET", "/v1/usage", Some(METERED), &[], None).json();
    assert_eq!(
        usage["month_count"], 4,
        "a batch refused by the rate is not counted"
    );
}

#[test]
fn limits_are_json_errors_and_nothing_is_counted() {
    let gw = Gateway::builder()
        .plan("test", 1_000)
        .gateway_yaml("batch: { max_names: 3, max_body_bytes: 1024 }")
        .start();
    let r = post(
        &gw,
        BATCH,
        &json!({ "domains": ["a.com", "b.com", "c.com", "d.com"] }),
    );
    let detail = r.assert_error(422, "validation_error");
    assert!(detail.as_str().unwrap().contains("1 to 3"), "{detail}");
    post(&gw, BATCH, &json!({ "domains": [] })).assert_error(422, "validation_error");
    post(&gw, BATCH, &json!({ "domains": [42] })).assert_error(422, "validation_error");
    post(&gw, BATCH, &json!({ "names": ["a.com"] })).assert_error(422, "validation_error");
    let huge = json!({ "domains": ["a".repeat(2_000)] }).to_string();
    let r = send(
        &gw,
        "POST",
        BATCH,
        Some(TEST_SECRET),
        &[],
        Some(huge.as_bytes()),
    );
    let detail = r.assert_error(413, "payload_too_large");
    assert!(detail.as_str().unwrap().contains("1024"), "{detail}");
    let ok = br#"{"domains":["a.com"]}"#;
    for ct in ["text/plain", "application/x-www-form-urlencoded"] {
        let r = send(
            &gw,
            "POST",
            BATCH,
            Some(TEST_SECRET),
            &[("Content-Type", ct)],
            Some(ok),
        );
        r.assert_error(415, "unsupported_media_type");
    }
    let r = send(
        &gw,
        "POST",
        BATCH,
        Some(TEST_SECRET),
        &[],
        Some(b"domains=a.com"),
    );
    r.assert_error(400, "bad_request");
    // No key: 401 before the body is read.
    send(&gw, "POST", BATCH, None, &[], Some(ok)).assert_error(401, "unauthorized");
    // Other methods, and bodies on other routes, are still refused.
    let r = send(&gw, "GET", BATCH, Some(TEST_SECRET), &[], None);
    r.assert_error(405, "method_not_allowed");
    assert_eq!(r.header("allow"), Some("POST, OPTIONS"));
    let r = send(
        &gw,
        "GET",
        "/v1/public/domain/a.com",
        Some(TEST_SECRET),
        &[],
        Some(ok),
    );
    r.assert_error(400, "bad_request");
    let r = send(
        &gw,
        "POST",
        "/v1/public/domain/a.com",
        Some(TEST_SECRET),
        &[],
        Some(ok),
    );
    r.assert_error(400, "bad_request");
    assert_eq!(month_count(&gw), 0, "no refused request was counted");
    // A chunked body (size unknown before reading) is refused as elsewhere.
    let chunked = raw(
        gw.addr,
        format!(
            "POST {BATCH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TEST_SECRET}\r\n\
             Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        )
        .as_bytes(),
    );
    assert!(String::from_utf8_lossy(&chunked).starts_with("HTTP/1.1 400"));
    // CORS: the preflight allows POST with a JSON body.
    let r = send(
        &gw,
        "OPTIONS",
        BATCH,
        None,
        &[
            ("Origin", "https://app.example"),
            ("Access-Control-Request-Method", "POST"),
            (
                "Access-Control-Request-Headers",
                "authorization, content-type",
            ),
        ],
        None,
    );
    assert_eq!(r.status, 204);
    assert_eq!(r.header("access-control-allow-methods"), Some("POST"));
    assert!(r
        .header("access-control-allow-headers")
        .unwrap()
        .contains("Content-Type"));
    // What fits is answered (three names, well under the body limit).
    assert_eq!(
        post(
            &gw,
            BATCH,
            &json!({ "domains": ["a.com", "b.com", "c.com"] })
        )
        .status,
        200
    );
    assert_eq!(month_count(&gw), 3);

    let off = Gateway::builder()
        .gateway_yaml("batch: { enabled: false }")
        .start();
    post(&off, BATCH, &json!({ "domains": ["a.com"] })).assert_error(404, "not_found");
}

/// Refused bodies (malformed, empty, wrong media type, too large) count nothing in the month
/// but take a call of a per-key rate: a key that sends only bad bodies is told `429` too. Before
/// this, 40 malformed bodies in a row from a key whose plan allows 5 a second were 40 `400`s.
#[test]
fn refused_bodies_count_against_the_keys_rate_not_the_month() {
    let gw = Gateway::builder()
        .plan("test", 1_000)
        .plan_yaml(
            "metered",
            "{ monthly_limit: 1000, rate_per_second: 5, burst: 5 }",
        )
        .key_in_project("k", METERED, "metered", "acme")
        .gateway_yaml("batch: { max_body_bytes: 1024 }")
        .account_rate(5, 30)
        .start();
    let huge = json!({ "domains": ["a".repeat(2_000)] }).to_string();
    // Each: extra headers, body.
    type Sent<'a> = (&'a [(&'a str, &'a str)], &'a [u8]);
    let bad: [Sent; 4] = [
        (&[], b"{not json"),
        (&[], b""),
        (
            &[("Content-Type", "text/plain")],
            br#"{"domains":["a.com"]}"#,
        ),
        (&[], huge.as_bytes()),
    ];
    let mut statuses = Vec::new();
    for i in 0..40 {
        let (headers, body) = bad[i % bad.len()];
        let r = send(&gw, "POST", BATCH, Some(METERED), headers, Some(body));
        if r.status == 429 {
            r.assert_error(429, "rate_limited");
            assert!(r.header("retry-after").is_some());
        }
        statuses.push(r.status);
    }
    let limited = statuses.iter().filter(|s| **s == 429).count();
    // The burst (5) is refused as before; 40 sends take well over a second only on a machine
    // under heavy load, so most of the rest are over the rate.
    assert!(limited >= 20, "{limited} of 40 rate limited: {statuses:?}");
    assert!(
        statuses[..5].iter().all(|s| *s != 429),
        "the burst is the body's own refusal: {statuses:?}"
    );
    let usage = send(&gw, "GET", "/v1/usage", Some(METERED), &[], None).json();
    assert_eq!(usage["month_count"], 0, "nothing refused is counted");
    // A plan with no rate: the account routes' rate per key (5 a second, burst 30) bounds them.
    let mut limited = 0;
    for _ in 0..60 {
        let r = send(&gw, "POST", BATCH, Some(TEST_SECRET), &[], Some(b"{"));
        limited += usize::from(r.status == 429);
    }
    assert!(
        limited >= 20,
        "{limited} of 60 rate limited on a plan without a rate"
    );
    assert_eq!(month_count(&gw), 0);
}

/// One curl call over HTTP/2 with a JSON body: (status, body).
fn curl_h2(gw: &Gateway, path: &str, body: &str, content_type: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "-k", "--http2", "--max-time", "10", "-X", "POST"])
        .args(["-H", &format!("Authorization: Bearer {TEST_SECRET}")])
        .args(["-H", &format!("Content-Type: {content_type}")])
        .args(["--data-binary", body])
        .args(["-w", "\n%{http_version} %{http_code}"])
        .arg(format!("https://127.0.0.1:{}{path}", gw.addr.port()))
        .output()
        .expect("curl is installed by the test command");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, tail) = stdout.rsplit_once('\n').unwrap();
    let (version, code) = tail.split_once(' ').unwrap();
    assert_eq!(version, "2", "HTTP/2 agreed by ALPN");
    (code.parse().unwrap(), body.to_owned())
}

#[test]
fn over_http2_a_batch_is_answered_and_refused_as_over_http1() {
    let dir = tempfile::tempdir().unwrap();
    certs::write_pair(dir.path());
    let gw = Gateway::builder()
        .in_dir(dir)
        .plan("test", 1_000)
        .data("disposable.txt", DISPOSABLE)
        .gateway_yaml("tls: { cert: tls/cert.pem, key: tls/key.pem, h2: true }")
        .gateway_yaml("batch: { max_names: 50, max_body_bytes: 2048 }")
        .start();
    let names: Vec<String> = (0..50).map(|i| format!("n{i}.mailinator.com")).collect();
    let body = json!({ "domains": names }).to_string();
    let (status, text) = curl_h2(&gw, BATCH, &body, "application/json");
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["count"], 50);
    let got: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["domain"].as_str().unwrap())
        .collect();
    assert_eq!(got, names, "in the order sent");
    assert!(v["results"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["reason"] == "disposable"));
    let (status, text) = curl_h2(&gw, BATCH, &body, "text/plain");
    assert_eq!(status, 415, "{text}");
    let big = json!({ "domains": ["a".repeat(3_000)] }).to_string();
    let (status, text) = curl_h2(&gw, BATCH, &big, "application/json");
    assert_eq!(status, 413, "{text}");
    let (status, _) = curl_h2(&gw, BATCH, "{\"domains\":[]}", "application/json");
    assert_eq!(status, 422);
    let usage = Command::new("curl")
        .args(["-sS", "-k", "--http2"])
        .args(["-H", &format!("Authorization: Bearer {TEST_SECRET}")])
        .arg(format!("https://127.0.0.1:{}/v1/usage", gw.addr.port()))
        .output()
        .unwrap();
    let usage: Value = serde_json::from_slice(&usage.stdout).unwrap();
    assert_eq!(usage["month_count"], 50, "only the answered batch counted");
}

/// `names` with their mail at Google Workspace, on a DNS server whose every answer leaves
/// `delay_ms` after its question, and a gateway asking it with the `mx` lines (a query timeout
/// of 3 s besides) and the shipped MX providers.
fn on_slow_google(names: &[String], delay_ms: u64, mx: &[&str]) -> (dns::DnsServer, Gateway) {
    let zones: HashMap<String, dns::Zone> = names
        .iter()
        .map(|name| {
            let zone = dns::Zone {
                mx: vec![(10, "aspmx.l.google.com".into())],
                a: None,
                ttl: 300,
            };
            (name.clone(), zone)
        })
        .collect();
    let server = dns::DnsServer::start_slow(zones, Duration::from_millis(delay_ms));
    let providers = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/mx_providers.csv"
    ))
    .unwrap();
    let mut builder = Gateway::builder()
        .plan("test", 1_000)
        .dns(server.addr)
        .data("mx_providers.csv", &providers)
        .mx_yaml("query_timeout_ms: 3000");
    for line in mx {
        builder = builder.mx_yaml(line);
    }
    (server, builder.start())
}

#[test]
fn the_mx_of_a_batch_is_resolved_concurrently_within_one_budget() {
    // Each answer leaves the DNS server 600 ms after its question: one after another, eight
    // names would take 4.8 s, far past the 2 s budget, and most would be answered unknown.
    let names: Vec<String> = (0..8).map(|i| format!("shop{i}.test")).collect();
    let (server, gw) = on_slow_google(&names, 600, &["budget_ms: 2000"]);
    let r = post(&gw, BATCH, &json!({ "domains": names }));
    assert_eq!(r.status, 200);
    let v = r.json();
    for (i, rec) in v["results"].as_array().unwrap().iter().enumerate() {
        assert_eq!(rec["domain"], names[i].as_str());
        assert_eq!(
            rec["mx_provider_label"], "Google Workspace",
            "{rec}: every name's MX arrived within the batch's budget"
        );
    }
    assert!(
        server.most_held() >= names.len(),
        "the names were asked at once (at most {} held)",
        server.most_held()
    );
}

/// Cold names past the project's share of MX slots answer as `GET` does: each name gets a
/// budget of its own from when its turn comes. Before, the batch shared one budget, and the
/// names that got no slot until it ran out were answered from the table alone, where `GET`
/// (its own budget) gave their MX provider (issue 77).
#[test]
fn cold_names_past_the_projects_share_answer_as_get_does() {
    // Each answer leaves 400 ms after its question; two lookups at once for the project, a
    // budget of 700 ms: a shared budget covered the first two names only.
    let names: Vec<String> = (0..6).map(|i| format!("cold{i}.test")).collect();
    let mut all = names.clone();
    all.push("alone.test".into());
    let mx = ["budget_ms: 700", "max_inflight_per_project: 2"];
    let (_server, gw) = on_slow_google(&all, 400, &mx);
    let get = single(&gw, "alone.test", "");
    assert_eq!(get["mx_provider_label"], "Google Workspace", "{get}");
    let started = std::time::Instant::now();
    let r = post(&gw, BATCH, &json!({ "domains": names }));
    println!(
        "a batch of {} cold names, 2 at a time: {} ms",
        names.len(),
        started.elapsed().as_millis()
    );
    assert_eq!(r.status, 200);
    for rec in r.json()["results"].as_array().unwrap() {
        assert_eq!(rec["mx_provider_label"], get["mx_provider_label"], "{rec}");
        assert_eq!(rec["risk_score"], get["risk_score"], "{rec}");
    }
}
