//! Hostile input against the real binary, over raw sockets, with a recording upstream: the
//! backend sees exactly the request the gateway builds, and nothing a client smuggles in.

use crate::common;

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{raw, read_response, wait_until, Gateway, Response, TEST_SECRET};

/// A backend that records the raw head of every request it receives, and answers by the
/// local part of the checked address: `stall@` sends half a chunked body then stalls,
/// `switch@` answers 101, `vary@` sends its own `Vary`; anything else gets a JSON 200.
struct Recorder {
    addr: SocketAddr,
    heads: Arc<Mutex<Vec<String>>>,
    /// Bytes received after a request head on any connection (a tunnel would show here).
    extra: Arc<Mutex<Vec<u8>>>,
}

impl Recorder {
    fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let extra = Arc::new(Mutex::new(Vec::new()));
        let (h, x) = (heads.clone(), extra.clone());
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (h, x) = (h.clone(), x.clone());
                thread::spawn(move || serve(stream, h, x));
            }
        });
        Recorder { addr, heads, extra }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

fn serve(mut stream: TcpStream, heads: Arc<Mutex<Vec<String>>>, extra: Arc<Mutex<Vec<u8>>>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => {
                    extra.lock().unwrap().extend_from_slice(&buf);
                    return;
                }
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
        buf.drain(..end);
        heads.lock().unwrap().push(head.clone());
        let path = head
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        let reply: Vec<u8> = if path.contains("/stall@") {
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n{\"a\":1\r\n",
            );
            thread::sleep(Duration::from_secs(5));
            return;
        } else if path.contains("/switch@") {
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
                .to_vec()
        } else {
            let body = format!(
                "{{\"checked\":{}}}",
                serde_json::Value::String(path.clone())
            );
            let vary = if path.contains("/vary@") {
                "Vary: Accept-Encoding\r\n"
            } else {
                ""
            };
            format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{vary}Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        };
        if stream.write_all(&reply).is_err() {
            return;
        }
    }
}

/// The responses in a byte stream, in order.
fn responses(bytes: &[u8]) -> Vec<Response> {
    let mut reader = BufReader::new(bytes);
    let mut out = Vec::new();
    while let Ok(r) = read_response(&mut reader) {
        out.push(r);
    }
    out
}

fn one(addr: SocketAddr, request: &str) -> Response {
    let bytes = raw(addr, request.as_bytes());
    responses(&bytes).into_iter().next().unwrap_or_else(|| {
        panic!(
            "no answer to {request:?}: {:?}",
            String::from_utf8_lossy(&bytes)
        )
    })
}

fn auth() -> String {
    format!("Authorization: Bearer {TEST_SECRET}\r\n")
}

/// The request line and the header lines of a recorded head, names lowercased, sorted.
fn shape(head: &str) -> (String, Vec<String>) {
    let mut lines = head.split("\r\n").filter(|l| !l.is_empty());
    let line = lines.next().unwrap_or_default().to_owned();
    let mut headers: Vec<String> = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            format!("{}: {}", k.trim().to_ascii_lowercase(), v.trim())
        })
        .collect();
    headers.sort();
    (line, headers)
}

fn gateway(upstream: &Recorder) -> Gateway {
    Gateway::builder().upstream(upstream.addr).start()
}

/// `gateway.upstream.mode` values: the backend-facing tests run in each.
const MODES: [&str; 2] = ["proxy", "relay"];

fn gateway_in(upstream: &Recorder, mode: &str) -> Gateway {
    Gateway::builder()
        .upstream(upstream.addr)
        .upstream_yaml(&format!("mode: {mode}"))
        .start()
}

fn usage(gw: &Gateway) -> u64 {
    gw.get("/v1/usage").json()["used"].as_u64().unwrap()
}

fn assert_alive(gw: &Gateway) {
    assert_eq!(gw.conn_as(None).get("/healthz").unwrap().status, 200);
}

/// Every request the backend saw carried our key id: none got past auth.
fn assert_all_authenticated(up: &Recorder) {
    for head in up.heads() {
        let (_, headers) = shape(&head);
        assert!(headers.contains(&"x-api-key-id: test".to_owned()), "{head}");
    }
}

