//! Keys that expire, against the real binary: `expires_in_days` checked, listed and enforced on
//! the gateway's clock (a key never makes a key that outlives it; a key manages only itself and
//! the keys it made, and a rotation hands them to the successor);
//! `POST /v1/keys/{id}/rotate` makes a successor in the old key's place and keeps the old key
//! working for the overlap, then `401` with a `detail` naming when; who may rotate what;
//! `max_keys` one over while the old key is there; and with two gateways on one PostgreSQL, a
//! key rotated on one keeps working for the overlap on both and then answers `401` on both,
//! and two gateways rotating one key at once make one successor.

use crate::common;
use crate::keys_api::{lookup, made_by, revoke};
use crate::postgres::Postgres;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const SERVER: &str = "drg_acme_server_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const OTHER: &str = "drg_acme_other_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const SOLO: &str = "drg_solo_key_cccccccccccccccccccccccccccccccccccccccc";
const BROWSER: &str = "drg_browser_key_dddddddddddddddddddddddddddddddddddd";
const CLOCK: &str = drg_gateway::server::CLOCK_START_ENV;
/// Generous: a poll is 200 ms, but the machine may be loaded.
const WITHIN: Duration = Duration::from_secs(20);

/// Project `acme` on `team` (4 keys) holds two operator keys; `solo` and `browser` are projects
/// of their own.
fn builder() -> GatewayBuilder {
    Gateway::builder()
        .plan_yaml("team", "{ monthly_limit: 1000, max_keys: 4 }")
        .key_in_project("server", SERVER, "team", "acme")
        .key_in_project("other", OTHER, "team", "acme")
        .key("solo", SOLO, "team", &[])
        .key("browser", BROWSER, "team", &["https://app.example"])
}

fn post(gw: &Gateway, secret: &str, path: &str, body: Option<Value>) -> Response {
    let body = body.map(|b| b.to_string());
    send(
        gw,
        "POST",
        path,
        Some(secret),
        &[],
        body.as_deref().map(str::as_bytes),
    )
}

/// `POST /v1/keys/{id}/rotate` with the server key and this body.
fn rotate(gw: &Gateway, id: &str, body: Option<Value>) -> Response {
    post(gw, SERVER, &format!("/v1/keys/{id}/rotate"), body)
}

/// A `201` rotation's successor: its id and secret.
fn successor(r: &Response) -> (String, String) {
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    (
        v["id"].as_str().unwrap().to_owned(),
        v["key"].as_str().unwrap().to_owned(),
    )
}

fn item(gw: &Gateway, id: &str) -> Value {
    let r = send(gw, "GET", "/v1/keys", Some(SERVER), &[], None);
    assert_eq!(r.status, 200);
    r.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("{id} is not listed"))
}

/// Asserts the lookup with `secret` is the `401` of an expired key, and returns its detail.
fn expired(gw: &Gateway, secret: &str) -> String {
    let r = send(
        gw,
        "GET",
        "/v1/public/domain/example.org",
        Some(secret),
        &[],
        None,
    );
    let detail = r.assert_error(401, "unauthorized");
    assert!(
        r.header("www-authenticate")
            .is_some_and(|h| h.contains("invalid_token")),
        "{:?}",
        r.headers
    );
    let detail = detail.as_str().unwrap().to_owned();
    assert!(detail.starts_with("this API key expired at 20"), "{detail}");
    assert!(detail.ends_with('Z'), "{detail}");
    detail
}

fn at(rfc3339: &str) -> chrono::DateTime<chrono::Utc> {
    rfc3339.parse().unwrap()
}

