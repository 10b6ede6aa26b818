//! API-made keys in the control store on PostgreSQL (`gateway.control`), against the real
//! binary and a real PostgreSQL on loopback: a key made or revoked (with the keys it made) on
//! one gateway is in force on the other within a second; `max_keys` holds when two gateways
//! make keys at once; with the database stopped, keys go on working (after a restart too),
//! changes answer `503` and none lands later, also when the server is frozen mid-write; a
//! database restored from an older dump is served whole; a commit whose answer was lost is
//! answered as it landed; and one project's churn leaves a row per key in force, nothing more.
//! (Before, keys lived on Redis with tombstones kept 400 days per revocation.)

use crate::commit_cutter::CommitCutter;
use crate::common;
use crate::keys_api::{create, lookup, made_by, race_creates, revoke};
use crate::postgres::Postgres;

use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

const SERVER: &str = "drg_acme_server_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// Project `acme` on `starter` (5 keys) with its server key, keys in the database at `url`.
fn at(url: &str) -> GatewayBuilder {
    Gateway::builder()
        .plan("starter", 100_000)
        .key_in_project("server", SERVER, "starter", "acme")
        .gateway_yaml(&format!(
            "control: {{ url: '{url}', call_timeout_ms: 1000 }}"
        ))
}

fn on(pg: &Postgres) -> GatewayBuilder {
    at(&pg.url())
}

