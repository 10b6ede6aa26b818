//! The control store on PostgreSQL (`gateway.control`), against the real binary and a real
//! PostgreSQL on loopback: two gateways on one database see each other's overrides and
//! webhooks within a second; a plan's bound holds when both write at once; with the database
//! stopped, lookups go on from the snapshot, writes answer `503` and none of them lands once it
//! is back; a database restored from an older dump is served by both gateways, and neither puts
//! back what the dump lacks, and `/readyz` says the revision went back. `migrate` moves an
//! earlier release's records (the state folder's SQLite file, the shared Redis's rows) into the
//! control store once, on either engine.

use crate::commit_cutter::CommitCutter;
use crate::common;
use crate::keys_api::lookup;
use crate::postgres::Postgres;
use crate::redis_server::RedisServer;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

const ACME: &str = "drg_control_acme_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// Project `acme` on `team` (3 overrides, webhooks and keys at most), webhooks on, records on
/// `pg`.
fn builder(pg: &Postgres) -> GatewayBuilder {
    builder_with(pg, "")
}

/// [`builder`] with more of `gateway.control` (`, key: value`).
fn builder_with(pg: &Postgres, more: &str) -> GatewayBuilder {
    Gateway::builder()
        .plan_yaml(
            "team",
            "{ monthly_limit: 100000, max_overrides: 3, max_webhooks: 3, max_keys: 3 }",
        )
        .key_in_project("acme-server", ACME, "team", "acme")
        .data("disposable.txt", "mailinator.com\n")
        .gateway_yaml("webhooks: { allow_private: true }")
        .gateway_yaml(&format!(
            "control: {{ url: '{}', call_timeout_ms: 1000{more} }}",
            pg.url()
        ))
}

fn put(gw: &Gateway, domain: &str, verdict: &str) -> Response {
    let body = json!({ "verdict": verdict }).to_string();
    send(
        gw,
        "PUT",
        &format!("/v1/overrides/{domain}"),
        Some(ACME),
        &[],
        Some(body.as_bytes()),
    )
}

fn delete(gw: &Gateway, domain: &str) -> Response {
    send(
        gw,
        "DELETE",
        &format!("/v1/overrides/{domain}"),
        Some(ACME),
        &[],
        None,
    )
}

