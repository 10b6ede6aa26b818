//! Access control end to end: keys (401), origins (403), preflight, quota (429), usage, rate-limit
//! headers, exact counting under concurrency, persistence across restarts, month rollover, and
//! hot reload of the keys file.

use crate::common;
use common::*;
use std::time::Duration;

const WEB: &str = "drg_web_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const OFF: &str = "drg_off_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const TINY: &str = "drg_tiny_key_cccccccccccccccccccccccccccccccccccc";
const LOOKUP: &str = "/v1/public/domain/example.org";

fn gateway() -> Gateway {
    Gateway::builder()
        .plan("tiny", 3)
        .key(
            "web",
            WEB,
            "test",
            &["https://*.example.com", "http://localhost:3000"],
        )
        .key("tiny", TINY, "tiny", &[])
        .key("off", OFF, "test", &[])
        .start()
        .with_disabled("off")
}

trait Disable {
    fn with_disabled(self, id: &str) -> Self;
}

impl Disable for Gateway {
    /// Marks a key disabled in the keys file and waits for the reload.
    fn with_disabled(self, id: &str) -> Self {
        let path = self.dir.path().join("keys.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let marker = format!("  - id: {id}\n");
        let patched = text.replace(&marker, &format!("{marker}    disabled: true\n"));
        write_atomic(&path, &patched);
        wait_until(Duration::from_secs(10), || {
            self.conn_as(Some(OFF)).get(LOOKUP).unwrap().status == 401
        });
        self
    }
}

#[test]
fn keys_missing_malformed_unknown_or_disabled_get_401() {
    let gw = gateway();
    let r = gw.conn_as(None).get(LOOKUP).unwrap();
    r.assert_error(401, "unauthorized");
    assert_eq!(
        r.header("www-authenticate"),
        Some(r#"Bearer realm="domain-risk""#)
    );
    for auth in [
        format!("Basic {TEST_SECRET}"),
        "Bearer".to_owned(),
        "Bearer drg_nobody_knows_this_key".to_owned(),
        bearer(OFF),
        bearer(&TEST_SECRET[..TEST_SECRET.len() - 1]),
    ] {
        let r = gw
            .conn_as(None)
            .request("GET", LOOKUP, &[("Authorization", &auth)])
            .unwrap();
        r.assert_error(401, "unauthorized");
        assert_eq!(
            r.header("www-authenticate"),
            Some(r#"Bearer realm="domain-risk", error="invalid_token""#),
            "{auth}"
        );
    }
    // Every /v1 route needs the key, the proxied one included.
    for path in ["/v1/public/top-domains", "/v1/usage", "/v1/check/a%40b.com"] {
        gw.conn_as(None)
            .get(path)
            .unwrap()
            .assert_error(401, "unauthorized");
    }
    // Health needs none.
    assert_eq!(gw.conn_as(None).get("/healthz").unwrap().status, 200);
}

#[test]
fn origins_are_enforced_for_browser_keys() {
    let gw = gateway();
    let mut c = gw.conn_as(Some(WEB));
    let r = c
        .request("GET", LOOKUP, &[("Origin", "https://app.example.com")])
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    assert_eq!(r.header("vary"), Some("Origin"));
    assert!(r
        .header("access-control-expose-headers")
        .unwrap()
        .contains("RateLimit"));

    let r = c
        .request(
            "GET",
            LOOKUP,
            &[("Referer", "http://localhost:3000/signup")],
        )
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://localhost:3000")
    );

    for (headers, shown) in [
        (
            vec![("Origin", "https://evil.example")],
            "Origin: https://evil.example",
        ),
        (
            vec![("Origin", "https://example.com")],
            "Origin: https://example.com",
        ),
        (vec![("Origin", "null")], "Origin: null"),
        (
            vec![("Origin", "http://app.example.com")],
            "Origin: http://app.example.com",
        ),
        (vec![], "Origin: (none)"),
    ] {
        let r = c.request("GET", LOOKUP, &headers).unwrap();
        let detail = r.assert_error(403, "forbidden");
        assert_eq!(detail, shown);
        assert_eq!(r.header("vary"), Some("Origin"));
        assert_eq!(r.header("access-control-allow-origin"), None);
    }
    // A server key takes any origin, and is not given CORS access.
    let r = gw
        .conn()
        .request("GET", LOOKUP, &[("Origin", "https://evil.example")])
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None);
}

#[test]
fn preflight_needs_no_key_and_keeps_the_connection() {
    let gw = gateway();
    let mut c = gw.conn_as(None);
    for _ in 0..2 {
        let r = c
            .request(
                "OPTIONS",
                LOOKUP,
                &[
                    ("Origin", "https://app.example.com"),
                    ("Access-Control-Request-Method", "GET"),
                    ("Access-Control-Request-Headers", "authorization"),
                ],
            )
            .unwrap();
        assert_eq!(r.status, 204);
        assert_eq!(
            r.header("access-control-allow-origin"),
            Some("https://app.example.com")
        );
        assert_eq!(r.header("access-control-allow-methods"), Some("GET"));
        assert!(r
            .header("access-control-allow-headers")
            .unwrap()
            .contains("Authorization"));
        assert_eq!(r.header("access-control-max-age"), Some("86400"));
        assert_eq!(r.header("vary"), Some("Origin"));
    }
    assert_eq!(
        c.get("/healthz").unwrap().status,
        200,
        "connection kept after 204"
    );
}

fn ratelimit(r: &Response) -> (String, String) {
    (
        r.header("ratelimit-policy")
            .expect("RateLimit-Policy")
            .to_owned(),
        r.header("ratelimit").expect("RateLimit").to_owned(),
    )
}

#[test]
fn quota_counts_every_passing_call_then_answers_429() {
    let gw = gateway();
    let mut c = gw.conn_as(Some(TINY));
    let r = c.get(LOOKUP).unwrap();
    assert_eq!(r.status, 200);
    let (policy, state) = ratelimit(&r);
    assert!(policy.starts_with("\"monthly\";q=3;w="), "{policy}");
    assert!(state.starts_with("\"monthly\";r=2;t="), "{state}");
    // A 422 passed the key and origin checks: it counts too.
    let r = c.get("/v1/public/domain/a_b.com").unwrap();
    r.assert_error(422, "validation_error");
    assert!(ratelimit(&r).1.starts_with("\"monthly\";r=1;"));
    // Rejected calls do not count.
    c.request("GET", LOOKUP, &[("Authorization", "Bearer drg_wrong")])
        .unwrap()
        .assert_error(401, "unauthorized");
    // /v1/usage does not count.
    let u = c.get("/v1/usage").unwrap();
    assert_eq!(u.status, 200);
    let usage = u.json();
    // The names existing clients read, and the first version's names as aliases.
    assert_eq!(usage["month_count"], 2);
    assert_eq!(usage["monthly_limit"], 3);
    assert_eq!(usage["used"], 2);
    assert_eq!(usage["limit"], 3);
    assert_eq!(usage["plan"], "tiny");
    // And which optional parts are on (tests/dashboard.rs checks them against the routes).
    assert!(usage["features"].is_object(), "{usage}");
    assert_eq!(usage.as_object().unwrap().len(), 7, "{usage}");
    let reset_at = usage["reset_at"].as_str().unwrap().to_owned();
    assert!(reset_at.ends_with("-01T00:00:00Z"), "{reset_at}");
    assert_eq!(c.get("/v1/public/top-domains").unwrap().status, 200);

    let r = c.get(LOOKUP).unwrap();
    r.assert_error(429, "quota_exceeded");
    assert_eq!(r.json()["reset_at"], reset_at.as_str());
    // Retry-After is the time left to the reset: the RateLimit header's `t`, and reset_at - now.
    let retry: i64 = r.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(ratelimit(&r).1, format!("\"monthly\";r=0;t={retry}"));
    let reset = chrono::DateTime::parse_from_rfc3339(&reset_at).unwrap();
    let left = (reset.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_seconds();
    assert!((left..=left + 5).contains(&retry), "{retry} s vs {left} s");
    assert_eq!(c.get("/v1/usage").unwrap().json()["used"], 3);
    // Other keys are not affected.
    assert_eq!(gw.get(LOOKUP).status, 200);
}

#[test]
fn proxied_answers_carry_the_quota_headers() {
    let up = Upstream::start(Duration::ZERO);
    let gw = Gateway::builder()
        .plan("tiny", 3)
        .key("tiny", TINY, "tiny", &[])
        .upstream(up.addr)
        .start();
    // A client naming another key in X-Api-Key-Id: the upstream sees only the real key's id.
    let r = gw
        .conn_as(Some(TINY))
        .request(
            "GET",
            "/v1/check/a%40example.com",
            &[("X-Api-Key-Id", "admin"), ("x-api-key-id", "test")],
        )
        .unwrap();
    assert_eq!(r.status, 200);
    assert!(ratelimit(&r).1.starts_with("\"monthly\";r=2;"));
    assert_eq!(r.header("vary"), Some("Origin"));
    let seen = up.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    let ids: Vec<&str> = seen[0]
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("x-api-key-id"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(ids, ["tiny"], "{seen:?}");
}

#[test]
fn exactly_the_limit_passes_under_concurrency() {
    let gw = Gateway::builder()
        .plan("five-hundred", 500)
        .key("k", TINY, "five-hundred", &[])
        .start();
    let counts = hammer(&[gw.addr], TINY, LOOKUP, 64, 10);
    assert_eq!(counts, [(200, 500), (429, 140)].into());
    assert_eq!(
        gw.conn_as(Some(TINY)).get("/v1/usage").unwrap().json()["used"],
        500
    );
}

#[test]
fn counts_survive_a_graceful_restart() {
    let builder = || {
        Gateway::builder()
            .plan("ten", 10)
            .key("k", TINY, "ten", &[])
    };
    let gw = builder().start();
    for _ in 0..4 {
        assert_eq!(gw.conn_as(Some(TINY)).get(LOOKUP).unwrap().status, 200);
    }
    let log_before = gw.log();
    let dir = gw.stop();
    // `state/quota.json` configured: the counters file sits next to that name.
    assert!(dir.path().join("state/quota.counters").is_file());
    let gw = builder().in_dir(dir).start();
    let usage = gw.conn_as(Some(TINY)).get("/v1/usage").unwrap().json();
    assert_eq!(usage["used"], 4, "{usage}");
    for log in [log_before, gw.log()] {
        for secret in [TINY, TEST_SECRET] {
            assert!(!log.contains(secret), "a secret reached the log");
        }
    }
}

/// The value of the `/metrics` line named `name` (no labels).
fn metric(gw: &Gateway, name: &str) -> Option<f64> {
    let text = String::from_utf8(gw.admin_get("/metrics").body).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

#[test]
fn a_full_slot_table_refuses_new_projects_and_tells_the_metrics() {
    const A: &str = "drg_a_key_dddddddddddddddddddddddddddddddddddddddd";
    const B: &str = "drg_b_key_eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee";
    let gw = Gateway::builder()
        .key("a", A, "test", &[])
        .key("b", B, "test", &[])
        .quota_section(
            "quota: { state_file: state/quota.counters, flush_interval_ms: 200, slots: 2 }",
        )
        .start();
    assert_eq!(gw.get(LOOKUP).status, 200);
    assert_eq!(gw.conn_as(Some(A)).get(LOOKUP).unwrap().status, 200);
    // Both slots are taken: the third project is refused, not served uncounted.
    for _ in 0..2 {
        let r = gw.conn_as(Some(B)).get(LOOKUP).unwrap();
        r.assert_error(503, "service_unavailable");
    }
    // Projects holding a slot keep counting.
    let mut a = gw.conn_as(Some(A));
    assert_eq!(a.get(LOOKUP).unwrap().status, 200);
    assert_eq!(a.get("/v1/usage").unwrap().json()["used"], 2);
    assert_eq!(
        gw.conn_as(Some(B)).get("/v1/usage").unwrap().json()["used"],
        0
    );
    assert_eq!(metric(&gw, "drg_quota_slots"), Some(2.0));
    assert_eq!(metric(&gw, "drg_quota_slots_used"), Some(2.0));
    assert_eq!(metric(&gw, "drg_quota_slots_full_total"), Some(2.0));
    assert_eq!(metric(&gw, "drg_quota_refused_calls_total"), Some(2.0));
    let log = gw.log();
    assert_eq!(
        log.matches("all 2 slots of the quota table are taken")
            .count(),
        1,
        "one warning: {log}"
    );
    // Readiness stays: one project's refusal is no reason to take the gateway out.
    assert_eq!(gw.admin_get("/readyz").status, 200);
}

#[test]
fn a_corrupt_state_file_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    std::fs::write(
        dir.path().join("state/quota.json"),
        "{\"version\":1,\"keys\":{\"k\":",
    )
    .unwrap();
    let conf = dir.path().join("gateway.yaml");
    std::fs::write(
        &conf,
        "gateway:\n  data: { dir: data, builtin_disposable: false }\n  quota: { state_file: state/quota.json }\n  access: { keys_file: keys.yaml }\n",
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::write(dir.path().join("keys.yaml"), "keys: []\n").unwrap();
    let out = crate::common::command(BIN)
        .args([
            "-c",
            conf.to_str().unwrap(),
            "serve",
            "--listen",
            "127.0.0.1:1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("corrupt"), "{err}");
}

#[test]
fn a_new_month_resets_the_quota() {
    // The gateway's clock starts at 23:59:50 when the process starts: January has 10 s left,
    // plenty for its start-up and the calls below, which therefore always run in January.
    let gw = Gateway::builder()
        .plan("two", 2)
        .key("k", TINY, "two", &[])
        .env("DOMAIN_RISK_GATEWAY_CLOCK_START", "2026-01-31T23:59:50Z")
        .start();
    let mut c = gw.conn_as(Some(TINY));
    assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    let second = c.get(LOOKUP).unwrap();
    assert_eq!(second.status, 200);
    let t: u64 = second
        .header("ratelimit")
        .unwrap()
        .split(";t=")
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        t >= 2,
        "only {t} s of January left after two calls: start-up took over 8 s"
    );
    let r = c.get(LOOKUP).unwrap();
    r.assert_error(429, "quota_exceeded");
    assert_eq!(r.json()["reset_at"], "2026-02-01T00:00:00Z");
    // Past midnight UTC on the 1st of February, per the injected clock.
    wait_until(Duration::from_secs(15), || {
        c.get(LOOKUP).unwrap().status == 200
    });
    let usage = c.get("/v1/usage").unwrap().json();
    assert_eq!(usage["used"], 1);
    assert_eq!(usage["reset_at"], "2026-03-01T00:00:00Z");
}

#[test]
fn keys_reload_adds_revokes_and_survives_a_broken_file() {
    let gw = gateway();
    let path = gw.dir.path().join("keys.yaml");
    // A key made with `key new --append` works within 2 s, without a restart.
    let out = crate::common::command(BIN)
        .args([
            "-c",
            gw.conf.to_str().unwrap(),
            "key",
            "new",
            "--id",
            "fresh",
            "--plan",
            "test",
            "--append",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let secret = stdout
        .split_whitespace()
        .find(|w| w.starts_with("drg_"))
        .expect("secret printed")
        .to_owned();
    assert!(
        !std::fs::read_to_string(&path).unwrap().contains(&secret),
        "secret stored"
    );
    let took = wait_until(Duration::from_secs(10), || {
        gw.conn_as(Some(&secret)).get(LOOKUP).unwrap().status == 200
    });
    eprintln!("new key live after {took:?}");

    // Revoked: refused at the next reload (a poll).
    let text = std::fs::read_to_string(&path).unwrap();
    write_atomic(
        &path,
        &text.replace("  - id: fresh\n", "  - id: fresh\n    disabled: true\n"),
    );
    wait_until(Duration::from_secs(10), || {
        gw.conn_as(Some(&secret)).get(LOOKUP).unwrap().status == 401
    });

    // A broken file keeps the old keys.
    write_atomic(&path, "keys:\n  - id: broken\n    plan: nope\n");
    wait_until(Duration::from_secs(10), || {
        gw.log().contains("keys: reload failed")
    });
    assert_eq!(gw.get(LOOKUP).status, 200);
    assert_eq!(gw.conn_as(Some(&secret)).get(LOOKUP).unwrap().status, 401);
    assert!(!gw.log().contains(&secret), "a secret reached the log");
}
