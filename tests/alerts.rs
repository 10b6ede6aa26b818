//! Quota alerts against the real binary and a real HTTP receiver on loopback: each threshold of
//! a project's month arrives once, signed (HMAC-SHA256 of the body), retried after a 500; across
//! two gateways on one Redis and a restart between the crossing and the delivery, still once;
//! an outbox write that fails (the file locked by another writer) neither loses nor repeats one.
//! Where alerts may go: private, metadata and numeric-form addresses and the gateway's own
//! listeners refused by `check-config` and at start, and a name refused once it resolves to one.

use crate::common;
use crate::redis_server;
use crate::webhook::{Delivery, Receiver};

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use redis_server::RedisServer;

const KEY: &str = "drg_alerts_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const LOOKUP: &str = "/v1/public/domain/example.org";
const SECRET: &str = "a-webhook-secret-of-some-length";

/// Thresholds of the alerts answered 2xx, in arrival order.
fn accepted(receiver: &Receiver) -> Vec<u64> {
    receiver
        .deliveries()
        .iter()
        .filter(|d| d.answered == 200)
        .map(|d| d.json()["threshold"].as_u64().unwrap())
        .collect()
}

fn signature_ok(d: &Delivery) -> bool {
    d.signed_with(SECRET)
}

/// Alerts to `url` at 50% and 100% of a `limit` of project acme; `allow_private` for a receiver on
/// loopback.
fn alerting(builder: GatewayBuilder, url: &str, limit: u64, allow_private: bool) -> GatewayBuilder {
    builder
        .plan_yaml("metered", &format!("{{ monthly_limit: {limit} }}"))
        .key_in_project("k", KEY, "metered", "acme")
        .quota_yaml(&format!(
            "alerts: {{ url: '{url}', allow_private: {allow_private}, secret_file: alert.secret, thresholds: [50, 100], timeout_ms: 1000 }}"
        ))
}

fn write_secret(dir: &tempfile::TempDir) {
    std::fs::write(dir.path().join("alert.secret"), format!("{SECRET}\n")).unwrap();
}

#[test]
fn each_threshold_arrives_once_signed_and_is_retried_after_a_500() {
    let receiver = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![500]);
    let dir = tempfile::tempdir().unwrap();
    write_secret(&dir);
    let gw = alerting(Gateway::builder(), &receiver.url(), 10, true)
        .in_dir(dir)
        .start();
    let mut c = gw.conn_as(Some(KEY));
    let statuses: Vec<u16> = (0..12).map(|_| c.get(LOOKUP).unwrap().status).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 10);
    wait_until(Duration::from_secs(20), || accepted(&receiver).len() == 2);
    // Nothing more comes (every later call of the month is past both thresholds).
    after_passes(&gw, 3);
    let all = receiver.deliveries();
    assert_eq!(all.len(), 3, "one 500, then each alert once: {all:?}");
    let mut accepted = accepted(&receiver);
    accepted.sort();
    assert_eq!(accepted, [50, 100]);
    assert!(all.iter().all(signature_ok), "signed: {all:?}");
    // The retried alert is the one that got the 500: same id, same bytes.
    let (first, retried) = (&all[0], all.iter().skip(1).find(|d| d.body == all[0].body));
    let retried = retried.expect("the refused alert again");
    assert_eq!(first.header("x-alert-id"), retried.header("x-alert-id"));
    assert_eq!(first.header("content-type"), Some("application/json"));
    let fifty = all
        .iter()
        .find(|d| d.json()["threshold"] == 50)
        .unwrap()
        .json();
    assert_eq!(fifty["project"], "acme");
    assert_eq!(fifty["plan"], "metered");
    assert_eq!(fifty["month_count"], 5);
    assert_eq!(fifty["monthly_limit"], 10);
    assert!(fifty["month"].as_str().unwrap().len() == 7, "{fifty}");
    assert!(fifty["at"].as_str().unwrap().ends_with('Z'), "{fifty}");
    assert_eq!(gw.metric("drg_quota_alerts_sent_total"), Some(2.0));
    assert_eq!(
        gw.metric("drg_quota_alerts_attempt_errors_total"),
        Some(1.0)
    );
    gw.wait_metric("drg_quota_alerts_pending", 0.0);
    assert!(!gw.log().contains(SECRET), "the secret is never logged");
}

