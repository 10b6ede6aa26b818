//! Each project's own webhooks delivered, against the real binary and receivers on loopback:
//! a project's webhook gets that project's verdict changes and threshold alerts, signed with its
//! own secret and a timestamp (the documented receiver code refuses a stale one), never another
//! project's; a webhook removed gets nothing more; a receiver that never answers one project
//! delays another project's delivery by less than a second; the operator's URL still gets both.

use crate::common;
use crate::webhook::{Delivery, Receiver};

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const ACME: &str = "drg_hooks_acme_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const OTHER: &str = "drg_hooks_other_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const OPERATOR_SECRET: &str = "the-operators-changes-secret";
const OLD_LIST: &str = "mailinator.com\n";

/// Two projects on a watched plan of 10 calls a month, projects' webhooks on (loopback
/// allowed), changes handed over every 100 ms; with `operator`, the operator's changes URL too.
fn builder(dir: &tempfile::TempDir, operator: Option<&str>) -> GatewayBuilder {
    let hook = match operator {
        Some(url) => {
            std::fs::write(dir.path().join("ops.secret"), OPERATOR_SECRET).unwrap();
            format!(", webhook: {{ url: '{url}', allow_private: true, secret_file: ops.secret }}")
        }
        None => String::new(),
    };
    Gateway::builder()
        .plan_yaml("pro", "{ monthly_limit: 10 }")
        .key_in_project("a", ACME, "pro", "acme")
        .key_in_project("o", OTHER, "pro", "other")
        .data("disposable.txt", OLD_LIST)
        .gateway_yaml("webhooks: { allow_private: true, timeout_ms: 30000 }")
        .gateway_yaml(&format!(
            "changes: {{ watch_days: {{ pro: 30 }}, send_interval_ms: 100, stable_seconds: 0{hook} }}"
        ))
}

