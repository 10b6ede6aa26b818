//! The shared quota on a real `redis-server`: one count across gateways, outages (fail open and
//! fail closed), replies that come after the call gave up (a paused Redis), persistence across a
//! Redis restart, month rollover and key expiry; a Redis that may evict (its `maxmemory-policy`
//! not `noeviction`) said so in the log, the metrics and readiness.

use crate::common;
use crate::redis_server;

use common::*;
use redis_server::{carried_calls, carried_files, RedisServer};
use std::time::Duration;

const SECRET: &str = "drg_shared_key_dddddddddddddddddddddddddddddddddddd";
const LOOKUP: &str = "/v1/public/domain/example.org";

fn gateway(redis: &RedisServer, policy: &str, limit: u64) -> Gateway {
    Gateway::builder()
        .plan("shared", limit)
        .key("k", SECRET, "shared", &[])
        .redis(&redis.url(), policy)
        .start()
}

fn month_key() -> String {
    format!("q:{{k}}:{}", chrono::Utc::now().format("%Y-%m"))
}

fn status(gw: &Gateway, path: &str) -> u16 {
    gw.conn_as(Some(SECRET)).get(path).unwrap().status
}

fn readyz_quota(gw: &Gateway) -> serde_json::Value {
    gw.admin_get("/readyz").json()["quota"].clone()
}

/// `t` of the `RateLimit` header: seconds until the quota resets.
fn seconds_to_reset(r: &Response) -> u64 {
    let h = r.header("ratelimit").expect("RateLimit header");
    h.split(";t=").nth(1).unwrap().parse().unwrap()
}

#[test]
fn two_gateways_share_one_exact_count() {
    let redis = RedisServer::start(false);
    let gws = [
        gateway(&redis, "fail_open", 300),
        gateway(&redis, "fail_open", 300),
    ];
    let addrs: Vec<_> = gws.iter().map(|g| g.addr).collect();
    let counts = hammer(&addrs, SECRET, LOOKUP, 64, 8);
    assert_eq!(counts, [(200, 300), (429, 512 - 300)].into());
    assert_eq!(redis.int(&["GET", &month_key()]), Some(300));
    // Each counted call leaves a marker of its id, dropped by the next call of its gateway: what
    // remains is about the calls in flight at the end, not the 300 made.
    let keys = redis.int(&["DBSIZE"]).unwrap();
    assert!((1..=1 + 2 * 64).contains(&keys), "{keys} keys");
    for gw in &gws {
        let u = gw.conn_as(Some(SECRET)).get("/v1/usage").unwrap().json();
        assert_eq!(u["used"], 300);
        assert_eq!(readyz_quota(gw)["connected"], true);
    }
}

#[test]
fn batched_counting_never_overshoots_and_settles_to_the_exact_count() {
    let redis = RedisServer::start(false);
    let batched = |r: &RedisServer| {
        Gateway::builder()
            .plan("shared", 300)
            .key("k", SECRET, "shared", &[])
            .redis_with(&r.url(), "fail_open", "sync_interval_ms: 50, batch_max: 10")
            .start()
    };
    let gws = [batched(&redis), batched(&redis)];
    let addrs: Vec<_> = gws.iter().map(|g| g.addr).collect();
    let counts = hammer(&addrs, SECRET, LOOKUP, 32, 16);
    let ok = counts.get(&200).copied().unwrap_or(0);
    assert_eq!(
        ok + counts.get(&429).copied().unwrap_or(0),
        512,
        "{counts:?}"
    );
    // Leases are counted before use: never over the limit; unused leases can refuse up to
    // gateways x 1.5 x batch_max = 30 calls early until they are given back (the hammer's
    // calls past the limit use them up here).
    assert!((280..=300).contains(&ok), "{ok} successes");
    // Once the unused leases are returned, Redis holds exactly the admitted calls.
    wait_until(Duration::from_secs(10), || {
        redis.int(&["GET", &month_key()]) == Some(ok as i64)
    });
    // And the freed calls can be used: the key reaches its limit exactly.
    let mut c = gws[0].conn_as(Some(SECRET));
    let more = (0..40)
        .filter(|_| c.get(LOOKUP).unwrap().status == 200)
        .count();
    assert_eq!(ok + more, 300);
}