#[test]
fn across_two_gateways_on_redis_and_a_restart_before_delivery_each_alert_arrives_once() {
    let redis = RedisServer::start(false);
    // The receiver is down while the thresholds are crossed.
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}/hooks/drg");
    let start = |dir: tempfile::TempDir| {
        write_secret(&dir);
        alerting(Gateway::builder(), &url, 20, true)
            .redis(&redis.url(), "fail_open")
            .in_dir(dir)
            .start()
    };
    let a = start(tempfile::tempdir().unwrap());
    let b = start(tempfile::tempdir().unwrap());
    let counts = hammer(&[a.addr, b.addr], KEY, LOOKUP, 4, 7);
    assert_eq!(counts.get(&200), Some(&20), "{counts:?}");
    // Each threshold claimed by exactly one of them in Redis.
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    for t in [50, 100] {
        let key = format!("q:{{acme}}:{month}:alert:{t}");
        wait_until(Duration::from_secs(10), || {
            redis.int(&["EXISTS", &key]) == Some(1)
        });
    }
    wait_until(Duration::from_secs(10), || {
        a.metric("drg_quota_alerts_attempt_errors_total")
            .unwrap_or(0.0)
            + b.metric("drg_quota_alerts_attempt_errors_total")
                .unwrap_or(0.0)
            >= 2.0
    });
    // Both gateways restart with their alerts undelivered; then the receiver comes up.
    let (dir_a, dir_b) = (a.stop(), b.stop());
    let a = start(dir_a);
    let b = start(dir_b);
    let receiver = Receiver::start(format!("127.0.0.1:{port}").parse().unwrap(), vec![]);
    wait_until(Duration::from_secs(30), || accepted(&receiver).len() >= 2);
    after_passes(&a, 3);
    after_passes(&b, 3);
    let mut accepted = accepted(&receiver);
    accepted.sort();
    assert_eq!(accepted, [50, 100], "{:?}", receiver.deliveries());
    assert_eq!(receiver.deliveries().len(), 2);
    assert!(receiver.deliveries().iter().all(signature_ok));
    let sent = a.metric("drg_quota_alerts_sent_total").unwrap_or(0.0)
        + b.metric("drg_quota_alerts_sent_total").unwrap_or(0.0);
    assert_eq!(sent, 2.0);
    // Further calls (refused over the month) bring no new alert.
    assert_eq!(a.conn_as(Some(KEY)).get(LOOKUP).unwrap().status, 429);
    after_passes(&a, 2);
    assert_eq!(receiver.deliveries().len(), 2);
}

/// The outbox of a test gateway's folder (beside its `state/quota.json`): the webhook engine's,
/// the one record of an alert.
fn outbox_of(dir: &std::path::Path) -> std::path::PathBuf {
    dir.join("state").join("webhooks.sqlite")
}

/// Another writer holding the outbox's write lock (a stuck process, a long backup): the gateway's
/// inserts wait out their busy timeout (5 s) and fail with "database is locked" until it is
/// released.
struct WriteLock(rusqlite::Connection);

impl WriteLock {
    fn take(path: &std::path::Path) -> WriteLock {
        let db = rusqlite::Connection::open(path).unwrap();
        db.execute_batch("BEGIN IMMEDIATE").unwrap();
        WriteLock(db)
    }

    fn release(self) {
        self.0.execute_batch("ROLLBACK").unwrap();
    }
}

/// The thresholds the outbox at `path` holds alerts of (their messages), in order.
/// The thresholds whose messages the outbox records as sent.
fn outbox_sent(path: &std::path::Path) -> Vec<u32> {
    let db = rusqlite::Connection::open(path).unwrap();
    let mut stmt = db
        .prepare(
            "SELECT json_extract(body, '$.threshold') AS t FROM messages
             WHERE topic = 'quota.threshold' AND state = 'sent' ORDER BY t",
        )
        .unwrap();
    let rows = stmt.query_map([], |r| r.get(0)).unwrap();
    rows.map(Result::unwrap).collect()
}