#[test]
fn the_upstream_gets_the_request_we_build_not_the_clients() {
    let up = Recorder::start();
    let gw = gateway(&up);
    let r = one(
        gw.addr,
        &format!(
            "GET /v1/check/J%C3%B6rg+x@B%C3%BCcher.DE?debug=1 HTTP/1.1\r\nHost: evil.internal\r\n{}\
             Cookie: session=1\r\nForwarded: for=6.6.6.6;host=evil\r\nX-Original-URL: /admin\r\n\
             X-Forwarded-For: 6.6.6.6, 7.7.7.7\r\nX-Forwarded-Host: evil\r\nX-Api-Key-Id: admin\r\n\
             X-Request-Id: req-123\r\nAccept: application/json\r\nUser-Agent: sdk/1.0\r\n\
             Accept-Language: de\r\nX-Custom: 1\r\nConnection: close\r\n\r\n",
            auth()
        ),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("x-request-id"), Some("req-123"));
    let heads = up.heads();
    assert_eq!(heads.len(), 1, "{heads:?}");
    let (line, headers) = shape(&heads[0]);
    assert_eq!(line, "GET /v1/check/J%C3%B6rg+x@xn--bcher-kva.de HTTP/1.1");
    assert_eq!(
        headers,
        [
            "accept-language: de".to_owned(),
            "accept: application/json".to_owned(),
            format!("host: {}", up.addr),
            "user-agent: sdk/1.0".to_owned(),
            "x-api-key-id: test".to_owned(),
            "x-forwarded-for: 127.0.0.1".to_owned(),
            "x-forwarded-proto: http".to_owned(),
            "x-request-id: req-123".to_owned(),
        ]
    );
}

#[test]
fn absolute_form_targets_and_http10_without_host_get_our_host() {
    let up = Recorder::start();
    let gw = gateway(&up);
    let r = one(
        gw.addr,
        &format!(
            "GET http://evil.internal/v1/check/User@Example.COM HTTP/1.1\r\nHost: evil.internal\r\n{}Connection: close\r\n\r\n",
            auth()
        ),
    );
    assert_eq!(r.status, 200);
    let r = one(
        gw.addr,
        &format!("GET /v1/check/example.org HTTP/1.0\r\n{}\r\n", auth()),
    );
    assert_eq!(r.status, 200);
    let heads = up.heads();
    assert_eq!(heads.len(), 2, "{heads:?}");
    let host = format!("host: {}", up.addr);
    let (line, headers) = shape(&heads[0]);
    assert_eq!(line, "GET /v1/check/User@example.com HTTP/1.1");
    assert!(headers.contains(&host), "{headers:?}");
    let (line, headers) = shape(&heads[1]);
    assert_eq!(line, "GET /v1/check/example.org HTTP/1.1");
    assert!(headers.contains(&host), "{headers:?}");
    assert_all_authenticated(&up);
    assert_alive(&gw);
}

#[test]
fn dot_segments_backslashes_and_control_bytes_never_reach_the_upstream() {
    let up = Recorder::start();
    let gw = gateway(&up);
    for target in [
        "..",
        "%2e%2e",
        "%2E%2E",
        ".",
        "..%5c..%5cadmin",
        "a%5cb@example.com",
        "a%00b@example.com",
        "a%0d%0aX-Injected:%201@example.com",
        "%ff@example.com",
        "..%2f..%2fadmin",
        "user@localhost",
    ] {
        let r = one(
            gw.addr,
            &format!(
                "GET /v1/check/{target} HTTP/1.1\r\nHost: gw\r\n{}Connection: close\r\n\r\n",
                auth()
            ),
        );
        r.assert_error(422, "validation_error");
    }
    // A path Pingora cannot even parse is refused before it is routed.
    let bytes = raw(
        gw.addr,
        format!(
            "GET /v1/check/a\0b@example.com HTTP/1.1\r\nHost: gw\r\n{}\r\n",
            auth()
        )
        .as_bytes(),
    );
    let status = responses(&bytes).first().map(|r| r.status);
    assert!(matches!(status, None | Some(400) | Some(422)), "{status:?}");
    // Raw bytes that are not UTF-8 are escaped by the parser, then refused as not UTF-8.
    let mut request = b"GET /v1/check/\xff\xfe@example.com HTTP/1.1\r\nHost: gw\r\n".to_vec();
    request.extend_from_slice(format!("{}Connection: close\r\n\r\n", auth()).as_bytes());
    let got = responses(&raw(gw.addr, &request));
    assert!(
        matches!(got.first().map(|r| r.status), None | Some(400) | Some(422)),
        "{:?}",
        got.first().map(|r| r.status)
    );
    assert_alive(&gw);
    assert!(up.heads().is_empty(), "{:?}", up.heads());
}