#[test]
fn an_outage_fails_open_and_loses_no_count() {
    let mut redis = RedisServer::start(true);
    let gw = gateway(&redis, "fail_open", 100_000);
    for _ in 0..20 {
        assert_eq!(status(&gw, LOOKUP), 200);
    }
    redis.kill();
    let mut conn = gw.conn_as(Some(SECRET));
    for _ in 0..30 {
        assert_eq!(conn.get(LOOKUP).unwrap().status, 200);
    }
    // Every call was let through on the fail-open path and counted locally, to be added later;
    // the breaker opened (and then skips Redis instead of trying it for every call).
    let q = readyz_quota(&gw);
    assert_eq!(q["connected"], false, "{q}");
    assert_eq!(q["pending_local_counts"], 30, "{q}");
    assert!(gw.log().contains("circuit breaker open"), "{}", gw.log());

    redis.restart();
    wait_until(Duration::from_secs(5), || {
        readyz_quota(&gw)["pending_local_counts"] == 0
    });
    assert_eq!(
        redis.int(&["GET", &month_key()]),
        Some(50),
        "every call counted once"
    );
    assert_eq!(status(&gw, LOOKUP), 200);
    assert_eq!(redis.int(&["GET", &month_key()]), Some(51));
    assert_eq!(readyz_quota(&gw)["connected"], true);
}

#[test]
fn fail_closed_answers_503_during_an_outage_then_recovers() {
    let mut redis = RedisServer::start(false);
    let gw = gateway(&redis, "fail_closed", 1_000);
    assert_eq!(status(&gw, LOOKUP), 200);
    redis.kill();
    for _ in 0..5 {
        let r = gw.conn_as(Some(SECRET)).get(LOOKUP).unwrap();
        r.assert_error(503, "service_unavailable");
    }
    // Uncounted routes still work.
    assert_eq!(gw.conn_as(None).get("/healthz").unwrap().status, 200);
    redis.restart();
    wait_until(Duration::from_secs(5), || status(&gw, LOOKUP) == 200);
    // A few quick calls after recovery: no 5xx storm.
    for _ in 0..20 {
        assert_eq!(status(&gw, LOOKUP), 200);
    }
}

#[test]
fn counts_survive_a_redis_restart_with_aof() {
    let mut redis = RedisServer::start(true);
    let gw = gateway(&redis, "fail_open", 1_000);
    for _ in 0..7 {
        assert_eq!(status(&gw, LOOKUP), 200);
    }
    redis.restart();
    let data: Vec<String> = redis
        .data_dir()
        .read_dir()
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        data.iter().any(|name| name.starts_with("appendonly")),
        "no AOF written: {data:?}"
    );
    assert_eq!(redis.int(&["GET", &month_key()]), Some(7));
    wait_until(Duration::from_secs(5), || {
        gw.conn_as(Some(SECRET)).get("/v1/usage").unwrap().json()["used"] == 7
    });
}

#[test]
fn a_new_month_uses_a_new_key_and_old_keys_expire() {
    let redis = RedisServer::start(false);
    // The gateway's clock starts at 23:59:50 when the process starts: January has 10 s left,
    // plenty for its start-up and the calls below, which therefore always run in January.
    let gw = Gateway::builder()
        .plan("two", 2)
        .key("k", SECRET, "two", &[])
        .redis(&redis.url(), "fail_open")
        .env("DOMAIN_RISK_GATEWAY_CLOCK_START", "2026-01-31T23:59:50Z")
        .start();
    let mut c = gw.conn_as(Some(SECRET));
    assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    let second = c.get(LOOKUP).unwrap();
    assert_eq!(second.status, 200);
    let left = seconds_to_reset(&second);
    assert!(
        left >= 2,
        "only {left} s of January left after two calls: start-up took over 8 s"
    );
    let r = c.get(LOOKUP).unwrap();
    r.assert_error(429, "quota_exceeded");
    assert_eq!(r.json()["reset_at"], "2026-02-01T00:00:00Z");
    assert_eq!(redis.int(&["GET", "q:{k}:2026-01"]), Some(2));
    // The January key lives until a day after January ends, by the gateway's clock.
    let ttl = redis.int(&["TTL", "q:{k}:2026-01"]).unwrap();
    assert!((86_400..=86_401 + left as i64).contains(&ttl), "{ttl}");
    // Past midnight UTC on the 1st of February, per the injected clock.
    wait_until(Duration::from_secs(15), || {
        c.get(LOOKUP).unwrap().status == 200
    });
    assert_eq!(redis.int(&["GET", "q:{k}:2026-02"]), Some(1));
    let u = gw.conn_as(Some(SECRET)).get("/v1/usage").unwrap().json();
    assert_eq!(u["used"], 1);
    assert_eq!(u["reset_at"], "2026-03-01T00:00:00Z");
}

