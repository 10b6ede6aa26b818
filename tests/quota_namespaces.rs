//! Two gateways on one state folder, each in a pid namespace of its own (two containers on one
//! volume: both are pid 1), through a 12 s Redis outage (over a hundred sync cycles of each) and
//! a `kill -9` at a random point:
//! every served call is counted once, and the folder keeps no more carried-calls files than
//! there are gateways. With files owned by pid, each took the other's live file for a previous
//! incarnation's and adopted it, over and over (110 calls became 265 million in Redis).

use crate::common;
use crate::redis_server;

use common::*;
use redis_server::RedisServer;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const SECRET: &str = "drg_shared_key_nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn";
const LOOKUP: &str = "/v1/public/domain/example.org";
const OUTAGE: Duration = Duration::from_secs(12);

/// `serve` as pid 1 of a new pid namespace (`unshare --pid --fork`; `--kill-child`: the
/// gateway dies with it). Root may make one; anyone else maps itself to root in a user
/// namespace first.
fn in_pid_namespace(conf: &str, listen: &str) -> Command {
    let mut command = Command::new("unshare");
    // SAFETY: geteuid(2) only reads the caller's id.
    if unsafe { libc::geteuid() } != 0 {
        command.arg("--map-root-user");
    }
    command.args([
        "--pid",
        "--fork",
        "--kill-child",
        BIN,
        "-c",
        conf,
        "serve",
        "--listen",
        listen,
    ]);
    command
}

fn gateway(redis: &RedisServer, state: &Path) -> Gateway {
    let gw = Gateway::builder()
        .plan("shared", 1_000_000)
        .key("k", SECRET, "shared", &[])
        .quota_section(&format!(
            "quota: {{ store: redis, state_file: {}/quota.counters, redis: {{ url: \"{}\", \
             failure_policy: fail_open, call_timeout_ms: 300, connect_timeout_ms: 300, \
             breaker_open_ms: 300, reconcile_interval_ms: 100 }} }}",
            state.display(),
            redis.url()
        ))
        .start_with(in_pid_namespace);
    let inner = descendants(gw.pid());
    assert_eq!(inner.len(), 1, "unshare runs the gateway as its one child");
    let status = std::fs::read_to_string(format!("/proc/{}/status", inner[0])).unwrap();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert!(
        nspid.ends_with("\t1"),
        "the gateway is pid 1 inside: {nspid}"
    );
    gw
}

fn month_key() -> String {
    format!("q:{{k}}:{}", chrono::Utc::now().format("%Y-%m"))
}

/// The carried-calls files in `state`, and the calls they hold all together.
fn carried(state: &Path) -> (usize, u64) {
    let mut files = 0;
    let mut calls = 0;
    for entry in std::fs::read_dir(state).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("quota.carried.") && !name.starts_with("quota.redis-carried.") {
            continue;
        }
        files += 1;
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let body: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        // This release's `{"entries": [...]}`, or earlier releases' bare list.
        let entries = body.get("entries").unwrap_or(&body);
        for e in entries.as_array().into_iter().flatten() {
            calls += e["calls"].as_u64().unwrap_or(0);
            for u in e["unsure"].as_array().into_iter().flatten() {
                calls += u[1].as_u64().unwrap_or(0);
            }
        }
    }
    (files, calls)
}

/// One lookup on `gw`; whether it was answered 200 (each such answer is one call served).
fn served(gw: &Gateway) -> bool {
    gw.conn_as(Some(SECRET))
        .get(LOOKUP)
        .is_ok_and(|r| r.status == 200)
}

/// Kills the gateway itself (not `unshare`) with SIGKILL: no shutdown code runs.
fn kill_hard(mut gw: Gateway) {
    for pid in descendants(gw.pid()) {
        send_signal(pid, "KILL");
    }
    assert!(gw.wait_exit(Duration::from_secs(15)));
}

#[test]
fn two_gateways_in_their_own_pid_namespaces_count_each_call_once_through_an_outage() {
    let mut redis = RedisServer::start(true);
    let state = tempfile::tempdir().unwrap();
    let mut a = gateway(&redis, state.path());
    let b = gateway(&redis, state.path());
    let mut total = 0u64;
    for gw in [&a, &b].into_iter().cycle().take(40) {
        assert!(served(gw));
        total += 1;
    }
    assert_eq!(redis.int(&["GET", &month_key()]), Some(40));
    redis.kill();
    let outage = Instant::now();
    // A random point of the outage's first half, and of A's sync cycle, for the kill.
    let kill_at = OUTAGE / 4 + Duration::from_millis(rand_below(OUTAGE.as_millis() as u64 / 4));
    let mut killed = false;
    let mut during = 0u64;
    while outage.elapsed() < OUTAGE {
        if !killed && outage.elapsed() >= kill_at {
            // Every call served so far is in a file (a kill loses at most the calls of the
            // last sync interval: this test is about adopting them, not that window).
            wait_until(Duration::from_secs(10), || {
                carried(state.path()).1 == during
            });
            std::thread::sleep(Duration::from_millis(rand_below(300)));
            kill_hard(a);
            // Restarted as pid 1 again, on the same folder, with B alive beside it.
            a = gateway(&redis, state.path());
            killed = true;
        }
        for gw in [&a, &b] {
            if served(gw) {
                during += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    total += during;
    assert!(
        during > 100,
        "calls were served during the outage: {during}"
    );
    // While Redis is away the files hold the outage's calls, each once, in at most two files.
    wait_until(Duration::from_secs(10), || {
        carried(state.path()).1 == during
    });
    assert!(carried(state.path()).0 <= 2, "{:?}", carried(state.path()));
    redis.restart();
    wait_until(Duration::from_secs(20), || {
        redis.int(&["GET", &month_key()]) == Some(total as i64)
    });
    // And stays there: nothing is adopted twice after the fact.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(redis.int(&["GET", &month_key()]), Some(total as i64));
    wait_until(Duration::from_secs(10), || carried(state.path()).1 == 0);
    let (files, _) = carried(state.path());
    assert!(files <= 2, "{files} carried-calls files for 2 gateways");
    for gw in [&a, &b] {
        let usage = gw.conn_as(Some(SECRET)).get("/v1/usage").unwrap().json();
        assert_eq!(usage["month_count"], total, "{usage}");
    }
}

/// A number below `n` that differs from run to run.
fn rand_below(n: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    u64::from(nanos) % n.max(1)
}
