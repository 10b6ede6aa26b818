//! Live top-domains on the real gateway: flagged lookups rank by flags, then score, then name;
//! a flood of random names does not evict the heavy hitters nor grow the counters; the ranking
//! survives a restart (and a corrupt state file does not stop the start); two gateways on one
//! real redis-server agree, and counts made while Redis is down or slow reach it once.

use crate::common;
use crate::redis_server;

use common::*;
use redis_server::RedisServer;
use std::time::Duration;

const TOP: &str = "top_domains: { render_interval_ms: 50, persist_interval_ms: 200, \
                   sync_interval_ms: 100, state_file: state/top.json }";
const DISPOSABLE: &str = "mailinator.com\nyopmail.com\nother.example\naa.example\nzz.example\n";
const RECORDS: &str = "domain,reason,risk_score,mx_provider_label,flag_weight\n\
                       team.example,role_account,60,,5\n\
                       dead.example,undeliverable,90,,\n";

fn builder() -> GatewayBuilder {
    Gateway::builder()
        .data("disposable.txt", DISPOSABLE)
        .data("free_providers.txt", "gmail.com\n")
        .data("domains.csv", RECORDS)
        .gateway_yaml(TOP)
}

/// `(domain, risk_score, reason)` of top-domains, after checking `count` and the reasons.
fn top(gw: &Gateway, limit: usize) -> Vec<(String, u64, String)> {
    let r = gw.get(&format!("/v1/public/top-domains?limit={limit}"));
    assert_eq!(r.status, 200);
    let v = r.json();
    let domains = v["domains"].as_array().unwrap();
    assert_eq!(v["count"], domains.len(), "{v}");
    domains
        .iter()
        .map(|d| {
            assert_ne!(d["reason"], "safe", "{v}");
            (
                d["domain"].as_str().unwrap().to_owned(),
                d["risk_score"].as_u64().unwrap(),
                d["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn names(gw: &Gateway, limit: usize) -> Vec<String> {
    top(gw, limit).into_iter().map(|e| e.0).collect()
}

fn look_up(gw: &Gateway, lookups: &[(&str, usize)]) {
    let mut c = gw.conn();
    for (name, n) in lookups {
        for _ in 0..*n {
            let r = c.get(&format!("/v1/public/domain/{name}")).unwrap();
            assert_eq!(r.status, 200, "{name}");
        }
    }
}

/// Waits until `gw` ranks `want` first.
fn wait_for(gw: &Gateway, want: &[&str]) {
    let mut last = Vec::new();
    let within = Duration::from_secs(15);
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until(within, || {
            last = names(gw, want.len());
            last == want
        })
    }));
    assert!(
        ok.is_ok(),
        "ranking {last:?}, want {want:?}; log:\n{}",
        gw.log()
    );
}

/// Waits for the whole of [`expected`]: a render made between two of the lookups can already
/// rank the first few right.
fn wait_for_expected(gw: &Gateway) {
    let want = expected();
    let names: Vec<&str> = want.iter().map(|e| e.0.as_str()).collect();
    wait_for(gw, &names);
}

const STATIC: [&str; 7] = [
    "team.example",
    "aa.example",
    "mailinator.com",
    "other.example",
    "yopmail.com",
    "zz.example",
    "dead.example",
];

const FLAGGED: [(&str, usize); 8] = [
    ("yopmail.com", 3),
    ("x.y.mailinator.com", 2),
    ("dead.example", 2),
    ("zz.example", 1),
    ("aa.example", 1),
    ("team.example", 1),
    ("gmail.com", 5),
    ("example.org", 5),
];

/// After [`FLAGGED`]: flags, then score, then name; never-flagged entries last.
fn expected() -> Vec<(String, u64, String)> {
    [
        ("yopmail.com", 100, "disposable"),
        // 2 flags each: the higher score first; the registrable domain's own score (100), not
        // the subdomain's answer (95).
        ("mailinator.com", 100, "disposable"),
        ("dead.example", 90, "undeliverable"),
        // 1 flag each: score, then name.
        ("aa.example", 100, "disposable"),
        ("zz.example", 100, "disposable"),
        ("team.example", 60, "role_account"),
        // Never flagged: the table's ranking.
        ("other.example", 100, "disposable"),
    ]
    .into_iter()
    .map(|(d, s, r)| (d.to_owned(), s, r.to_owned()))
    .collect()
}

#[test]
fn flagged_lookups_rank_by_flags_then_score_then_name() {
    let gw = builder().start();
    // No flag yet: the fixed ranking of the table.
    assert_eq!(names(&gw, 100), STATIC);
    look_up(&gw, &FLAGGED);
    wait_for_expected(&gw);
    assert_eq!(top(&gw, 100), expected());
    assert_eq!(names(&gw, 2), ["yopmail.com", "mailinator.com"]);
    // Safe answers never count: looking up safe names changes nothing. The proof that the
    // gateway has processed them is a flagged lookup made after them: once the ranking shows it,
    // any count of theirs would show too (the drain takes every buffer at once).
    look_up(&gw, &[("gmail.com", 50), ("example.org", 50)]);
    look_up(&gw, &[("other.example", 1)]);
    let mut want = expected();
    let other = want.pop().unwrap();
    assert_eq!(other.0, "other.example");
    // 1 flag now: among the others with 1 flag, by score (100), then name.
    want.insert(4, other);
    let names: Vec<&str> = want.iter().map(|e| e.0.as_str()).collect();
    wait_for(&gw, &names);
    assert_eq!(top(&gw, 100), want);
    let metrics = String::from_utf8(gw.admin_get("/metrics").body).unwrap();
    assert!(metrics.contains("drg_top_flags_total 11"), "{metrics}");
}

#[test]
fn a_random_name_flood_does_not_evict_the_heavy_hitters_nor_grow_the_counters() {
    let flood: Vec<String> = (0..3_000).map(|i| format!("r{i:x}q.example")).collect();
    let mut list = String::from("h1.example\nh2.example\nh3.example\n");
    for name in &flood {
        list.push_str(name);
        list.push('\n');
    }
    let gw = Gateway::builder()
        .data("disposable.txt", &list)
        .gateway_yaml(
            "top_domains: { capacity: 100, render_interval_ms: 50, state_file: state/top.json }",
        )
        .start();
    let mut c = gw.conn();
    let mut get = |name: &str| {
        let r = c.get(&format!("/v1/public/domain/{name}")).unwrap();
        assert_eq!(r.status, 200);
    };
    // 240, 160 and 80 flags among 3,000 names flagged once: N = 3,480 and the bound 2N/m = 70
    // is below every gap.
    for (i, name) in flood.iter().enumerate() {
        get(name);
        if i % 25 < 2 {
            get("h1.example");
        }
        if i % 75 < 4 {
            get("h2.example");
        }
        if i % 75 == 10 || i % 75 == 11 {
            get("h3.example");
        }
    }
    wait_for(&gw, &["h1.example", "h2.example", "h3.example"]);
    let metrics = String::from_utf8(gw.admin_get("/metrics").body).unwrap();
    let counters: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("drg_top_counters "))
        .unwrap()
        .parse()
        .unwrap();
    // One day of one summary: at most `capacity` counters, whatever the flood.
    assert!(counters > 0.0 && counters <= 100.0, "{counters}");
    assert!(metrics.contains("drg_top_flags_total 3480"), "{metrics}");
}