fn outbox_thresholds(path: &std::path::Path) -> Vec<u32> {
    let db = rusqlite::Connection::open(path).unwrap();
    let mut stmt = db
        .prepare(
            "SELECT json_extract(body, '$.threshold') AS t FROM messages
             WHERE topic = 'quota.threshold' ORDER BY t",
        )
        .unwrap();
    let rows = stmt.query_map([], |r| r.get(0)).unwrap();
    rows.map(Result::unwrap).collect()
}

#[test]
fn an_alert_whose_outbox_write_failed_is_delivered_once_when_the_outbox_recovers() {
    let receiver = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    let dir = tempfile::tempdir().unwrap();
    write_secret(&dir);
    let gw = alerting(Gateway::builder(), &receiver.url(), 10, true)
        .in_dir(dir)
        .start();
    let mut c = gw.conn_as(Some(KEY));
    for _ in 0..4 {
        assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    }
    let lock = WriteLock::take(&outbox_of(gw.dir.path()));
    // The call that crosses 50%: its alert's outbox write fails.
    assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    wait_until(Duration::from_secs(15), || {
        gw.log().contains("database is locked")
    });
    // Meanwhile it is pending (held for another write), not lost.
    let pending_while_locked = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        gw.metric("drg_quota_alerts_pending") == Some(1.0)
    });
    assert!(receiver.deliveries().is_empty());
    lock.release();
    // The outbox writable again: recorded and delivered, without another call.
    wait_until(Duration::from_secs(20), || accepted(&receiver) == [50]);
    // More calls over 50% bring no repeat.
    for _ in 0..2 {
        assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    }
    after_passes(&gw, 3);
    let all = receiver.deliveries();
    assert_eq!(all.len(), 1, "once: {all:?}");
    assert_eq!(all[0].json()["month_count"], 5, "the crossing call's count");
    assert!(signature_ok(&all[0]));
    assert_eq!(outbox_thresholds(&outbox_of(gw.dir.path())), [50]);
    let failed = gw.metric("drg_quota_alerts_insert_errors_total");
    assert!(failed.is_some_and(|n| n >= 1.0), "{failed:?}");
    assert!(pending_while_locked, "a held alert counts as pending");
    assert_eq!(gw.metric("drg_quota_alerts_sent_total"), Some(1.0));
    assert_eq!(gw.metric("drg_quota_alerts_dropped_total"), Some(0.0));
    gw.wait_metric("drg_quota_alerts_pending", 0.0);
}

#[test]
fn a_restart_offers_again_a_threshold_the_outbox_never_got_even_on_a_refused_call() {
    let receiver = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    let dir = tempfile::tempdir().unwrap();
    write_secret(&dir);
    let start = |dir: tempfile::TempDir| {
        alerting(Gateway::builder(), &receiver.url(), 10, true)
            .in_dir(dir)
            .start()
    };
    let gw = start(dir);
    let mut c = gw.conn_as(Some(KEY));
    for _ in 0..5 {
        assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    }
    wait_until(Duration::from_secs(10), || accepted(&receiver) == [50]);
    // The receiver's 200 comes before the outbox records it: locking in between would hold the
    // 50% message unsettled, and a restart would rightly send it again (same `Webhook-Id`).
    let outbox = outbox_of(gw.dir.path());
    wait_until(Duration::from_secs(10), || outbox_sent(&outbox) == [50]);
    // The call that crosses 100% meets a locked outbox, and the gateway stops before it is free.
    let lock = WriteLock::take(&outbox);
    for _ in 0..5 {
        assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    }
    wait_until(Duration::from_secs(15), || {
        gw.log().contains("database is locked")
    });
    let dir = gw.stop();
    lock.release();
    assert_eq!(outbox_thresholds(&outbox), [50], "100% never recorded");
    let gw = start(dir);
    // The month is used up: the next call is refused, and still offers what the outbox lacks.
    assert_eq!(gw.conn_as(Some(KEY)).get(LOOKUP).unwrap().status, 429);
    // Bounded for a loaded machine; a miss says what the gateway and the receiver saw.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while accepted(&receiver) != [50, 100] {
        assert!(
            std::time::Instant::now() < deadline,
            "delivered {:?} after 30 s; outbox {:?}:\n{}",
            accepted(&receiver),
            outbox_thresholds(&outbox),
            gw.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    after_passes(&gw, 2);
    let all = receiver.deliveries();
    assert_eq!(all.len(), 2, "each once: {all:?}");
    assert_eq!(all[1].json()["month_count"], 10);
    assert_eq!(outbox_thresholds(&outbox), [50, 100]);
}

#[test]
fn a_secret_too_short_or_missing_stops_the_start_with_a_clear_error() {
    for (secret, needle) in [
        (Some("short"), "at least 16 are needed"),
        (None, "No such file"),
    ] {
        let conf = write_config_with_alerts(secret);
        for args in [&["check-config"][..], &["serve"][..]] {
            let out = crate::common::command(env!("CARGO_BIN_EXE_domain-risk-gateway"))
                .args(args)
                .arg("--conf")
                .arg(&conf)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stderr).to_string()
                + &String::from_utf8_lossy(&out.stdout);
            assert!(!out.status.success(), "{args:?}: {text}");
            assert!(
                text.contains("gateway.quota.alerts.secret_file") && text.contains(needle),
                "{args:?}: {text}"
            );
        }
    }
}