/// Makes a webhook of the project on `gw`: its id.
fn make_webhook(gw: &Gateway) -> String {
    let made = send(
        gw,
        "POST",
        "/v1/webhooks",
        Some(ACME),
        &[],
        Some(br#"{"url": "http://127.0.0.1:9/h", "events": ["verdict.changed"]}"#),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    made.json()["id"].as_str().unwrap().to_owned()
}

/// The domains of the project's overrides in force on `gw`, sorted.
fn overrides(gw: &Gateway) -> Vec<String> {
    let r = send(gw, "GET", "/v1/overrides", Some(ACME), &[], None);
    assert_eq!(r.status, 200, "{}", r.text());
    let mut out: Vec<String> = r.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["domain"].as_str().unwrap().to_owned())
        .collect();
    out.sort();
    out
}

/// `reason` of `name` for the project.
fn reason(gw: &Gateway, name: &str) -> String {
    let r = gw
        .conn_as(Some(ACME))
        .get(&format!("/v1/public/domain/{name}"))
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["reason"].as_str().unwrap().to_owned()
}

/// How long until `gw` lists exactly `want` (at most 5 s).
fn until_listed(gw: &Gateway, want: &[&str]) -> Duration {
    let start = Instant::now();
    while overrides(gw) != want {
        // What the gateway said, when it does not follow: the test's log tells why.
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?} after 5 s, not {want:?}:\n{}",
            overrides(gw),
            gw.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

#[test]
fn two_gateways_on_one_postgres_see_each_others_writes_within_a_second() {
    let pg = Postgres::start();
    let (a, b) = (builder(&pg).start(), builder(&pg).start());
    assert_eq!(put(&a, "shop.example", "block").status, 201);
    // In force at once where it was answered.
    assert_eq!(reason(&a, "x.shop.example"), "disposable");
    let seen = until_listed(&b, &["shop.example"]);
    assert!(seen < Duration::from_secs(1), "{seen:?}");
    assert_eq!(reason(&b, "x.shop.example"), "disposable");
    // A removal on B reaches A.
    assert_eq!(delete(&b, "shop.example").status, 204);
    let gone = until_listed(&a, &[]);
    assert!(gone < Duration::from_secs(1), "{gone:?}");
    assert_eq!(reason(&a, "x.shop.example"), "safe");
    // A webhook made on A is listed on B, within a second (asserted apart: a wait's bound is
    // stretched on a loaded machine, the claim is not).
    let id = make_webhook(&a);
    let listed = wait_until(Duration::from_secs(1), || {
        send(&b, "GET", "/v1/webhooks", Some(ACME), &[], None)
            .text()
            .contains(&id)
    });
    assert!(listed < Duration::from_secs(1), "{listed:?}");
    assert!(send(&b, "GET", "/v1/webhooks", Some(ACME), &[], None)
        .text()
        .contains(&id));
    // The rows are the database's: the removed override left none, one webhook.
    assert_eq!(
        pg.psql("SELECT kind || ':' || count(*) FROM drg_records GROUP BY kind ORDER BY kind"),
        "webhooks:1"
    );
}

/// A `DELETE` is decided by the database (issue 93): sent through the other gateway 0-2 ms
/// after the `PUT` was answered, it answered `404` from that gateway's copy and the override
/// stayed (34 of 50). Now the store decides: every removal answers `204` and nothing stays; a
/// name nobody set answers `404`, through either gateway; the same for a webhook. The poll is
/// slowed to 10 s so that only the store can know.
#[test]
fn a_delete_through_the_other_gateway_right_after_the_write_is_decided_by_the_database() {
    let pg = Postgres::start();
    let more = ", poll_ms: 10000";
    let (a, b) = (
        builder_with(&pg, more).start(),
        builder_with(&pg, more).start(),
    );
    for i in 0..50 {
        let name = format!("race{i}.example");
        assert_eq!(put(&a, &name, "block").status, 201);
        let removed = delete(&b, &name);
        assert_eq!(removed.status, 204, "{i}: {}", removed.text());
    }
    assert_eq!(
        pg.psql("SELECT count(*) FROM drg_records WHERE kind = 'overrides' AND NOT removed"),
        "0"
    );
    for gw in [&a, &b] {
        delete(gw, "never-set.example").assert_error(404, "not_found");
    }
    // Removed twice: the second is the store's 404, not a second audit row.
    assert_eq!(put(&a, "twice.example", "allow").status, 201);
    assert_eq!(delete(&b, "twice.example").status, 204);
    delete(&a, "twice.example").assert_error(404, "not_found");
    let removed_rows = pg.psql(
        "SELECT count(*) FROM drg_audit WHERE action = 'override.removed' AND target = 'twice.example'",
    );
    assert_eq!(removed_rows, "1");
    // A webhook made on A, removed through B at once.
    let id = make_webhook(&a);
    let path = format!("/v1/webhooks/{id}");
    let gone = send(&b, "DELETE", &path, Some(ACME), &[], None);
    assert_eq!(gone.status, 204, "{}", gone.text());
    send(&a, "DELETE", &path, Some(ACME), &[], None).assert_error(404, "not_found");
}

/// PostgreSQL tells each gateway a change as it commits (`NOTIFY`): with the poll behind it
/// at 10 s, a write on one gateway is in force on the other within a second, its removal too.
/// (Before, the other gateway waited for its poll.)
#[test]
fn a_change_reaches_the_other_gateway_when_it_commits_not_at_the_next_poll() {
    let pg = Postgres::start();
    let slow_poll = || builder_with(&pg, ", poll_ms: 10000");
    let (a, b) = (slow_poll().start(), slow_poll().start());
    // Both listen once their first read is done; a moment for the LISTEN to be in place.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(put(&a, "told.example", "block").status, 201);
    let seen = until_listed(&b, &["told.example"]);
    eprintln!("a write on one gateway was in force on the other after {seen:?}");
    assert!(seen < Duration::from_secs(1), "{seen:?}");
    assert_eq!(delete(&b, "told.example").status, 204);
    let gone = until_listed(&a, &[]);
    assert!(gone < Duration::from_secs(1), "{gone:?}");
}

#[test]
fn the_plans_bound_holds_when_two_gateways_write_at_once() {
    let pg = Postgres::start();
    let (a, b) = (builder(&pg).start(), builder(&pg).start());
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..12)
            .map(|i| {
                let gw = if i % 2 == 0 { &a } else { &b };
                s.spawn(move || put(gw, &format!("n{i}.example"), "block").status)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let made = statuses.iter().filter(|s| **s == 201).count();
    let full = statuses.iter().filter(|s| **s == 409).count();
    assert_eq!((made, full), (3, 9), "{statuses:?}");
    assert_eq!(
        pg.psql("SELECT count(*) FROM drg_records WHERE kind = 'overrides' AND NOT removed"),
        "3"
    );
    wait_until(Duration::from_secs(2), || {
        overrides(&a).len() == 3 && overrides(&b).len() == 3
    });
    assert_eq!(overrides(&a), overrides(&b));
}

#[test]
fn a_write_held_up_in_one_project_holds_up_no_other_projects_write() {
    const OTHER: &str = "drg_control_other_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    let pg = Postgres::start();
    let gw = builder(&pg)
        .key_in_project("other-server", OTHER, "team", "other")
        .start();
    assert_eq!(put(&gw, "held.example", "block").status, 201);
    // Another session locks acme's row: acme's next write of it waits on that lock mid-way,
    // as a write held up by a slow disk or a long statement would.
    let mut session = pg.session();
    session.run(
        "BEGIN; SELECT key FROM drg_records WHERE kind = 'overrides' AND project = 'acme' \
         AND key = 'held.example' FOR UPDATE;",
    );
    let waiting = std::thread::scope(|s| {
        let held = s.spawn(|| put(&gw, "held.example", "allow"));
        std::thread::sleep(Duration::from_millis(200));
        // Another project's write goes on beside it (before: it waited on the kind's revision
        // row that acme's write held, and answered 503 at the call's budget).
        let t = Instant::now();
        let body = json!({ "verdict": "block" }).to_string();
        let other = send(
            &gw,
            "PUT",
            "/v1/overrides/other.example",
            Some(OTHER),
            &[],
            Some(body.as_bytes()),
        );
        let took = t.elapsed();
        assert_eq!(other.status, 201, "after {took:?}: {}", other.text());
        held.join().unwrap().status
    });
    // The held write gives up at its budget and never lands.
    assert_eq!(waiting, 503);
    drop(session);
    assert_eq!(
        pg.psql("SELECT body::json->>'verdict' FROM drg_records WHERE project = 'acme'"),
        "block"
    );
}

#[test]
fn with_postgres_stopped_lookups_go_on_writes_answer_503_and_none_lands_later() {
    let pg = Postgres::start();
    let (a, b) = (builder(&pg).start(), builder(&pg).start());
    assert_eq!(put(&a, "kept.example", "block").status, 201);
    until_listed(&b, &["kept.example"]);
    pg.stop();
    // The snapshot answers.
    for gw in [&a, &b] {
        assert_eq!(reason(gw, "kept.example"), "disposable");
        assert_eq!(overrides(gw), ["kept.example"]);
    }
    let refused = put(&a, "late.example", "block");
    refused.assert_error(503, "service_unavailable");
    delete(&b, "kept.example").assert_error(503, "service_unavailable");
    pg.restart();
    // Back: the refused writes never land, and a new one does.
    std::thread::sleep(Duration::from_millis(1_500));
    for gw in [&a, &b] {
        assert_eq!(overrides(gw), ["kept.example"]);
    }
    assert_eq!(
        pg.psql("SELECT string_agg(key, ',') FROM drg_records WHERE kind = 'overrides'"),
        "kept.example"
    );
    let again = put(&b, "after.example", "allow");
    assert_eq!(again.status, 201, "{}", again.text());
    until_listed(&a, &["after.example", "kept.example"]);
}

#[test]
fn a_database_restored_from_an_older_dump_is_served_and_nothing_is_put_back() {
    let pg = Postgres::start();
    let (a, b) = (builder(&pg).start(), builder(&pg).start());
    assert_eq!(put(&a, "old.example", "block").status, 201);
    until_listed(&b, &["old.example"]);
    // The backup: the records and the revisions as they are now.
    pg.psql("CREATE TABLE backup_records AS SELECT * FROM drg_records");
    pg.psql("CREATE TABLE backup_revision AS SELECT * FROM drg_revision");
    assert_eq!(put(&b, "new.example", "block").status, 201);
    assert_eq!(delete(&a, "old.example").status, 204);
    until_listed(&a, &["new.example"]);
    until_listed(&b, &["new.example"]);
    // Restored: both gateways serve the older state within seconds.
    pg.psql(
        "BEGIN; DELETE FROM drg_records; INSERT INTO drg_records SELECT * FROM backup_records; \
         DELETE FROM drg_revision; INSERT INTO drg_revision SELECT * FROM backup_revision; COMMIT",
    );
    let restored = until_listed(&a, &["old.example"]);
    until_listed(&b, &["old.example"]);
    assert!(restored < Duration::from_secs(3), "{restored:?}");
    assert_eq!(reason(&b, "new.example"), "safe");
    // Neither gateway writes back what the dump lacks: still the dump's, polls later.
    std::thread::sleep(Duration::from_millis(1_500));
    assert_eq!(
        pg.psql(
            "SELECT string_agg(key, ',' ORDER BY key) FROM drg_records WHERE kind = 'overrides'"
        ),
        "old.example"
    );
    for gw in [&a, &b] {
        assert_eq!(overrides(gw), ["old.example"]);
        assert!(gw.log().contains("revision went back"), "{}", gw.log());
        let told = gw.admin_get("/readyz").json()["control_store"].clone();
        assert_eq!(told["engine"], "postgres", "{told}");
        let back = &told["went_back"][0];
        assert_eq!(back["kind"], "overrides", "{told}");
        assert!(back["to"].as_i64() < back["from"].as_i64(), "{told}");
    }
}

/// A write whose server stalled past its deadline (a `SIGSTOP` between its statements and its
/// `COMMIT`, here a sleep) is refused at the `COMMIT` itself: nothing lands, the revision stays.
#[test]
fn a_commit_past_the_writes_deadline_is_refused_by_the_database() {
    let pg = Postgres::start();
    let gw = builder(&pg).start();
    assert_eq!(put(&gw, "first.example", "block").status, 201);
    let revision = || pg.psql("SELECT n FROM drg_revision WHERE kind = 'overrides'");
    let before = revision();
    let late = pg.try_psql(
        "BEGIN;
         SELECT set_config('drg.deadline', (clock_timestamp() + interval '50 ms')::text, true);
         UPDATE drg_revision SET n = n + 1 WHERE kind = 'overrides';
         DELETE FROM drg_records WHERE key = 'first.example';
         SELECT pg_sleep(0.3);
         COMMIT;",
    );
    let said = late.expect_err("the commit is refused");
    assert!(said.contains("deadline passed before its commit"), "{said}");
    assert_eq!(revision(), before);
    assert_eq!(overrides(&gw), ["first.example"]);
    // In time, the same commits.
    pg.psql(
        "BEGIN;
         SELECT set_config('drg.deadline', (clock_timestamp() + interval '5 s')::text, true);
         UPDATE drg_revision SET n = n + 1 WHERE kind = 'overrides';
         COMMIT;",
    );
    assert_ne!(revision(), before);
}

/// The connection breaks right after a write's `COMMIT` reached the database: the server
/// commits and the gateway hears nothing. It waits until the database could no longer commit
/// the write, reads what came of it and answers that: `201` and in force. (Before: `503`,
/// "nothing changed", with the override in force.)
#[test]
fn a_write_whose_commit_answer_was_lost_answers_what_landed() {
    let pg = Postgres::start();
    let cutter = CommitCutter::start(([127, 0, 0, 1], pg.port).into());
    let gw = Gateway::builder()
        .plan_yaml("team", "{ monthly_limit: 100000, max_overrides: 3 }")
        .key_in_project("acme-server", ACME, "team", "acme")
        .data("disposable.txt", "mailinator.com\n")
        .gateway_yaml(&format!(
            "control: {{ url: 'postgres://drg@{}/postgres', call_timeout_ms: 2000 }}",
            cutter.addr
        ))
        .start();
    assert_eq!(put(&gw, "warm.example", "block").status, 201);
    cutter.arm("cut.example");
    let r = put(&gw, "cut.example", "block");
    assert!(cutter.cut(), "the write's COMMIT was cut");
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(reason(&gw, "x.cut.example"), "disposable");
    assert_eq!(
        pg.psql("SELECT count(*) FROM drg_records WHERE key = 'cut.example'"),
        "1"
    );
    assert!(
        gw.log().contains("the commit whose answer was lost landed"),
        "{}",
        gw.log()
    );
    // A removal cut the same way: `204`, and gone.
    cutter.arm("cut.example");
    let r = delete(&gw, "cut.example");
    assert!(cutter.cut());
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(overrides(&gw), ["warm.example"]);
}

/// A change and its audit entry commit together or not at all: with the trail refusing rows (a
/// trigger standing for a table the database cannot write), an override, a webhook and a key
/// are answered `503` and none is in force; once it takes them, each change has its entry.
/// (Before, the entry was appended after the change committed: a `201` with no entry.)
#[test]
fn a_change_and_its_audit_entry_commit_together() {
    let pg = Postgres::start();
    let gw = builder(&pg).start();
    pg.psql(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN RAISE EXCEPTION 'the trail takes no row'; END $$;
         CREATE TRIGGER refuse BEFORE INSERT ON drg_audit FOR EACH ROW EXECUTE FUNCTION refuse();",
    );
    put(&gw, "shop.example", "block").assert_error(503, "service_unavailable");
    let hook = br#"{"url": "http://127.0.0.1:9/h", "events": ["verdict.changed"]}"#;
    let post = |gw: &Gateway| send(gw, "POST", "/v1/webhooks", Some(ACME), &[], Some(hook));
    post(&gw).assert_error(503, "service_unavailable");
    let key = send(&gw, "POST", "/v1/keys", Some(ACME), &[], Some(b"{}"));
    key.assert_error(503, "service_unavailable");
    assert_eq!(
        pg.psql("SELECT (SELECT count(*) FROM drg_records) + (SELECT count(*) FROM drg_keys)"),
        "0"
    );
    assert_eq!(overrides(&gw), Vec::<String>::new());
    pg.psql("DROP TRIGGER refuse ON drg_audit");
    assert_eq!(put(&gw, "shop.example", "block").status, 201);
    assert_eq!(post(&gw).status, 201);
    let made = send(&gw, "POST", "/v1/keys", Some(ACME), &[], Some(b"{}"));
    assert_eq!(made.status, 201, "{}", made.text());
    assert_eq!(
        pg.psql("SELECT string_agg(action, ',' ORDER BY id) FROM drg_audit"),
        "override.set,webhook.created,key.created"
    );
}

/// A retry through another gateway with the same `Idempotency-Key` gets the first answer: the
/// key is kept with the write, in the database both read.
#[test]
fn a_retry_through_another_gateway_applies_once() {
    let pg = Postgres::start();
    let (a, b) = (builder(&pg).start(), builder(&pg).start());
    let body = br#"{"url": "http://127.0.0.1:9/h", "events": ["verdict.changed"]}"#;
    let post = |gw: &Gateway| {
        let extra = [("Idempotency-Key", "through-b")];
        send(gw, "POST", "/v1/webhooks", Some(ACME), &extra, Some(body))
    };
    let first = post(&a);
    assert_eq!(first.status, 201, "{}", first.text());
    let again = post(&b);
    assert_eq!(again.status, 201, "{}", again.text());
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.json()["id"], first.json()["id"]);
    assert_eq!(
        pg.psql("SELECT count(*) FROM drg_records WHERE kind = 'webhooks'"),
        "1"
    );
}

/// An override an earlier release kept, as its JSON.
fn earlier(domain: &str, stamp: u64, removed: bool) -> String {
    json!({
        "project": "acme", "domain": domain, "verdict": "block", "note": "",
        "set_by": "acme-server", "set_at": 1, "stamp": stamp, "removed": removed,
    })
    .to_string()
}

/// `migrate` with `gw`'s configuration (the gateway stopped, its folder kept in `dir`).
fn migrate(dir: &tempfile::TempDir) -> String {
    let conf = dir.path().join("gateway.yaml");
    run_ok(&["-c", conf.to_str().unwrap(), "migrate"])
}

#[test]
fn an_embedded_deployments_records_move_into_its_sqlite_control_store_once() {
    let plain = || {
        Gateway::builder()
            .plan_yaml("team", "{ monthly_limit: 100000, max_overrides: 3 }")
            .key_in_project("acme-server", ACME, "team", "acme")
            .data("disposable.txt", "mailinator.com\n")
    };
    let dir = plain().start().stop();
    // What an earlier release kept in the state folder: a SQLite file of rows.
    let file = dir.path().join("state/overrides.records.sqlite");
    let old = rusqlite::Connection::open(&file).unwrap();
    old.execute_batch(
        "CREATE TABLE records (project TEXT NOT NULL, key TEXT NOT NULL, stamp INTEGER NOT NULL,
           removed INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY (project, key))",
    )
    .unwrap();
    for (name, removed) in [("old.example", false), ("gone.example", true)] {
        old.execute(
            "INSERT INTO records VALUES ('acme', ?1, 5, ?2, ?3)",
            rusqlite::params![name, removed, earlier(name, 5, removed)],
        )
        .unwrap();
    }
    drop(old);
    // And its audit trail.
    let trail = dir.path().join("state/audit.sqlite");
    let old = rusqlite::Connection::open(&trail).unwrap();
    old.execute_batch(
        "CREATE TABLE entries (project TEXT NOT NULL, id INTEGER NOT NULL, at TEXT NOT NULL,
           key_id TEXT NOT NULL, action TEXT NOT NULL, target TEXT NOT NULL,
           detail TEXT NOT NULL, PRIMARY KEY (project, id));
         INSERT INTO entries VALUES ('acme', 1700000000000000, '2026-01-01T00:00:00Z',
           'acme-server', 'override.set', 'old.example', 'block');",
    )
    .unwrap();
    drop(old);
    // And its API-made keys, in the format of the release before lineage (no `created_by`),
    // with a field of a newer one, and a key that key made.
    let (before, child) = (
        "drg_made_before_eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee",
        "drg_made_by_before_ffffffffffffffffffffffffffffffffff",
    );
    let managed = json!({
        "version": 1,
        "keys": [
            earlier_key("before", before, None),
            earlier_key("child", child, Some("before")),
        ],
        "future_file_field": [1, 2]
    });
    let managed_file = dir.path().join("state/keys.managed.json");
    std::fs::write(&managed_file, managed.to_string()).unwrap();
    // Not served until moved, and the log says how.
    let gw = plain().in_dir(dir).start();
    assert_eq!(reason(&gw, "old.example"), "safe");
    assert_eq!(lookup(&gw, before), 401);
    assert!(
        gw.log().contains("run `domain-risk-gateway migrate`"),
        "{}",
        gw.log()
    );
    let dir = gw.stop();
    let said = migrate(&dir);
    assert!(said.contains("SQLite"), "{said}");
    // The removal removes nothing the store holds.
    assert!(said.contains("overrides: 2 found, 1 taken"), "{said}");
    assert!(said.contains("audit: 1 found, 1 taken"), "{said}");
    assert!(
        said.contains("keys: 2 found, 2 taken (from file:keys.managed.json)"),
        "{said}"
    );
    assert!(!file.exists() && file.with_extension("sqlite.migrated").exists());
    assert!(!managed_file.exists() && managed_file.with_extension("json.migrated").exists());
    let gw = plain().in_dir(dir).start();
    assert_eq!((lookup(&gw, before), lookup(&gw, child)), (200, 200));
    // What this release does not know of a key is kept with it; its lineage is the store's.
    let db = rusqlite::Connection::open(gw.dir.path().join("state/control.sqlite")).unwrap();
    let (body, parent): (String, Option<String>) = db
        .query_row(
            "SELECT body, parent FROM drg_keys WHERE id = 'child'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(body.contains("future_key_field"), "{body}");
    assert_eq!(parent.as_deref(), Some("before"));
    assert_eq!(reason(&gw, "x.old.example"), "disposable");
    assert_eq!(overrides(&gw), ["old.example"]);
    assert_eq!(
        gw.admin_get("/readyz").json()["control_store"]["engine"],
        "sqlite"
    );
    let audit = send(&gw, "GET", "/v1/audit", Some(ACME), &[], None).json();
    assert_eq!(audit["items"][0]["id"], "1700000000000000", "{audit}");
    assert_eq!(audit["items"][0]["target"], "old.example", "{audit}");
    assert!(!gw.log().contains("migrate"), "{}", gw.log());
    // A second run finds nothing and moves nothing.
    let dir = gw.stop();
    let said = migrate(&dir);
    assert!(
        said.contains("overrides: 0 found, 0 taken (nothing new found)"),
        "{said}"
    );
    assert!(
        said.contains("keys: 0 found, 0 taken (nothing new found)"),
        "{said}"
    );
}

/// An API-made key as an earlier release kept it (`by`: the key that made it).
fn earlier_key(id: &str, secret: &str, by: Option<&str>) -> serde_json::Value {
    use sha2::Digest;
    let mut key = json!({
        "id": id, "project": "acme", "plan": "team", "label": null,
        "sha256": hex::encode(sha2::Sha256::digest(secret.as_bytes())),
        "prefix": &secret[..12], "created_at": "2026-10-01T00:00:00Z", "last_used": null,
        "future_key_field": {"x": 1}
    });
    if let Some(by) = by {
        key["created_by"] = by.into();
    }
    key
}

#[test]
fn a_redis_deployments_records_move_into_postgres_once() {
    let redis = RedisServer::start(false);
    let pg = Postgres::start();
    let mut c = redis.client().get_connection().unwrap();
    let _: () = redis::cmd("HSET")
        .arg("drg:{overrides}:rows")
        .arg("acme\nredis.example")
        .arg(earlier("redis.example", 7, false))
        .query(&mut c)
        .unwrap();
    let secret = "drg_kept_on_redis_gggggggggggggggggggggggggggggggggggg";
    let _: () = redis::cmd("HSET")
        .arg("keys:{keys}:rows")
        .arg("onredis")
        .arg(earlier_key("onredis", secret, Some("acme-server")).to_string())
        .query(&mut c)
        .unwrap();
    let gw = builder(&pg).redis(&redis.url(), "fail_open").start();
    assert_eq!(lookup(&gw, secret), 401);
    assert_eq!(reason(&gw, "redis.example"), "safe");
    let said = migrate(&gw.dir);
    assert!(said.contains("PostgreSQL"), "{said}");
    assert!(
        said.contains("overrides: 1 found, 1 taken (from redis drg:{overrides}:rows)"),
        "{said}"
    );
    assert!(
        said.contains("keys: 1 found, 1 taken (from redis keys:{keys}:rows)"),
        "{said}"
    );
    until_listed(&gw, &["redis.example"]);
    assert_eq!(reason(&gw, "redis.example"), "disposable");
    wait_until(Duration::from_secs(2), || lookup(&gw, secret) == 200);
    // Removed since: a second run takes the source no more, and the removal stands.
    assert_eq!(delete(&gw, "redis.example").status, 204);
    let again = migrate(&gw.dir);
    assert!(
        again.contains("taken by an earlier run: redis drg:{overrides}:rows"),
        "{again}"
    );
    std::thread::sleep(Duration::from_millis(1_000));
    assert_eq!(overrides(&gw), Vec::<String>::new());
}

/// `migrate` keeps every revocation an earlier release remembered (issue 93: three revoked
/// keys answered `200` after it). On Redis, a row whose revocation marker is in
/// `keys:{keys}:revoked` and a key that one made; in a gateway's managed file, a key only the
/// file held when the key was revoked on Redis (a cache older than its revocation), and a key
/// in the file's own `revoked` list. Each answers `401` after `migrate`; the live keys `200`.
/// A run before that took a revoked key in (the release before this fix) has it revoked by the
/// next run, audited.
#[test]
fn migrate_keeps_every_revocation_an_earlier_release_remembered() {
    let redis = RedisServer::start(false);
    let pg = Postgres::start();
    let mut c = redis.client().get_connection().unwrap();
    let secret = |id: &str| format!("drg_migrate_{id}_{}", "h".repeat(40 - id.len()));
    let row = |id: &str, by: &str| earlier_key(id, &secret(id), Some(by)).to_string();
    let hset = |c: &mut redis::Connection, hash: &str, field: &str, value: String| {
        let _: () = redis::cmd("HSET")
            .arg(hash)
            .arg(field)
            .arg(value)
            .query(c)
            .unwrap();
    };
    hset(
        &mut c,
        "keys:{keys}:rows",
        "live",
        row("live", "acme-server"),
    );
    hset(
        &mut c,
        "keys:{keys}:rows",
        "marked",
        row("marked", "acme-server"),
    );
    hset(
        &mut c,
        "keys:{keys}:rows",
        "madebymarked",
        row("madebymarked", "marked"),
    );
    let marker = json!({"project": "acme", "at": 1_790_000_000}).to_string();
    for id in ["marked", "cachedold"] {
        hset(&mut c, "keys:{keys}:revoked", id, marker.clone());
    }
    let gw = builder(&pg).redis(&redis.url(), "fail_open").start();
    let dir = gw.stop();
    let managed = json!({
        "version": 1,
        "keys": [
            earlier_key("cachedold", &secret("cachedold"), Some("acme-server")),
            earlier_key("inrevoked", &secret("inrevoked"), Some("acme-server")),
            earlier_key("filelive", &secret("filelive"), Some("acme-server")),
        ],
        "revoked": [{"id": "inrevoked", "project": "acme", "at": 1_790_000_000}],
    });
    std::fs::write(
        dir.path().join("state/keys.managed.json"),
        managed.to_string(),
    )
    .unwrap();
    let said = migrate(&dir);
    assert!(said.contains("keys:"), "{said}");
    let gw = builder(&pg)
        .redis(&redis.url(), "fail_open")
        .in_dir(dir)
        .start();
    for id in ["live", "filelive"] {
        wait_until(Duration::from_secs(2), || lookup(&gw, &secret(id)) == 200);
    }
    for id in ["marked", "madebymarked", "cachedold", "inrevoked"] {
        assert_eq!(lookup(&gw, &secret(id)), 401, "{id}: {said}");
    }
    assert_eq!(
        pg.psql("SELECT string_agg(id, ',' ORDER BY id) FROM drg_keys"),
        "filelive,live"
    );
    // A revoked key a run before took in: the next run revokes it, audited.
    pg.psql(
        "INSERT INTO drg_keys (id, project, body, parent)
         SELECT 'marked', project, replace(body, '\"live\"', '\"marked\"'), NULL
         FROM drg_keys WHERE id = 'live'",
    );
    let dir = gw.stop();
    migrate(&dir);
    assert_eq!(
        pg.psql("SELECT string_agg(id, ',' ORDER BY id) FROM drg_keys"),
        "filelive,live"
    );
    assert_eq!(
        pg.psql("SELECT count(*) FROM drg_audit WHERE action = 'key.revoked' AND target = 'marked' AND key_id = 'migrate'"),
        "1"
    );
}

/// Copies `tables` aside (a backup of them as they are now).
fn back_up(pg: &Postgres, tables: &[&str]) {
    for t in tables {
        pg.psql(&format!("CREATE TABLE backup_{t} AS SELECT * FROM {t}"));
    }
}

/// Puts back what [`back_up`] copied of `tables`, in one transaction (a restore).
fn restore(pg: &Postgres, tables: &[&str]) {
    let sql: String = (tables.iter().rev())
        .map(|t| format!("DELETE FROM {t};"))
        .chain(
            tables
                .iter()
                .map(|t| format!("INSERT INTO {t} SELECT * FROM backup_{t};")),
        )
        .collect();
    pg.psql(&format!("BEGIN; {sql} COMMIT"));
}

const ROLLOUT: &str = "drg_control_rollout_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

/// `key sync` (or `--dry-run`) with the configuration in `dir`.
fn key_sync(dir: &std::path::Path, dry: bool) -> String {
    let conf = dir.join("gateway.yaml");
    let mut args = vec!["-c", conf.to_str().unwrap(), "key", "sync"];
    if dry {
        args.push("--dry-run");
    }
    run_ok(&args)
}

#[test]
fn a_keys_file_one_gateway_lacks_removes_nothing_only_key_sync_does_audited() {
    let pg = Postgres::start();
    // A rolling change: the first gateway's keys file has a new operator key of the project,
    // the second's not yet.
    let a = builder(&pg)
        .key_in_project("acme-rollout", ROLLOUT, "team", "acme")
        .start();
    let b = builder(&pg).start();
    let made = send(
        &a,
        "POST",
        "/v1/keys",
        Some(ROLLOUT),
        &[],
        Some(br#"{"label": "ci"}"#),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    let id = made.json()["id"].as_str().unwrap().to_owned();
    let secret = made.json()["key"].as_str().unwrap().to_owned();
    // Answered 201: it works on every gateway of the store, and stays (it was dropped from
    // PostgreSQL within 0.2 s by the gateway whose file lacks its maker).
    wait_until(Duration::from_secs(2), || lookup(&b, &secret) == 200);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!((lookup(&a, &secret), lookup(&b, &secret)), (200, 200));
    let rows = format!("SELECT count(*) FROM drg_keys WHERE id = '{id}'");
    assert_eq!(pg.psql(&rows), "1");
    // A restart of that gateway changes nothing either.
    let b = builder(&pg).in_dir(b.stop()).start();
    wait_until(Duration::from_secs(2), || lookup(&b, &secret) == 200);
    assert_eq!(pg.psql(&rows), "1");
    let revoked = format!(
        "SELECT count(*) FROM drg_audit WHERE action = 'key.revoked' AND target = '{id}' \
         AND key_id = 'key sync'"
    );
    assert_eq!(pg.psql(&revoked), "0");
    // The operator applies the second gateway's file: dry first (nothing written), then for
    // real. The key is revoked on both, audited, and its maker refused on every gateway, the
    // one whose file still holds it included.
    let said = key_sync(b.dir.path(), true);
    assert!(said.contains(&id) && said.contains("dry run"), "{said}");
    assert_eq!(pg.psql(&rows), "1");
    let said = key_sync(b.dir.path(), false);
    assert!(
        said.contains("retired acme-rollout") && said.contains(&id),
        "{said}"
    );
    assert_eq!(pg.psql(&rows), "0");
    assert_eq!(pg.psql(&revoked), "1");
    for gw in [&a, &b] {
        wait_until(Duration::from_secs(2), || lookup(gw, &secret) == 401);
    }
    wait_until(Duration::from_secs(2), || lookup(&a, ROLLOUT) == 401);
    assert_eq!(lookup(&a, ACME), 200);
    // Applying the first gateway's file (which holds it) brings the operator key back there,
    // not what it made.
    let said = key_sync(a.dir.path(), false);
    assert!(said.contains("acme-rollout: retired before"), "{said}");
    wait_until(Duration::from_secs(2), || lookup(&a, ROLLOUT) == 200);
    assert_eq!((lookup(&a, &secret), lookup(&b, ROLLOUT)), (401, 401));
}

const OPS: &str = "drg_control_ops_key_ccccccccccccccccccccccccccccccccc";

/// An operator key that made nothing is retired too once a keys file that lacks it is applied
/// (issue 93: the store knew a maker only by the keys it made, so a removed key that had made
/// none stayed in service on every gateway whose file still held it; `key sync` said "nothing
/// to change"). The first sync records the file's operator keys; the second, from a gateway
/// whose file lacks `acme-ops`, retires it, audited, and the gateway whose file still holds it
/// refuses it within a read of the store. Applying a file that holds it brings it back.
#[test]
fn an_operator_key_that_made_nothing_is_retired_when_a_file_without_it_is_applied() {
    let pg = Postgres::start();
    let a = builder(&pg)
        .key_in_project("acme-ops", OPS, "team", "acme")
        .start();
    let b = builder(&pg).start();
    assert_eq!(lookup(&a, OPS), 200);
    let said = key_sync(a.dir.path(), false);
    assert!(said.contains("nothing to change"), "{said}");
    assert_eq!(
        pg.psql("SELECT count(*) FROM drg_applied_keys WHERE id = 'acme-ops' AND project = 'acme'"),
        "1"
    );
    let said = key_sync(b.dir.path(), true);
    assert!(said.contains("retired acme-ops: it made no key"), "{said}");
    assert_eq!(lookup(&a, OPS), 200, "a dry run writes nothing");
    let said = key_sync(b.dir.path(), false);
    assert!(said.contains("retired acme-ops: it made no key"), "{said}");
    assert_eq!(
        pg.psql(
            "SELECT count(*) FROM drg_audit WHERE action = 'key.revoked' AND target = 'acme-ops' \
             AND key_id = 'key sync' AND project = 'acme'"
        ),
        "1"
    );
    wait_until(Duration::from_secs(2), || lookup(&a, OPS) == 401);
    assert_eq!(lookup(&a, ACME), 200);
    // A second sync of the same file retires nothing more, audits nothing more.
    let said = key_sync(b.dir.path(), false);
    assert!(said.contains("nothing to change"), "{said}");
    let said = key_sync(a.dir.path(), false);
    assert!(said.contains("acme-ops: retired before"), "{said}");
    wait_until(Duration::from_secs(2), || lookup(&a, OPS) == 200);
}

#[test]
fn a_commit_slow_to_answer_is_settled_by_the_database_never_taken_for_a_refusal() {
    let pg = Postgres::start();
    // The gateways' commits wait on a synchronous standby, as on a primary that replicates so.
    pg.psql("ALTER ROLE drg SET synchronous_commit = on");
    let (a, b) = (builder(&pg).start(), builder(&pg).start());
    assert_eq!(put(&a, "early.example", "block").status, 201);
    let standby = |names: &str| {
        pg.psql(&format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
        ));
        pg.psql("SELECT pg_reload_conf()");
        std::thread::sleep(Duration::from_millis(300));
    };
    let make_key = |label: &str| {
        let body = json!({ "label": label }).to_string();
        send(
            &a,
            "POST",
            "/v1/keys",
            Some(ACME),
            &[],
            Some(body.as_bytes()),
        )
    };
    let keys = "SELECT count(*) FROM drg_keys";
    // The standby gone: a COMMIT is made here, then waits, its rows not yet shown. Committed:
    // `201` (a timeout answered `503`, and it landed anyway).
    standby("gone");
    let slow = put(&a, "slow.example", "block");
    assert_eq!(slow.status, 201, "{}\n{}", slow.text(), a.log());
    // Writes behind it (its row lock, the lock its `NOTIFY` holds to the end of its commit)
    // cannot commit by their deadline: `503`, and they never land.
    let blocked = put(&b, "blocked.example", "block");
    assert_eq!(blocked.status, 503, "{}", blocked.text());
    let behind = make_key("behind");
    assert_eq!(behind.status, 503, "{}\n{}", behind.text(), a.log());
    // The standby requirement lifted: what was answered `201` is in force on both gateways,
    // listed and audited; what was answered `503` is not, then or later.
    standby("");
    until_listed(&b, &["early.example", "slow.example"]);
    std::thread::sleep(Duration::from_secs(1));
    for gw in [&a, &b] {
        assert_eq!(overrides(gw), ["early.example", "slow.example"]);
    }
    assert_eq!(pg.psql(keys), "0");
    assert_eq!(
        pg.psql(
            "SELECT count(*) FROM drg_audit WHERE target IN ('slow.example', 'blocked.example')"
        ),
        "1"
    );
    // A key made while the standby is gone: `201` with its secret, working once shown.
    standby("gone");
    let made = make_key("slow");
    assert_eq!(made.status, 201, "{}\n{}", made.text(), a.log());
    let secret = made.json()["key"].as_str().unwrap().to_owned();
    standby("");
    wait_until(Duration::from_secs(2), || lookup(&b, &secret) == 200);
    assert_eq!(pg.psql(keys), "1");
    assert!(
        a.log().contains("asking the database what came of it"),
        "{}",
        a.log()
    );
}

#[test]
fn a_gateway_paused_across_a_restore_whose_counter_climbs_back_sees_it() {
    use crate::keys_api::{made_by, revoke};
    let pg = Postgres::start();
    let (a, b) = (builder(&pg).start(), builder(&pg).start());
    assert_eq!(put(&a, "kept.example", "block").status, 201);
    let (old_id, old) = made_by(&a, ACME, "old");
    until_listed(&b, &["kept.example"]);
    wait_until(Duration::from_secs(2), || lookup(&b, &old) == 200);
    // The backup: every table the gateways read, as it is now.
    let tables = [
        "drg_records",
        "drg_keys",
        "drg_revision",
        "drg_revision_log",
    ];
    back_up(&pg, &tables);
    // Writes the backup lacks, held by both gateways.
    assert_eq!(put(&a, "lost1.example", "block").status, 201);
    assert_eq!(put(&a, "lost2.example", "block").status, 201);
    let (_, lost) = made_by(&a, ACME, "lost");
    until_listed(&b, &["kept.example", "lost1.example", "lost2.example"]);
    wait_until(Duration::from_secs(2), || lookup(&b, &lost) == 200);
    // The second gateway paused; the database restored; the first gateway's writes bring each
    // counter back to the number the paused one holds.
    b.signal("STOP");
    restore(&pg, &tables);
    until_listed(&a, &["kept.example"]);
    assert_eq!(put(&a, "new1.example", "block").status, 201);
    assert_eq!(put(&a, "new2.example", "block").status, 201);
    assert_eq!(revoke(&a, ACME, &old_id).status, 204);
    b.signal("CONT");
    // Once it runs again it serves what the database holds: the overrides the restore and the
    // writes after it made, neither key (the database lacks one, the other was revoked after
    // the restore), and it says the store went back, in its log and on `/readyz`.
    let seen = until_listed(&b, &["kept.example", "new1.example", "new2.example"]);
    assert!(seen < Duration::from_secs(3), "{seen:?}");
    wait_until(Duration::from_secs(3), || lookup(&b, &lost) == 401);
    assert_eq!(lookup(&b, &old), 401);
    assert!(
        b.log().contains("went back") && b.log().contains("through another history"),
        "{}",
        b.log()
    );
    let told = b.admin_get("/readyz").json()["control_store"]["went_back"].clone();
    let kinds: Vec<&str> = (told.as_array().unwrap().iter())
        .map(|w| w["kind"].as_str().unwrap())
        .collect();
    assert!(
        kinds.contains(&"overrides") && kinds.contains(&"keys"),
        "{told}"
    );
}

#[test]
fn a_gateway_started_while_the_database_is_away_answers_503_for_its_lists_never_an_empty_one() {
    let pg = Postgres::start();
    let gw = builder(&pg).start();
    assert_eq!(put(&gw, "kept.example", "block").status, 201);
    make_webhook(&gw);
    let dir = gw.stop();
    pg.stop();
    let gw = builder(&pg).in_dir(dir).start();
    // The project has an override and a webhook: an empty list would say it has none.
    for path in ["/v1/overrides", "/v1/webhooks", "/v1/reports"] {
        let r = send(&gw, "GET", path, Some(ACME), &[], None);
        assert_eq!(r.status, 503, "{path}: {}", r.text());
        assert_eq!(r.json()["error"], "service_unavailable", "{path}");
    }
    pg.restart();
    let status = |path: &str| send(&gw, "GET", path, Some(ACME), &[], None).status;
    wait_until(Duration::from_secs(5), || status("/v1/overrides") == 200);
    until_listed(&gw, &["kept.example"]);
    // Each list answers from the store once its own read succeeds: the webhooks' may come a
    // moment after the overrides' (a fresh clone's run saw a 503 there, never an empty list).
    wait_until(Duration::from_secs(5), || status("/v1/webhooks") == 200);
    let hooks = send(&gw, "GET", "/v1/webhooks", Some(ACME), &[], None);
    assert_eq!(
        hooks.json()["items"].as_array().map(Vec::len),
        Some(1),
        "{}",
        hooks.text()
    );
}

#[test]
fn a_gateway_started_while_the_database_is_away_trusts_its_key_cache_only_within_its_bound() {
    use crate::keys_api::{made_by, revoke};
    let pg = Postgres::start();
    let bounded = || builder(&pg).gateway_yaml("keys_api: { unverified_after_seconds: 60 }");
    let gw = bounded().start();
    let (id, made) = made_by(&gw, ACME, "cached");
    let dir = gw.stop();
    // Revoked through another gateway while this one is stopped; then the database goes away.
    let other = bounded().start();
    wait_until(Duration::from_secs(2), || lookup(&other, &made) == 200);
    assert_eq!(revoke(&other, ACME, &id).status, 204);
    drop(other.stop());
    pg.stop();
    // Its cache was read from the store within the bound: a start serves it (the revocation is
    // not known here, and cannot be, until the store answers).
    let cache = dir.path().join("state/keys.control-cache.json");
    let gw = bounded().in_dir(dir).start();
    assert_eq!(lookup(&gw, &made), 200);
    let dir = gw.stop();
    // A cache older than the bound (a state folder from before the revocation): the API-made
    // key answers `503`, never `200`; operator keys work.
    let mut file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cache).unwrap()).unwrap();
    let read_at = file["read_at"]
        .as_i64()
        .expect("the cache says when the store answered");
    file["read_at"] = json!(read_at - 3_600);
    std::fs::write(&cache, file.to_string()).unwrap();
    let gw = bounded().in_dir(dir).start();
    assert_eq!(lookup(&gw, &made), 503);
    assert_eq!(lookup(&gw, ACME), 200);
    // The store back: the revocation holds.
    pg.restart();
    wait_until(Duration::from_secs(5), || lookup(&gw, &made) == 401);
}

