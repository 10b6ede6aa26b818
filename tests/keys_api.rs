//! `/v1/keys` against the real binary: listing, making keys within `max_keys` (the secret shown
//! once, live at once), revoking (at once here, within a poll on a gateway sharing the managed
//! file), refusing foreign ids, operator keys and self-revocation, hostile bodies, a restart,
//! and the switch that turns it off.

use crate::common;

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use serde_json::Value;

const SERVER: &str = "drg_acme_server_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const OTHER: &str = "drg_acme_other_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const SOLO: &str = "drg_solo_key_cccccccccccccccccccccccccccccccccccccccc";
const BROWSER: &str = "drg_browser_key_dddddddddddddddddddddddddddddddddddd";
const LOOKUP: &str = "/v1/public/domain/example.org";

/// Project `acme` on `starter` (5 keys) holds two operator keys; `solo` and `browser` are
/// projects of their own.
fn builder() -> GatewayBuilder {
    Gateway::builder()
        .plan("starter", 1_000)
        .key_in_project("server", SERVER, "starter", "acme")
        .key_in_project("other", OTHER, "starter", "acme")
        .key("solo", SOLO, "starter", &[])
        .key("browser", BROWSER, "starter", &["https://app.example"])
}

fn list(gw: &Gateway, secret: &str) -> Value {
    let r = send(gw, "GET", "/v1/keys", Some(secret), &[], None);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

fn ids(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect()
}

pub(crate) fn create(gw: &Gateway, secret: &str, label: &str) -> Response {
    let body = serde_json::json!({ "label": label }).to_string();
    send(
        gw,
        "POST",
        "/v1/keys",
        Some(secret),
        &[],
        Some(body.as_bytes()),
    )
}

/// The key `id` as `GET /v1/keys` lists it.
fn listed_item(gw: &Gateway, id: &Value) -> Value {
    let listed = list(gw, SERVER);
    listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == *id)
        .cloned()
        .unwrap()
}

/// `POST /v1/keys` with the server key and this body.
fn post_body(gw: &Gateway, body: &str) -> Response {
    send(
        gw,
        "POST",
        "/v1/keys",
        Some(SERVER),
        &[],
        Some(body.as_bytes()),
    )
}

pub(crate) fn revoke(gw: &Gateway, secret: &str, id: &str) -> Response {
    send(
        gw,
        "DELETE",
        &format!("/v1/keys/{id}"),
        Some(secret),
        &[],
        None,
    )
}

pub(crate) fn lookup(gw: &Gateway, secret: &str) -> u16 {
    send(gw, "GET", LOOKUP, Some(secret), &[], None).status
}

fn month_count(gw: &Gateway, secret: &str) -> u64 {
    send(gw, "GET", "/v1/usage", Some(secret), &[], None).json()["month_count"]
        .as_u64()
        .unwrap()
}

/// The cache of the control store's keys in `gw`'s state folder.
fn cache_file(gw: &Gateway) -> std::path::PathBuf {
    gw.dir.path().join("state/keys.control-cache.json")
}

/// The key cache of the state folder `state` as one JSON document: the file, with `keys`
/// gathered from its key files (`<cache>.keys/NN.json`, as many as it names); none while
/// it does not read.
pub(crate) fn read_cache(state: &std::path::Path) -> Option<Value> {
    let read = |path: std::path::PathBuf| -> Option<Value> {
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    };
    let mut cache = read(state.join("keys.control-cache.json"))?;
    let mut keys = Vec::new();
    for shard in 0..cache["key_files"].as_u64()? {
        let file = state.join(format!("keys.control-cache.json.keys/{shard:02}.json"));
        keys.extend(read(file)?.as_array()?.iter().cloned());
    }
    cache["keys"] = Value::Array(keys);
    Some(cache)
}