/// A minimal config with alerts whose secret file holds `secret` (`None`: no file), in a folder
/// kept for the test's run.
fn write_config_with_alerts(secret: Option<&str>) -> std::path::PathBuf {
    let listen = format!("127.0.0.1:{}", free_port());
    let alerts = "{ url: 'http://127.0.0.1:9/x', allow_private: true, secret_file: alert.secret }";
    write_config(secret, &listen, "null", alerts)
}

/// A minimal config listening on `listen` (no port taken: `check-config` binds nothing), the admin
/// listener on `admin`, `alerts` as the `quota.alerts` section; in a folder kept for the test's run.
fn write_config(
    secret: Option<&str>,
    listen: &str,
    admin: &str,
    alerts: &str,
) -> std::path::PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    write_config_in(&dir, secret, listen, admin, alerts, "")
}

/// [`write_config`] in `dir`, with `access` extra lines in the `access:` section.
fn write_config_in(
    dir: &std::path::Path,
    secret: Option<&str>,
    listen: &str,
    admin: &str,
    alerts: &str,
    access: &str,
) -> std::path::PathBuf {
    if let Some(secret) = secret {
        std::fs::write(dir.join("alert.secret"), secret).unwrap();
    }
    std::fs::create_dir(dir.join("data")).unwrap();
    std::fs::write(dir.join("keys.yaml"), "keys: []\n").unwrap();
    let conf = dir.join("gateway.yaml");
    std::fs::write(
        &conf,
        format!(
            "pid_file: {d}/pid\nupgrade_sock: {d}/upgrade.sock\ngateway:\n  listen: {listen}\n  admin: {{ listen: {admin} }}\n  mx: {{ enabled: false }}\n  data: {{ dir: data, builtin_disposable: false }}\n  access:\n    keys_file: keys.yaml\n{access}  quota:\n    state_file: state/quota.counters\n    alerts: {alerts}\n",
            d = dir.display(),
        ),
    )
    .unwrap();
    conf
}

/// Runs the binary with `args` on `conf`: whether it succeeded, and what it printed.
fn run(conf: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = crate::common::command(env!("CARGO_BIN_EXE_domain-risk-gateway"))
        .arg("--conf")
        .arg(conf)
        .args(args)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    (out.status.success(), text)
}

const LISTEN: &str = "127.0.0.1:18080";
const ADMIN: &str = "127.0.0.1:19180";

