//! Crash safety of the embedded quota store: a gateway killed with SIGKILL (no shutdown code
//! runs, no final flush) loses no counted call; its successor on the same folder reads them all.

use crate::common;

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