/// Makes a webhook of `key`'s project; its id and its secret.
fn create(gw: &Gateway, key: &str, url: &str, events: &[&str]) -> (String, String) {
    let body = json!({ "url": url, "events": events }).to_string();
    let r = send(
        gw,
        "POST",
        "/v1/webhooks",
        Some(key),
        &[],
        Some(body.as_bytes()),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let v = r.json();
    (
        v["id"].as_str().unwrap().to_owned(),
        v["secret"].as_str().unwrap().to_owned(),
    )
}

fn lookup(gw: &Gateway, key: &str, name: &str) -> Value {
    let r = gw
        .conn_as(Some(key))
        .get(&format!("/v1/public/domain/{name}"))
        .unwrap();
    assert_eq!(r.status, 200);
    r.json()
}

fn watched(gw: &Gateway) -> f64 {
    gw.metric("drg_changes_total{event=\"watched\"}")
        .unwrap_or(0.0)
}

/// The deliveries of `event` (`verdict.changed`: messages with `changes`; `quota.threshold`:
/// alerts with `threshold`) for `project`.
fn of(receiver: &Receiver, project: &str, event: &str) -> Vec<Delivery> {
    let field = if event == "verdict.changed" {
        "changes"
    } else {
        "threshold"
    };
    receiver
        .deliveries()
        .into_iter()
        .filter(|d| d.json()["project"] == project && !d.json()[field].is_null())
        .collect()
}

/// The documented receiver code accepts `d` signed with `secret`, and refuses it six minutes
/// later.
fn receiver_code_checks(d: &Delivery, secret: &str, dir: &std::path::Path) {
    let file = dir.join("hook.secret");
    std::fs::write(&file, secret).unwrap();
    let header = d.header("webhook-signature").unwrap().to_owned();
    let t: i64 = header
        .split(',')
        .find_map(|p| p.strip_prefix("t="))
        .unwrap()
        .parse()
        .unwrap();
    let verify = |now: i64| {
        let mut child = std::process::Command::new("python3")
            .arg(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/examples/webhook-receiver/verify.py"
            ))
            .args(["--secret-file", file.to_str().unwrap(), "--header", &header])
            .args(["--now", &now.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(&d.body).unwrap();
        let out = child.wait_with_output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success(), said)
    };
    let (ok, why) = verify(t + 1);
    assert!(ok, "{why}");
    let (ok, why) = verify(t + 360);
    assert!(!ok && why.starts_with("stale"), "{why}");
}

#[test]
fn a_projects_webhook_gets_its_own_changes_and_alerts_signed_with_its_secret() {
    let mine = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    let theirs = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    let operator = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    let removed = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    let dir = tempfile::tempdir().unwrap();
    let gw = builder(&dir, Some(&operator.url())).in_dir(dir).start();
    let (_, acme_secret) = create(
        &gw,
        ACME,
        &mine.url(),
        &["verdict.changed", "quota.threshold"],
    );
    let (gone, _) = create(
        &gw,
        ACME,
        &removed.url(),
        &["verdict.changed", "quota.threshold"],
    );
    let (_, other_secret) = create(&gw, OTHER, &theirs.url(), &["verdict.changed"]);
    // The removed webhook gets nothing from now on.
    let r = send(
        &gw,
        "DELETE",
        &format!("/v1/webhooks/{gone}"),
        Some(ACME),
        &[],
        None,
    );
    assert_eq!(r.status, 204);
    for name in ["foo-dispo.example", "keeps-safe.example"] {
        assert_eq!(lookup(&gw, ACME, name)["reason"], "safe");
    }
    assert_eq!(lookup(&gw, OTHER, "bar-dispo.example")["reason"], "safe");
    wait_until(Duration::from_secs(10), || watched(&gw) >= 3.0);
    write_atomic(
        &gw.data_path("disposable.txt"),
        &format!("{OLD_LIST}foo-dispo.example\nbar-dispo.example\n"),
    );
    wait_until(Duration::from_secs(20), || {
        !of(&mine, "acme", "verdict.changed").is_empty()
            && !of(&theirs, "other", "verdict.changed").is_empty()
            && operator.deliveries().len() >= 2
    });
    let acme = &of(&mine, "acme", "verdict.changed")[0];
    assert!(acme.timed_signed_with(&acme_secret) && !acme.timed_signed_with(&other_secret));
    // Projects' webhooks get the timestamped signature only (a captured message cannot be
    // replayed later), and the id receivers dedupe on.
    assert_eq!(acme.header("x-signature"), None);
    assert_eq!(acme.header("webhook-id"), acme.header("x-change-id"));
    let message = acme.json();
    let names: Vec<&str> = message["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["domain"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["foo-dispo.example"]);
    let other = &of(&theirs, "other", "verdict.changed")[0];
    assert!(other.timed_signed_with(&other_secret));
    assert!(
        of(&mine, "other", "verdict.changed").is_empty(),
        "never another project's"
    );
    assert!(of(&theirs, "acme", "verdict.changed").is_empty());
    // The operator's URL still gets every project's, with its own secret and the same id.
    let ops = operator.deliveries();
    // The operator's receivers keep `X-Signature` beside it, for a release.
    assert!(ops
        .iter()
        .all(|d| d.signed_with(OPERATOR_SECRET) && d.timed_signed_with(OPERATOR_SECRET)));
    assert!(ops
        .iter()
        .any(|d| d.header("x-change-id") == acme.header("x-change-id")));
    receiver_code_checks(acme, &acme_secret, gw.dir.path());

    // acme's month reaches 80% (8 of 10 calls): its webhook gets the alert; other's does not
    // take alerts.
    for i in 0..6 {
        lookup(&gw, ACME, &format!("n{i}.example"));
    }
    wait_until(Duration::from_secs(20), || {
        !of(&mine, "acme", "quota.threshold").is_empty()
    });
    let alert = &of(&mine, "acme", "quota.threshold")[0];
    assert_eq!(alert.json()["threshold"], 80);
    assert!(alert.timed_signed_with(&acme_secret));
    assert!(alert.header("x-alert-id").is_some());
    assert_eq!(alert.header("webhook-id"), alert.header("x-alert-id"));
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        removed.deliveries().is_empty(),
        "the removed webhook got nothing"
    );
    assert!(!gw.log().contains(&acme_secret), "a secret is never logged");
}

#[test]
fn a_project_receiver_that_never_answers_delays_another_projects_by_under_a_second() {
    // acme's messages are read and never answered; other's are answered at once.
    let receiver = Receiver::start_hanging_for("127.0.0.1:0".parse().unwrap(), "acme");
    let dir = tempfile::tempdir().unwrap();
    let gw = builder(&dir, None).in_dir(dir).start();
    create(&gw, ACME, &receiver.url(), &["verdict.changed"]);
    create(&gw, OTHER, &receiver.url(), &["verdict.changed"]);
    assert_eq!(lookup(&gw, ACME, "foo-dispo.example")["reason"], "safe");
    assert_eq!(lookup(&gw, OTHER, "bar-dispo.example")["reason"], "safe");
    wait_until(Duration::from_secs(10), || watched(&gw) >= 2.0);
    let (usual, held_up) = crate::webhook::held_up_beside_a_hung_project(
        &receiver,
        &gw.data_path("disposable.txt"),
        OLD_LIST,
    );
    assert!(
        held_up < usual + Duration::from_secs(1),
        "other's message took {held_up:?}, a change usually {usual:?}"
    );
}

/// How long other's change took alone, and beside the hung receivers (other's, the operator's),
/// and how many hung attempts were in flight then.
struct BesideHung {
    usual: Duration,
    theirs: Duration,
    ops: Duration,
    held: usize,
}

/// Projects `hung` (id, key), each with `hooks` webhooks whose receivers never answer, and
/// other's webhook that answers: other's change alone (its webhook then proven), then the hung
/// projects' changes, then, once `in_flight` of their attempts hang, other's next change.
fn beside_hung(hung: &[(String, String)], hooks: usize, in_flight: usize) -> BesideHung {
    let operator = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    let fine = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    let dir = tempfile::tempdir().unwrap();
    let mut b = builder(&dir, Some(&operator.url()));
    for (p, key) in hung {
        b = b.key_in_project(p, key, "pro", p);
    }
    let gw = b.in_dir(dir).start();
    let receivers: Vec<Receiver> = hung
        .iter()
        .map(|(p, _)| Receiver::start_hanging_for("127.0.0.1:0".parse().unwrap(), p))
        .collect();
    for ((p, key), receiver) in hung.iter().zip(&receivers) {
        for _ in 0..hooks {
            create(&gw, key, &receiver.url(), &["verdict.changed"]);
        }
        assert_eq!(
            lookup(&gw, key, &format!("{p}-dispo.example"))["reason"],
            "safe"
        );
    }
    create(&gw, OTHER, &fine.url(), &["verdict.changed"]);
    assert_eq!(lookup(&gw, OTHER, "bar-dispo.example")["reason"], "safe");
    assert_eq!(lookup(&gw, OTHER, "baz-dispo.example")["reason"], "safe");
    let names = hung.len() as f64 + 2.0;
    wait_until(Duration::from_secs(10), || watched(&gw) >= names);
    let arrived = |r: &Receiver, name: &str| {
        r.deliveries()
            .iter()
            .find(|d| d.json()["changes"].to_string().contains(name))
            .map(|d| d.at)
    };
    // Alone, how long a change takes to reach other's receiver.
    let reloaded = std::time::Instant::now();
    write_atomic(
        &gw.data_path("disposable.txt"),
        &format!("{OLD_LIST}bar-dispo.example\n"),
    );
    wait_until(Duration::from_secs(20), || {
        arrived(&fine, "bar-dispo").is_some()
    });
    let usual = arrived(&fine, "bar-dispo").unwrap() - reloaded;
    // The hung projects' changes: their receivers hang; then other's change beside them.
    let hung_names: String = hung
        .iter()
        .map(|(p, _)| format!("{p}-dispo.example\n"))
        .collect();
    let list = format!("{OLD_LIST}bar-dispo.example\n{hung_names}");
    write_atomic(&gw.data_path("disposable.txt"), &list);
    let held = || {
        receivers
            .iter()
            .map(|r| r.deliveries().len())
            .sum::<usize>()
    };
    wait_until(Duration::from_secs(20), || held() >= in_flight);
    // Time for any further attempt to be taken.
    std::thread::sleep(Duration::from_millis(500));
    let reloaded = std::time::Instant::now();
    write_atomic(
        &gw.data_path("disposable.txt"),
        &format!("{list}baz-dispo.example\n"),
    );
    wait_until(Duration::from_secs(40), || {
        arrived(&fine, "baz-dispo").is_some() && arrived(&operator, "baz-dispo").is_some()
    });
    let beside = BesideHung {
        usual,
        theirs: arrived(&fine, "baz-dispo").unwrap() - reloaded,
        ops: arrived(&operator, "baz-dispo").unwrap() - reloaded,
        held: held(),
    };
    eprintln!(
        "alone {:?}; beside {} hung attempts: other's {:?}, the operator's {:?}",
        beside.usual, beside.held, beside.theirs, beside.ops
    );
    assert!(
        beside.theirs < beside.usual + Duration::from_secs(1),
        "other's {:?} against {:?} beside {} hung attempts",
        beside.theirs,
        beside.usual,
        beside.held
    );
    assert!(
        beside.ops < beside.usual + Duration::from_secs(1),
        "the operator's {:?} against {:?}",
        beside.ops,
        beside.usual
    );
    beside
}

/// `n` projects `h00`, `h01`, ... with their keys.
fn projects(n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            let key = format!("drg_hooks_h{i:02}_key_{}", "h".repeat(38));
            (format!("h{i:02}"), key)
        })
        .collect()
}