/// How long until `secret` answers `want` on `gw` (at most 5 s).
fn until(gw: &Gateway, secret: &str, want: u16) -> Duration {
    let start = Instant::now();
    while lookup(gw, secret) != want {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{secret} not {want} after 5 s:\n{}",
            gw.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

/// The project's audit trail, newest first: `action target` each. The trail is read from the
/// database: one that has just resumed (its backends running what paused ones were sent)
/// answers `503` a moment, so a `503` is asked again for up to 10 s.
fn trail(gw: &Gateway) -> Vec<String> {
    let mut r = send(gw, "GET", "/v1/audit", Some(SERVER), &[], None);
    let end = Instant::now() + Duration::from_secs(10);
    while r.status == 503 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(100));
        r = send(gw, "GET", "/v1/audit", Some(SERVER), &[], None);
    }
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["action"].as_str().unwrap(),
                e["target"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn a_key_made_or_revoked_on_one_gateway_is_in_force_on_the_other_within_a_second() {
    let pg = Postgres::start();
    let (a, b) = (on(&pg).start(), on(&pg).start());
    // Both listen once their first read is done; a moment for the LISTEN to be in place.
    std::thread::sleep(Duration::from_millis(500));
    let (k1, s1) = made_by(&a, SERVER, "one");
    let (k2, s2) = made_by(&a, &s1, "two");
    assert_eq!(lookup(&a, &s2), 200, "at once where it was made");
    let seen = until(&b, &s2, 200);
    eprintln!("a key made on one gateway worked on the other after {seen:?}");
    assert!(seen < Duration::from_secs(1), "{seen:?}");
    // Revoked on B with what it made: refused on B at once, on A within a second.
    assert_eq!(revoke(&b, SERVER, &k1).status, 204);
    assert_eq!((lookup(&b, &s1), lookup(&b, &s2)), (401, 401));
    let gone = until(&a, &s2, 401);
    eprintln!("a revocation on one gateway held on the other after {gone:?}");
    assert!(gone < Duration::from_secs(1), "{gone:?}");
    assert_eq!(lookup(&a, &s1), 401);
    // The database dropped the key made by the revoked one (its lineage's foreign key); the
    // audit entries were written with the changes, once each.
    assert_eq!(pg.psql("SELECT count(*) FROM drg_keys"), "0");
    assert_eq!(
        trail(&a),
        [
            format!("key.revoked {k1}"),
            format!("key.created {k2}"),
            format!("key.created {k1}")
        ]
    );
}

/// A key row written straight into the store for `project`, moving no revision: what a
/// follower reads only when it reads that project or every key.
fn plant_key(pg: &Postgres, project: &str, id: &str, secret: &str) {
    let body = serde_json::json!({
        "id": id, "project": project, "plan": "starter", "label": null,
        "sha256": drg_access::keys::hash_secret(secret).iter().map(|b| format!("{b:02x}"))
            .collect::<String>(),
        "prefix": &secret[..12], "created_at": "2026-11-01T00:00:00Z", "last_used": null
    });
    pg.psql(&format!(
        "INSERT INTO drg_keys (id, project, body) VALUES ('{id}', '{project}', '{body}')"
    ));
}

#[test]
fn a_key_change_makes_the_other_gateway_read_that_project_alone() {
    const GLOBEX: &str = "drg_globex_server_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const IN_GLOBEX: &str = "drg_planted_key_ccccccccccccccccccccccccccccccccccccc";
    const ELSEWHERE: &str = "drg_planted_key_ddddddddddddddddddddddddddddddddddddd";
    let pg = Postgres::start();
    let with_globex = || on(&pg).key_in_project("globex-server", GLOBEX, "starter", "globex");
    let (a, b) = (with_globex().start(), with_globex().start());
    std::thread::sleep(Duration::from_millis(500));
    // A first change: a store that never had one has no revision to follow from (read whole).
    let (_, s0) = made_by(&a, SERVER, "zero");
    until(&b, &s0, 200);
    // Rows written behind the gateways' back, in `globex` and in a project no key here names.
    plant_key(&pg, "globex", "key_00000000beef", IN_GLOBEX);
    plant_key(&pg, "initech", "key_00000000cafe", ELSEWHERE);
    let planted = |gw: &Gateway| (lookup(gw, IN_GLOBEX), lookup(gw, ELSEWHERE));
    // Another project's change: B reads `acme` alone (a whole read would serve both rows).
    let (_, s1) = made_by(&a, SERVER, "one");
    assert_eq!(lookup(&a, &s1), 200, "at once where it was made");
    until(&b, &s1, 200);
    let (_, s2) = made_by(&a, SERVER, "two");
    assert_eq!(lookup(&a, &s2), 200, "at once where it was made");
    until(&b, &s2, 200);
    assert_eq!((planted(&a), planted(&b)), ((401, 401), (401, 401)));
    // A change of `globex` reads `globex` whole, on A in the change and on B after it.
    let (_, s3) = made_by(&a, GLOBEX, "three");
    until(&b, &s3, 200);
    assert_eq!((planted(&a), planted(&b)), ((200, 401), (200, 401)));
    // A revision that names no project (a key sync, an import) is read whole.
    pg.psql(
        "WITH r AS (UPDATE drg_revision SET n = n + 1, token = 'whole' WHERE kind = 'keys' \
         RETURNING n) INSERT INTO drg_revision_log (kind, n, token) SELECT 'keys', n, 'whole' \
         FROM r; SELECT pg_notify('drg_revision', 'keys')",
    );
    until(&a, ELSEWHERE, 200);
    until(&b, ELSEWHERE, 200);
}

#[test]
fn max_keys_holds_exactly_when_two_gateways_make_keys_at_once() {
    let pg = Postgres::start();
    let gws = [on(&pg).start(), on(&pg).start()];
    // acme: 1 operator key of 5, so 4 of these 16 attempts succeed, whichever gateway serves.
    let statuses = race_creates(&gws, SERVER, 16);
    let made = statuses.iter().filter(|s| **s == 201).count();
    let full = statuses.iter().filter(|s| **s == 409).count();
    assert_eq!((made, full), (4, 12), "{statuses:?}");
    assert_eq!(
        pg.psql("SELECT count(*) FROM drg_keys WHERE project = 'acme'"),
        "4"
    );
    for gw in &gws {
        wait_until(Duration::from_secs(5), || {
            let r = send(gw, "GET", "/v1/keys", Some(SERVER), &[], None);
            r.json()["items"].as_array().unwrap().len() == 5
        });
    }
}

#[test]
fn with_postgres_stopped_keys_work_changes_answer_503_and_none_lands_later() {
    let pg = Postgres::start();
    let (a, b) = (on(&pg).start(), on(&pg).start());
    let (kept_id, kept) = made_by(&a, SERVER, "kept");
    let (_, other) = made_by(&a, SERVER, "other");
    until(&b, &kept, 200);
    until(&b, &other, 200);
    pg.stop();
    for gw in [&a, &b] {
        assert_eq!((lookup(gw, &kept), lookup(gw, &other)), (200, 200));
    }
    create(&a, SERVER, "late").assert_error(503, "service_unavailable");
    revoke(&b, SERVER, &kept_id).assert_error(503, "service_unavailable");
    let rotate = format!("/v1/keys/{kept_id}/rotate");
    send(&a, "POST", &rotate, Some(SERVER), &[], None).assert_error(503, "service_unavailable");
    // A gateway restarted while the database is away serves the keys it last knew.
    let dir = b.stop();
    let b = on(&pg).in_dir(dir).start();
    assert_eq!((lookup(&b, &kept), lookup(&b, &other)), (200, 200));
    pg.restart();
    // Back: the refused changes never land, and a new one does.
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(
        pg.psql("SELECT string_agg(body::json->>'label', ',' ORDER BY body::json->>'label') FROM drg_keys"),
        "kept,other"
    );
    for gw in [&a, &b] {
        assert_eq!(lookup(gw, &kept), 200);
    }
    let (_, after) = made_by(&b, SERVER, "after");
    until(&a, &after, 200);
}

#[test]
fn a_database_restored_from_an_older_dump_is_served_and_nothing_is_put_back() {
    let pg = Postgres::start();
    let (a, b) = (on(&pg).start(), on(&pg).start());
    let (old_id, old) = made_by(&a, SERVER, "old");
    until(&b, &old, 200);
    // The backup: the keys and the revisions as they are now.
    pg.psql("CREATE TABLE backup_keys AS SELECT * FROM drg_keys");
    pg.psql("CREATE TABLE backup_revision AS SELECT * FROM drg_revision");
    let (_, new) = made_by(&b, SERVER, "new");
    assert_eq!(revoke(&a, SERVER, &old_id).status, 204);
    until(&a, &new, 200);
    until(&b, &old, 401);
    pg.psql(
        "BEGIN; DELETE FROM drg_keys; INSERT INTO drg_keys SELECT * FROM backup_keys; \
         DELETE FROM drg_revision; INSERT INTO drg_revision SELECT * FROM backup_revision; COMMIT",
    );
    // Both serve the dump's keys within seconds: the new one gone; the old one, which both saw
    // revoked, stays refused (before, it answered `200` again), named for revoking again.
    for gw in [&a, &b] {
        let gone = until(gw, &new, 401);
        assert!(gone < Duration::from_secs(3), "{gone:?}");
        assert_eq!(lookup(gw, &old), 401);
    }
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(
        pg.psql("SELECT string_agg(body::json->>'label', ',') FROM drg_keys"),
        "old",
        "neither gateway wrote back what the dump lacks"
    );
    for gw in [&a, &b] {
        let told = gw.admin_get("/readyz").json()["control_store"].clone();
        let kinds: Vec<&Value> = told["went_back"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| &w["kind"])
            .collect();
        assert!(kinds.contains(&&Value::from("keys")), "{told}");
        assert!(
            told.to_string().contains(&format!("key revoke {old_id}")),
            "{told}"
        );
    }
}

/// PostgreSQL frozen (`SIGSTOP`) with key changes in flight: each answers `503`, and once the
/// server resumes and runs what it was sent, `COMMIT`s included, none takes effect.
#[test]
fn a_503_while_postgres_is_paused_never_makes_or_revokes_a_key_later() {
    let pg = Postgres::start();
    let (a, b) = (on(&pg).start(), on(&pg).start());
    let (kept_id, kept) = made_by(&a, SERVER, "kept");
    until(&b, &kept, 200);
    let revision = pg.psql("SELECT n FROM drg_revision WHERE kind = 'keys'");
    pg.pause();
    let answers: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..12)
            .map(|i| {
                let gw = if i % 2 == 0 { &a } else { &b };
                let kept_id = kept_id.clone();
                s.spawn(move || match i % 3 {
                    0 => create(gw, SERVER, &format!("paused {i}")).status,
                    1 => revoke(gw, SERVER, &kept_id).status,
                    _ => {
                        let path = format!("/v1/keys/{kept_id}/rotate");
                        send(gw, "POST", &path, Some(SERVER), &[], None).status
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    pg.resume();
    assert!(answers.iter().all(|s| *s == 503), "{answers:?}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(pg.psql("SELECT count(*) FROM drg_keys"), "1");
    assert_eq!(
        pg.psql("SELECT n FROM drg_revision WHERE kind = 'keys'"),
        revision
    );
    for gw in [&a, &b] {
        assert_eq!(lookup(gw, &kept), 200);
        assert_eq!(trail(gw).len(), 1, "{:?}", trail(gw));
    }
}

/// The connection breaks right after a key's `COMMIT` reached the database: the gateway waits
/// until the database could no longer commit it, reads what came of it and answers that.
#[test]
fn a_key_whose_commit_answer_was_lost_answers_what_landed() {
    let pg = Postgres::start();
    let cutter = CommitCutter::start(([127, 0, 0, 1], pg.port).into());
    let gw = at(&format!("postgres://drg@{}/postgres", cutter.addr)).start();
    made_by(&gw, SERVER, "warm");
    cutter.arm("cut-label");
    let r = create(&gw, SERVER, "cut-label");
    assert!(cutter.cut(), "the change's COMMIT was cut");
    assert_eq!(r.status, 201, "{}", r.text());
    let secret = r.json()["key"].as_str().unwrap().to_owned();
    assert_eq!(lookup(&gw, &secret), 200);
    assert!(
        gw.log().contains("the commit whose answer was lost landed"),
        "{}",
        gw.log()
    );
}

/// One project makes and revokes keys in a loop: the store holds a row per key in force and
/// nothing for the revoked ones (before: a tombstone per revocation, kept 400 days).
#[test]
fn one_projects_key_churn_leaves_a_row_per_key_in_force_and_nothing_more() {
    let pg = Postgres::start();
    let gw = on(&pg).start();
    let (_, kept) = made_by(&gw, SERVER, "kept");
    let mut took = Vec::new();
    for i in 0..400 {
        let start = Instant::now();
        let (id, _) = made_by(&gw, SERVER, &format!("churn {i}"));
        assert_eq!(revoke(&gw, SERVER, &id).status, 204);
        took.push(start.elapsed());
    }
    let median = |d: &[Duration]| {
        let mut d = d.to_vec();
        d.sort();
        d[d.len() / 2]
    };
    eprintln!(
        "make + revoke: first 50 {:?}, last 50 {:?} (medians)",
        median(&took[..50]),
        median(&took[350..])
    );
    assert_eq!(pg.psql("SELECT count(*) FROM drg_keys"), "1");
    assert_eq!(lookup(&gw, &kept), 200);
    // The trail keeps its bound (the newest 1,000 entries).
    assert_eq!(
        pg.psql("SELECT count(*) FROM drg_audit WHERE project = 'acme'"),
        "801"
    );
}

/// The last uses of API-made keys reach PostgreSQL in one statement a batch (before: one
/// `UPDATE` a key, all inside one call's budget).
#[test]
fn the_last_uses_of_many_keys_are_saved_together() {
    let pg = Postgres::start();
    let gw = on(&pg)
        .gateway_yaml("keys_api: { last_used_flush_seconds: 1 }")
        .start();
    let made: Vec<String> = (0..4)
        .map(|i| made_by(&gw, SERVER, &format!("used-{i}")).1)
        .collect();
    for secret in &made {
        assert_eq!(lookup(&gw, secret), 200);
    }
    wait_until(Duration::from_secs(5), || {
        pg.psql("SELECT count(*) FROM drg_keys WHERE last_used > 0") == "4"
    });
}
