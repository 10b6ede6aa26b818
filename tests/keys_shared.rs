//! API-made keys on the shared Redis (the Redis quota store): two gateways with separate state
//! folders that share only a `redis-server` make, use and revoke each other's keys, lineage
//! included; `max_keys` holds across them; a restart keeps the keys; with Redis stopped the
//! last known keys work, making is refused, and a revocation is in force at once on the gateway
//! that took it and on the others once Redis is back; a make whose reply never came (a paused
//! Redis) leaves no key behind, so its 503 "nothing was changed" holds; a revoked key never
//! comes back on any gateway, whatever the order of stops, flushes, failovers and restarts (the
//! three orders a review found, each of which brought it back before: see each test).

use crate::common;
use crate::keys_api::{create, lookup, made_by, race_creates, revoke};
use crate::redis_server;

use std::time::{Duration, Instant};

use common::*;
use redis_server::RedisServer;
use serde_json::Value;

const SERVER: &str = "drg_acme_server_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const OTHER: &str = "drg_acme_other_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
/// Generous: a poll is 200 ms, but the machine may be loaded.
const WITHIN: Duration = Duration::from_secs(20);

/// Project `acme` on `team` (6 keys) holds two operator keys; its own state folder, the
/// quota (and so the keys) on `redis`.
fn builder(redis: &RedisServer) -> GatewayBuilder {
    polling(redis, 200)
}

/// [`builder`] with a poll of the shared store every `ms`.
fn polling(redis: &RedisServer, ms: u64) -> GatewayBuilder {
    acme()
        .redis(&redis.url(), "fail_open")
        .gateway_yaml(&format!("keys_api: {{ shared_poll_ms: {ms} }}"))
}

/// Project `acme` on `team` (6 keys) with its two operator keys, the quota store still to set.
fn acme() -> GatewayBuilder {
    Gateway::builder()
        .plan_yaml("team", "{ monthly_limit: 1000, max_keys: 6 }")
        .key_in_project("server", SERVER, "team", "acme")
        .key_in_project("other", OTHER, "team", "acme")
}

fn listed(gw: &Gateway) -> Vec<Value> {
    let r = send(gw, "GET", "/v1/keys", Some(SERVER), &[], None);
    assert_eq!(r.status, 200);
    r.json()["items"].as_array().unwrap().clone()
}

/// Every field and value of a Redis hash, as text.
fn hash_text(redis: &RedisServer, key: &str) -> String {
    let mut c = redis.client().get_connection().unwrap();
    let pairs: Vec<String> = redis::cmd("HGETALL").arg(key).query(&mut c).unwrap();
    pairs.join(" ")
}

#[test]
fn a_key_made_on_one_gateway_works_on_the_other_and_a_revocation_reaches_both() {
    let redis = RedisServer::start(false);
    let (a, b) = (builder(&redis).start(), builder(&redis).start());
    let (id, secret) = made_by(&a, SERVER, "ci");
    assert_eq!(lookup(&a, &secret), 200, "live at once where it was made");
    wait_until(WITHIN, || lookup(&b, &secret) == 200);
    let item = listed(&b)
        .into_iter()
        .find(|i| i["id"] == id.as_str())
        .unwrap();
    assert_eq!(item["source"], "api");
    assert_eq!(item["created_by"], "server");
    assert_eq!(item["label"], "ci");
    // Redis holds the hashed secret only.
    let rows = hash_text(&redis, "keys:{keys}:rows");
    assert!(rows.contains(&id), "{rows}");
    assert!(!rows.contains(&secret));
    // Nothing of the keys in either state folder's managed file: they live in Redis.
    for gw in [&a, &b] {
        assert!(!gw.dir.path().join("state/keys.managed.json").exists());
    }

    assert_eq!(revoke(&b, SERVER, &id).status, 204);
    assert_eq!(
        lookup(&b, &secret),
        401,
        "refused at once where it was revoked"
    );
    wait_until(WITHIN, || lookup(&a, &secret) == 401);
    assert_eq!(revoke(&a, SERVER, &id).status, 404, "gone everywhere");
    assert_eq!(
        revoke(&a, SERVER, "other").status,
        403,
        "operator keys stay"
    );
    assert!(!listed(&a).iter().any(|i| i["id"] == id.as_str()));
}