#[test]
fn the_gateway_starts_and_serves_while_redis_is_down() {
    let mut redis = RedisServer::start(false);
    redis.kill();
    let gw = gateway(&redis, "fail_open", 1_000);
    assert_eq!(status(&gw, LOOKUP), 200);
    assert_eq!(readyz_quota(&gw)["connected"], false);
    redis.restart();
    wait_until(Duration::from_secs(5), || {
        readyz_quota(&gw)["pending_local_counts"] == 0
    });
    assert_eq!(redis.int(&["GET", &month_key()]), Some(1));
}

/// Waits until the gateway has reported a Redis call that timed out.
fn wait_for_a_timeout(gw: &Gateway) {
    wait_until(Duration::from_secs(5), || {
        gw.log().contains("Redis call failed (timed out)")
    });
}

/// Waits until the gateway has settled a call whose script ran after it had given up on it.
fn wait_until_settled(gw: &Gateway) {
    wait_until(Duration::from_secs(10), || {
        gw.log().contains("had reached Redis after all")
    });
    wait_until(Duration::from_secs(5), || {
        readyz_quota(gw)["pending_local_counts"] == 0
    });
}

#[test]
fn a_call_whose_reply_came_too_late_is_counted_once() {
    let redis = RedisServer::start(false);
    let gw = gateway(&redis, "fail_open", 1_000);
    let mut c = gw.conn_as(Some(SECRET));
    for _ in 0..5 {
        assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    }
    // The script reaches the paused Redis and waits in its socket; the gateway gives up after its
    // budget and, failing open, serves and counts the call locally.
    redis.pause();
    assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    wait_for_a_timeout(&gw);
    assert_eq!(readyz_quota(&gw)["pending_local_counts"], 1);
    // Redis runs the script after all (its reply goes nowhere); the local count is then sent
    // under the call's id, which Redis has seen: it adds nothing more.
    redis.resume();
    wait_until_settled(&gw);
    assert_eq!(redis.int(&["GET", &month_key()]), Some(6), "6 calls made");
    assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    assert_eq!(redis.int(&["GET", &month_key()]), Some(7));
}

#[test]
fn a_call_refused_while_redis_stalled_is_not_counted_when_its_script_runs_late() {
    let redis = RedisServer::start(false);
    let gw = gateway(&redis, "fail_closed", 1_000);
    let mut c = gw.conn_as(Some(SECRET));
    for _ in 0..3 {
        assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    }
    redis.pause();
    c.get(LOOKUP)
        .unwrap()
        .assert_error(503, "service_unavailable");
    wait_for_a_timeout(&gw);
    // The refused call's script runs when Redis resumes; its id then takes its count back.
    redis.resume();
    wait_until_settled(&gw);
    assert_eq!(redis.int(&["GET", &month_key()]), Some(3), "3 calls served");
}

#[test]
fn a_lease_granted_after_its_request_gave_up_is_taken_back() {
    let redis = RedisServer::start(false);
    let gw = Gateway::builder()
        .plan("shared", 1_000)
        .key("k", SECRET, "shared", &[])
        .redis_with(
            &redis.url(),
            "fail_open",
            "sync_interval_ms: 50, batch_max: 10",
        )
        .start();
    let mut c = gw.conn_as(Some(SECRET));
    for _ in 0..3 {
        assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    }
    // The unused part of the lease goes back: the next call asks for a new lease.
    wait_until(Duration::from_secs(5), || {
        redis.int(&["GET", &month_key()]) == Some(3)
    });
    redis.pause();
    assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    wait_for_a_timeout(&gw);
    // Redis grants the 10 calls after the gateway gave up, which never learns of them: settling
    // the request's id takes them back, and the served call is counted once.
    redis.resume();
    wait_until_settled(&gw);
    assert_eq!(redis.int(&["GET", &month_key()]), Some(4), "4 calls made");
}