#[test]
fn bodies_upgrades_and_bad_framing_are_refused_uncounted() {
    let up = Recorder::start();
    let gw = gateway(&up);
    let before = usage(&gw);
    let check = "/v1/check/user@example.com";
    let a = auth();
    let big = "x".repeat(1_000_000);
    let cases: Vec<(String, &str)> = vec![
        (
            format!("GET {check} HTTP/1.1\r\nHost: gw\r\n{a}Content-Length: {}\r\n\r\n{big}", big.len()),
            "request bodies",
        ),
        (
            format!("GET {check} HTTP/1.1\r\nHost: gw\r\n{a}Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            "Transfer-Encoding",
        ),
        (
            format!("GET {check} HTTP/1.1\r\nHost: gw\r\n{a}Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
            "Transfer-Encoding",
        ),
        (
            format!("GET {check} HTTP/1.1\r\nHost: gw\r\n{a}Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: x\r\n\r\n"),
            "upgrades",
        ),
        (
            format!("GET {check} HTTP/1.1\r\n{a}\r\n"),
            "Host header",
        ),
        (
            format!("GET {check} HTTP/1.1\r\nHost: gw\r\n{a}Connection: X-Forwarded-For\r\n\r\n"),
            "Connection may only",
        ),
        (
            format!("GET {check} HTTP/1.1\r\nHost: gw\r\n{a}Connection: keep-alive, X-Api-Key-Id\r\n\r\n"),
            "Connection may only",
        ),
    ];
    for (request, detail) in &cases {
        let r = one(gw.addr, request);
        let got = r.assert_error(400, "bad_request");
        assert!(got.as_str().unwrap().contains(detail), "{got} for {detail}");
    }
    // Differing duplicate lengths and doubled Hosts are refused by Pingora's own parser (a
    // plain 400 before any of our code runs).
    for request in [
        format!(
            "GET {check} HTTP/1.1\r\nHost: gw\r\n{a}Content-Length: 0\r\nContent-Length: 7\r\n\r\n"
        ),
        format!("GET {check} HTTP/1.1\r\nHost: a\r\nHost: b\r\n{a}\r\n"),
    ] {
        assert_eq!(one(gw.addr, &request).status, 400, "{request}");
    }
    assert_alive(&gw);
    assert!(up.heads().is_empty(), "{:?}", up.heads());
    assert_eq!(usage(&gw), before, "a refused request was counted");
}

#[test]
fn a_backend_answering_101_opens_no_tunnel() {
    for mode in MODES {
        a_backend_answering_101_opens_no_tunnel_in(mode);
    }
}

fn a_backend_answering_101_opens_no_tunnel_in(mode: &str) {
    let up = Recorder::start();
    let gw = gateway_in(&up, mode);
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    write!(
        s,
        "GET /v1/check/switch@example.com HTTP/1.1\r\nHost: gw\r\n{}\r\n",
        auth()
    )
    .unwrap();
    let mut first = [0u8; 512];
    let n = s.read(&mut first).unwrap_or(0);
    let first = String::from_utf8_lossy(&first[..n]).into_owned();
    assert!(!first.starts_with("HTTP/1.1 101"), "{first}");
    // Key-less bytes on the same connection never reach the backend.
    let _ = s.write_all(b"GET /v1/check/x@example.com HTTP/1.1\r\nHost: gw\r\n\r\n");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let rest = String::from_utf8_lossy(&rest);
    assert!(!rest.contains("\"checked\""), "{rest}");
    // The gateway closed that connection: nothing more can arrive at the backend through it.
    assert_eq!(up.heads().len(), 1, "{:?}", up.heads());
    assert!(
        up.extra.lock().unwrap().is_empty(),
        "bytes tunnelled to the backend"
    );
    assert_all_authenticated(&up);
    assert_alive(&gw);
}

#[test]
fn a_backend_failing_mid_body_gives_a_truncated_answer_not_a_framed_one() {
    let up = Recorder::start();
    let gw = gateway_in(&up, "proxy");
    let bytes = raw(
        gw.addr,
        format!(
            "GET /v1/check/stall@example.com HTTP/1.1\r\nHost: gw\r\n{}\r\n",
            auth()
        )
        .as_bytes(),
    );
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    // The chunked body never ends with its zero-length chunk, and holds no error of ours.
    assert!(
        responses(&bytes).is_empty(),
        "a complete response came out: {text}"
    );
    assert!(!text.contains("upstream_timeout"), "{text}");
    assert_all_authenticated(&up);
    assert_alive(&gw);
}

#[test]
fn the_relay_answers_a_backend_failing_mid_body_with_a_clean_error() {
    // The relay reads the whole answer before writing: nothing of the half body goes out, and
    // the client gets the read timeout's 504 instead.
    let up = Recorder::start();
    let gw = gateway_in(&up, "relay");
    let bytes = raw(
        gw.addr,
        format!(
            "GET /v1/check/stall@example.com HTTP/1.1\r\nHost: gw\r\n{}\r\n",
            auth()
        )
        .as_bytes(),
    );
    let got = responses(&bytes);
    let text = String::from_utf8_lossy(&bytes);
    assert_eq!(got.len(), 1, "{text}");
    got[0].assert_error(504, "upstream_timeout");
    assert!(!text.contains("{\"a\":1"), "half a body went out: {text}");
    assert_all_authenticated(&up);
    assert_alive(&gw);
}

#[test]
fn the_backends_vary_is_kept_and_errors_that_close_say_so() {
    let up = Recorder::start();
    for mode in MODES {
        let gw = gateway_in(&up, mode);
        let r = gw.get("/v1/check/vary@example.com");
        assert_eq!(r.status, 200, "{mode}");
        assert_eq!(r.header("vary"), Some("Accept-Encoding, Origin"), "{mode}");
    }
    assert_all_authenticated(&up);

    // A dead backend: 502 that says Connection: close, then closes.
    let dead = Gateway::builder().start();
    let mut c = dead.conn();
    let r = c.get("/v1/check/user@example.com").unwrap();
    r.assert_error(502, "upstream_unavailable");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.is_closed());
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let up = Recorder::start();
    let gw = gateway(&up);
    let a = auth();
    let bytes = raw(
        gw.addr,
        format!(
            "GET /v1/public/domain/one.example HTTP/1.1\r\nHost: gw\r\n{a}\r\n\
             GET /v1/check/two@example.com HTTP/1.1\r\nHost: gw\r\n{a}\r\n\
             GET /v1/public/domain/three.example HTTP/1.1\r\nHost: gw\r\n{a}Connection: close\r\n\r\n"
        )
        .as_bytes(),
    );
    let got = responses(&bytes);
    assert_eq!(got.len(), 3, "{}", String::from_utf8_lossy(&bytes));
    assert_eq!(got[0].json()["domain"], "one.example");
    assert_eq!(got[1].json()["checked"], "/v1/check/two@example.com");
    assert_eq!(got[2].json()["domain"], "three.example");
    assert_eq!(up.heads().len(), 1);
    assert_all_authenticated(&up);
    assert_alive(&gw);
}

#[test]
fn oversized_and_overlong_headers_get_431() {
    let gw = Gateway::builder()
        .gateway_yaml("limits: { max_header_bytes: 4096, max_headers: 20 }")
        .start();
    let big = format!(
        "GET /v1/public/domain/a.example HTTP/1.1\r\nHost: gw\r\n{}X-Pad: {}\r\n\r\n",
        auth(),
        "p".repeat(8_000)
    );
    one(gw.addr, &big).assert_error(431, "bad_request");
    let many: String = (0..30).map(|i| format!("X-H{i}: {i}\r\n")).collect();
    let r = one(
        gw.addr,
        &format!(
            "GET /v1/public/domain/a.example HTTP/1.1\r\nHost: gw\r\n{}{many}\r\n",
            auth()
        ),
    );
    r.assert_error(431, "bad_request");
    // Just under the limits is fine.
    let few: String = (0..15).map(|i| format!("X-H{i}: {i}\r\n")).collect();
    let r = one(
        gw.addr,
        &format!("GET /v1/public/domain/a.example HTTP/1.1\r\nHost: gw\r\n{}{few}Connection: close\r\n\r\n", auth()),
    );
    assert_eq!(r.status, 200);
    let counts = gw.admin_get("/readyz").json()["connections"].clone();
    assert_eq!(counts["header_too_large"], 2, "{counts}");
}

/// Bytes of the next request sent in the same read as the previous header count toward the
/// next request's limits (before, only the bytes read after the first answer were counted, so a
/// pipelined header could pass `max_header_bytes` by what came with its predecessor).
#[test]
fn bytes_pipelined_behind_a_header_count_toward_the_next_requests_limits() {
    let gw = Gateway::builder()
        .gateway_yaml("limits: { max_header_bytes: 4096, max_headers: 20 }")
        .start();
    let mut s = TcpStream::connect(gw.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let first = format!(
        "GET /v1/public/domain/one.example HTTP/1.1\r\nHost: gw\r\n{}\r\n",
        auth()
    );
    let second_start = format!(
        "GET /v1/public/domain/two.example HTTP/1.1\r\nHost: gw\r\n{}X-Pad: {}",
        auth(),
        "p".repeat(3_800)
    );
    s.write_all(format!("{first}{second_start}").as_bytes())
        .unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let r = read_response(&mut reader).unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    // The second header, about 4.4 KB in all, ends after the first answer.
    s.write_all(format!("{}\r\nConnection: close\r\n\r\n", "p".repeat(400)).as_bytes())
        .unwrap();
    read_response(&mut reader)
        .unwrap()
        .assert_error(431, "bad_request");
    // Within the limit, the same two requests in one write are answered in order.
    let small = format!(
        "{first}GET /v1/public/domain/two.example HTTP/1.1\r\nHost: gw\r\n{}X-Pad: {}\r\nConnection: close\r\n\r\n",
        auth(),
        "p".repeat(3_000)
    );
    let got = responses(&raw(gw.addr, small.as_bytes()));
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].json()["domain"], "two.example");
}