/// `(id, body)` of every API-made key `gw`'s control store (its state folder's SQLite) holds.
pub(crate) fn stored_keys(gw: &Gateway) -> Vec<(String, String)> {
    let db = rusqlite::Connection::open(gw.dir.path().join("state/control.sqlite")).unwrap();
    let mut stmt = db
        .prepare("SELECT id, body FROM drg_keys ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

#[test]
fn keys_are_listed_made_within_max_keys_shown_once_and_revoked_at_once() {
    let gw = builder().start();
    assert_eq!(lookup(&gw, SERVER), 200);
    let before = month_count(&gw, SERVER);

    let listed = list(&gw, SERVER);
    assert_eq!(ids(&listed), ["other", "server"], "{listed}");
    let server = &listed["items"][1];
    let fields: Vec<&str> = server
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        fields,
        [
            "created_at",
            "created_by",
            "expires_at",
            "id",
            "key_prefix",
            "label",
            "last_used_at",
            "origins",
            "rotated_to",
            "source"
        ]
    );
    assert_eq!(server["source"], "operator");
    assert_eq!(server["key_prefix"], &SERVER[..12]);
    assert_eq!(server["origins"], serde_json::json!([]));
    assert!(server["last_used_at"].as_str().is_some(), "{server}");
    assert_eq!(
        listed["items"][0]["last_used_at"],
        Value::Null,
        "other: never used"
    );

    // A new key: 201, the secret once, live at once, in the project's count.
    let made = create(&gw, SERVER, "CI");
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.body));
    let made = made.json();
    let secret = made["key"].as_str().unwrap().to_owned();
    let id = made["id"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("drg_") && secret.len() > 40, "{made}");
    assert_eq!(made["key_prefix"], &secret[..12]);
    assert_eq!(made["label"], "CI");
    assert_eq!(made["last_used_at"], Value::Null);
    assert_eq!(made["source"], "api");
    assert!(made["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(lookup(&gw, &secret), 200, "the new key works at once");
    assert_eq!(
        month_count(&gw, &secret),
        before + 1,
        "one count for the project"
    );

    // Never shown again: not in the list, not in the store or its cache (only its hash).
    let again = send(&gw, "GET", "/v1/keys", Some(SERVER), &[], None);
    let text = String::from_utf8_lossy(&again.body).into_owned();
    assert!(!text.contains(&secret[12..]), "{text}");
    assert!(ids(&again.json()).contains(&id));
    let item = again.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == id.as_str())
        .cloned()
        .unwrap();
    assert!(item.get("key").is_none(), "{item}");
    assert!(item["last_used_at"].as_str().is_some(), "{item}");
    // The cache is written behind the change, a moment later.
    let cached = || {
        let state = gw.dir.path().join("state");
        read_cache(&state)
            .map(|c| c.to_string())
            .unwrap_or_default()
    };
    wait_until(Duration::from_secs(5), || {
        cached().contains(&hex_sha256(&secret))
    });
    assert!(!cached().contains(&secret[12..]));
    let stored = stored_keys(&gw);
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0].0, id);
    assert!(stored[0].1.contains(&hex_sha256(&secret)) && !stored[0].1.contains(&secret[12..]));
    use std::os::unix::fs::PermissionsExt;
    let shards = gw.dir.path().join("state/keys.control-cache.json.keys");
    let shard = shards.join("00.json");
    for file in [
        cache_file(&gw),
        shard,
        gw.dir.path().join("state/control.sqlite"),
    ] {
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", file.display());
    }
    let mode = std::fs::metadata(&shards).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{}", shards.display());
    let keys_yaml = std::fs::read_to_string(gw.dir.path().join("keys.yaml")).unwrap();
    assert!(
        !keys_yaml.contains(&id),
        "the operator's file is never written"
    );

    // Up to max_keys (5: two operator keys, three made), then 409.
    let extra: Vec<String> = (0..2)
        .map(|i| {
            let r = create(&gw, SERVER, &format!("k{i}"));
            assert_eq!(r.status, 201);
            r.json()["id"].as_str().unwrap().to_owned()
        })
        .collect();
    let full = create(&gw, SERVER, "one too many");
    let detail = full.assert_error(409, "conflict");
    assert_eq!(detail, "max_keys: 5");
    assert_eq!(list(&gw, SERVER)["items"].as_array().unwrap().len(), 5);

    // Revoked: refused on the very next request, and the slot is free again.
    assert_eq!(revoke(&gw, SERVER, &id).status, 204);
    assert_eq!(lookup(&gw, &secret), 401);
    assert!(!ids(&list(&gw, SERVER)).contains(&id));
    assert_eq!(create(&gw, SERVER, "again").status, 201);

    // What cannot be revoked: gone already, unknown, another project's (same answer, saying
    // nothing about other projects), an operator key, the calling key.
    let gone = revoke(&gw, SERVER, &id);
    gone.assert_error(404, "not_found");
    let unknown = revoke(&gw, SERVER, "key_000000000000");
    unknown.assert_error(404, "not_found");
    let foreign = revoke(&gw, SERVER, "solo");
    foreign.assert_error(404, "not_found");
    assert_eq!(foreign.body, unknown.body);
    assert_eq!(lookup(&gw, SOLO), 200);
    // Another project's API-made key: 404 too, and it keeps working.
    let solo_made = create(&gw, SOLO, "solo's").json();
    let solo_id = solo_made["id"].as_str().unwrap();
    revoke(&gw, SERVER, solo_id).assert_error(404, "not_found");
    assert_eq!(lookup(&gw, solo_made["key"].as_str().unwrap()), 200);
    assert!(!ids(&list(&gw, SERVER)).contains(&solo_id.to_owned()));
    revoke(&gw, SERVER, "other").assert_error(403, "forbidden");
    assert_eq!(lookup(&gw, OTHER), 200);
    revoke(&gw, SERVER, "server").assert_error(409, "conflict");
    // A key the API made may revoke another one of its project.
    let made_by = &extra[0];
    let second = create(&gw, SERVER, "x");
    assert_eq!(second.status, 409, "the project is full again");
    let r = revoke(&gw, OTHER, made_by);
    assert_eq!(r.status, 204);

    // Not counted, and counted in the metrics.
    assert_eq!(month_count(&gw, SERVER), before + 2);
    let metrics = String::from_utf8(gw.admin_get("/metrics").body).unwrap();
    assert!(
        metrics.contains("drg_keys_api_changes_total{action=\"created\"} 5"),
        "{metrics}"
    );
    assert!(metrics.contains("drg_keys_api_changes_total{action=\"revoked\"} 2"));
}