#[test]
fn counts_added_after_an_outage_expire_by_the_gateway_clock() {
    let mut redis = RedisServer::start(false);
    redis.kill();
    // Far from the real date, so the real clock would give the key years to live.
    let gw = Gateway::builder()
        .plan("shared", 1_000)
        .key("k", SECRET, "shared", &[])
        .redis(&redis.url(), "fail_open")
        .env("DOMAIN_RISK_GATEWAY_CLOCK_START", "2030-06-15T00:00:00Z")
        .start();
    assert_eq!(status(&gw, LOOKUP), 200);
    redis.restart();
    wait_until(Duration::from_secs(5), || {
        readyz_quota(&gw)["pending_local_counts"] == 0
    });
    assert_eq!(redis.int(&["GET", "q:{k}:2030-06"]), Some(1));
    // Written by the background sync: the rest of June by the gateway's clock, plus a day.
    let ttl = redis.int(&["TTL", "q:{k}:2030-06"]).unwrap();
    assert!(
        (17 * 86_400 - 60..=17 * 86_400).contains(&ttl),
        "TTL {ttl} s"
    );
}

#[test]
fn a_count_under_the_untagged_name_of_older_releases_carries_over() {
    let redis = RedisServer::start(false);
    // What a gateway before cluster support left: this month's count without the hash tag.
    let legacy = format!("q:k:{}", chrono::Utc::now().format("%Y-%m"));
    assert_eq!(redis.int(&["INCRBY", &legacy, "5"]), Some(5));
    let gw = gateway(&redis, "fail_open", 1_000);
    let u = gw.conn_as(Some(SECRET)).get("/v1/usage").unwrap().json();
    assert_eq!(u["used"], 5, "read before the first call");
    assert_eq!(status(&gw, LOOKUP), 200);
    assert_eq!(redis.int(&["GET", &month_key()]), Some(6));
    assert_eq!(redis.int(&["EXISTS", &legacy]), Some(0), "adopted once");
    let ttl = redis.int(&["TTL", &month_key()]).unwrap();
    assert!(
        ttl > 86_400,
        "the adopted count expires after its month: TTL {ttl}"
    );
    assert_eq!(status(&gw, LOOKUP), 200);
    assert_eq!(redis.int(&["GET", &month_key()]), Some(7));
}

/// A Redis whose `maxmemory-policy` evicts would drop API-made keys and month counts without a
/// word under memory pressure: the gateway says so (WARN, `drg_quota_store_noeviction 0`, the
/// policy in the admin `/readyz`), and with `on_eviction_policy: unready` is not ready until
/// Redis is set to `noeviction`.
#[test]
fn a_redis_that_may_evict_is_reported_and_can_keep_the_gateway_unready() {
    let redis = RedisServer::start_with(
        false,
        vec!["--maxmemory-policy".into(), "allkeys-lru".into()],
        false,
    );
    let warned = gateway(&redis, "fail_open", 100);
    warned.wait_metric("drg_quota_store_noeviction", 0.0);
    assert_eq!(readyz_quota(&warned)["eviction_policy"], "allkeys-lru");
    assert_eq!(status(&warned, "/readyz"), 200, "warn: still ready");
    assert!(
        warned.log().contains("maxmemory-policy is allkeys-lru"),
        "{}",
        warned.log()
    );
    let strict = Gateway::builder()
        .plan("shared", 100)
        .key("k", SECRET, "shared", &[])
        .redis_with(&redis.url(), "fail_open", "on_eviction_policy: unready")
        .start();
    strict.wait_metric("drg_quota_store_noeviction", 0.0);
    let r = strict.get("/readyz");
    assert_eq!(
        (r.status, r.json()["status"].clone()),
        (503, "quota_store_evicts".into())
    );
    assert_eq!(
        strict.admin_get("/readyz").json()["status"],
        "quota_store_evicts"
    );
    // Lookups are still answered (fail open): readiness only steers new traffic away.
    assert_eq!(status(&strict, LOOKUP), 200);
    let mut c = redis.client().get_connection().unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .query(&mut c)
        .unwrap();
    strict.wait_metric("drg_quota_store_noeviction", 1.0);
    wait_until(Duration::from_secs(5), || {
        strict.get("/readyz").status == 200
    });
    assert!(strict.log().contains("maxmemory-policy is noeviction"));
}