#[test]
fn the_ranking_survives_a_restart_and_a_corrupt_state_file_is_ignored() {
    // No periodic write within the test: what the restart finds was written at shutdown.
    let builder = || {
        Gateway::builder()
            .data("disposable.txt", DISPOSABLE)
            .data("free_providers.txt", "gmail.com\n")
            .data("domains.csv", RECORDS)
            .gateway_yaml(
                "top_domains: { render_interval_ms: 50, persist_interval_ms: 3600000, \
                 state_file: state/top.json }",
            )
    };
    let gw = builder().start();
    look_up(&gw, &FLAGGED);
    wait_for_expected(&gw);
    let before = top(&gw, 100);
    assert_eq!(before, expected());
    let dir = gw.stop();
    let state = dir.path().join("state/top.json");
    assert!(state.exists());

    let gw = builder().in_dir(dir).start();
    // Loaded before the first request.
    assert_eq!(top(&gw, 100), before);
    let dir = gw.stop();

    std::fs::write(&state, b"{\"format\":1,\"own\":[[20000,{\"tot").unwrap();
    let gw = builder().in_dir(dir).start();
    assert_eq!(names(&gw, 100), STATIC);
    assert!(gw.log().contains("corrupt"), "{}", gw.log());
    // And counting goes on, written over the bad file.
    look_up(&gw, &[("yopmail.com", 1)]);
    wait_for(&gw, &["yopmail.com", "team.example"]);
}