#[test]
fn slow_headers_idle_connections_and_long_sessions_are_bounded() {
    let gw = Gateway::builder()
        .gateway_yaml(
            "limits: { header_timeout_ms: 600, idle_timeout_ms: 1500, max_requests_per_connection: 3 }",
        )
        .start();
    // A client trickling its header one byte at a time is cut off at the header deadline,
    // however often it sends.
    let mut slow = TcpStream::connect(gw.addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let started = Instant::now();
    let request = b"GET /v1/public/domain/a.example HTTP/1.1\r\nHost: gw\r\nX-Slow: ";
    let mut answer = Vec::new();
    for b in request.iter().chain(std::iter::repeat(&b'x')) {
        if slow.write_all(&[*b]).is_err() {
            break;
        }
        let mut buf = [0u8; 512];
        match slow.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => break,
        }
        assert!(started.elapsed() < Duration::from_secs(20), "never cut off");
    }
    let r = responses(&answer);
    assert_eq!(r.len(), 1, "{}", String::from_utf8_lossy(&answer));
    r[0].assert_error(408, "bad_request");

    // An idle keep-alive connection is closed after the idle timeout.
    let mut c = gw.conn();
    assert_eq!(c.get("/v1/public/domain/a.example").unwrap().status, 200);
    wait_until(Duration::from_secs(10), || c.is_closed());

    // The third request on one connection is its last.
    let mut c = gw.conn();
    for i in 1..=3 {
        let r = c.get("/v1/public/domain/a.example").unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("connection") == Some("close"),
            i == 3,
            "request {i}"
        );
    }
    assert!(c.is_closed());
    let counts = gw.admin_get("/readyz").json()["connections"].clone();
    assert!(counts["header_timeouts"].as_u64().unwrap() >= 1, "{counts}");
    assert!(counts["idle_closed"].as_u64().unwrap() >= 1, "{counts}");
}