/// Calls counted while Redis was away used to live only in the gateway's memory: a restart (or
/// `kill -9`) in the outage lost them, and usage read low for the month. Now they are kept in
/// the state folder at each sync and the next gateway on it sends them, once each.
#[test]
fn calls_counted_during_an_outage_survive_a_restart_and_a_kill() {
    let mut redis = RedisServer::start(true);
    let url = redis.url();
    let builder = || {
        Gateway::builder()
            .plan("shared", 100_000)
            .key("k", SECRET, "shared", &[])
            .redis(&url, "fail_open")
    };
    let gw = builder().start();
    for _ in 0..20 {
        assert_eq!(status(&gw, LOOKUP), 200);
    }
    redis.kill();
    let mut conn = gw.conn_as(Some(SECRET));
    for _ in 0..30 {
        assert_eq!(conn.get(LOOKUP).unwrap().status, 200);
    }
    // Kept within a sync (100 ms here): then SIGKILL, no shutdown code runs.
    let state = gw.dir.path().join("state");
    let carried = || carried_files(&state);
    // Never sent, or sent to the dead Redis under an id: either way named (carried_calls).
    wait_until(Duration::from_secs(5), || carried_calls(&state) == 30);
    let mut gw = gw;
    gw.signal("KILL");
    assert!(gw.wait_exit(Duration::from_secs(15)));
    let dir = std::mem::replace(&mut gw.dir, tempfile::tempdir().unwrap());
    redis.restart();
    let next = builder().in_dir(dir).start();
    wait_until(Duration::from_secs(10), || {
        redis.int(&["GET", &month_key()]) == Some(50)
    });
    wait_until(Duration::from_secs(5), || {
        carried().is_empty() || !carried().contains("calls")
    });
    assert!(
        next.log().contains("not yet in Redis are sent"),
        "{}",
        next.log()
    );
    // Once each: nothing more arrives.
    assert_eq!(status(&next, LOOKUP), 200);
    assert_eq!(redis.int(&["GET", &month_key()]), Some(51));
}

/// A gateway killed (`kill -9`) while holding a lease: Redis counts the whole lease, and the
/// part never served used to stay counted for the rest of the month (45 of 50 here). The lease's
/// unused part is kept in the carried-calls file with every sync, and the next gateway on that
/// state folder gives it back.
#[test]
fn a_killed_gateways_unused_lease_is_given_back_by_the_next() {
    let redis = RedisServer::start(false);
    let url = redis.url();
    let builder = || {
        Gateway::builder()
            .plan("shared", 100_000)
            .key("k", SECRET, "shared", &[])
            // Leases kept (not given back on a timer) for the whole test.
            .redis_with(&url, "fail_open", "sync_interval_ms: 60000, batch_max: 50")
    };
    let mut gw = builder().start();
    for _ in 0..5 {
        assert_eq!(status(&gw, LOOKUP), 200);
    }
    assert_eq!(
        redis.int(&["GET", &month_key()]),
        Some(50),
        "one lease of 50"
    );
    let state = gw.dir.path().join("state");
    wait_until(Duration::from_secs(5), || {
        carried_files(&state).contains("\"returned\":45")
    });
    gw.signal("KILL");
    assert!(gw.wait_exit(Duration::from_secs(15)));
    let dir = std::mem::replace(&mut gw.dir, tempfile::tempdir().unwrap());
    let next = builder().in_dir(dir).start();
    wait_until(Duration::from_secs(10), || {
        redis.int(&["GET", &month_key()]) == Some(5)
    });
    assert!(
        next.log()
            .contains("45 leased calls never served are given back"),
        "{}",
        next.log()
    );
    wait_until(Duration::from_secs(5), || {
        !carried_files(&state).contains("returned")
    });
    // Given back once: the next call leases anew from 5.
    assert_eq!(status(&next, LOOKUP), 200);
    assert_eq!(redis.int(&["GET", &month_key()]), Some(55));
}

