//! The JSON access log end to end: one line per request of every kind, masking, no secrets,
//! escaping of hostile values, SIGUSR1 reopening after a rename, and logging to stderr.

use crate::common;
use common::*;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const TINY: &str = "drg_tiny_key_cccccccccccccccccccccccccccccccccccc";
const WRONG: &str = "drg_wrong_key_ddddddddddddddddddddddddddddddddddd";
const WAIT: Duration = Duration::from_secs(10);

/// Every line of the log, each asserted to be one JSON object.
fn lines_of(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| {
            serde_json::from_str::<Value>(l)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}"))
        })
        .inspect(|v| assert!(v.is_object(), "{v}"))
        .collect()
}

fn file_lines(path: &Path) -> Vec<Value> {
    lines_of(&std::fs::read_to_string(path).unwrap_or_default())
}

/// The one line whose `request_id` is `id`, once written.
fn line_with_id(path: &Path, id: &str) -> Value {
    let mut found = Vec::new();
    wait_until(WAIT, || {
        found = file_lines(path)
            .into_iter()
            .filter(|l| l["request_id"] == id)
            .collect();
        !found.is_empty()
    });
    assert_eq!(found.len(), 1, "one line per request: {found:?}");
    found.remove(0)
}

fn get(c: &mut Conn, path: &str, id: &str, extra: &[(&str, &str)]) -> Response {
    let mut headers = vec![("X-Request-Id", id)];
    headers.extend_from_slice(extra);
    c.request("GET", path, &headers).unwrap()
}

fn gateway_with_file_log(up: &Upstream) -> (Gateway, std::path::PathBuf) {
    let gw = Gateway::builder()
        .upstream(up.addr)
        .plan("one", 1)
        .key("tiny", TINY, "one", &[])
        .gateway_yaml("access_log: { enabled: true, path: access.log }")
        .start();
    let path = gw.dir.path().join("access.log");
    (gw, path)
}

