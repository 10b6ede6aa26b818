//! OpenTelemetry tracing against the real binary and a real OTLP/HTTP receiver on loopback (the
//! opentelemetry-proto decoder, tests/otlp/receiver.py): the spans of a lookup and of a
//! `/v1/check` call and their links, the `traceparent` the backend gets, the trace id in the
//! access log, a trusted caller's trace followed and an untrusted one's not, and requests
//! unaffected while the collector is away.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;

/// The receiver's Python: a venv under target/ with the pinned decoder.
fn python() -> PathBuf {
    python_venv(
        "otlp-venv",
        &["opentelemetry-proto==1.45.2"],
        "import opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    )
}

/// The receiver process; killed on drop.
struct Collector {
    port: u16,
    child: Child,
}

impl Collector {
    fn start() -> Collector {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/otlp/receiver.py");
        let mut child = Command::new(python())
            .arg(script)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().strip_prefix("port ").unwrap().parse().unwrap();
        Collector { port, child }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn spans(&self) -> Vec<serde_json::Value> {
        let addr = format!("127.0.0.1:{}", self.port).parse().unwrap();
        let mut c = Conn::open(addr).unwrap();
        let r = c.get("/spans").unwrap();
        serde_json::from_slice::<Vec<serde_json::Value>>(&r.body).unwrap()
    }

    fn of_trace(&self, trace_id: &str) -> Vec<serde_json::Value> {
        self.spans()
            .into_iter()
            .filter(|s| s["trace_id"] == trace_id)
            .collect()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn named<'a>(spans: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    spans
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no span {name} in {spans:#?}"))
}

/// The trace id of the access log's line for `request_id`.
fn logged_trace_id(gw: &Gateway, request_id: &str) -> String {
    let path = gw.dir.path().join("access.log");
    let mut found = None;
    wait_until(Duration::from_secs(5), || {
        found = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|l| l["request_id"] == request_id)
            .and_then(|l| l["trace_id"].as_str().map(str::to_owned));
        found.is_some()
    });
    found.unwrap()
}

fn traced(builder: GatewayBuilder, endpoint: &str, extra: &str) -> GatewayBuilder {
    builder
        .gateway_yaml(&format!(
            "tracing: {{ otlp_endpoint: '{endpoint}', service_name: drg-test, headers: {{ X-Test: yes }}{extra} }}"
        ))
        .gateway_yaml("access_log: { enabled: true, path: access.log }")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
}

#[test]
fn a_lookup_and_a_check_are_traced_into_the_backend() {
    let collector = Collector::start();
    let backend = Upstream::start(Duration::ZERO);
    let gw = traced(Gateway::builder(), &collector.url(), "")
        .upstream(backend.addr)
        .start();
    let mut c = gw.conn();
    let lookup = c
        .request(
            "GET",
            "/v1/public/domain/example.org",
            &[("X-Request-Id", "lookup-1")],
        )
        .unwrap();
    assert_eq!(lookup.status, 200);
    let check = c
        .request(
            "GET",
            "/v1/check/someone@example.org",
            &[("X-Request-Id", "check-1")],
        )
        .unwrap();
    assert_eq!(
        check.status,
        200,
        "{}",
        String::from_utf8_lossy(&check.body)
    );

    // The lookup: a server span with a quota child, in the trace the access log names.
    let lookup_trace = logged_trace_id(&gw, "lookup-1");
    assert_eq!(lookup_trace.len(), 32);
    let mut spans = Vec::new();
    wait_until(Duration::from_secs(10), || {
        spans = collector.of_trace(&lookup_trace);
        spans.len() >= 2
    });
    let server = named(&spans, "GET /v1/public/domain/{domain}");
    assert_eq!(server["kind"], 2, "SERVER");
    assert_eq!(server["parent_span_id"], "", "a new trace");
    assert_eq!(server["service"], "drg-test");
    assert_eq!(server["x_test"], "yes", "the configured export header");
    assert_eq!(server["content_type"], "application/x-protobuf");
    let attrs = &server["attributes"];
    assert_eq!(attrs["http.response.status_code"], 200);
    assert_eq!(attrs["drg.key_id"], "test");
    assert_eq!(attrs["drg.project"], "test");
    assert_eq!(attrs["drg.decision"], "allowed");
    assert_eq!(attrs["http.route"], "domain");
    let quota = named(&spans, "quota");
    assert_eq!(quota["parent_span_id"], server["span_id"]);

    // The check: server -> upstream (client) -> the backend got our traceparent.
    let check_trace = logged_trace_id(&gw, "check-1");
    wait_until(Duration::from_secs(10), || {
        spans = collector.of_trace(&check_trace);
        spans.len() >= 3
    });
    let server = named(&spans, "GET /v1/check/{target}");
    let upstream = named(&spans, "upstream");
    assert_eq!(upstream["kind"], 3, "CLIENT");
    assert_eq!(upstream["parent_span_id"], server["span_id"]);
    assert_eq!(upstream["attributes"]["http.response.status_code"], 200);
    let seen = backend.requests();
    let traceparent = seen
        .iter()
        .find(|r| r.path.starts_with("/v1/check/"))
        .and_then(|r| {
            r.headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("traceparent"))
                .map(|(_, v)| v.clone())
        })
        .expect("a traceparent upstream");
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[1], check_trace, "the same trace");
    assert_eq!(parts[2], upstream["span_id"], "under the upstream span");
    assert_eq!(parts[3], "01", "sampled");
    // No email anywhere in the spans.
    let all = serde_json::to_string(&collector.spans()).unwrap();
    assert!(!all.contains("someone"), "{all}");
    assert!(gw.metric("drg_trace_spans_exported_total").unwrap() >= 5.0);
}

#[test]
fn only_a_trusted_proxys_trace_context_is_followed() {
    let collector = Collector::start();
    let parent_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let traceparent = format!("00-{parent_trace}-00f067aa0ba902b7-01");
    // Each gateway lives until its spans are exported (a killed one exports nothing more).
    let start = |trusted: bool| {
        let mut builder = traced(Gateway::builder(), &collector.url(), "");
        if trusted {
            builder = builder.gateway_yaml("trusted_proxies: [127.0.0.1/32]");
        }
        builder.start()
    };
    let ask = |gw: &Gateway, id: &str| {
        let r = gw
            .conn()
            .request(
                "GET",
                "/v1/public/domain/example.org",
                &[("X-Request-Id", id), ("traceparent", &traceparent)],
            )
            .unwrap();
        assert_eq!(r.status, 200);
        logged_trace_id(gw, id)
    };
    let (trusting, wary) = (start(true), start(false));
    assert_eq!(ask(&trusting, "trusted-1"), parent_trace);
    let untrusted = ask(&wary, "untrusted-1");
    assert_ne!(untrusted, parent_trace, "a stranger cannot pick the trace");
    // The trusted caller's span is the parent of ours; the stranger's trace is a new root.
    wait_until(Duration::from_secs(10), || {
        collector
            .of_trace(parent_trace)
            .iter()
            .any(|s| s["parent_span_id"] == "00f067aa0ba902b7")
    });
    wait_until(Duration::from_secs(10), || {
        collector
            .of_trace(&untrusted)
            .iter()
            .any(|s| s["parent_span_id"] == "" && s["kind"] == 2)
    });
}

#[test]
fn with_the_collector_away_requests_are_answered_as_ever_and_losses_are_counted() {
    // A collector that takes connections and never answers: every export waits out its
    // timeout, so the queue fills whatever the machine's load. (A port where nothing listened
    // refused at once: exports failed so fast that under load the queue never filled, and no
    // span was dropped within the wait.)
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", silent.local_addr().unwrap());
    let gw = traced(
        Gateway::builder(),
        &dead,
        ", queue_size: 64, export_timeout_ms: 200",
    )
    .start();
    let counts = hammer(
        &[gw.addr],
        TEST_SECRET,
        "/v1/public/domain/example.org",
        4,
        100,
    );
    assert_eq!(counts, [(200, 400)].into());
    // 400 requests, 2 spans each, a queue of 64 and no collector: most are lost, all counted.
    wait_until(Duration::from_secs(20), || {
        let dropped = gw.metric("drg_trace_spans_dropped_total").unwrap_or(0.0);
        let failed = gw
            .metric("drg_trace_spans_export_failed_total")
            .unwrap_or(0.0);
        dropped > 0.0 && failed > 0.0
    });
    assert_eq!(gw.metric("drg_trace_spans_exported_total"), Some(0.0));
}

#[test]
fn a_bad_tracing_section_is_refused_naming_the_key() {
    let out = crate::common::command(env!("CARGO_BIN_EXE_domain-risk-gateway"))
        .args(["check-config", "--conf"])
        .arg(write_bad_config())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(text.contains("gateway.tracing.sample_ratio: 2"), "{text}");
}

fn write_bad_config() -> PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    std::fs::create_dir(dir.join("data")).unwrap();
    std::fs::write(dir.join("keys.yaml"), "keys: []\n").unwrap();
    let conf = dir.join("gateway.yaml");
    std::fs::write(
        &conf,
        "gateway:\n  data: { dir: data }\n  access: { keys_file: keys.yaml }\n  tracing: { otlp_endpoint: 'http://127.0.0.1:4318', sample_ratio: 2 }\n",
    )
    .unwrap();
    conf
}