#[test]
fn a_key_seen_revoked_stays_refused_when_a_restore_brings_it_back_and_is_named_to_revoke_again() {
    use crate::keys_api::{made_by, revoke};
    let pg = Postgres::start();
    let (a, b) = (builder(&pg).start(), builder(&pg).start());
    let (id, secret) = made_by(&a, ACME, "revoked-later");
    wait_until(Duration::from_secs(2), || lookup(&b, &secret) == 200);
    let tables = ["drg_keys", "drg_revision", "drg_revision_log"];
    back_up(&pg, &tables);
    assert_eq!(revoke(&a, ACME, &id).status, 204);
    wait_until(Duration::from_secs(2), || lookup(&b, &secret) == 401);
    // Restored from before the revocation: the key is in the store again.
    restore(&pg, &tables);
    let again = format!("domain-risk-gateway key revoke {id}");
    for gw in [&a, &b] {
        wait_until(Duration::from_secs(3), || {
            let told = gw.admin_get("/readyz").json()["control_store"]["went_back"].clone();
            told.to_string().contains(&again)
        });
        assert_eq!(lookup(gw, &secret), 401, "seen revoked, refused");
        assert!(gw.log().contains(&again), "{}", gw.log());
    }
    // A gateway that never saw the revocation serves what the store holds: the command named
    // revokes it there too, audited.
    let c = builder(&pg).start();
    wait_until(Duration::from_secs(2), || lookup(&c, &secret) == 200);
    let conf = c.dir.path().join("gateway.yaml");
    let said = run_ok(&["-c", conf.to_str().unwrap(), "key", "revoke", &id]);
    assert!(said.contains(&id), "{said}");
    wait_until(Duration::from_secs(2), || lookup(&c, &secret) == 401);
    assert_eq!(
        pg.psql(&format!(
            "SELECT count(*) FROM drg_audit WHERE target = '{id}' AND key_id = 'key revoke'"
        )),
        "1"
    );
}