#[test]
fn a_key_revoked_on_one_gateway_takes_the_keys_it_made_on_the_other() {
    let redis = RedisServer::start(false);
    let (a, b) = (builder(&redis).start(), builder(&redis).start());
    let (parent, parent_secret) = made_by(&a, SERVER, "parent");
    wait_until(WITHIN, || lookup(&b, &parent_secret) == 200);
    let (child, child_secret) = made_by(&b, &parent_secret, "child");
    let (_, grandchild_secret) = made_by(&b, &child_secret, "grandchild");
    let (_, kept_secret) = made_by(&b, OTHER, "kept");
    for s in [&child_secret, &grandchild_secret, &kept_secret] {
        wait_until(WITHIN, || lookup(&a, s) == 200);
    }
    let item = listed(&a)
        .into_iter()
        .find(|i| i["id"] == child.as_str())
        .unwrap();
    assert_eq!(item["created_by"], parent.as_str());

    assert_eq!(revoke(&a, SERVER, &parent).status, 204);
    for s in [&parent_secret, &child_secret, &grandchild_secret] {
        assert_eq!(lookup(&a, s), 401, "at once where it was revoked");
        wait_until(WITHIN, || lookup(&b, s) == 401);
    }
    assert_eq!(lookup(&a, &kept_secret), 200, "another maker's key stays");
    assert_eq!(lookup(&b, &kept_secret), 200);
}

#[test]
fn max_keys_holds_exactly_when_two_gateways_make_keys_at_once() {
    let redis = RedisServer::start(false);
    let gws = [builder(&redis).start(), builder(&redis).start()];
    // acme: 2 operator keys of 6, so 4 of these 16 attempts succeed, whichever gateway serves.
    let statuses = race_creates(&gws, SERVER, 16);
    let count = |code| statuses.iter().filter(|s| **s == code).count();
    assert_eq!((count(201), count(409)), (4, 12), "{statuses:?}");
    for gw in &gws {
        wait_until(WITHIN, || listed(gw).len() == 6);
    }
    assert_eq!(redis.int(&["SCARD", "keys:{keys}:project:acme"]), Some(4));
}

#[test]
fn a_restart_keeps_the_keys_also_while_redis_is_away() {
    let mut redis = RedisServer::start(true);
    let a = builder(&redis).start();
    let (id, secret) = made_by(&a, SERVER, "kept");
    let dir = a.stop();
    let a = builder(&redis).in_dir(dir).start();
    assert_eq!(lookup(&a, &secret), 200);
    assert!(listed(&a).iter().any(|i| i["id"] == id.as_str()));

    // A gateway started while Redis is away serves the keys it last knew (its cache).
    redis.kill();
    let dir = a.stop();
    let a = builder(&redis).in_dir(dir).start();
    assert_eq!(lookup(&a, &secret), 200);
    // One that never read Redis knows no API-made key.
    let fresh = builder(&redis).start();
    assert_eq!(lookup(&fresh, &secret), 401);
    redis.restart();
    wait_until(WITHIN, || lookup(&fresh, &secret) == 200);
}

#[test]
fn with_redis_away_keys_work_making_is_refused_and_a_revocation_waits_for_redis() {
    let mut redis = RedisServer::start(true);
    let (a, b) = (builder(&redis).start(), builder(&redis).start());
    let (id, secret) = made_by(&a, SERVER, "outage");
    let (child, child_secret) = made_by(&a, &secret, "made by it");
    for s in [&secret, &child_secret] {
        wait_until(WITHIN, || lookup(&b, s) == 200);
    }

    let up = "drg_keys_shared_store_up{store=\"redis\"}";
    assert_eq!(a.metric(up), Some(1.0));
    redis.kill();
    assert_eq!(
        lookup(&a, &secret),
        200,
        "the last known keys stay in service"
    );
    // Within a poll, the gateway says the store is away.
    wait_until(WITHIN, || a.metric(up) == Some(0.0));
    assert_eq!(a.metric(up), Some(0.0));
    assert_eq!(lookup(&b, &secret), 200);
    let r = create(&a, SERVER, "during");
    r.assert_error(503, "service_unavailable");
    assert!(r.json()["message"]
        .as_str()
        .unwrap()
        .contains("nothing was changed"));
    assert!(r.header("retry-after").is_some());

    // Revoked on A while Redis is away: in force on A at once (the key and what it made), kept
    // in A's state folder; B knows nothing yet.
    let r = revoke(&a, SERVER, &id);
    assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["status"], "pending");
    assert_eq!(lookup(&a, &secret), 401);
    assert_eq!(lookup(&a, &child_secret), 401);
    let pending = a.dir.path().join("state/keys.redis-pending.json");
    assert!(std::fs::read_to_string(&pending).unwrap().contains(&id));
    assert_eq!(lookup(&b, &secret), 200);
    // An id A does not know cannot be judged without Redis.
    revoke(&a, SERVER, "key_000000000000").assert_error(503, "service_unavailable");

    redis.restart();
    for s in [&secret, &child_secret] {
        wait_until(WITHIN, || lookup(&b, s) == 401);
    }
    wait_until(WITHIN, || !pending.exists());
    wait_until(WITHIN, || a.metric(up) == Some(1.0));
    assert_eq!(a.metric(up), Some(1.0));
    assert_eq!(lookup(&a, &secret), 401, "never back on A");
    assert!(!hash_text(&redis, "keys:{keys}:rows").contains(&child));
    // Making works again.
    made_by(&b, SERVER, "after");
}

