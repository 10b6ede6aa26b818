//! The embedding API end to end: `examples/embed.rs`, a Pingora host proxy with its own routes
//! and backend, run as a real process with the domain-risk routes mounted under `/v1/`.

use crate::common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    read_headers, read_response, send, write_atomic, Gateway, Response, Upstream, TEST_SECRET,
};

const BROWSER_SECRET: &str = "drg_test_browser_key_0123456789abcdefghijklmnop";
const SMALL_SECRET: &str = "drg_test_small_plan_key_0123456789abcdefghijklm";

/// `examples/embed.rs` as `cargo test` built it (it builds every example before the tests run).
fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path = profile.join("examples").join("embed");
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test` (which builds the examples) or `cargo build --example embed` first",
        path.display()
    );
    path
}

/// A request as the host's backend saw it, body included.
#[derive(Clone)]
struct Seen {
    request_line: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// The host's own backend: answers every request with its body echoed back, after `delay`,
/// with headers of its own, and records what it saw.
struct HostBackend {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl HostBackend {
    fn start(delay: Duration) -> HostBackend {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let s = s.clone();
                thread::spawn(move || echo(stream, s, delay));
            }
        });
        HostBackend { addr, seen, stop }
    }

    /// What reached the backend, but the readiness probes of the test harness's start.
    fn seen(&self) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|s| s.request_line != "GET /readyz HTTP/1.1")
            .cloned()
            .collect()
    }
}

impl Drop for HostBackend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn echo(stream: TcpStream, seen: Arc<Mutex<Vec<Seen>>>, delay: Duration) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let Ok(headers) = read_headers(&mut reader) else {
            return;
        };
        let len = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .map_or(0, |(_, v)| v.parse::<usize>().unwrap());
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        seen.lock().unwrap().push(Seen {
            request_line: line.trim_end().to_owned(),
            headers,
            body: body.clone(),
        });
        thread::sleep(delay);
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nX-Host-Backend: echo\r\nSet-Cookie: session=abc; HttpOnly\r\n\r\n",
            body.len()
        );
        let out = reader.get_mut();
        if out.write_all(head.as_bytes()).is_err() || out.write_all(&body).is_err() {
            return;
        }
    }
}

/// The example host on `backend`, with a test key, a browser key, a key on a plan of 3 calls a
/// month, `data` files, and `check` as the gateway's `/v1/check` backend.
fn host(
    backend: &HostBackend,
    check: Option<SocketAddr>,
    dir: Option<tempfile::TempDir>,
) -> Gateway {
    let backend = backend.addr.to_string();
    let mut builder = Gateway::builder()
        .key(
            "browser",
            BROWSER_SECRET,
            "test",
            &["https://app.example.com"],
        )
        .key("small", SMALL_SECRET, "three", &[])
        .plan("three", 3)
        .grace_seconds(3);
    builder = match dir {
        Some(dir) => builder.in_dir(dir),
        None => builder.data("disposable.txt", "planted-dispo.com\n"),
    };
    if let Some(check) = check {
        builder = builder.upstream(check);
    }
    let program = example();
    builder.start_with(move |conf, listen| {
        let mut command = crate::common::command(&program);
        command.args(["-c", conf, "--listen", listen, "--upstream", &backend]);
        command
    })
}

/// A GET on a fresh connection.
fn get(gw: &Gateway, path: &str, secret: Option<&str>, extra: &[(&str, &str)]) -> Response {
    send(gw, "GET", path, secret, extra, None)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

#[test]
fn the_hosts_routes_reach_its_backend_untouched_and_v1_is_the_gateways() {
    let backend = HostBackend::start(Duration::ZERO);
    let check = Upstream::start(Duration::ZERO);
    let gw = host(&backend, Some(check.addr), None);

    // The host's own local route.
    let r = get(&gw, "/host/health", None, &[]);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"host ok\n"[..]));

    // The host's proxied routes: request line, headers (its own credentials and cookies
    // included) and body reach its backend as the client sent them; the answer comes back with
    // the backend's headers and nothing of the gateway's.
    let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let r = send(
        &gw,
        "POST",
        "/app/upload?x=1&y=%40",
        Some("host-own-token"),
        &[
            ("Cookie", "theme=dark"),
            ("X-Custom", "kept as sent"),
            ("Content-Type", "application/octet-stream"),
            ("Origin", "https://elsewhere.example"),
        ],
        Some(&body),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.body, body, "the body came back changed");
    assert_eq!(r.header("x-host-backend"), Some("echo"));
    assert_eq!(r.header("set-cookie"), Some("session=abc; HttpOnly"));
    for ours in ["ratelimit", "ratelimit-policy", "x-dataset-version", "vary"] {
        assert_eq!(r.header(ours), None, "{ours} added to a host answer");
    }
    let seen = backend.seen();
    let lines: Vec<&str> = seen.iter().map(|s| s.request_line.as_str()).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let s = &seen[0];
    assert_eq!(s.request_line, "POST /app/upload?x=1&y=%40 HTTP/1.1");
    assert!(s.body == body, "the body reached the backend changed");
    for (name, value) in [
        ("authorization", "Bearer host-own-token"),
        ("cookie", "theme=dark"),
        ("x-custom", "kept as sent"),
        ("origin", "https://elsewhere.example"),
        ("host", "localhost"),
    ] {
        assert_eq!(
            header(&s.headers, name),
            Some(value),
            "{name}: {:?}",
            s.headers
        );
    }
    for added in ["x-api-key-id", "x-request-id", "x-forwarded-for"] {
        assert_eq!(
            header(&s.headers, added),
            None,
            "{added} added to a host request"
        );
    }

    // `/v1/` is the gateway's: 401 without a key, the record with one, never the host backend.
    get(&gw, "/v1/public/domain/planted-dispo.com", None, &[]).assert_error(401, "unauthorized");
    let r = get(
        &gw,
        "/v1/public/domain/x.planted-dispo.com",
        Some(TEST_SECRET),
        &[],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["reason"], "disposable");
    assert!(r.header("ratelimit").is_some() && r.header("x-dataset-version").is_some());
    let r = get(&gw, "/v1/nowhere", Some(TEST_SECRET), &[]);
    r.assert_error(404, "not_found");

    // Origins: a browser key from elsewhere is refused, from its own origin answered.
    let evil = [("Origin", "https://evil.example")];
    let r = get(
        &gw,
        "/v1/public/domain/gmail.com",
        Some(BROWSER_SECRET),
        &evil,
    );
    r.assert_error(403, "forbidden");
    let own = [("Origin", "https://app.example.com")];
    let r = get(
        &gw,
        "/v1/public/domain/gmail.com",
        Some(BROWSER_SECRET),
        &own,
    );
    assert_eq!(r.status, 200);

    // The monthly quota: a plan of 3 calls answers the fourth 429.
    let statuses: Vec<u16> = (0..4)
        .map(|_| get(&gw, "/v1/public/domain/a.com", Some(SMALL_SECRET), &[]).status)
        .collect();
    assert_eq!(statuses, [200, 200, 200, 429]);

    // `/v1/check` goes to the gateway's backend, built by the gateway, not to the host's.
    let r = get(&gw, "/v1/check/user%40example.com", Some(TEST_SECRET), &[]);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let checked = check.requests();
    assert_eq!(checked.len(), 1);
    assert_eq!(checked[0].path, "/v1/check/user@example.com");
    assert_eq!(checked[0].header("x-api-key-id"), Some("test"));
    assert_eq!(checked[0].header("authorization"), None);
    // Spellings of `/v1/` a backend could read as it are the gateway's too: never forwarded
    // around its keys and quota to a host backend that may serve `/v1/` itself.
    for respelt in [
        "//v1/check/user@example.com",
        "/%76%31/check/user@example.com",
        "/app/../v1/check/user@example.com",
        "/V1/check/user@example.com",
        "/v1;x/check/user@example.com",
        // Read as `/v1/` by a backend that trims segments, strips NULs or control
        // characters, reads a C string, or NFKC-normalises (full-width `／ｖ１／`).
        "/v1%20/check/user@example.com",
        "/v1%09/check/user@example.com",
        "/v1%00/check/user@example.com",
        "/%EF%BD%96%EF%BC%91/check/user@example.com",
    ] {
        let r = get(&gw, respelt, None, &[]);
        assert_eq!(
            r.status,
            404,
            "{respelt}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    assert_eq!(check.requests().len(), 1);
    assert_eq!(
        backend.seen().len(),
        1,
        "a /v1/ request reached the host's backend"
    );

    // The admin listener's metrics count the gateway's requests, and only those.
    let lookups = gw
        .metric("drg_requests_total{route=\"domain\",status=\"200\"}")
        .expect("lookups counted");
    assert_eq!(
        lookups, 5.0,
        "one, from its origin, three of the small plan"
    );
    let metrics = String::from_utf8(gw.admin_get("/metrics").body).unwrap();
    assert!(!metrics.contains("upload"), "a host route in the metrics");
    assert_eq!(gw.admin_get("/readyz").status, 200);
}

#[test]
fn a_data_reload_shows_in_the_host_without_a_failed_request() {
    let backend = HostBackend::start(Duration::ZERO);
    let gw = host(&backend, None, None);
    let path = "/v1/public/domain/fresh-dispo.com";
    let r = get(&gw, path, Some(TEST_SECRET), &[]);
    assert_eq!(r.json()["reason"], "safe");

    let stop = Arc::new(AtomicBool::new(false));
    // Each client's answers so far: the reload comes once they are all under way, and the stop
    // once each had an answer begun after the reload showed (fixed waits did not say either).
    let answered: Arc<Vec<AtomicUsize>> = Arc::new((0..4).map(|_| AtomicUsize::new(0)).collect());
    let addr = gw.addr;
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let stop = stop.clone();
            let answered = answered.clone();
            thread::spawn(move || {
                let mut c = common::Conn::open_as(addr, Some(TEST_SECRET)).unwrap();
                let mut statuses = BTreeMap::new();
                let mut reasons = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let r = c.get("/v1/public/domain/fresh-dispo.com").unwrap();
                    *statuses.entry(r.status).or_insert(0usize) += 1;
                    reasons.push(r.json()["reason"].as_str().unwrap().to_owned());
                    let h = c.get("/host/health").unwrap();
                    *statuses.entry(h.status).or_insert(0usize) += 1;
                    answered[i].fetch_add(1, Ordering::SeqCst);
                }
                (statuses, reasons)
            })
        })
        .collect();
    let counts = || -> Vec<usize> { answered.iter().map(|a| a.load(Ordering::SeqCst)).collect() };
    common::wait_until(Duration::from_secs(10), || counts().iter().all(|n| *n >= 5));
    write_atomic(
        &gw.data_path("disposable.txt"),
        "planted-dispo.com\nfresh-dispo.com\n",
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(&gw, path, Some(TEST_SECRET), &[]).json()["reason"] != "disposable" {
        assert!(
            Instant::now() < deadline,
            "the reload never showed:\n{}",
            gw.log()
        );
        thread::sleep(Duration::from_millis(50));
    }
    let shown = counts();
    common::wait_until(Duration::from_secs(10), || {
        counts()
            .iter()
            .zip(&shown)
            .all(|(now, then)| *now >= then + 2)
    });
    stop.store(true, Ordering::SeqCst);
    let mut statuses = BTreeMap::new();
    let mut last_reasons = Vec::new();
    for c in clients {
        let (s, reasons) = c.join().unwrap();
        for (k, v) in s {
            *statuses.entry(k).or_insert(0) += v;
        }
        last_reasons.push(reasons.last().cloned().unwrap());
    }
    assert_eq!(
        statuses.keys().copied().collect::<Vec<_>>(),
        [200],
        "{statuses:?}"
    );
    assert!(statuses[&200] > 20, "{statuses:?}");
    assert!(
        last_reasons.iter().all(|r| r == "disposable"),
        "{last_reasons:?}"
    );
}

#[test]
fn sigterm_drains_the_hosts_requests_and_keeps_the_gateways_counts() {
    let backend = HostBackend::start(Duration::from_millis(1500));
    let mut gw = host(&backend, None, None);
    for _ in 0..2 {
        let r = get(&gw, "/v1/public/domain/a.com", Some(SMALL_SECRET), &[]);
        assert_eq!(r.status, 200);
    }
    // A slow host request in flight when SIGTERM comes.
    let addr = gw.addr;
    let slow = thread::spawn(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream
            .write_all(b"GET /app/slow HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .unwrap();
        read_response(&mut BufReader::new(stream))
    });
    // In flight once the host's backend has it (a fixed wait could signal before it arrived).
    common::wait_until(Duration::from_secs(10), || backend.seen().len() == 1);
    gw.signal("TERM");
    // Draining (`drain_seconds`): the gateway's readiness says so while requests still come in.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match gw.try_admin_get("/readyz") {
            Ok(r) if r.status == 503 => break,
            _ if Instant::now() > deadline => panic!("never draining:\n{}", gw.log()),
            _ => thread::sleep(Duration::from_millis(20)),
        }
    }
    let r = get(&gw, "/v1/public/domain/a.com", Some(SMALL_SECRET), &[]);
    assert_eq!(r.status, 200, "a call while draining");
    let answer = slow.join().unwrap().expect("the slow host request was cut");
    assert_eq!(answer.status, 200);
    assert!(
        gw.wait_exit(Duration::from_secs(15)),
        "no exit:\n{}",
        gw.log()
    );

    // The gateway's counts survived the stop: the month holds the 3 calls, the fourth is 429.
    let dir = std::mem::replace(&mut gw.dir, tempfile::tempdir().unwrap());
    let gw = host(&backend, None, Some(dir));
    let usage = get(&gw, "/v1/usage", Some(SMALL_SECRET), &[]).json();
    assert_eq!(usage["month_count"], 3, "{usage}");
    let r = get(&gw, "/v1/public/domain/a.com", Some(SMALL_SECRET), &[]);
    r.assert_error(429, "quota_exceeded");
}

#[test]
fn the_example_refuses_a_broken_gateway_section_with_the_key_at_fault() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("gateway.yaml");
    std::fs::write(&conf, "gateway:\n  quota:\n    store: carrier-pigeon\n").unwrap();
    let out = Command::new(example())
        .args([
            "-c",
            conf.to_str().unwrap(),
            "--listen",
            "127.0.0.1:1",
            "--upstream",
            "127.0.0.1:1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("gateway.quota.store"), "{stderr}");
}