fn hex_sha256(secret: &str) -> String {
    drg_access::keys::hash_secret(secret)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn browser_keys_and_hostile_bodies_are_refused_with_json() {
    let gw = builder()
        .gateway_yaml("keys_api: { body_timeout_ms: 300 }")
        .start();
    let origin = [("Origin", "https://app.example")];
    // A browser key neither lists nor manages (tests/tenancy.rs checks every such route).
    send(&gw, "GET", "/v1/keys", Some(BROWSER), &origin, None).assert_error(403, "forbidden");
    let r = send(&gw, "POST", "/v1/keys", Some(BROWSER), &origin, Some(b"{}"));
    r.assert_error(403, "forbidden");
    send(&gw, "POST", "/v1/keys", None, &[], Some(b"{}")).assert_error(401, "unauthorized");
    for (body, status, code) in [
        (&b"{\"label\":"[..], 400, "bad_request"),
        (b"not json", 400, "bad_request"),
        (b"[]", 400, "bad_request"),
        (b"{\"label\":42}", 422, "validation_error"),
    ] {
        let r = send(&gw, "POST", "/v1/keys", Some(SERVER), &[], Some(body));
        r.assert_error(status, code);
    }
    let long = format!("{{\"label\":\"{}\"}}", "x".repeat(101));
    post_body(&gw, &long).assert_error(422, "validation_error");
    let huge = format!("{{\"label\":\"{}\"}}", "x".repeat(5_000));
    let r = send(
        &gw,
        "POST",
        "/v1/keys",
        Some(SERVER),
        &[],
        Some(huge.as_bytes()),
    );
    let detail = r.assert_error(413, "payload_too_large");
    assert!(
        detail.as_str().unwrap().contains("larger than 4096"),
        "{detail}"
    );
    let chunked = send(
        &gw,
        "POST",
        "/v1/keys",
        Some(SERVER),
        &[("Transfer-Encoding", "chunked")],
        None,
    );
    chunked.assert_error(400, "bad_request");
    // Bodies elsewhere are still refused.
    send(&gw, "POST", "/v1/usage", Some(SERVER), &[], Some(b"{}")).assert_error(400, "bad_request");
    // A body that never arrives: 400 after keys_api.body_timeout_ms, no key made.
    let mut stream = TcpStream::connect(gw.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "POST /v1/keys HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SERVER}\r\nContent-Length: 50\r\n\r\n{{\"label\""
    )
    .unwrap();
    let r = read_response(&mut BufReader::new(stream)).unwrap();
    r.assert_error(400, "bad_request");
    // No body at all is a key without a label.
    let r = send(&gw, "POST", "/v1/keys", Some(SERVER), &[], None);
    assert_eq!(r.status, 201);
    assert_eq!(r.json()["label"], Value::Null);
    assert_eq!(list(&gw, SERVER)["items"].as_array().unwrap().len(), 3);
}

#[test]
fn a_restart_keeps_api_made_keys_and_when_they_were_last_used() {
    let gw = builder().start();
    let made = create(&gw, SERVER, "kept").json();
    let secret = made["key"].as_str().unwrap().to_owned();
    assert_eq!(lookup(&gw, &secret), 200);
    let dir = gw.stop();
    let gw = builder().in_dir(dir).start();
    assert_eq!(lookup(&gw, &secret), 200);
    let item = listed_item(&gw, &made["id"]);
    assert_eq!(item["label"], "kept");
    assert_eq!(item["key_prefix"], made["key_prefix"]);
    assert_eq!(item["created_at"], made["created_at"]);
    assert!(
        item["last_used_at"].as_str().is_some(),
        "saved at the stop: {item}"
    );
}

#[test]
fn a_key_made_with_origins_is_a_browser_key_of_those_sites() {
    let gw = builder().start();
    let post = |body: &str| post_body(&gw, body);
    let made = post(r#"{"label":"signup","origins":["https://app.example.com"]}"#);
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.body));
    let made = made.json();
    assert_eq!(
        made["origins"],
        serde_json::json!(["https://app.example.com"])
    );
    let secret = made["key"].as_str().unwrap();
    let from = |origin: &str| {
        send(
            &gw,
            "GET",
            LOOKUP,
            Some(secret),
            &[("Origin", origin)],
            None,
        )
        .status
    };
    assert_eq!(from("https://app.example.com"), 200);
    assert_eq!(from("https://evil.example"), 403);
    // A browser key cannot list keys (the project's others), as any browser key.
    assert_eq!(
        send(
            &gw,
            "GET",
            "/v1/keys",
            Some(secret),
            &[("Origin", "https://app.example.com")],
            None
        )
        .status,
        403
    );
    let item = listed_item(&gw, &made["id"]);
    assert_eq!(
        item["origins"],
        serde_json::json!(["https://app.example.com"])
    );
    for bad in [
        r#"{"origins":"https://app.example.com"}"#,
        r#"{"origins":["app.example.com/path"]}"#,
    ] {
        post(bad).assert_invalid("origin", bad);
    }
}