#[test]
fn on_a_redis_cluster_keys_are_made_and_revoked_across_gateways() {
    let cluster = redis_server::RedisCluster::start();
    let nodes: String = cluster
        .seeds()
        .iter()
        .map(|u| format!("\n        - {u}"))
        .collect();
    let start = || {
        Gateway::builder()
            .plan_yaml("team", "{ monthly_limit: 1000, max_keys: 6 }")
            .key_in_project("server", SERVER, "team", "acme")
            .redis_with(
                &cluster.masters[0].url(),
                "fail_open",
                &format!("mode: cluster, nodes:{nodes}"),
            )
            .gateway_yaml("keys_api: { shared_poll_ms: 200 }")
            .start()
    };
    let (a, b) = (start(), start());
    let (id, secret) = made_by(&a, SERVER, "cluster");
    let (_, child_secret) = made_by(&a, &secret, "child");
    wait_until(WITHIN, || lookup(&b, &child_secret) == 200);
    assert_eq!(revoke(&b, SERVER, &id).status, 204);
    wait_until(WITHIN, || lookup(&a, &child_secret) == 401);
    assert_eq!(lookup(&a, &secret), 401);
}

#[test]
fn an_operator_key_removed_from_the_keys_files_revokes_what_it_made_in_redis() {
    use drg_access::keys::{key_entry_yaml_with, EntryExtras};
    let redis = RedisServer::start(false);
    let (a, b) = (builder(&redis).start(), builder(&redis).start());
    let (_, secret) = made_by(&a, OTHER, "made by other");
    wait_until(WITHIN, || lookup(&b, &secret) == 200);
    let extras = EntryExtras {
        project: Some("acme"),
        ..Default::default()
    };
    let only_server = format!(
        "keys:\n{}",
        key_entry_yaml_with("server", SERVER, "team", &[], &extras)
    );
    for gw in [&a, &b] {
        write_atomic(&gw.dir.path().join("keys.yaml"), &only_server);
    }
    for gw in [&a, &b] {
        wait_until(WITHIN, || lookup(gw, &secret) == 401);
    }
    // Gone from Redis too: it no longer counts in `max_keys`.
    let project = "keys:{keys}:project:acme";
    wait_until(WITHIN, || redis.int(&["SCARD", project]) == Some(0));
}

/// With Redis paused, a make's script waits unread and runs when Redis resumes: before, each
/// 503 "nothing was changed" left a key behind that counted toward `max_keys` (3 of 3). Now the
/// gateway queues the id's removal, and once Redis answers nothing of them is left.
#[test]
fn a_make_refused_while_redis_is_paused_leaves_no_key_behind() {
    let redis = RedisServer::start(false);
    let (a, b) = (builder(&redis).start(), builder(&redis).start());
    // A key made first: A's connection to Redis is up when Redis stops, so what A sends
    // meanwhile waits unread in it.
    let (first, _) = made_by(&a, SERVER, "before");
    redis.pause();
    for i in 0..3 {
        let r = create(&a, SERVER, &format!("paused {i}"));
        r.assert_error(503, "service_unavailable");
        assert!(r.json()["message"]
            .as_str()
            .unwrap()
            .contains("nothing was changed"));
    }
    redis.resume();
    let pending = a.dir.path().join("state/keys.redis-pending.json");
    wait_until(WITHIN, || !pending.exists());
    let api_made = |gw: &Gateway| {
        listed(gw)
            .iter()
            .filter(|k| k["label"].as_str().is_some_and(|l| l.starts_with("paused")))
            .count()
    };
    wait_until(WITHIN, || api_made(&a) == 0 && api_made(&b) == 0);
    assert!(!hash_text(&redis, "keys:{keys}:rows").contains("paused"));
    // The project's three further API-made keys are all still to be had (6: two operator
    // keys and `first`).
    assert!(listed(&b).iter().any(|k| k["id"] == first.as_str()));
    for i in 0..3 {
        made_by(&b, SERVER, &format!("after {i}"));
    }
    create(&b, SERVER, "one too many").assert_error(409, "conflict");
}

