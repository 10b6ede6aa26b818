//! Quota alerts against the real binary and a real HTTP receiver on loopback: each threshold of
//! a project's month arrives once, signed (HMAC-SHA256 of the body), retried after a 500; across
//! two gateways on one Redis and a restart between the crossing and the delivery, still once.

mod common;
#[allow(dead_code)]
#[path = "common/redis_server.rs"]
mod redis_server;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use hmac::{Hmac, Mac};
use redis_server::RedisServer;
use sha2::Sha256;

const KEY: &str = "drg_alerts_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const LOOKUP: &str = "/v1/public/domain/example.org";
const SECRET: &str = "a-webhook-secret-of-some-length";

/// One request the receiver got, and what it answered.
#[derive(Debug, Clone)]
struct Delivery {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    answered: u16,
}

impl Delivery {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// A webhook receiver: answers each request with the next status of `script`, then 200.
struct Receiver {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Delivery>>>,
}

impl Receiver {
    fn start(addr: SocketAddr, script: Vec<u16>) -> Receiver {
        let listener = TcpListener::bind(addr).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Delivery>>> = Arc::default();
        let script = Arc::new(Mutex::new(script));
        let record = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (record, script) = (record.clone(), script.clone());
                std::thread::spawn(move || serve(stream, &record, &script));
            }
        });
        Receiver { addr, seen }
    }

    fn url(&self) -> String {
        format!("http://{}/hooks/drg", self.addr)
    }

    fn deliveries(&self) -> Vec<Delivery> {
        self.seen.lock().unwrap().clone()
    }

    /// Thresholds of the alerts answered 2xx, in arrival order.
    fn accepted(&self) -> Vec<u64> {
        self.deliveries()
            .iter()
            .filter(|d| d.answered == 200)
            .map(|d| d.json()["threshold"].as_u64().unwrap())
            .collect()
    }
}

fn serve(stream: std::net::TcpStream, record: &Mutex<Vec<Delivery>>, script: &Mutex<Vec<u16>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        assert!(line.starts_with("POST /hooks/drg HTTP/1.1"), "{line}");
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap();
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().unwrap())
            .expect("a Content-Length");
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
        let status = {
            let mut s = script.lock().unwrap();
            if s.is_empty() {
                200
            } else {
                s.remove(0)
            }
        };
        record.lock().unwrap().push(Delivery {
            headers,
            body,
            answered: status,
        });
        let reply = format!("HTTP/1.1 {status} X\r\ncontent-length: 2\r\n\r\nok");
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

fn signature_ok(d: &Delivery) -> bool {
    let Some(sig) = d
        .header("x-signature")
        .and_then(|s| s.strip_prefix("sha256="))
    else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(&d.body);
    mac.verify_slice(&hex::decode(sig).unwrap()).is_ok()
}

fn alerting(builder: GatewayBuilder, url: &str, limit: u64) -> GatewayBuilder {
    builder
        .plan_yaml("metered", &format!("{{ monthly_limit: {limit} }}"))
        .key_in_project("k", KEY, "metered", "acme")
        .quota_yaml(&format!(
            "alerts: {{ url: '{url}', secret_file: alert.secret, thresholds: [50, 100], timeout_ms: 1000 }}"
        ))
}

fn write_secret(dir: &tempfile::TempDir) {
    std::fs::write(dir.path().join("alert.secret"), format!("{SECRET}\n")).unwrap();
}

#[test]
fn each_threshold_arrives_once_signed_and_is_retried_after_a_500() {
    let receiver = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![500]);
    let dir = tempfile::tempdir().unwrap();
    write_secret(&dir);
    let gw = alerting(Gateway::builder(), &receiver.url(), 10)
        .in_dir(dir)
        .start();
    let mut c = gw.conn_as(Some(KEY));
    let statuses: Vec<u16> = (0..12).map(|_| c.get(LOOKUP).unwrap().status).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 10);
    wait_until(Duration::from_secs(20), || receiver.accepted().len() == 2);
    // Nothing more comes (every later call of the month is past both thresholds).
    std::thread::sleep(Duration::from_millis(2_500));
    let all = receiver.deliveries();
    assert_eq!(all.len(), 3, "one 500, then each alert once: {all:?}");
    let mut accepted = receiver.accepted();
    accepted.sort();
    assert_eq!(accepted, [50, 100]);
    assert!(all.iter().all(signature_ok), "signed: {all:?}");
    // The retried alert is the one that got the 500: same id, same bytes.
    let (first, retried) = (&all[0], all.iter().skip(1).find(|d| d.body == all[0].body));
    let retried = retried.expect("the refused alert again");
    assert_eq!(first.header("x-alert-id"), retried.header("x-alert-id"));
    assert_eq!(first.header("content-type"), Some("application/json"));
    let fifty = all
        .iter()
        .find(|d| d.json()["threshold"] == 50)
        .unwrap()
        .json();
    assert_eq!(fifty["project"], "acme");
    assert_eq!(fifty["plan"], "metered");
    assert_eq!(fifty["month_count"], 5);
    assert_eq!(fifty["monthly_limit"], 10);
    assert!(fifty["month"].as_str().unwrap().len() == 7, "{fifty}");
    assert!(fifty["at"].as_str().unwrap().ends_with('Z'), "{fifty}");
    assert_eq!(gw.metric("drg_quota_alerts_sent_total"), Some(2.0));
    assert_eq!(
        gw.metric("drg_quota_alerts_attempt_errors_total"),
        Some(1.0)
    );
    gw.wait_metric("drg_quota_alerts_pending", 0.0);
    assert!(!gw.log().contains(SECRET), "the secret is never logged");
}