#[test]
fn in_proxy_mode_the_backend_continues_the_trace_too() {
    let collector = Collector::start();
    let backend = Upstream::start(Duration::ZERO);
    let gw = traced(Gateway::builder(), &collector.url(), "")
        .upstream(backend.addr)
        .upstream_yaml("mode: proxy")
        .start();
    let r = gw
        .conn()
        .request(
            "GET",
            "/v1/check/example.org",
            &[("X-Request-Id", "proxied-1")],
        )
        .unwrap();
    assert_eq!(r.status, 200);
    let trace = logged_trace_id(&gw, "proxied-1");
    let mut spans = Vec::new();
    wait_until(Duration::from_secs(10), || {
        spans = collector.of_trace(&trace);
        spans.iter().any(|s| s["name"] == "upstream")
    });
    let upstream = named(&spans, "upstream");
    let traceparent = backend
        .requests()
        .iter()
        .flat_map(|r| r.headers.clone())
        .find(|(k, _)| k.eq_ignore_ascii_case("traceparent"))
        .map(|(_, v)| v)
        .expect("a traceparent upstream");
    let span_id = upstream["span_id"].as_str().unwrap();
    assert_eq!(traceparent, format!("00-{trace}-{span_id}-01"));
    assert_eq!(upstream["attributes"]["http.response.status_code"], 200);
}