/// Redis out of memory under `noeviction` refuses writes: a revocation must still reach every
/// gateway within a poll (it only frees memory), not wait for Redis to have room again.
#[test]
fn a_revocation_reaches_the_other_gateway_while_redis_is_out_of_memory() {
    let redis = RedisServer::start_with(
        false,
        vec![
            "--maxmemory".into(),
            "4mb".into(),
            "--maxmemory-policy".into(),
            "noeviction".into(),
        ],
        false,
    );
    let (a, b) = (builder(&redis).start(), builder(&redis).start());
    let (id, secret) = made_by(&a, SERVER, "doomed");
    wait_until(WITHIN, || lookup(&b, &secret) == 200);
    // Fill Redis until it refuses writes.
    let mut c = redis.client().get_connection().unwrap();
    let blob = "x".repeat(64 * 1024);
    for i in 0..1_000 {
        let r: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("filler:{i}"))
            .arg(&blob)
            .query(&mut c);
        if r.is_err() {
            break;
        }
    }
    let oom: redis::RedisResult<()> = redis::cmd("SET").arg("one-more").arg(&blob).query(&mut c);
    assert!(oom.is_err(), "Redis still takes writes");
    let r = revoke(&a, SERVER, &id);
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(lookup(&a, &secret), 401);
    // Within a few polls (200 ms each), on a loaded machine (the whole suite runs four tests
    // at a time): the reported failure was 15 s and more.
    let revoked = std::time::Instant::now();
    wait_until(WITHIN, || lookup(&b, &secret) == 401);
    assert!(
        revoked.elapsed() < Duration::from_secs(6),
        "B took {:?}:\n{}",
        revoked.elapsed(),
        b.log()
    );
}