#[test]
fn across_two_gateways_on_redis_and_a_restart_before_delivery_each_alert_arrives_once() {
    let redis = RedisServer::start(false);
    // The receiver is down while the thresholds are crossed.
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/hooks/drg");
    let start = |dir: tempfile::TempDir| {
        write_secret(&dir);
        alerting(Gateway::builder(), &url, 20)
            .redis(&redis.url(), "fail_open")
            .in_dir(dir)
            .start()
    };
    let a = start(tempfile::tempdir().unwrap());
    let b = start(tempfile::tempdir().unwrap());
    let counts = hammer(&[a.addr, b.addr], KEY, LOOKUP, 4, 7);
    assert_eq!(counts.get(&200), Some(&20), "{counts:?}");
    // Each threshold claimed by exactly one of them in Redis.
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    for t in [50, 100] {
        let key = format!("q:{{acme}}:{month}:alert:{t}");
        wait_until(Duration::from_secs(10), || {
            redis.int(&["EXISTS", &key]) == Some(1)
        });
    }
    wait_until(Duration::from_secs(10), || {
        a.metric("drg_quota_alerts_attempt_errors_total")
            .unwrap_or(0.0)
            + b.metric("drg_quota_alerts_attempt_errors_total")
                .unwrap_or(0.0)
            >= 2.0
    });
    // Both gateways restart with their alerts undelivered; then the receiver comes up.
    let (dir_a, dir_b) = (a.stop(), b.stop());
    let a = start(dir_a);
    let b = start(dir_b);
    let receiver = Receiver::start(format!("127.0.0.1:{port}").parse().unwrap(), vec![]);
    wait_until(Duration::from_secs(30), || receiver.accepted().len() >= 2);
    std::thread::sleep(Duration::from_millis(3_000));
    let mut accepted = receiver.accepted();
    accepted.sort();
    assert_eq!(accepted, [50, 100], "{:?}", receiver.deliveries());
    assert_eq!(receiver.deliveries().len(), 2);
    assert!(receiver.deliveries().iter().all(signature_ok));
    let sent = a.metric("drg_quota_alerts_sent_total").unwrap_or(0.0)
        + b.metric("drg_quota_alerts_sent_total").unwrap_or(0.0);
    assert_eq!(sent, 2.0);
    // Further calls (refused over the month) bring no new alert.
    assert_eq!(a.conn_as(Some(KEY)).get(LOOKUP).unwrap().status, 429);
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(receiver.deliveries().len(), 2);
}

#[test]
fn a_secret_too_short_or_missing_stops_the_start_with_a_clear_error() {
    for (secret, needle) in [
        (Some("short"), "at least 16 are needed"),
        (None, "No such file"),
    ] {
        let conf = write_config_with_alerts(secret);
        for args in [&["check-config"][..], &["serve"][..]] {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_domain-risk-gateway"))
                .args(args)
                .arg("--conf")
                .arg(&conf)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stderr).to_string()
                + &String::from_utf8_lossy(&out.stdout);
            assert!(!out.status.success(), "{args:?}: {text}");
            assert!(
                text.contains("gateway.quota.alerts.secret_file") && text.contains(needle),
                "{args:?}: {text}"
            );
        }
    }
}

/// A minimal config with alerts whose secret file holds `secret` (`None`: no file), in a folder
/// kept for the test's run.
fn write_config_with_alerts(secret: Option<&str>) -> std::path::PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    if let Some(secret) = secret {
        std::fs::write(dir.join("alert.secret"), secret).unwrap();
    }
    std::fs::create_dir(dir.join("data")).unwrap();
    std::fs::write(dir.join("keys.yaml"), "keys: []\n").unwrap();
    let conf = dir.join("gateway.yaml");
    std::fs::write(
        &conf,
        format!(
            "pid_file: {d}/pid\nupgrade_sock: {d}/upgrade.sock\ngateway:\n  listen: 127.0.0.1:{port}\n  admin: {{ listen: null }}\n  mx: {{ enabled: false }}\n  data: {{ dir: data }}\n  access:\n    keys_file: keys.yaml\n  quota:\n    state_file: state/quota.counters\n    alerts: {{ url: 'http://127.0.0.1:9/x', secret_file: alert.secret }}\n",
            d = dir.display(),
            port = free_port(),
        ),
    )
    .unwrap();
    conf
}