/// `FLUSHALL` (or the month's count evicted) used to restart a project's month from zero (667
/// -> 47 in an outside test): the next call now finds the count missing and sets it back to
/// what its gateway had seen, and says so; two gateways on one Redis go on from there.
#[test]
fn a_flushed_month_count_is_set_back_to_what_the_gateway_saw() {
    let redis = RedisServer::start(false);
    let (gw, other) = (
        gateway(&redis, "fail_open", 1_000),
        gateway(&redis, "fail_open", 1_000),
    );
    for (g, calls) in [(&gw, 20), (&other, 20), (&gw, 20)] {
        for _ in 0..calls {
            assert_eq!(status(g, LOOKUP), 200);
        }
    }
    assert_eq!(redis.int(&["GET", &month_key()]), Some(60));
    let mut c = redis.client().get_connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    // The gateway that saw the count last sets it back; the other one then counts on it.
    assert_eq!(status(&gw, LOOKUP), 200);
    assert_eq!(redis.int(&["GET", &month_key()]), Some(61), "{}", gw.log());
    assert_eq!(status(&other, LOOKUP), 200);
    assert_eq!(
        redis.int(&["GET", &month_key()]),
        Some(62),
        "{}",
        other.log()
    );
    for g in [&gw, &other] {
        let usage = g.conn_as(Some(SECRET)).get("/v1/usage").unwrap().json();
        assert!(usage["month_count"].as_u64().unwrap() >= 61, "{usage}");
    }
    assert!(gw.log().contains("was missing from Redis"), "{}", gw.log());
    assert_eq!(gw.metric("drg_quota_counts_restored_total"), Some(1.0));
    assert_eq!(other.metric("drg_quota_counts_restored_total"), Some(0.0));
    // The count keeps its expiry (the end of the month, not forever).
    assert!(redis.int(&["TTL", &month_key()]).unwrap() > 0);
}

/// A count restored after a flush took the first caller's last-seen value (20 when another
/// gateway had seen 60), and a gateway restarted against a Redis that had lost its data had no
/// last-seen value at all (the month restarted from the outage's calls). Each reading now
/// carries the epoch of the count it was read in, a reading from before the loss raises the
/// restored count to it, and each gateway keeps its readings in its state folder.
#[test]
fn a_month_restored_after_a_lost_redis_reads_the_highest_count_any_gateway_had_seen() {
    let redis = RedisServer::start(false);
    let builder = || {
        Gateway::builder()
            .plan("shared", 1_000)
            .key("k", SECRET, "shared", &[])
            .redis(&redis.url(), "fail_open")
    };
    let (a, b) = (builder().start(), builder().start());
    for (g, calls) in [(&a, 20), (&b, 40)] {
        for _ in 0..calls {
            assert_eq!(status(g, LOOKUP), 200);
        }
    }
    let count = || redis.int(&["GET", &month_key()]);
    let flush = || {
        let mut c = redis.client().get_connection().unwrap();
        let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    };
    assert_eq!(count(), Some(60));
    flush();
    // A, which saw 20, calls first; B, which saw 60, raises the count to what it saw.
    assert_eq!(status(&a, LOOKUP), 200);
    assert_eq!(count(), Some(21));
    assert_eq!(status(&b, LOOKUP), 200);
    assert_eq!(count(), Some(62), "{}", b.log());
    assert!(b.log().contains("set back to the 60 calls"), "{}", b.log());
    // Both restart against a Redis that lost everything: their readings come from the folder.
    let (dir_a, dir_b) = (a.stop(), b.stop());
    flush();
    let a = builder().in_dir(dir_a).start();
    assert_eq!(status(&a, LOOKUP), 200);
    assert_eq!(count(), Some(22), "{}", a.log());
    let b = builder().in_dir(dir_b).start();
    assert_eq!(status(&b, LOOKUP), 200);
    assert_eq!(count(), Some(64), "{}", b.log());
    for g in [&a, &b] {
        let usage = g.conn_as(Some(SECRET)).get("/v1/usage").unwrap().json();
        assert_eq!(usage["month_count"], 64, "{usage}");
    }
}