#[test]
fn check_config_refuses_private_metadata_numeric_and_own_listener_urls_naming_the_key() {
    for (url, allow_private, needle) in [
        (
            "http://169.254.169.254/latest/meta-data/",
            false,
            "169.254.169.254 is link-local",
        ),
        // Metadata stays refused with the switch on.
        (
            "http://169.254.169.254/latest/meta-data/",
            true,
            "never a receiver",
        ),
        (
            "http://[::ffff:169.254.169.254]/",
            true,
            "carries the IPv4 address 169.254.169.254, which is link-local",
        ),
        ("http://127.0.0.1:9/x", false, "127.0.0.1 is loopback"),
        ("http://[::1]/", false, "::1 is loopback"),
        (
            "http://[::ffff:127.0.0.1]/",
            false,
            "carries the IPv4 address 127.0.0.1, which is loopback",
        ),
        (
            "http://0x7f000001/",
            false,
            "host '0x7f000001': 127.0.0.1 is loopback",
        ),
        (
            "http://2130706433/",
            false,
            "host '2130706433': 127.0.0.1 is loopback",
        ),
        ("http://0177.0.0.1/", false, "127.0.0.1 is loopback"),
        ("http://127.1/", false, "127.0.0.1 is loopback"),
        ("https://10.1.2.3/hook", false, "10.1.2.3 is private"),
        ("https://[fd00::1]/hook", false, "fd00::1 is private"),
        ("http://100.64.0.1/", false, "carrier-grade NAT"),
        // The gateway's own listeners, in any spelling, even with allow_private.
        (
            "http://127.0.0.1:19180/",
            true,
            "own listener gateway.admin.listen",
        ),
        (
            "http://0x7f.1:19180/metrics",
            true,
            "own listener gateway.admin.listen",
        ),
        (
            "http://[::ffff:127.0.0.1]:19180/",
            true,
            "own listener gateway.admin.listen",
        ),
        (
            "http://2130706433:18080/",
            true,
            "own listener gateway.listen",
        ),
        ("http://0.0.0.0:18080/", true, "own listener gateway.listen"),
    ] {
        let alerts = format!(
            "{{ url: '{url}', allow_private: {allow_private}, secret_file: alert.secret }}"
        );
        let conf = write_config(Some(SECRET), LISTEN, ADMIN, &alerts);
        let (ok, text) = run(&conf, &["check-config"]);
        assert!(!ok, "{url}: {text}");
        assert!(
            text.contains("gateway.quota.alerts.url: host '") && text.contains(needle),
            "{url} (allow_private {allow_private}): {text}"
        );
        assert!(
            !text.contains("meta-data") && !text.contains("/hook"),
            "the host only: {text}"
        );
    }
    // Every problem at once, each by its key.
    let alerts = "{ url: 'http://0x7f000001/', secret_file: alert.secret, max_attempts: 0 }";
    let (ok, text) = run(
        &write_config(Some(SECRET), LISTEN, ADMIN, alerts),
        &["check-config"],
    );
    assert!(
        !ok && text.contains("gateway.quota.alerts.url")
            && text.contains("gateway.quota.alerts.max_attempts"),
        "{text}"
    );
    // Accepted: loopback with the switch on, and a name (not resolved by check-config).
    for (url, allow_private) in [
        ("http://127.0.0.1:9/x", true),
        ("http://localhost:19180/x", false),
        ("https://hooks.example.com/drg", false),
    ] {
        let alerts = format!(
            "{{ url: '{url}', allow_private: {allow_private}, secret_file: alert.secret }}"
        );
        let (ok, text) = run(
            &write_config(Some(SECRET), LISTEN, ADMIN, &alerts),
            &["check-config"],
        );
        assert!(ok, "{url}: {text}");
    }
}

#[test]
fn serve_refuses_them_at_start_including_the_listen_address_of_the_command_line() {
    let alerts = "{ url: 'http://169.254.169.254/latest/meta-data/', secret_file: alert.secret }";
    let (ok, text) = run(
        &write_config(Some(SECRET), LISTEN, "null", alerts),
        &["serve"],
    );
    assert!(
        !ok && text.contains("gateway.quota.alerts.url: host '169.254.169.254'"),
        "{text}"
    );
    // `serve --listen` moves the public listener onto the alerts' URL: refused before binding.
    let port = free_port();
    let alerts = format!(
        "{{ url: 'http://0x7f.1:{port}/', allow_private: true, secret_file: alert.secret }}"
    );
    let conf = write_config(Some(SECRET), LISTEN, "null", &alerts);
    let (ok, text) = run(&conf, &["serve", "--listen", &format!("127.0.0.1:{port}")]);
    assert!(!ok, "{text}");
    assert!(
        text.contains("--listen") && text.contains("own listener gateway.listen"),
        "{text}"
    );
}