#[test]
fn connections_beyond_the_cap_are_closed_and_slots_come_back() {
    let gw = Gateway::builder()
        .gateway_yaml("limits: { max_connections: 8 }")
        .start();
    let open = || gw.admin_get("/readyz").json()["connections"]["open_connections"].clone();
    // The harness's own readiness connection may still be closing: start from none open, or
    // one of the eight below would be the one refused.
    wait_until(Duration::from_secs(10), || open() == 0);
    let held: Vec<TcpStream> = (0..8)
        .map(|_| TcpStream::connect(gw.addr).unwrap())
        .collect();
    wait_until(Duration::from_secs(10), || open() == 8);
    let mut extra = TcpStream::connect(gw.addr).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n");
    let mut buf = Vec::new();
    let _ = extra.read_to_end(&mut buf);
    assert!(buf.is_empty(), "{}", String::from_utf8_lossy(&buf));
    drop(held);
    wait_until(Duration::from_secs(10), || open() == 0);
    assert_alive(&gw);
    let counts = gw.admin_get("/readyz").json()["connections"].clone();
    assert!(
        counts["refused_connections"].as_u64().unwrap() >= 1,
        "{counts}"
    );
}

#[test]
fn public_readiness_says_only_its_status() {
    let gw = Gateway::builder().start();
    let r = gw.conn_as(None).get("/readyz").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, br#"{"status":"ready"}"#);
    let admin = gw.admin_get("/readyz").json();
    assert_eq!(admin["pid"], gw.pid());
    assert_eq!(admin["keys"], 1);
    assert_eq!(gw.admin_get("/nope").status, 404);
}