#[test]
fn every_request_gets_one_line_with_its_fields_and_never_a_secret_or_an_email() {
    let up = Upstream::start(Duration::ZERO);
    let (gw, log) = gateway_with_file_log(&up);
    let mut c = gw.conn();

    // A local lookup.
    let r = get(&mut c, "/v1/public/domain/example.com", "local-1", &[]);
    assert_eq!(r.status, 200);
    let l = line_with_id(&log, "local-1");
    assert_eq!(l["method"], "GET");
    assert_eq!(l["route"], "domain");
    assert_eq!(l["target"], "example.com");
    assert_eq!(l["status"], 200);
    assert_eq!(l["key_id"], "test");
    assert_eq!(l["upstream_status"], Value::Null);
    assert_eq!(l["upstream_duration_us"], Value::Null);
    assert_eq!(l["origin"], Value::Null);
    assert_eq!(l["bytes_sent"], r.body.len());
    assert!(l["duration_us"].is_u64(), "{l}");
    let time = l["time"].as_str().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(time).is_ok() && time.ends_with('Z'),
        "{time}"
    );
    assert_eq!(time.len(), "2026-01-01T00:00:00.000Z".len(), "{time}");
    let keys: Vec<&str> = l.as_object().unwrap().keys().map(String::as_str).collect();
    let mut expected = [
        "time",
        "request_id",
        "method",
        "route",
        "target",
        "status",
        "duration_us",
        "upstream_status",
        "upstream_duration_us",
        "key_id",
        "origin",
        "bytes_sent",
    ];
    expected.sort_unstable();
    let mut keys = keys;
    keys.sort_unstable();
    assert_eq!(keys, expected);

    // A wrong key: 401, no key id.
    let mut bad = gw.conn_as(Some(WRONG));
    let r = get(&mut bad, "/v1/public/domain/example.com", "unauth-1", &[]);
    assert_eq!(r.status, 401);
    let l = line_with_id(&log, "unauth-1");
    assert_eq!(l["status"], 401);
    assert_eq!(l["key_id"], Value::Null);

    // A proxied check: the local part masked, the backend's status and time recorded.
    let r = c
        .request("GET", "/v1/check/jane.doe%40example.com", &[])
        .unwrap();
    assert_eq!(r.status, 200);
    let id = r.header("x-request-id").unwrap().to_owned();
    let l = line_with_id(&log, &id);
    assert_eq!(l["route"], "check");
    assert_eq!(l["target"], "ja****@example.com");
    assert_eq!(l["upstream_status"], 200);
    assert!(l["upstream_duration_us"].is_u64(), "{l}");
    assert_eq!(l["bytes_sent"], r.body.len());
    assert_eq!(l["key_id"], "test");

    // Over quota: 429, with the key's id.
    let mut tiny = gw.conn_as(Some(TINY));
    assert_eq!(
        get(&mut tiny, "/v1/public/domain/a.example", "q-1", &[]).status,
        200
    );
    let r = get(&mut tiny, "/v1/public/domain/a.example", "q-2", &[]);
    assert_eq!(r.status, 429);
    let l = line_with_id(&log, "q-2");
    assert_eq!(l["status"], 429);
    assert_eq!(l["key_id"], "tiny");

    // Unauthenticated routes and the preflight.
    assert_eq!(get(&mut c, "/readyz", "ready-1", &[]).status, 200);
    assert_eq!(line_with_id(&log, "ready-1")["route"], "ready");
    assert_eq!(get(&mut c, "/v1/openapi.json", "doc-1", &[]).status, 200);
    assert_eq!(line_with_id(&log, "doc-1")["route"], "openapi");
    let r = c
        .request(
            "OPTIONS",
            "/v1/check/x%40example.com",
            &[
                ("X-Request-Id", "pre-1"),
                ("Origin", "https://app.example"),
                ("Access-Control-Request-Method", "GET"),
            ],
        )
        .unwrap();
    assert_eq!(r.status, 204);
    let l = line_with_id(&log, "pre-1");
    assert_eq!(l["route"], "preflight");
    assert_eq!(l["method"], "OPTIONS");
    assert_eq!(l["origin"], "https://app.example");
    // An unknown path is logged without its path.
    assert_eq!(
        get(&mut c, "/nowhere/bob@example.com", "nf-1", &[]).status,
        404
    );
    let l = line_with_id(&log, "nf-1");
    assert_eq!(l["route"], "not_found");
    assert_eq!(l["target"], Value::Null);

    let text = std::fs::read_to_string(&log).unwrap();
    for secret in [TEST_SECRET, WRONG, TINY] {
        assert!(!text.contains(secret), "a secret in the access log");
    }
    assert!(!text.contains("jane.doe"), "a full email in the access log");
    assert!(!text.contains("bob@"), "a path in the access log");

    let metrics = String::from_utf8(gw.admin_get("/metrics").body).unwrap();
    let written = file_lines(&log).len();
    let counted: usize = metrics
        .lines()
        .find_map(|l| l.strip_prefix("drg_access_log_lines_total "))
        .expect("lines counter")
        .parse()
        .unwrap();
    // The scrape itself is on the admin listener, which does not log.
    assert!(
        counted >= written && written >= 10,
        "{counted} vs {written}"
    );
    assert!(metrics.contains("drg_access_log_dropped_total 0\n"));
}

#[test]
fn hostile_values_stay_one_valid_line_each() {
    let up = Upstream::start(Duration::ZERO);
    let (gw, log) = gateway_with_file_log(&up);
    let mut c = gw.conn();
    // Quotes, a backslash, a tab, braces and non-ASCII: everything a header value may carry.
    let origin = "https://a.example\", \"key_id\": \"admin\"}\t{\\\"x\u{e9}";
    let r = get(
        &mut c,
        // A decoded newline, quotes and a fake field in the target.
        "/v1/public/domain/evil%0A%7B%22status%22%3A200%7D%22%5C",
        "hostile-1",
        &[("Origin", origin)],
    );
    assert!(r.status >= 400, "{}", r.status);
    let l = line_with_id(&log, "hostile-1");
    assert_eq!(l["origin"], origin);
    assert_eq!(l["target"], "evil\n{\"status\":200}\"\\");
    assert_eq!(l["status"], r.status);
    assert_eq!(l["key_id"], "test");
    // Every line of the file is one whole JSON object (checked by `file_lines`).
    assert!(file_lines(&log).len() >= 2);
}