/// Four projects' twenty webhooks whose receivers never answer (each project at the plan's five)
/// hold up neither another project's delivery nor the operator's receiver by a second: each
/// project holds at most its share of the slots, and the operator's have slots of their own.
#[test]
fn twenty_hung_receivers_of_four_projects_hold_up_neither_another_project_nor_the_operator() {
    let beside = beside_hung(&projects(4), 5, 8);
    assert!(
        beside.held <= 4 * 2,
        "each project holds at most its share: {} attempts in flight",
        beside.held
    );
}

/// Accounts are free to make: sixteen new projects whose two receivers each never answer (32
/// attempts, more than the 28 project slots) hold up neither a project whose webhook has
/// delivered before nor the operator's receiver by a second; they hold half the project slots
/// at most while their first attempts hang (before: every slot, until their timeout).
#[test]
fn sixteen_new_accounts_with_hung_receivers_hold_up_no_proven_webhook() {
    let beside = beside_hung(&projects(16), 2, 14);
    assert!(
        beside.held <= 14,
        "new accounts hold the open half of the slots at most: {} attempts in flight",
        beside.held
    );
}

/// A delivery in flight when the gateway is killed (`kill -9`) is sent again within seconds of
/// the restart (the restarted gateway sees the lease's holder gone), with the same
/// `Webhook-Id`.
#[test]
fn a_delivery_in_flight_at_a_kill_9_is_sent_again_within_seconds_of_the_restart() {
    let receiver = Receiver::start_hanging_first("127.0.0.1:0".parse().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let mut gw = builder(&dir, None).in_dir(dir).start();
    create(&gw, ACME, &receiver.url(), &["verdict.changed"]);
    assert_eq!(lookup(&gw, ACME, "foo-dispo.example")["reason"], "safe");
    wait_until(Duration::from_secs(10), || watched(&gw) >= 1.0);
    write_atomic(
        &gw.data_path("disposable.txt"),
        &format!("{OLD_LIST}foo-dispo.example\n"),
    );
    wait_until(Duration::from_secs(20), || receiver.deliveries().len() == 1);
    let first = receiver.deliveries()[0].clone();
    assert_eq!(first.answered, 0, "in flight");
    gw.signal("KILL");
    assert!(gw.wait_exit(Duration::from_secs(15)));
    let dir = std::mem::replace(&mut gw.dir, tempfile::tempdir().unwrap());
    let dir2 = tempfile::tempdir().unwrap();
    let restarted = std::time::Instant::now();
    let _gw = builder(&dir2, None).in_dir(dir).start();
    wait_until(Duration::from_secs(30), || receiver.deliveries().len() >= 2);
    let took = receiver.deliveries()[1].at - restarted;
    eprintln!("sent again {took:?} after the restart");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let again = &receiver.deliveries()[1];
    assert_eq!(again.answered, 200);
    assert!(first.header("webhook-id").is_some());
    assert_eq!(
        again.header("webhook-id"),
        first.header("webhook-id"),
        "the same id"
    );
    assert_eq!(again.body, first.body, "the same bytes");
}

/// A delivery the receiver answered `2xx`, its gateway killed before the outbox recorded it:
/// at least once, never more than twice, each time with the same `Webhook-Id`.
#[test]
fn a_delivery_killed_between_the_answer_and_its_record_arrives_twice_at_most_with_one_id() {
    let receiver = Receiver::start("127.0.0.1:0".parse().unwrap(), vec![]);
    let dir = tempfile::tempdir().unwrap();
    let mut gw = builder(&dir, None)
        .env(drg_gateway::webhooks::SETTLE_PAUSE_ENV, "5000")
        .in_dir(dir)
        .start();
    create(&gw, ACME, &receiver.url(), &["verdict.changed"]);
    assert_eq!(lookup(&gw, ACME, "foo-dispo.example")["reason"], "safe");
    wait_until(Duration::from_secs(10), || watched(&gw) >= 1.0);
    write_atomic(
        &gw.data_path("disposable.txt"),
        &format!("{OLD_LIST}foo-dispo.example\n"),
    );
    // Answered 200, and the gateway waits before recording it: killed there.
    wait_until(Duration::from_secs(20), || receiver.deliveries().len() == 1);
    gw.signal("KILL");
    assert!(gw.wait_exit(Duration::from_secs(15)));
    let dir = std::mem::replace(&mut gw.dir, tempfile::tempdir().unwrap());
    let dir2 = tempfile::tempdir().unwrap();
    let _gw = builder(&dir2, None).in_dir(dir).start();
    wait_until(Duration::from_secs(20), || receiver.deliveries().len() >= 2);
    // Settled this time: nothing more comes.
    std::thread::sleep(Duration::from_secs(2));
    let all = receiver.deliveries();
    assert_eq!(all.len(), 2, "twice at most");
    assert!(all[0].header("webhook-id").is_some());
    assert_eq!(all[0].header("webhook-id"), all[1].header("webhook-id"));
    assert_eq!(all[0].body, all[1].body);
}