#[test]
fn expires_in_days_is_checked_listed_and_enforced_on_the_gateways_clock() {
    let gw = builder().env(CLOCK, "2026-01-01T00:00:00Z").start();
    for bad in [json!(0), json!(3651), json!(1.5), json!("7"), json!(-1)] {
        post(
            &gw,
            SERVER,
            "/v1/keys",
            Some(json!({ "expires_in_days": bad })),
        )
        .assert_invalid(
            "expires_in_days must be a whole number from 1 to 3650",
            "{bad}",
        );
    }
    let made = post(
        &gw,
        SERVER,
        "/v1/keys",
        Some(json!({"label": "a day", "expires_in_days": 1})),
    );
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.body));
    let made = made.json();
    let (id, secret) = (made["id"].as_str().unwrap(), made["key"].as_str().unwrap());
    let (created, expires) = (
        at(made["created_at"].as_str().unwrap()),
        at(made["expires_at"].as_str().unwrap()),
    );
    assert!(
        created < at("2026-01-01T00:10:00Z"),
        "the gateway's clock: {made}"
    );
    assert_eq!(expires - created, chrono::Duration::days(1), "{made}");
    assert_eq!(made["rotated_to"], Value::Null);
    assert_eq!(item(&gw, id)["expires_at"], made["expires_at"]);
    let forever = item(&gw, "server");
    assert_eq!(forever["expires_at"], Value::Null, "{forever}");
    assert_eq!(forever["rotated_to"], Value::Null, "{forever}");
    assert_eq!(lookup(&gw, secret), 200);
    // A key it makes lives no longer than it (issue 79: a key never makes a key that
    // outlives it): with no `expires_in_days` it inherits the end; asked for longer, 422.
    let (_, child) = made_by(&gw, secret, "child");
    post(
        &gw,
        secret,
        "/v1/keys",
        Some(json!({"label": "longer", "expires_in_days": 2})),
    )
    .assert_error(422, "validation_error");

    // A day and a minute later (the same state folder): refused, with the time it expired.
    let dir = gw.stop();
    let gw = builder()
        .env(CLOCK, "2026-01-02T00:01:00Z")
        .in_dir(dir)
        .start();
    let detail = expired(&gw, secret);
    assert_eq!(
        detail,
        format!(
            "this API key expired at {}",
            made["expires_at"].as_str().unwrap()
        )
    );
    assert_eq!(lookup(&gw, &child), 401, "what it made ended with it");
    assert_eq!(lookup(&gw, SERVER), 200);
    assert_eq!(
        item(&gw, id)["expires_at"],
        made["expires_at"],
        "still listed"
    );
    // Deleted like any key.
    assert_eq!(revoke(&gw, SERVER, id).status, 204);
    let listed = send(&gw, "GET", "/v1/keys", Some(SERVER), &[], None).json();
    let ids: Vec<&str> = (listed["items"].as_array().unwrap().iter())
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert!(!ids.contains(&id), "revoked, with what it made: {ids:?}");
}

#[test]
fn a_rotation_makes_the_successor_in_the_old_keys_place_and_no_overlap_refuses_the_old_key_at_once()
{
    let gw = builder().start();
    let (parent, parent_secret) = made_by(&gw, SERVER, "parent");
    let r = post(
        &gw,
        &parent_secret,
        "/v1/keys",
        Some(json!({"label": "ci", "expires_in_days": 30})),
    );
    let (old, old_secret) = successor(&r);

    let r = rotate(&gw, &old, Some(json!({"overlap_hours": 0})));
    let (new, new_secret) = successor(&r);
    let v = r.json();
    assert_eq!(v["label"], "ci");
    assert_eq!(v["source"], "api");
    assert_eq!(
        v["created_by"],
        parent.as_str(),
        "the old key's maker, not the caller"
    );
    assert_eq!(v["previous"]["id"], old.as_str());
    let previous_end = at(v["previous"]["expires_at"].as_str().unwrap());
    assert!(previous_end <= chrono::Utc::now(), "{v}");
    let lifetime = at(v["expires_at"].as_str().unwrap()) - at(v["created_at"].as_str().unwrap());
    assert_eq!(
        lifetime,
        chrono::Duration::days(30),
        "the old key's lifetime again: {v}"
    );
    assert_eq!(v["key_prefix"], &new_secret[..12]);

    let detail = expired(&gw, &old_secret);
    assert!(
        detail.ends_with(v["previous"]["expires_at"].as_str().unwrap()),
        "{detail}"
    );
    assert_eq!(lookup(&gw, &new_secret), 200);
    let listed = item(&gw, &old);
    assert_eq!(listed["rotated_to"], new.as_str(), "{listed}");
    assert_eq!(listed["expires_at"], v["previous"]["expires_at"]);
    // Expired: not rotated again (its successor would bring it back).
    let again = rotate(&gw, &old, None);
    let d = again.assert_error(409, "conflict");
    assert!(d.as_str().unwrap().starts_with("expired at "), "{d}");
    // Deleting the old key leaves its successor: it is not what the old key made.
    assert_eq!(revoke(&gw, SERVER, &old).status, 204);
    assert_eq!(lookup(&gw, &new_secret), 200);
    // Revoking their maker takes both lines.
    assert_eq!(revoke(&gw, SERVER, &parent).status, 204);
    assert_eq!(lookup(&gw, &new_secret), 401);
}

