//! `/v1/check` through the real gateway to stub upstreams on loopback.

use crate::common;
use common::*;
use std::time::{Duration, Instant};

#[test]
fn check_is_proxied_with_headers_rewritten() {
    let up = Upstream::start(Duration::ZERO);
    let gw = Gateway::builder().upstream(up.addr).start();
    let mut c = gw.conn();
    let r = c
        .request(
            "GET",
            "/v1/check/jane%40example.com",
            &[
                ("Authorization", &bearer(TEST_SECRET)),
                ("X-Forwarded-For", "203.0.113.7"),
                ("X-Api-Key-Id", "spoofed"),
            ],
        )
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // The upstream path is rebuilt from the canonical target, not copied.
    assert_eq!(r.json()["checked"], "/v1/check/jane@example.com");
    let id = r
        .header("x-request-id")
        .expect("x-request-id on the answer")
        .to_owned();

    let seen = up.requests();
    assert_eq!(seen.len(), 1);
    let req = &seen[0];
    assert_eq!(req.method, "GET");
    assert_eq!(
        req.header("authorization"),
        None,
        "Authorization leaked upstream"
    );
    assert_eq!(req.header("x-request-id"), Some(id.as_str()));
    assert_eq!(req.header("x-api-key-id"), Some("test"), "spoofed key id");
    // The client's chain is kept only from a trusted proxy (none configured here).
    assert_eq!(req.header("x-forwarded-for"), Some("127.0.0.1"));

    // The caller's own request id is kept; the keep-alive pool to the upstream is reused.
    let r = c
        .request(
            "GET",
            "/v1/check/example.com",
            &[("X-Request-Id", "abc-123")],
        )
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-id"), Some("abc-123"));
    assert_eq!(up.requests()[1].header("x-request-id"), Some("abc-123"));
    assert_eq!(
        up.requests()[1].header("x-forwarded-for"),
        Some("127.0.0.1")
    );
    assert_eq!(up.connections.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[test]
fn impossible_targets_are_refused_without_touching_the_upstream() {
    let up = Upstream::start(Duration::ZERO);
    let gw = Gateway::builder().upstream(up.addr).start();
    let long = "a".repeat(321);
    let local = format!("{}%40example.com", "a".repeat(65));
    for (target, needle) in [
        ("", "empty"),
        (long.as_str(), "maximum is 320"),
        ("a%40b%40example.com", "more than one '@'"),
        (local.as_str(), "maximum is 64"),
        ("user%40%5B192.168.0.1%5D", "IP address"),
        ("10.0.0.1", "IP address"),
        ("https:%2F%2Fexample.com", "URL"),
        ("mailto:a%40example.com", "URL"),
    ] {
        gw.get(&format!("/v1/check/{target}"))
            .assert_invalid(needle, target);
    }
    assert!(
        up.requests().is_empty(),
        "upstream was called: {:?}",
        up.requests()
    );
}

#[test]
fn dead_upstream_gives_502_from_the_refused_connect() {
    // Bound but never listening, for the whole test: every connect to it is refused.
    let dead = DeadPort::new();
    let gw = Gateway::builder().upstream(dead.addr).start();
    let r = gw.get("/v1/check/user%40example.com");
    r.assert_error(502, "upstream_unavailable");
    // The refusal itself gave the answer, not the connect timeout (500 ms) running out.
    gw.wait_metric("drg_upstream_errors_total{kind=\"connect_refused\"}", 1.0);
    assert_eq!(
        gw.metric("drg_upstream_errors_total{kind=\"timeout\"}"),
        Some(0.0)
    );
    // The gateway keeps serving.
    assert_eq!(gw.get("/healthz").status, 200);
}

#[test]
fn slow_upstream_gives_504_within_the_read_timeout() {
    // The backend would answer after 30 s; read_timeout_ms is 1000 in the test config.
    let up = Upstream::start(Duration::from_secs(30));
    let gw = Gateway::builder().upstream(up.addr).start();
    let started = Instant::now();
    let r = gw.get("/v1/check/user%40example.com");
    let took = started.elapsed();
    r.assert_error(504, "upstream_timeout");
    // It waited for the read timeout (a timer never fires early), not for the backend: the
    // upper bound is the behaviour, far from both the 1 s timeout and the 30 s answer.
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    gw.wait_metric("drg_upstream_errors_total{kind=\"timeout\"}", 1.0);
    assert_eq!(up.requests().len(), 1, "retried: {:?}", up.requests());
}

#[test]
fn a_trusted_proxy_keeps_the_clients_forwarded_chain() {
    let up = Upstream::start(Duration::ZERO);
    let gw = Gateway::builder()
        .upstream(up.addr)
        .gateway_yaml("trusted_proxies: [\"127.0.0.0/8\"]")
        .start();
    let r = gw
        .conn()
        .request(
            "GET",
            "/v1/check/example.com",
            &[("X-Forwarded-For", "203.0.113.7")],
        )
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        up.requests()[0].header("x-forwarded-for"),
        Some("203.0.113.7, 127.0.0.1")
    );
}