/// Polls the admin listener on `addr` (TCP) for one metric sample.
fn admin_metric(addr: SocketAddr, sample: &str) -> Option<f64> {
    let r = Conn::open_as(addr, None).ok()?.get("/metrics").ok()?;
    String::from_utf8(r.body)
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn a_name_that_resolves_to_loopback_passes_the_config_and_is_refused_when_sent() {
    let receiver = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    // A name: `check-config` does not resolve it; the gateway does when it sends.
    let url = format!("http://localhost:{}/hooks/drg", receiver.addr.port());
    let dir = tempfile::tempdir().unwrap();
    write_secret(&dir);
    let gw = alerting(Gateway::builder(), &url, 10, false)
        .in_dir(dir)
        .start();
    let (ok, text) = run(&gw.conf, &["check-config"]);
    assert!(ok, "{text}");
    let mut c = gw.conn_as(Some(KEY));
    for _ in 0..10 {
        assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    }
    wait_until(Duration::from_secs(10), || {
        gw.metric("drg_quota_alerts_refused_total") == Some(2.0)
    });
    assert_eq!(gw.metric("drg_quota_alerts_failed_total"), Some(2.0));
    assert_eq!(
        gw.metric("drg_quota_alerts_attempt_errors_total"),
        Some(2.0)
    );
    // Given up at once: a later pass (every second) tries nothing more.
    after_passes(&gw, 2);
    assert_eq!(
        gw.metric("drg_quota_alerts_attempt_errors_total"),
        Some(2.0)
    );
    assert_eq!(gw.metric("drg_quota_alerts_sent_total"), Some(0.0));
    gw.wait_metric("drg_quota_alerts_pending", 0.0);
    assert!(
        receiver.deliveries().is_empty(),
        "{:?}",
        receiver.deliveries()
    );
    let log = gw.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("quota alert refused"))
        .collect();
    assert_eq!(lines.len(), 2, "once per alert: {log}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("'localhost'") && l.contains("127.0.0.1 is loopback")),
        "{lines:?}"
    );
    assert!(
        !log.contains(SECRET) && !log.contains("/hooks/drg"),
        "{log}"
    );
}

#[test]
fn with_allow_private_the_gateways_own_admin_listener_stays_refused_when_sent() {
    // The admin listener on every address: `localhost`, whichever family it resolves to, is it.
    let admin: SocketAddr = format!("0.0.0.0:{}", free_port()).parse().unwrap();
    let url = format!("http://localhost:{}/hooks/drg", admin.port());
    let dir = tempfile::tempdir().unwrap();
    let alerts = format!(
        "{{ url: '{url}', allow_private: true, secret_file: alert.secret, thresholds: [50, 100], timeout_ms: 1000 }}"
    );
    let plans = "    plans: { metered: { monthly_limit: 10 } }\n";
    // The public listener is set by `Gateway::spawn` (`serve --listen`).
    let conf = write_config_in(
        dir.path(),
        Some(SECRET),
        "127.0.0.1:1",
        &admin.to_string(),
        &alerts,
        plans,
    );
    let extras = drg_access::keys::EntryExtras {
        project: Some("acme"),
        ..Default::default()
    };
    let key = drg_access::keys::key_entry_yaml_with("k", KEY, "metered", &[], &extras);
    std::fs::write(dir.path().join("keys.yaml"), format!("keys:\n{key}")).unwrap();
    let gw = Gateway::spawn(dir, conf, &[]);
    let local_admin: SocketAddr = format!("127.0.0.1:{}", admin.port()).parse().unwrap();
    let mut c = gw.conn_as(Some(KEY));
    for _ in 0..10 {
        assert_eq!(c.get(LOOKUP).unwrap().status, 200);
    }
    wait_until(Duration::from_secs(10), || {
        admin_metric(local_admin, "drg_quota_alerts_refused_total") == Some(2.0)
    });
    assert_eq!(
        admin_metric(local_admin, "drg_quota_alerts_sent_total"),
        Some(0.0)
    );
    let log = gw.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("quota alert refused"))
        .collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains("own listener gateway.admin.listen")),
        "{lines:?}"
    );
    assert!(!log.contains(SECRET), "{log}");
}

/// Waits until `gw`'s alerts service has run `n` more passes: what it would still do after what
/// the test did (a repeat, a retry), it has had the time to do. A fixed wait said nothing of it
/// under load, where a pass can come late and the wait pass with no pass at all.
fn after_passes(gw: &Gateway, n: u32) {
    let passes = || gw.metric("drg_quota_alerts_passes_total").unwrap_or(0.0);
    let from = passes();
    wait_until(Duration::from_secs(30), || passes() >= from + f64::from(n));
}