#[test]
fn a_rotated_key_works_for_its_overlap_and_then_answers_401() {
    let gw = builder().start();
    let (old, old_secret) = made_by(&gw, SERVER, "rotated");
    // A key may rotate itself; 0.001 h is 3.6 s (to the second).
    let started = Instant::now();
    let r = post(
        &gw,
        &old_secret,
        &format!("/v1/keys/{old}/rotate"),
        Some(json!({"overlap_hours": 0.001})),
    );
    let (new, new_secret) = successor(&r);
    let end = at(r.json()["previous"]["expires_at"].as_str().unwrap());
    assert_eq!(lookup(&gw, &old_secret), 200, "in its overlap");
    assert_eq!(lookup(&gw, &new_secret), 200);
    // Rotated already, its successor there: 409 naming it.
    let d = rotate(&gw, &old, None).assert_error(409, "conflict");
    assert_eq!(d, format!("rotated_to: {new}"));
    wait_until(Duration::from_secs(10), || lookup(&gw, &old_secret) == 401);
    let took = started.elapsed();
    assert!(chrono::Utc::now() >= end, "not before {end}");
    assert!(
        took >= Duration::from_millis(2_500),
        "the overlap held: {took:?}"
    );
    expired(&gw, &old_secret);
    assert_eq!(lookup(&gw, &new_secret), 200);
    // With no body: the configured overlap (24 h by default).
    let r = rotate(&gw, &new, None);
    successor(&r);
    let end = at(r.json()["previous"]["expires_at"].as_str().unwrap());
    let hours = (end - chrono::Utc::now()).num_minutes() as f64 / 60.0;
    assert!((23.9..=24.0).contains(&hours), "{hours}");
    assert_eq!(lookup(&gw, &new_secret), 200);
}

