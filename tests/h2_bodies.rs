//! Request bodies over HTTP/2, against the real binary (TLS + `h2: true`, curl as the client)
//! in both upstream modes: a body is refused on every route but `POST /v1/keys` exactly as on
//! HTTP/1.1, whether or not `Content-Length` announces it; a refused request is never counted,
//! and never reaches the backend, so a body holding a second request cannot be answered as the
//! next request on a pooled backend connection (request smuggling).

use crate::certs;
use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// A key on a plan that may make more keys (`pro`: 10).
const PRO: &str = "drg_pro_key_for_h2_tests_0123456789abcdefghijklmn";

/// A request for the backend, smuggled in a body: a backend that does not read GET bodies
/// would take it for the next request on the connection.
const SMUGGLED: &str = "GET /v1/check/smuggled@example.com HTTP/1.1\r\nHost: backend\r\n\r\n";

fn gateway(mode: &str, upstream: &Upstream) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    certs::write_pair(dir.path());
    Gateway::builder()
        .in_dir(dir)
        .upstream(upstream.addr)
        .plan("pro", 1_000)
        .key("pro", PRO, "pro", &[])
        .upstream_yaml(&format!("mode: {mode}"))
        .gateway_yaml("tls: { cert: tls/cert.pem, key: tls/key.pem, h2: true }")
        .start()
}

/// One curl call over HTTP/2 (fails the test if h2 was not agreed): (status, body). `None`
/// when curl could not complete it (e.g. the stream was reset).
fn curl(gw: &Gateway, args: &[&str], path: &str) -> Option<(u16, String)> {
    curl_as(gw, TEST_SECRET, args, path)
}

fn curl_as(gw: &Gateway, secret: &str, args: &[&str], path: &str) -> Option<(u16, String)> {
    let out = Command::new("curl")
        .args(["-sS", "-k", "--http2", "--max-time", "10"])
        .args(["-H", &format!("Authorization: {}", bearer(secret))])
        .args(["-w", "\n%{http_version} %{http_code}"])
        .args(args)
        .arg(format!("https://127.0.0.1:{}{path}", gw.addr.port()))
        .output()
        .expect("curl is installed by scripts/test (scripts/deps.sh)");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        eprintln!(
            "curl {args:?} {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    let (body, tail) = stdout.rsplit_once('\n').unwrap();
    let (version, code) = tail.split_once(' ').unwrap();
    assert_eq!(version, "2", "HTTP/2 agreed by ALPN");
    Some((code.parse().unwrap(), body.to_owned()))
}

fn month_count(gw: &Gateway) -> u64 {
    let (status, body) = curl(gw, &[], "/v1/usage").unwrap();
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["month_count"]
        .as_u64()
        .unwrap()
}

fn body_file(dir: &Path) -> PathBuf {
    let file = dir.join("smuggled.txt");
    std::fs::write(&file, SMUGGLED).unwrap();
    file
}

fn assert_refused(answer: Option<(u16, String)>, what: &str) {
    let (status, body) = answer.unwrap_or_else(|| panic!("{what}: no answer"));
    assert_eq!(status, 400, "{what}: {body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"], "bad_request", "{what}: {body}");
}

fn bodies_are_refused_and_never_reach_the_backend(mode: &str) {
    let upstream = Upstream::start(Duration::ZERO);
    let gw = gateway(mode, &upstream);
    let body = body_file(gw.dir.path());
    let data = format!("@{}", body.display());
    let check = "/v1/check/a@example.com";

    // A body without Content-Length (h2 frames it by DATA frames alone), on every kind of
    // route, and one whose Content-Length says 0 while DATA follows.
    let unannounced = ["-X", "GET", "--data-binary", &data, "-H", "content-length:"];
    for path in [
        check,
        "/v1/public/domain/example.org",
        "/v1/public/top-domains",
    ] {
        assert_refused(curl(&gw, &unannounced, path), path);
    }
    let zero = [
        "-X",
        "GET",
        "--data-binary",
        &data,
        "-H",
        "content-length: 0",
    ];
    if let Some((status, body)) = curl(&gw, &zero, check) {
        assert_eq!(status, 400, "content-length: 0 with DATA: {body}");
    }
    let announced = ["-X", "GET", "--data-binary", &data];
    assert_refused(curl(&gw, &announced, check), "announced body");
    // POST /v1/keys takes a body, but only one whose length is announced, as on HTTP/1.1.
    let post = ["-X", "POST", "--data-binary", "{}", "-H", "content-length:"];
    assert_refused(
        curl_as(&gw, PRO, &post, "/v1/keys"),
        "keys body without length",
    );
    let post = ["-X", "POST", "--data-binary", "{}"];
    let (status, made) = curl_as(&gw, PRO, &post, "/v1/keys").unwrap();
    assert_eq!(status, 201, "{made}");

    assert_eq!(month_count(&gw), 0, "no refused request was counted");
    assert!(upstream.requests().is_empty(), "{:?}", upstream.requests());

    // Ordinary calls right after: each gets its own answer, the backend saw only them.
    for i in 0..15 {
        let path = format!("/v1/check/user{i}@example.com");
        let (status, body) = curl(&gw, &[], &path).unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(
            body.contains(&format!("user{i}@example.com")),
            "{i}: {body}"
        );
    }
    let seen = upstream.requests();
    assert_eq!(seen.len(), 15, "{seen:?}");
    assert!(
        seen.iter().all(|r| !r.path.contains("smuggled")),
        "{seen:?}"
    );
    assert!(seen.iter().all(|r| r.header("transfer-encoding").is_none()
        && r.header("content-length").is_none_or(|v| v == "0")));
    assert_eq!(month_count(&gw), 15);
}

#[test]
fn h2_bodies_are_refused_in_relay_mode() {
    bodies_are_refused_and_never_reach_the_backend("relay");
}

#[test]
fn h2_bodies_are_refused_in_proxy_mode() {
    bodies_are_refused_and_never_reach_the_backend("proxy");
}

#[test]
fn h2_bodiless_requests_are_served_and_counted_once() {
    let upstream = Upstream::start(Duration::ZERO);
    let gw = gateway("relay", &upstream);
    for _ in 0..3 {
        let (status, body) = curl(&gw, &[], "/v1/public/domain/example.org").unwrap();
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(month_count(&gw), 3);
}