/// The statuses of `n` keys made at once with `secret`, taking turns over `gws`.
pub(crate) fn race_creates(gws: &[Gateway], secret: &str, n: usize) -> Vec<u16> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let gw = &gws[i % gws.len()];
                s.spawn(move || create(gw, secret, &format!("race {i}")).status)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn switched_off_its_routes_are_404_and_keys_made_before_keep_working() {
    let gw = builder().start();
    let made = create(&gw, SERVER, "before").json();
    let secret = made["key"].as_str().unwrap().to_owned();
    let id = made["id"].as_str().unwrap().to_owned();
    let dir = gw.stop();
    let gw = builder()
        .gateway_yaml("keys_api: { enabled: false }")
        .in_dir(dir)
        .start();
    send(&gw, "GET", "/v1/keys", Some(SERVER), &[], None).assert_error(404, "not_found");
    send(&gw, "POST", "/v1/keys", Some(SERVER), &[], Some(b"{}")).assert_error(404, "not_found");
    send(&gw, "POST", "/v1/keys", Some(SERVER), &[], None).assert_error(404, "not_found");
    revoke(&gw, SERVER, &id).assert_error(404, "not_found");
    assert_eq!(lookup(&gw, &secret), 200);
}

/// Marks the operator key `id` disabled in the keys file (the reload applies it).
fn disable_in_keys_file(gw: &Gateway, id: &str) {
    let path = gw.dir.path().join("keys.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let marker = format!("  - id: {id}\n");
    assert!(text.contains(&marker), "{text}");
    write_atomic(
        &path,
        &text.replace(&marker, &format!("{marker}    disabled: true\n")),
    );
}

/// `(id, secret)` of a key made through the API with `secret`.
pub(crate) fn made_by(gw: &Gateway, secret: &str, label: &str) -> (String, String) {
    let r = create(gw, secret, label);
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let made = r.json();
    assert!(made["created_by"].is_string(), "{made}");
    (
        made["id"].as_str().unwrap().to_owned(),
        made["key"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn a_revocation_in_the_keys_file_applies_whatever_state_the_cache_is_in() {
    let gw = builder().start();
    let (_, api) = made_by(&gw, SERVER, "api");
    assert_eq!(lookup(&gw, &api), 200);
    // The cache becomes unreadable (a folder where the file was)...
    let file = cache_file(&gw);
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir(&file).unwrap();
    // ... and the operator disables a leaked key in the meantime: it is refused within a
    // reload; the API-made keys the control store gave stand, the operator's other keys work.
    disable_in_keys_file(&gw, "other");
    wait_until(Duration::from_secs(5), || lookup(&gw, OTHER) == 401);
    assert_eq!(lookup(&gw, &api), 200);
    assert_eq!(lookup(&gw, SERVER), 200);
    let ready = gw.admin_get("/readyz");
    assert_eq!(ready.status, 200);
    assert!(
        ready.json().get("managed_keys_problem").is_none(),
        "{}",
        ready.text()
    );
    assert!(
        gw.log()
            .contains("the keys the control store gave are served"),
        "{}",
        gw.log()
    );
}

#[test]
fn the_cache_written_behind_a_burst_of_changes_holds_the_last_one() {
    // Made and revoked one after another, then stopped at once: the cache, written behind the
    // changes (a burst is one write; once more when the service stops), holds the last.
    let gw = builder().start();
    let made: Vec<(String, String)> = (0..3)
        .map(|i| made_by(&gw, SERVER, &format!("burst{i}")))
        .collect();
    assert_eq!(revoke(&gw, SERVER, &made[1].0).status, 204);
    let dir = gw.stop();
    let cache = read_cache(&dir.path().join("state")).expect("the cache reads");
    let held: Vec<(&str, &str)> = (cache["keys"].as_array().unwrap().iter())
        .map(|k| (k["id"].as_str().unwrap(), k["sha256"].as_str().unwrap()))
        .collect();
    for (i, (id, secret)) in made.iter().enumerate() {
        let want = (i != 1).then(|| (id.as_str(), hex_sha256(secret)));
        let found = held.iter().find(|(k, _)| k == id);
        assert_eq!(found.map(|(k, h)| (*k, h.to_string())), want, "{cache}");
    }
    assert!(cache["revoked_seen"][&made[1].0].is_i64(), "{cache}");
}

#[test]
fn a_corrupt_cache_is_set_aside_and_the_keys_come_from_the_control_store() {
    let gw = builder().start();
    let (_, api) = made_by(&gw, SERVER, "api");
    let dir = gw.stop();
    // The key file holding it cut short (the cache itself reads).
    let folder = dir.path().join("state/keys.control-cache.json.keys");
    let holding = (std::fs::read_dir(&folder).unwrap().flatten())
        .find(|f| {
            std::fs::read_to_string(f.path())
                .unwrap()
                .contains("\"api\"")
        })
        .unwrap();
    std::fs::write(holding.path(), "[{\"id\":").unwrap();
    let gw = builder().in_dir(dir).start();
    assert_eq!(lookup(&gw, SERVER), 200);
    wait_until(Duration::from_secs(5), || lookup(&gw, &api) == 200);
    let mut aside: Vec<String> = std::fs::read_dir(gw.dir.path().join("state"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("keys.control-cache.json.corrupt-"))
        .collect();
    aside.sort();
    // The cache and its key files, set aside together.
    assert_eq!(aside.len(), 2, "{aside:?}");
    assert_eq!(format!("{}.keys", aside[0]), aside[1]);
    assert_eq!(gw.log().matches("set aside as").count(), 1, "{}", gw.log());
    // Written again from the store.
    wait_until(Duration::from_secs(5), || {
        let folder = gw.dir.path().join("state/keys.control-cache.json.keys");
        (std::fs::read_dir(folder).into_iter().flatten().flatten())
            .any(|f| std::fs::read_to_string(f.path()).is_ok_and(|t| t.contains("\"api\"")))
    });
    wait_until(Duration::from_secs(5), || {
        gw.metric("drg_keys_managed_file_ok") == Some(1.0)
    });
}

#[test]
fn a_key_revoked_or_removed_revokes_what_it_made_for_good_and_a_disabled_one_suspends_it() {
    let gw = builder().start();
    // server -> a -> b (a server key of the project makes keys, and so does what it made).
    let (a_id, a) = made_by(&gw, SERVER, "a");
    let (b_id, b) = made_by(&gw, &a, "b");
    let (d_id, d) = made_by(&gw, &b, "d");
    let listed = list(&gw, SERVER);
    let by = |id: &str| {
        listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["id"] == id)
            .unwrap()["created_by"]
            .clone()
    };
    assert_eq!(
        (by(&a_id), by(&b_id), by(&d_id)),
        ("server".into(), a_id.clone().into(), b_id.clone().into())
    );
    assert_eq!(by("server"), serde_json::Value::Null);
    // Revoking a through the API revokes b, which a made, and d, which b made.
    assert_eq!(revoke(&gw, OTHER, &a_id).status, 204);
    for secret in [&a, &b, &d] {
        assert_eq!(lookup(&gw, secret), 401);
    }
    let left = ids(&list(&gw, SERVER));
    assert!(!left.contains(&b_id) && !left.contains(&d_id), "{left:?}");
    let (c_id, c) = made_by(&gw, OTHER, "c");
    assert_eq!(lookup(&gw, &c), 200);
    // The operator disables `other`, which made c, which made e: both are off within a
    // reload, and back when `other` is enabled again.
    let (e_id, e) = made_by(&gw, &c, "e");
    disable_in_keys_file(&gw, "other");
    wait_until(Duration::from_secs(5), || lookup(&gw, &c) == 401);
    assert_eq!(lookup(&gw, &e), 401);
    assert_eq!(lookup(&gw, SERVER), 200);
    let path = gw.dir.path().join("keys.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    write_atomic(&path, &text.replace("    disabled: true\n", ""));
    wait_until(Duration::from_secs(5), || lookup(&gw, &e) == 200);
    // The operator removes `other` (a leaked key): c and e are revoked for good, the control
    // store no longer holds them, and a key `other` added back does not bring them back.
    let without_other: String = text
        .split("  - id: ")
        .enumerate()
        .filter(|(i, entry)| *i == 0 || !entry.starts_with("other\n"))
        .map(|(i, entry)| {
            if i == 0 {
                entry.to_owned()
            } else {
                format!("  - id: {entry}")
            }
        })
        .collect();
    assert!(!without_other.contains("id: other"), "{without_other}");
    write_atomic(&path, &without_other);
    wait_until(Duration::from_secs(5), || lookup(&gw, &c) == 401);
    assert_eq!(lookup(&gw, &e), 401);
    wait_until(Duration::from_secs(5), || {
        let held = stored_keys(&gw);
        !held.iter().any(|(id, _)| *id == c_id || *id == e_id)
    });
    // Each is audited: one gateway's own keys file is its store's truth of who made keys.
    let trail = send(&gw, "GET", "/v1/audit", Some(SERVER), &[], None).json();
    let by_file = |id: &str| {
        trail["items"].as_array().unwrap().iter().any(|i| {
            i["action"] == "key.revoked" && i["target"] == id && i["key_id"] == "keys.yaml"
        })
    };
    assert!(by_file(&c_id) && by_file(&e_id), "{trail}");
    write_atomic(&path, &text.replace("    disabled: true\n", ""));
    wait_until(Duration::from_secs(5), || lookup(&gw, OTHER) == 200);
    assert_eq!(lookup(&gw, &c), 401);
}