/// `FLUSHALL` (or a keyspace evicted, or another Redis): before, every API-made key answered
/// 401 on every gateway within a second and never came back. Now each gateway sees the data set
/// gone (its epoch) and puts back what it knew before reading: the keys keep working, Redis has
/// them again, a key revoked before the flush stays revoked, and the log says so.
#[test]
fn a_flushed_redis_gets_the_keys_back_and_they_never_stop_working() {
    let redis = RedisServer::start(false);
    let (a, b) = (builder(&redis).start(), builder(&redis).start());
    let (kept, kept_secret) = made_by(&a, SERVER, "kept");
    let (child, child_secret) = made_by(&a, &kept_secret, "kept's child");
    let (gone, gone_secret) = made_by(&a, SERVER, "revoked first");
    assert_eq!(revoke(&a, SERVER, &gone).status, 204);
    for gw in [&a, &b] {
        wait_until(WITHIN, || {
            lookup(gw, &child_secret) == 200 && lookup(gw, &gone_secret) == 401
        });
    }
    let mut c = redis.client().get_connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    // Several polls (200 ms) later, the keys still work on both gateways...
    let until = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < until {
        for gw in [&a, &b] {
            assert_eq!(lookup(gw, &kept_secret), 200);
            assert_eq!(lookup(gw, &child_secret), 200);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // ...Redis has them again, lineage included, and not the revoked one.
    wait_until(WITHIN, || {
        let rows = hash_text(&redis, "keys:{keys}:rows");
        rows.contains(&kept) && rows.contains(&child)
    });
    assert!(!hash_text(&redis, "keys:{keys}:rows").contains(&gone));
    assert!(
        a.log().contains("lost its data set") || b.log().contains("lost its data set"),
        "{}",
        a.log()
    );
    let restores = |gw: &Gateway| {
        gw.metric("drg_keys_shared_store_restores_total{store=\"redis\"}")
            .unwrap_or(0.0)
    };
    assert!(restores(&a) + restores(&b) >= 1.0, "no restore counted");
    let told = |gw: &Gateway| gw.admin_get("/readyz").json()["keys_store"]["restores"].as_u64();
    assert!(
        told(&a).unwrap_or(0) + told(&b).unwrap_or(0) >= 1,
        "{:?} {:?}",
        told(&a),
        told(&b)
    );
    // Revoking the restored maker takes its child on both gateways.
    assert_eq!(revoke(&b, SERVER, &kept).status, 204);
    for gw in [&a, &b] {
        wait_until(WITHIN, || lookup(gw, &child_secret) == 401);
    }
}

/// A key revoked on one gateway that comes back in Redis (put back as a gateway of an earlier
/// release that had not polled since the revocation does after a flush) is left out by every
/// gateway that reads it (its tombstone is in Redis) and revoked again by the first to read it.
/// Back without its tombstone (Redis lost the revocation, and the version did not go back), it is
/// left out by the gateways that hold the tombstone, which treat it as a loss and publish it
/// again.
#[test]
fn a_revoked_key_that_comes_back_in_redis_is_revoked_again() {
    let redis = RedisServer::start(false);
    let (a, b) = (builder(&redis).start(), builder(&redis).start());
    let (id, secret) = made_by(&a, SERVER, "revoked, then put back");
    wait_until(WITHIN, || lookup(&b, &secret) == 200);
    let c = std::cell::RefCell::new(redis.client().get_connection().unwrap());
    let row: String = redis::cmd("HGET")
        .arg("keys:{keys}:rows")
        .arg(&id)
        .query(&mut *c.borrow_mut())
        .unwrap();
    assert_eq!(revoke(&a, SERVER, &id).status, 204);
    wait_until(WITHIN, || lookup(&b, &secret) == 401);
    // What a stale gateway's restore writes: the row, the project's set, a new version; then
    // the same with the tombstone lost too (Redis lost the revocation, the gateways kept it).
    let put_back = |forget: bool| {
        let mut p = redis::pipe();
        p.cmd("HSET")
            .arg("keys:{keys}:rows")
            .arg(&id)
            .arg(&row)
            .cmd("SADD")
            .arg("keys:{keys}:project:acme")
            .arg(&id)
            .cmd("INCR")
            .arg("keys:{keys}:version");
        if forget {
            p.cmd("HDEL").arg("keys:{keys}:revoked").arg(&id);
        }
        let _: () = p.query(&mut *c.borrow_mut()).unwrap();
    };
    for (forget, said) in [
        (false, "came back in Redis"),
        (true, "without their revocation"),
    ] {
        put_back(forget);
        wait_until(WITHIN, || !hash_text(&redis, ROWS).contains(&id));
        refused_everywhere(&[&a, &b], &[&secret]);
        assert!(
            a.log().contains(said) || b.log().contains(said),
            "{said}: {}",
            a.log()
        );
    }
    assert!(hash_text(&redis, "keys:{keys}:revoked").contains(&id));
}

/// A gateway started after Redis lost its data (flushed while it was stopped) knows the data
/// set its cache was read from. Its cache may lack revocations other gateways made while it was
/// stopped, so it puts back its tombstones only and withholds its keys (before, it put them
/// back: a key revoked meanwhile came back); the operator's `restore-withheld` puts them back.
#[test]
fn a_gateway_started_after_a_flush_withholds_its_keys_until_the_operator_puts_them_back() {
    let redis = RedisServer::start(false);
    let a = builder(&redis).start();
    let (id, secret) = made_by(&a, SERVER, "kept across a flush and a restart");
    // The cache has the key (and the data set it was read from) before the stop.
    let cache = a.dir.path().join("state/keys.redis-cache.json");
    wait_until(WITHIN, || {
        std::fs::read_to_string(&cache).is_ok_and(|c| c.contains(&id) && c.contains("redis_epoch"))
    });
    let dir = a.stop();
    let mut c = redis.client().get_connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    let a = builder(&redis).in_dir(dir).start();
    logged(&a, "lost its data set");
    logged(&a, "are withheld in");
    wait_until(WITHIN, || lookup(&a, &secret) == 401);
    assert!(!hash_text(&redis, ROWS).contains(&id));
    let said = run_ok(&[
        "-c",
        a.dir.path().join("gateway.yaml").to_str().unwrap(),
        "restore-withheld",
    ]);
    assert!(said.contains("put back 1 keys"), "{said}");
    wait_until(WITHIN, || hash_text(&redis, ROWS).contains(&id));
    wait_until(WITHIN, || lookup(&a, &secret) == 200);
}

/// No lock is held across a Redis call in the keys API: while Redis stalls, four projects'
/// makes each wait out their own call budget (1 s) side by side, not one after another (about
/// 4 s before, queued behind one async lock; the poll queued there too).
#[test]
fn slow_key_calls_of_one_project_do_not_queue_anothers() {
    const OTHERS: [(&str, &str); 3] = [
        (
            "beta",
            "drg_beta_server_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
        ),
        (
            "gamma",
            "drg_gamma_server_key_ccccccccccccccccccccccccccccccccccc",
        ),
        (
            "delta",
            "drg_delta_server_key_ddddddddddddddddddddddddddddddddddd",
        ),
    ];
    let redis = RedisServer::start(false);
    let mut b = builder(&redis);
    for (project, secret) in OTHERS {
        b = b.key_in_project(project, secret, "team", project);
    }
    let gw = b.start();
    // Each project's connection to Redis is up (a key made), then Redis stalls.
    made_by(&gw, SERVER, "first");
    for (_, secret) in OTHERS {
        made_by(&gw, secret, "first");
    }
    redis.pause();
    let started = std::time::Instant::now();
    let secrets: Vec<&str> = std::iter::once(SERVER)
        .chain(OTHERS.iter().map(|(_, s)| *s))
        .collect();
    std::thread::scope(|scope| {
        for secret in &secrets {
            let gw = &gw;
            scope.spawn(move || {
                create(gw, secret, "while Redis stalls").assert_error(503, "service_unavailable");
            });
        }
    });
    let took = started.elapsed();
    redis.resume();
    assert!(
        took < Duration::from_millis(3_000),
        "four projects' makes took {took:?}: queued one after another"
    );
}

fn flushall(redis: &RedisServer) {
    let mut c = redis.client().get_connection().unwrap();
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
}

const ROWS: &str = "keys:{keys}:rows";

/// Starts `first`, then `second` once `first` has read the store (and so named its data set):
/// then a data set lost is named anew by `second` (before, a gateway named every data set it
/// was first to read alike, and the others then missed the loss).
fn named_by_first(
    first: GatewayBuilder,
    second: GatewayBuilder,
    redis: &RedisServer,
) -> (Gateway, Gateway) {
    let first = first.start();
    wait_until(WITHIN, || {
        redis.info_args(&["GET", EPOCH]).is_some_and(|e| e != "Nil")
    });
    (first, second.start())
}

const EPOCH: &str = "keys:{keys}:epoch";

/// SIGKILL: nothing is flushed or saved at a stop. Hands back its folder.
fn kill_hard(mut gw: Gateway) -> tempfile::TempDir {
    gw.signal("KILL");
    assert!(gw.wait_exit(Duration::from_secs(15)));
    std::mem::replace(&mut gw.dir, tempfile::tempdir().unwrap())
}

/// Waits until `gw` logs `text`.
fn logged(gw: &Gateway, text: &str) {
    let deadline = Instant::now() + WITHIN;
    while !gw.log().contains(text) {
        assert!(Instant::now() < deadline, "no {text:?} in:\n{}", gw.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until each of `secrets` answers 401 on every one of `gws`, then checks that they stay
/// so for a few polls (a key put back by a restore comes back within one).
fn refused_everywhere(gws: &[&Gateway], secrets: &[&str]) {
    let statuses = || {
        let each = |s: &&str| gws.iter().map(|g| lookup(g, s)).collect::<Vec<_>>();
        secrets.iter().map(each).collect::<Vec<_>>()
    };
    let refused = vec![vec![401; gws.len()]; secrets.len()];
    let deadline = Instant::now() + WITHIN;
    while statuses() != refused {
        assert!(
            Instant::now() < deadline,
            "revoked keys still answer {:?} (a key's status on each gateway) after {WITHIN:?}",
            statuses()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let until = Instant::now() + Duration::from_millis(1_200);
    while Instant::now() < until {
        assert_eq!(statuses(), refused, "a revoked key came back");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn epoch(redis: &RedisServer) -> Option<String> {
    let mut c = redis.client().get_connection().unwrap();
    redis::cmd("GET").arg(EPOCH).query(&mut c).unwrap()
}

/// After a `FLUSHALL`, the gateway that named the lost data set (the first to read it) names
/// the new one too, polling first. Before, it gave it the same name: the other gateway took the
/// new data set for the old, put nothing back and never published what it held (keys only it
/// knew were lost).
#[test]
fn a_gateway_that_named_the_lost_data_set_names_the_new_one_anew() {
    let redis = RedisServer::start(false);
    let (a, b) = named_by_first(polling(&redis, 200), polling(&redis, 2_000), &redis);
    let named = epoch(&redis);
    flushall(&redis);
    logged(&a, "lost its data set");
    logged(&b, "lost its data set");
    assert_ne!(epoch(&redis), named);
}

/// Order 1 of the revocation review: B is away during a `FLUSHALL`, A puts the keys back and a
/// key K is revoked on A, A restarts, then B returns and puts back what its cache held. Before,
/// K came back for good (B restored it; A had forgotten its revocation with its restart).
#[test]
fn a_gateway_away_during_a_flush_does_not_bring_back_a_key_revoked_meanwhile() {
    let redis = RedisServer::start(false);
    let (b, a) = named_by_first(builder(&redis), builder(&redis), &redis);
    let (id, secret) = made_by(&a, SERVER, "revoked while B is away");
    let (_, child_secret) = made_by(&a, &secret, "made by it");
    wait_until(WITHIN, || lookup(&b, &child_secret) == 200);
    // B's cache holds both keys when it stops (killed: nothing is written at a stop).
    let b_dir = kill_hard(b);
    flushall(&redis);
    // A puts its keys back, then K is revoked there.
    wait_until(WITHIN, || hash_text(&redis, ROWS).contains(&id));
    assert_eq!(revoke(&a, SERVER, &id).status, 204);
    let a = builder(&redis).in_dir(kill_hard(a)).start();
    let b = builder(&redis).in_dir(b_dir).start();
    // B finds the data set it read gone and puts back what it knew, less the revocations.
    logged(&b, "lost its data set");
    refused_everywhere(&[&a, &b], &[&secret, &child_secret]);
    assert!(!hash_text(&redis, ROWS).contains(&id));
}

/// Order 1 after the hour the revoking gateway used to remember its revocations for (in
/// memory): the same order with A running all along, its record of K's revocation dated two
/// hours back, in Redis and in its cache. A revocation is kept for as long as a key could be
/// put back, not an hour.
#[test]
fn a_revocation_older_than_an_hour_still_holds_against_a_gateway_that_was_away() {
    let redis = RedisServer::start(false);
    let (b, a) = named_by_first(builder(&redis), builder(&redis), &redis);
    let (id, secret) = made_by(&a, SERVER, "revoked two hours before B returns");
    wait_until(WITHIN, || lookup(&b, &secret) == 200);
    let b_dir = kill_hard(b);
    flushall(&redis);
    wait_until(WITHIN, || hash_text(&redis, ROWS).contains(&id));
    assert_eq!(revoke(&a, SERVER, &id).status, 204);
    // A has read its own revocation back (its cache is at Redis's version): nothing rewrites
    // the records until B returns.
    let cache = a.dir.path().join("state/keys.redis-cache.json");
    wait_until(WITHIN, || {
        let version = redis.int(&["GET", "keys:{keys}:version"]);
        cached(&cache)["redis_version"].as_i64() == version && tombstone_at(&cache, &id).is_some()
    });
    backdate(&redis, &cache, &id, 7_200);
    let b = builder(&redis).in_dir(b_dir).start();
    logged(&b, "lost its data set");
    refused_everywhere(&[&a, &b], &[&secret]);
}

fn cached(cache: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(cache).unwrap_or_default()).unwrap_or_default()
}

/// When the cache's record of `id`'s revocation says it was made (unix seconds).
fn tombstone_at(cache: &std::path::Path, id: &str) -> Option<i64> {
    cached(cache)["revoked"]
        .as_array()?
        .iter()
        .find(|t| t["id"] == id)?["at"]
        .as_i64()
}

/// Dates the revocation of `id` `secs` back, in Redis and in a gateway's cache.
fn backdate(redis: &RedisServer, cache: &std::path::Path, id: &str, secs: i64) {
    let mut c = redis.client().get_connection().unwrap();
    let key = "keys:{keys}:revoked";
    let text: String = redis::cmd("HGET").arg(key).arg(id).query(&mut c).unwrap();
    let mut t: Value = serde_json::from_str(&text).unwrap();
    t["at"] = (t["at"].as_i64().unwrap() - secs).into();
    let _: () = redis::cmd("HSET")
        .arg(key)
        .arg(id)
        .arg(t.to_string())
        .query(&mut c)
        .unwrap();
    let mut file = cached(cache);
    for t in file["revoked"].as_array_mut().unwrap() {
        if t["id"] == id {
            t["at"] = (t["at"].as_i64().unwrap() - secs).into();
        }
    }
    write_atomic(cache, &serde_json::to_string_pretty(&file).unwrap());
    assert!(tombstone_at(cache, id).unwrap() < now_unix() - secs + 60);
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Order 2: a `DELETE` in the poll window right after a `FLUSHALL` (polls of a second, so the
/// window is wide) finds nothing in Redis. Before, it answered 404, was not remembered, and the
/// other gateway's restore brought the key back for good. Now the gateway that knew the key
/// records its revocation in Redis: 204, and no restore puts it back.
#[test]
fn a_revocation_right_after_a_flush_is_kept_against_every_restore() {
    let redis = RedisServer::start(false);
    let (b, a) = named_by_first(polling(&redis, 1_000), polling(&redis, 1_000), &redis);
    let (id, secret) = made_by(&a, SERVER, "revoked right after a flush");
    let (_, child_secret) = made_by(&a, &secret, "made by it");
    wait_until(WITHIN, || lookup(&b, &child_secret) == 200);
    flushall(&redis);
    let r = revoke(&a, SERVER, &id);
    for gw in [&a, &b] {
        logged(gw, "lost its data set");
    }
    refused_everywhere(&[&a, &b], &[&secret, &child_secret]);
    // Checked last: what became of the key is the point (before, also the answer was 404).
    assert_eq!(r.status, 204, "{}", String::from_utf8_lossy(&r.body));
}

/// Order 3: a Sentinel failover to a replica that missed the revocation, while the revoking
/// gateway is down (killed). The replica stops replicating (pointed at a port nobody listens on,
/// it keeps its data: a replica drops it only when a new master's sync arrives; Sentinel leaves
/// it so for `failover-timeout`, 5 s here), the key is revoked on the master, and Sentinel
/// promotes the replica: its version is lower than the one the gateways read, in the same
/// epoch. Before, that was an ordinary change: the key came back on both gateways for good.
#[test]
fn a_failover_to_a_replica_that_missed_a_revocation_does_not_bring_the_key_back() {
    let deployment = redis_server::RedisSentinel::start(1);
    let sentinels: String = deployment
        .sentinel_urls()
        .iter()
        .map(|u| format!("\n          - {u}"))
        .collect();
    let start = |dir: Option<tempfile::TempDir>| {
        let mut b = acme()
            .redis_with(
                &deployment.servers[0].url(),
                "fail_open",
                &format!(
                    "mode: sentinel, sentinel:\n        master_name: {}\n        nodes:{sentinels}",
                    deployment.name
                ),
            )
            .gateway_yaml("keys_api: { shared_poll_ms: 200 }");
        if let Some(dir) = dir {
            b = b.in_dir(dir);
        }
        b.start()
    };
    let (a, b) = (start(None), start(None));
    let (id, secret) = made_by(&a, SERVER, "revoked on the master alone");
    wait_until(WITHIN, || lookup(&b, &secret) == 200);
    let master = deployment.master_port();
    let (replica, old_master) = match &deployment.servers[..] {
        [x, y] if x.port == master => (y, x),
        [x, y] => (x, y),
        _ => unreachable!(),
    };
    wait_until(WITHIN, || hash_text(replica, ROWS).contains(&id));
    let nowhere = free_port().to_string();
    assert!(replica
        .info_args(&["REPLICAOF", "127.0.0.1", &nowhere])
        .is_some());
    assert_eq!(revoke(&a, SERVER, &id).status, 204);
    wait_until(WITHIN, || lookup(&b, &secret) == 401);
    assert!(!hash_text(old_master, ROWS).contains(&id));
    assert!(
        hash_text(replica, ROWS).contains(&id),
        "the replica missed the revocation"
    );
    let a_dir = kill_hard(a);
    deployment.failover();
    assert_eq!(deployment.master_port(), replica.port);
    let a = start(Some(a_dir));
    refused_everywhere(&[&a, &b], &[&secret]);
}