/// Batched counting under concurrent calls: a lease is asked once per need (the grant and the
/// end of its request are one step, so no call finds the lease empty with no request in flight
/// in between and asks for a second), so each of two gateways never holds more than the lease in
/// hand and the next one (`batch_max` each) beyond the calls it admitted.
#[test]
fn concurrent_calls_ask_for_one_lease_at_a_time() {
    const LEASE: i64 = 20;
    let redis = RedisServer::start(false);
    let start = || {
        Gateway::builder()
            .plan("shared", 100_000)
            .key("k", SECRET, "shared", &[])
            // Leases kept (not given back) for the whole test: what Redis holds beyond the
            // calls admitted is what the gateways leased and have not used.
            .redis_with(
                &redis.url(),
                "fail_open",
                "sync_interval_ms: 60000, batch_max: 20",
            )
            .start()
    };
    let (a, b) = (start(), start());
    for round in 0..5 {
        let counts = hammer(&[a.addr, b.addr], SECRET, LOOKUP, 16, 25);
        assert_eq!(counts.get(&200).copied().unwrap_or(0), 400, "{counts:?}");
        let admitted = 400 * (round + 1);
        let held = redis.int(&["GET", &month_key()]).unwrap() - admitted;
        assert!(
            (0..=2 * 2 * LEASE).contains(&held),
            "round {round}: Redis counts {held} calls beyond the {admitted} admitted"
        );
    }
}

/// A link to `redis` that holds every byte `delay` each way.
fn slow_link_to(redis: &RedisServer, delay: Duration) -> crate::slow_proxy::SlowProxy {
    let target: std::net::SocketAddr = redis.url()["redis://".len()..]
        .trim_end_matches('/')
        .parse()
        .unwrap();
    crate::slow_proxy::SlowProxy::start(target, delay)
}

/// A gateway counting a plan of 100,000 in leases of 10 through `proxy`, with budgets of
/// `budget_ms` for Redis calls and connections.
fn leases_of_10_behind(proxy: &crate::slow_proxy::SlowProxy, budget_ms: u64) -> Gateway {
    Gateway::builder()
        .plan("shared", 100_000)
        .key("k", SECRET, "shared", &[])
        .quota_section(&format!(
            "quota: {{ store: redis, state_file: state/quota.counters, redis: {{ url: \"redis://{}/\", \
             sync_interval_ms: 60000, batch_max: 10, call_timeout_ms: {budget_ms}, connect_timeout_ms: {budget_ms} }} }}",
            proxy.addr
        ))
        .start()
}

/// Batched counting behind a link of 15 ms each way, leases of 10: concurrent calls use a lease
/// up before the next one comes back, wait for it, and the metrics say how many waited and for
/// how long (what tells an operator that `batch_max` lasts less than a round trip).
#[test]
fn calls_that_wait_for_the_next_lease_are_counted_with_their_wait() {
    let redis = RedisServer::start(false);
    let proxy = slow_link_to(&redis, Duration::from_millis(15));
    let gw = leases_of_10_behind(&proxy, 1000);
    assert_eq!(gw.metric("drg_quota_lease_waits_total"), Some(0.0));
    let counts = hammer(&[gw.addr], SECRET, LOOKUP, 16, 10);
    assert_eq!(counts.get(&200).copied().unwrap_or(0), 160, "{counts:?}");
    let waits = gw.metric("drg_quota_lease_waits_total").unwrap();
    let waited = gw.metric("drg_quota_lease_wait_seconds_total").unwrap();
    // 160 calls from 16 at once, 10 a lease: most calls find the lease gone (135 to 141 of
    // them in four runs).
    assert!(waits >= 80.0, "{waits} calls waited");
    // Each waited for (most of) a round trip of 30 ms through the link.
    assert!(
        waited / waits > 0.005 && waited / waits < 1.0,
        "{waited} s over {waits} waits"
    );
    // The local store has no leases: no such metric.
    let local = Gateway::builder().start();
    assert_eq!(local.metric("drg_quota_lease_waits_total"), None);
    // And the log tells the operator, once, within a window of ten syncs (2.5 s here).
    let told = "waited for their key's next lease";
    wait_until(Duration::from_secs(10), || gw.log().contains(told));
    let line = gw
        .log()
        .lines()
        .find(|l| l.contains(told))
        .unwrap()
        .to_owned();
    assert!(
        line.contains("batch_max (10)") && line.contains("us on average"),
        "{line}"
    );
    assert!(!line.contains(SECRET) && !line.contains("q:{k}"), "{line}");
    hammer(&[gw.addr], SECRET, LOOKUP, 16, 10);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        gw.log().matches(told).count(),
        1,
        "at most every ten minutes"
    );
}

