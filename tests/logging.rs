//! Logging under a flood of broken requests: client-caused error lines are rate-limited and
//! summed up in one summary line a second, and the gateway keeps answering.

use crate::common;
use common::*;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const SUMMARY: &str = "suppressed ";

/// Opens `connections` connections from 4 threads, each sending half a request header (or, one
/// in four, garbage) and closing at once; gives up after `within`. Returns how many were sent.
fn flood(addr: SocketAddr, connections: usize, within: Duration) -> usize {
    let next = AtomicUsize::new(0);
    let sent = AtomicUsize::new(0);
    let deadline = Instant::now() + within;
    thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= connections || Instant::now() > deadline {
                    break;
                }
                let Ok(mut c) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
                    continue;
                };
                let bytes: &[u8] = if i % 4 == 3 {
                    b"\x16\x03\x01\x00\xa5garbage\x00\r\n\r\n"
                } else {
                    b"GET /v1/domain/example.com HTTP/1.1\r\nHost: gw\r\nX-Half: "
                };
                if c.write_all(bytes).is_ok() {
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    sent.into_inner()
}

/// The counts in the summary lines of `log`.
fn suppressed_counts(log: &str) -> Vec<u64> {
    log.lines()
        .filter_map(|l| l.split_once(SUMMARY))
        .filter_map(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .collect()
}

/// Lines written by the flood other than summaries: Pingora's downstream errors that got through.
fn client_error_lines(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("downstream") || l.contains("Downstream"))
        .filter(|l| !l.contains(SUMMARY))
        .count()
}

#[test]
fn a_flood_of_half_sent_requests_writes_a_bounded_log_with_a_count() {
    let gw = Gateway::builder().start();
    let before = gw.log();
    let started = Instant::now();
    let sent = flood(gw.addr, 3_000, Duration::from_secs(60));
    assert!(sent >= 1_000, "only {sent} connections got their bytes out");

    // Three in four connections cause a client error (the garbage ones get their 400); all of
    // them are either written or counted in a summary line within a second or two.
    let accounted = |log: &str| {
        let grown = &log[before.len()..];
        client_error_lines(grown) as u64 + suppressed_counts(grown).iter().sum::<u64>()
    };
    wait_until(Duration::from_secs(10), || {
        accounted(&gw.log()) >= sent as u64 / 2
    });
    let r = gw.conn_as(None).get("/healthz").unwrap();
    assert_eq!(
        r.status, 200,
        "the gateway must still answer after the flood"
    );

    let after = gw.log();
    let grown = &after[before.len()..];
    let lines = grown.lines().count();
    let suppressed: u64 = suppressed_counts(grown).iter().sum();
    assert!(suppressed > 0, "no summary line with a count:\n{grown}");
    // A burst of 20 and 5 lines a second, plus a summary a second, for the one category this
    // flood hits: under 100 lines if it lasts a few seconds, and never one line per request.
    let seconds = started.elapsed().as_secs();
    let bound = 100 + 6 * seconds as usize;
    eprintln!(
        "{sent} broken connections in {seconds}s: log grew {} bytes / {lines} lines \
         ({} client-error lines written, {suppressed} suppressed)",
        grown.len(),
        client_error_lines(grown),
    );
    assert!(
        lines < bound,
        "the log grew by {lines} lines (bound {bound}) for {sent} broken requests:\n{grown}"
    );
}

#[test]
fn a_rate_of_zero_writes_only_summaries() {
    let gw = Gateway::builder()
        .env("DOMAIN_RISK_GATEWAY_LOG_CLIENT_RATE", "0")
        .start();
    let before = gw.log().len();
    let sent = flood(gw.addr, 200, Duration::from_secs(30));
    wait_until(Duration::from_secs(10), || {
        suppressed_counts(&gw.log()[before..]).iter().sum::<u64>() >= sent as u64 / 2
    });
    let log = gw.log();
    assert_eq!(client_error_lines(&log[before..]), 0, "{}", &log[before..]);
    assert_eq!(gw.conn_as(None).get("/healthz").unwrap().status, 200);
}

#[test]
fn a_bad_limit_in_the_environment_is_refused() {
    let out = crate::common::command(BIN)
        .args(["-c", "/nonexistent/gateway.yaml", "check-config"])
        .env("DOMAIN_RISK_GATEWAY_LOG_CLIENT_BURST", "lots")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("DOMAIN_RISK_GATEWAY_LOG_CLIENT_BURST") && stderr.contains("lots"),
        "{stderr}"
    );
}