fn shared(redis: &RedisServer) -> Gateway {
    builder().redis(&redis.url(), "fail_open").start()
}

fn today_key() -> String {
    format!("drg:top:{{{}}}", chrono::Utc::now().format("%Y-%m-%d"))
}

#[test]
fn two_gateways_on_one_redis_agree() {
    let redis = RedisServer::start(false);
    let a = shared(&redis);
    let b = shared(&redis);
    look_up(&a, &[("yopmail.com", 3), ("team.example", 1)]);
    look_up(
        &b,
        &[
            ("mailinator.com", 2),
            ("yopmail.com", 2),
            ("dead.example", 4),
        ],
    );
    let want = [
        "yopmail.com",
        "dead.example",
        "mailinator.com",
        "team.example",
        "aa.example",
    ];
    wait_for(&a, &want);
    wait_for(&b, &want);
    assert_eq!(top(&a, 100), top(&b, 100));
    assert_eq!(redis.int(&["ZSCORE", &today_key(), "yopmail.com"]), Some(5));
    assert_eq!(redis.int(&["ZCARD", &today_key()]), Some(4));
    // Every key expires.
    assert!(redis.int(&["TTL", &today_key()]).unwrap() > 0);
}

/// Failed Redis steps (`add` or `read`) of the gateway's top-domains sharing.
fn sync_failures(gw: &Gateway, step: &str) -> f64 {
    let sample = format!("drg_top_sync_failures_total{{step=\"{step}\"}}");
    // The labelled counter appears with its first failure.
    gw.metric(&sample).unwrap_or(0.0)
}

/// Waits until the gateway has run later syncs than the one last seen in Redis: each of the
/// flagged `names`, looked up once in turn, reaches Redis only with a sync that starts after
/// its lookup (a sync sends what was counted before it).
fn wait_for_later_syncs(gw: &Gateway, redis: &RedisServer, names: &[&str]) {
    for name in names {
        look_up(gw, &[(name, 1)]);
        wait_until(Duration::from_secs(15), || {
            redis.int(&["ZSCORE", &today_key(), name]) == Some(1)
        });
    }
}

#[test]
fn counts_made_while_redis_is_down_or_slow_serve_locally_and_reach_it_once() {
    let mut redis = RedisServer::start(true);
    let gw = shared(&redis);
    look_up(&gw, &[("dead.example", 2)]);
    wait_until(Duration::from_secs(15), || {
        redis.int(&["ZSCORE", &today_key(), "dead.example"]) == Some(2)
    });
    // That batch is in Redis: nothing is left to send, so the next failed `add` is the batch
    // counted below.
    let adds_failed = sync_failures(&gw, "add");
    redis.kill();
    look_up(&gw, &[("yopmail.com", 3)]);
    // Ranked here at once, Redis or not.
    wait_for(&gw, &["yopmail.com", "dead.example"]);
    // The gateway tried to send them to the dead Redis: they wait to be sent again.
    wait_until(Duration::from_secs(15), || {
        sync_failures(&gw, "add") > adds_failed
    });
    redis.restart();
    wait_until(Duration::from_secs(15), || {
        redis.int(&["ZSCORE", &today_key(), "yopmail.com"]) == Some(3)
    });
    // Several syncs later, still added once.
    wait_for_later_syncs(&gw, &redis, &["aa.example", "zz.example"]);
    assert_eq!(redis.int(&["ZSCORE", &today_key(), "yopmail.com"]), Some(3));
    assert_eq!(
        redis.int(&["ZSCORE", &today_key(), "dead.example"]),
        Some(2)
    );
    wait_for(&gw, &["yopmail.com", "dead.example"]);

    // A batch whose answer comes too late (Redis paused with the call in its socket) is sent
    // again under the same id once Redis answers: Redis runs both, adds it once.
    let before = sync_failures(&gw, "add");
    redis.pause();
    look_up(&gw, &[("mailinator.com", 4)]);
    wait_until(Duration::from_secs(15), || {
        sync_failures(&gw, "add") > before
    });
    redis.resume();
    wait_until(Duration::from_secs(15), || {
        redis.int(&["ZSCORE", &today_key(), "mailinator.com"]) == Some(4)
    });
    wait_for_later_syncs(&gw, &redis, &["other.example", "team.example"]);
    assert_eq!(
        redis.int(&["ZSCORE", &today_key(), "mailinator.com"]),
        Some(4)
    );
    wait_for(&gw, &["mailinator.com", "yopmail.com", "dead.example"]);
}