/// A collector that answers 500 is left alone, 1 s, 2 s, 4 s ... after each failure: spans
/// are dropped (and counted) meanwhile instead of being encoded and sent batch after batch;
/// once it accepts again, spans reach it.
#[test]
fn a_failing_collector_is_backed_off_from_and_asked_again() {
    let collector = Collector::start();
    let control = |path: &str| {
        let addr = format!("127.0.0.1:{}", collector.port).parse().unwrap();
        let mut c = Conn::open(addr).unwrap();
        let r = c.request("POST", path, &[("Content-Length", "0")]).unwrap();
        assert_eq!(r.status, 200);
    };
    control("/fail?status=500");
    let gw = traced(Gateway::builder(), &collector.url(), "").start();
    let posts = || -> u64 {
        let addr = format!("127.0.0.1:{}", collector.port).parse().unwrap();
        let mut c = Conn::open(addr).unwrap();
        serde_json::from_slice(&c.get("/posts").unwrap().body).unwrap()
    };
    // 3 s of traffic, batches due every 100 ms (OTEL_BSP_SCHEDULE_DELAY): about 30 exports
    // without a backoff; with it, the first and those after 1 s and 2 s.
    let started = std::time::Instant::now();
    let mut c = gw.conn();
    let mut n = 0;
    while started.elapsed() < Duration::from_secs(3) {
        if n % 50 == 49 {
            c = gw.conn();
        }
        assert_eq!(c.get("/v1/public/domain/example.org").unwrap().status, 200);
        n += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let tried = posts();
    assert!(
        (1..=4).contains(&tried),
        "{tried} exports to a failing collector in 3 s"
    );
    assert!(gw.metric("drg_trace_spans_export_failed_total").unwrap() > 0.0);
    // Accepting again: after the backoff, the next spans reach it.
    control("/fail?status=0");
    wait_until(Duration::from_secs(20), || {
        assert_eq!(c.get("/v1/public/domain/example.org").unwrap().status, 200);
        std::thread::sleep(Duration::from_millis(50));
        gw.metric("drg_trace_spans_exported_total").unwrap_or(0.0) > 0.0
    });
}