#[test]
fn sigusr1_reopens_the_file_after_a_rename() {
    let up = Upstream::start(Duration::ZERO);
    let (gw, log) = gateway_with_file_log(&up);
    let mut c = gw.conn();
    assert_eq!(get(&mut c, "/healthz", "before", &[]).status, 200);
    line_with_id(&log, "before");

    let rotated = gw.dir.path().join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    gw.signal("USR1");
    wait_until(WAIT, || gw.log().contains("access log reopened"));
    assert!(log.exists());

    assert_eq!(get(&mut c, "/healthz", "after", &[]).status, 200);
    line_with_id(&log, "after");
    let old = file_lines(&rotated);
    assert!(old.iter().any(|l| l["request_id"] == "before"));
    assert!(!old.iter().any(|l| l["request_id"] == "after"));
    assert!(!file_lines(&log).iter().any(|l| l["request_id"] == "before"));
}

#[test]
fn a_failed_reopen_keeps_the_old_file() {
    let up = Upstream::start(Duration::ZERO);
    let (gw, log) = gateway_with_file_log(&up);
    let mut c = gw.conn();
    let moved = gw.dir.path().join("moved.log");
    std::fs::rename(&log, &moved).unwrap();
    // The path is now a folder: it cannot be opened as the log.
    std::fs::create_dir(&log).unwrap();
    gw.signal("USR1");
    wait_until(WAIT, || gw.log().contains("cannot reopen the access log"));
    assert_eq!(get(&mut c, "/healthz", "still", &[]).status, 200);
    line_with_id(&moved, "still");
}

#[test]
fn lines_go_to_stderr_without_a_path() {
    // The builder's default upstream refuses connections: the check fails with 502.
    let gw = Gateway::builder()
        .gateway_yaml("access_log: { enabled: true }")
        .start();
    let mut c = gw.conn();
    assert_eq!(
        get(&mut c, "/v1/public/domain/example.com", "to-stderr", &[]).status,
        200
    );
    let r = get(
        &mut gw.conn(),
        "/v1/check/ab%40example.com",
        "failed-1",
        &[],
    );
    assert_eq!(r.status, 502);
    let access_lines = || -> Vec<Value> {
        gw.log()
            .lines()
            .filter(|l| l.starts_with('{'))
            .flat_map(lines_of)
            .collect()
    };
    wait_until(WAIT, || {
        let lines = access_lines();
        ["to-stderr", "failed-1"]
            .iter()
            .all(|id| lines.iter().any(|l| l["request_id"] == *id))
    });
    let lines = access_lines();
    let ok = lines
        .iter()
        .find(|l| l["request_id"] == "to-stderr")
        .unwrap();
    assert_eq!(ok["status"], 200);
    // A proxied call that got no answer: no upstream status, the time spent trying.
    let failed = lines
        .iter()
        .find(|l| l["request_id"] == "failed-1")
        .unwrap();
    assert_eq!(failed["status"], 502);
    assert_eq!(failed["target"], "****@example.com");
    assert_eq!(failed["upstream_status"], Value::Null);
    assert!(failed["upstream_duration_us"].is_u64(), "{failed}");
}

#[test]
fn sigusr1_is_harmless_with_the_log_off() {
    let gw = Gateway::builder().start();
    gw.signal("USR1");
    wait_until(WAIT, || gw.log().contains("the access log is off"));
    assert_eq!(gw.get("/healthz").status, 200);
    assert!(!gw.dir.path().join("access.log").exists());
}