/// The call that finds its key's lease half used asks for the next one and answers at once: it
/// does not wait out the round trip (a link of 400 ms each way here). Only a call that finds
/// the lease empty, with the next one on its way, waits for it; and the lease it brings is
/// counted in Redis once.
#[test]
fn the_call_that_asks_for_the_next_lease_does_not_wait_for_it() {
    let redis = RedisServer::start(false);
    let proxy = slow_link_to(&redis, Duration::from_millis(400));
    let gw = leases_of_10_behind(&proxy, 5000);
    // The first call takes a lease of 10 through the link (its round trip is this call's).
    assert_eq!(status(&gw, LOOKUP), 200);
    assert_eq!(redis.int(&["GET", &month_key()]), Some(10));
    // Nine more from the lease: the fifth of them (5 left) asks for the next lease.
    let started = std::time::Instant::now();
    for _ in 0..9 {
        assert_eq!(status(&gw, LOOKUP), 200);
    }
    let took = started.elapsed();
    // Had that call waited for its refill, these nine would take a round trip (800 ms).
    assert!(
        took < Duration::from_millis(400),
        "9 calls from the lease took {took:?}"
    );
    // The refill reaches Redis (20 reserved); its grant comes back 400 ms later. None waited.
    wait_until(Duration::from_secs(5), || {
        redis.int(&["GET", &month_key()]) == Some(20)
    });
    assert_eq!(gw.metric("drg_quota_lease_waits_total"), Some(0.0));
    // Ten more. The first finds the lease empty with the grant still on the link back: it
    // alone waits. The second lease serves the ten, its fifth asking for a third (in Redis once).
    for _ in 0..10 {
        assert_eq!(status(&gw, LOOKUP), 200);
    }
    assert_eq!(gw.metric("drg_quota_lease_waits_total"), Some(1.0));
    wait_until(Duration::from_secs(5), || {
        redis.int(&["GET", &month_key()]) == Some(30)
    });
}

/// Redis behind a slow link (300 ms each way) with the shipped budgets (connect 200 ms, calls
/// 50 ms): every call skips Redis. Two gateways used to say only that Redis was unreachable; each
/// now says Redis answers, slower than the budgets, with the times it measured.
#[test]
fn a_slow_link_to_redis_is_named_with_what_was_measured() {
    let redis = RedisServer::start(false);
    let proxy = slow_link_to(&redis, Duration::from_millis(300));
    let start = || {
        Gateway::builder()
            .plan("shared", 1_000)
            .key("k", SECRET, "shared", &[])
            .quota_section(&format!(
                "quota: {{ store: redis, state_file: state/quota.counters, redis: {{ url: \"redis://{}/\" }} }}",
                proxy.addr
            ))
            .start()
    };
    let (a, b) = (start(), start());
    for gw in [&a, &b] {
        // Served (fail open) meanwhile.
        assert_eq!(status(gw, LOOKUP), 200);
    }
    for gw in [&a, &b] {
        let seen = (0..100).any(|_| {
            gw.log()
                .contains("Redis answers, but slower than the budgets")
                || {
                    std::thread::sleep(Duration::from_millis(200));
                    false
                }
        });
        assert!(seen, "{}", gw.log());
        let log = gw.log();
        assert!(
            log.contains("connect_timeout_ms 200") && log.contains("call_timeout_ms 50"),
            "{log}"
        );
    }
}
