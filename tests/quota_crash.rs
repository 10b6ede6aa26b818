//! Crash safety of the quota stores: a gateway killed with SIGKILL (no shutdown code runs, no
//! final flush) loses no counted call of the embedded store, its successor on the same folder
//! reads them all; and the Redis store's successor counts each call of an outage once, whatever
//! instant the kill came at.

use crate::common;
use crate::redis_server::{carried_calls, carried_files, RedisServer};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{hammer, Conn, Gateway, TEST_SECRET};

const LOOKUP: &str = "/v1/public/domain/example.com";
const CLIENTS: usize = 4;

/// SIGKILL: the process gets no chance to flush anything. Hands back its folder.
fn kill_hard(mut gw: Gateway) -> tempfile::TempDir {
    gw.signal("KILL");
    assert!(
        gw.wait_exit(Duration::from_secs(15)),
        "the gateway survived SIGKILL"
    );
    std::mem::replace(&mut gw.dir, tempfile::tempdir().unwrap())
}

/// The month's count the gateway on `dir` reports for the test key, after a fresh start.
fn count_after_restart(dir: tempfile::TempDir) -> (u64, Gateway) {
    let gw = Gateway::builder().in_dir(dir).start();
    let usage = gw.get("/v1/usage");
    assert_eq!(usage.status, 200, "{}", gw.log());
    let count = usage.json()["month_count"].as_u64().unwrap();
    (count, gw)
}

#[test]
fn a_killed_gateway_loses_no_count_made_before_it_died() {
    let gw = Gateway::builder().start();
    let statuses = hammer(&[gw.addr], TEST_SECRET, LOOKUP, CLIENTS, 300);
    let seen = statuses.get(&200).copied().unwrap_or(0) as u64;
    assert_eq!(seen, (CLIENTS * 300) as u64, "{statuses:?}");
    // Right after the last answer: well within one flush interval, so only counts the kernel
    // kept for the dead process can make the number.
    let (count, gw) = count_after_restart(kill_hard(gw));
    assert_eq!(count, seen, "{}", gw.log());
}

#[test]
fn a_gateway_killed_under_load_loses_no_answered_count() {
    let gw = Gateway::builder().start();
    let seen = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (addr, seen, stop) = (gw.addr, seen.clone(), stop.clone());
            thread::spawn(move || {
                let mut c = Conn::open_as(addr, Some(TEST_SECRET)).unwrap();
                // Each client has one request in flight at most; it stops at the first one
                // the dead gateway cannot answer.
                while !stop.load(Ordering::Relaxed) {
                    match c.get(LOOKUP) {
                        Ok(r) => {
                            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                            seen.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => return,
                    }
                }
            })
        })
        .collect();
    common::wait_until(Duration::from_secs(60), || {
        seen.load(Ordering::Relaxed) >= 2_000
    });
    let dir = kill_hard(gw);
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let seen = seen.load(Ordering::Relaxed);
    let (count, gw) = count_after_restart(dir);
    eprintln!("killed under load: {seen} answers seen, {count} calls counted");
    // Every answered call was counted before its answer was sent. A call counted whose answer
    // the kill cut off is counted but not seen: at most one per client.
    assert!(
        (seen..=seen + CLIENTS as u64).contains(&count),
        "seen {seen} answers, counted {count}:\n{}",
        gw.log()
    );
}

const SHARED_SECRET: &str = "drg_shared_key_cccccccccccccccccccccccccccccccccccc";
const SHARED_LOOKUP: &str = "/v1/public/domain/example.org";

/// Calls counted while Redis was away are carried to Redis by the next sync. The carried-calls
/// file used to name them as calls never sent until the write after the carry: a `kill -9` in
/// between left them to the next gateway, which sent them again (100 calls read 201 in an
/// outside review). The carry is now named in the file, under its id, before it leaves; the sync
/// is held here after Redis applied it and before the file is written again, and killed there.
#[test]
fn a_gateway_killed_while_its_outage_calls_reach_redis_counts_each_once() {
    let mut redis = RedisServer::start(true);
    let url = redis.url();
    let builder = || {
        Gateway::builder()
            .plan("shared", 100_000)
            .key("k", SHARED_SECRET, "shared", &[])
            .redis(&url, "fail_open")
    };
    let mut gw = builder()
        .env(drg_gateway::server::CARRY_PAUSE_ENV, "5000")
        .start();
    let mut conn = gw.conn_as(Some(SHARED_SECRET));
    for _ in 0..20 {
        assert_eq!(conn.get(SHARED_LOOKUP).unwrap().status, 200);
    }
    redis.kill();
    let mut conn = gw.conn_as(Some(SHARED_SECRET));
    for _ in 0..100 {
        assert_eq!(conn.get(SHARED_LOOKUP).unwrap().status, 200);
    }
    let state = gw.dir.path().join("state");
    // Generous: a sync round already in its 5 s pause writes the file after it. (Once, in CI
    // beside four other tests, 30 s passed without it: what the file held is told.)
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    // The 100 are named either as never sent or, once a sync tried Redis while it was down, as
    // a batch whose reply never came (a CI run waited 30 s for the first form while the file
    // held the second).
    while carried_calls(&state) != 100 {
        assert!(
            std::time::Instant::now() < deadline,
            "the outage's 100 calls never named in the carried file, which holds {:?}:\n{}",
            carried_files(&state),
            gw.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let month = format!("q:{{k}}:{}", chrono::Utc::now().format("%Y-%m"));
    redis.restart();
    // The sync sent the 100 calls and holds for 5 s before it writes the file again.
    common::wait_until(Duration::from_secs(20), || {
        redis.int(&["GET", &month]) == Some(120)
    });
    gw.signal("KILL");
    assert!(gw.wait_exit(Duration::from_secs(15)));
    let dir = std::mem::replace(&mut gw.dir, tempfile::tempdir().unwrap());
    let next = builder().in_dir(dir).start();
    // The next gateway adopts the file and settles what it names.
    common::wait_until(Duration::from_secs(20), || {
        let held = carried_files(&state);
        !held.contains("calls") && !held.contains("unsure")
    });
    assert_eq!(
        redis.int(&["GET", &month]),
        Some(120),
        "120 calls served:\n{}",
        next.log()
    );
    let usage = next.conn_as(Some(SHARED_SECRET)).get("/v1/usage").unwrap();
    assert_eq!(usage.json()["month_count"], 120, "{}", next.log());
}