#[test]
fn only_the_projects_own_api_made_keys_are_rotated_and_max_keys_lets_one_successor_over() {
    let gw = builder().start();
    // acme: 2 operator keys of 4.
    let (a, _) = made_by(&gw, SERVER, "a");
    let (_, _) = made_by(&gw, SERVER, "b");
    rotate(&gw, "other", None).assert_error(403, "forbidden");
    rotate(&gw, "solo", None).assert_error(404, "not_found");
    rotate(&gw, "key_000000000000", None).assert_error(404, "not_found");
    rotate(&gw, "bad%20id", None).assert_error(404, "not_found");
    let (solo_key, _) = made_by(&gw, SOLO, "solo's");
    rotate(&gw, &solo_key, None).assert_error(404, "not_found");
    let browser = send(
        &gw,
        "POST",
        &format!("/v1/keys/{a}/rotate"),
        Some(BROWSER),
        &[("Origin", "https://app.example")],
        None,
    );
    assert_eq!(
        browser.assert_error(403, "forbidden"),
        "POST /v1/keys/{id}/rotate"
    );
    for (body, code) in [
        ("{\"overlap_hours\": 721}", 422),
        ("{\"overlap_hours\": -1}", 422),
        ("{\"overlap_hours\": \"1\"}", 422),
        ("[1]", 400),
        ("{", 400),
    ] {
        let r = send(
            &gw,
            "POST",
            &format!("/v1/keys/{a}/rotate"),
            Some(SERVER),
            &[],
            Some(body.as_bytes()),
        );
        assert_eq!(
            r.status,
            code,
            "{body}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    let r = send(
        &gw,
        "GET",
        &format!("/v1/keys/{a}/rotate"),
        Some(SERVER),
        &[],
        None,
    );
    assert_eq!((r.status, r.header("allow")), (405, Some("POST, OPTIONS")));

    // At max_keys (4): the successor is allowed while the old key is there, once.
    post(&gw, SERVER, "/v1/keys", None).assert_error(409, "conflict");
    let (a2, _) = successor(&rotate(&gw, &a, Some(json!({"overlap_hours": 1}))));
    let d = rotate(&gw, &a2, None).assert_error(409, "conflict");
    assert_eq!(d, "max_keys: 4");
    // Once the old key is deleted, the next rotation is.
    assert_eq!(revoke(&gw, SERVER, &a).status, 204);
    successor(&rotate(&gw, &a2, Some(json!({"overlap_hours": 0}))));
}

/// A gateway whose control store is `pg`.
fn on_postgres(pg: &Postgres) -> GatewayBuilder {
    builder().gateway_yaml(&format!("control: {{ url: '{}' }}", pg.url()))
}

/// A PostgreSQL, two gateways on it, and a key made on the first that the second takes: its
/// id and secret.
fn two_gateways_and_a_key() -> (Postgres, [Gateway; 2], String, String) {
    let pg = Postgres::start();
    let gws = [on_postgres(&pg).start(), on_postgres(&pg).start()];
    let (id, secret) = made_by(&gws[0], SERVER, "shared");
    wait_until(WITHIN, || lookup(&gws[1], &secret) == 200);
    (pg, gws, id, secret)
}

#[test]
fn a_key_rotated_on_one_gateway_works_for_the_overlap_on_both_then_answers_401_on_both() {
    let (pg, [a, b], old, old_secret) = two_gateways_and_a_key();

    // 0.002 h: 7.2 s of overlap (at least 6.2 s, to the second): time for B to see the successor.
    let r = rotate(&a, &old, Some(json!({"overlap_hours": 0.002})));
    let (new, new_secret) = successor(&r);
    let end = at(r.json()["previous"]["expires_at"].as_str().unwrap());
    assert_eq!(lookup(&a, &new_secret), 200, "at once where it was rotated");
    wait_until(WITHIN, || lookup(&b, &new_secret) == 200);
    // B read the rotated row within the overlap: both still take the old key.
    assert_eq!(item(&b, &old)["rotated_to"], new.as_str());
    for gw in [&a, &b] {
        assert_eq!(lookup(gw, &old_secret), 200, "in its overlap");
    }
    for gw in [&a, &b] {
        wait_until(Duration::from_secs(15), || lookup(gw, &old_secret) == 401);
        assert!(chrono::Utc::now() >= end, "not before {end}");
        let detail = expired(gw, &old_secret);
        assert_eq!(
            detail,
            format!(
                "this API key expired at {}",
                item(gw, &old)["expires_at"].as_str().unwrap()
            )
        );
        assert_eq!(lookup(gw, &new_secret), 200);
    }
    let row = pg.psql(&format!("SELECT body FROM drg_keys WHERE id = '{old}'"));
    let row: Value = serde_json::from_str(row.trim()).unwrap();
    assert_eq!(row["rotated_to"], new.as_str(), "{row}");
}

#[test]
fn two_gateways_rotating_one_key_at_once_make_one_successor() {
    let (pg, [a, b], old, old_secret) = two_gateways_and_a_key();
    let answers: Vec<Response> = std::thread::scope(|s| {
        let handles: Vec<_> = [&a, &b, &a, &b]
            .into_iter()
            .map(|gw| s.spawn(|| rotate(gw, &old, Some(json!({"overlap_hours": 1})))))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count(),
        3,
        "{statuses:?}"
    );
    // acme: 2 operator keys, the old one and its successor.
    let held = pg.psql("SELECT count(*) FROM drg_keys WHERE project = 'acme'");
    assert_eq!(held.trim(), "2");
    assert_eq!(lookup(&b, &old_secret), 200, "in its overlap");
}

/// A key's lineage (issue 79): a 1-day child can neither rotate nor revoke its parent (`403`)
/// nor make a key that outlives it; after a rotation, deleting the old key keeps the keys it
/// made (handed to the successor). On SQLite, then on PostgreSQL.
fn a_key_stays_inside_its_lineage(gw: &Gateway) {
    let (parent, parent_secret) = made_by(gw, SERVER, "parent");
    let r = post(
        gw,
        &parent_secret,
        "/v1/keys",
        Some(json!({"label": "a day", "expires_in_days": 1})),
    );
    let (child, child_secret) = successor(&r);
    let child_end = r.json()["expires_at"].as_str().unwrap().to_owned();
    // Up the lineage, or beside it: refused, nothing changed.
    post(
        gw,
        &child_secret,
        &format!("/v1/keys/{parent}/rotate"),
        None,
    )
    .assert_error(403, "forbidden");
    let del = send(
        gw,
        "DELETE",
        &format!("/v1/keys/{parent}"),
        Some(&child_secret),
        &[],
        None,
    );
    del.assert_error(403, "forbidden");
    let (sibling, _) = made_by(gw, &parent_secret, "sibling");
    post(
        gw,
        &child_secret,
        &format!("/v1/keys/{sibling}/rotate"),
        None,
    )
    .assert_error(403, "forbidden");
    assert_eq!(lookup(gw, &parent_secret), 200);
    // No key that outlives it: asked for longer, 422; asked for nothing, its own end.
    post(
        gw,
        &child_secret,
        "/v1/keys",
        Some(json!({"expires_in_days": 3650})),
    )
    .assert_error(422, "validation_error");
    let r = post(gw, &child_secret, "/v1/keys", Some(json!({"label": "g"})));
    let (grandchild, _) = successor(&r);
    assert_eq!(r.json()["expires_at"], child_end.as_str(), "inherited");
    // Down the lineage: the parent manages what its child made.
    assert_eq!(revoke(gw, &parent_secret, &grandchild).status, 204);

    // A rotation hands the old key's children to the successor: deleting the old key after
    // the overlap keeps them.
    let r = post(
        gw,
        &parent_secret,
        &format!("/v1/keys/{parent}/rotate"),
        Some(json!({"overlap_hours": 0})),
    );
    let (next, next_secret) = successor(&r);
    assert_eq!(item(gw, &child)["created_by"], next.as_str());
    assert_eq!(revoke(gw, SERVER, &parent).status, 204);
    assert_eq!(
        lookup(gw, &child_secret),
        200,
        "the child outlives the old key"
    );
    assert_eq!(lookup(gw, &next_secret), 200);
    // Revoking the successor takes them along, as it would have the old key.
    assert_eq!(revoke(gw, SERVER, &next).status, 204);
    assert_eq!(lookup(gw, &child_secret), 401);
    let _ = sibling;
}

#[test]
fn a_key_stays_inside_its_lineage_on_sqlite() {
    a_key_stays_inside_its_lineage(&roomy().start());
}

/// [`builder`] with room for a lineage of keys.
fn roomy() -> GatewayBuilder {
    builder().plan_yaml("team", "{ monthly_limit: 1000, max_keys: 10 }")
}

#[test]
fn a_key_stays_inside_its_lineage_on_postgres() {
    let pg = Postgres::start();
    let control = format!("control: {{ url: '{}' }}", pg.url());
    a_key_stays_inside_its_lineage(&roomy().gateway_yaml(&control).start());
}
