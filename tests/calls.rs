//! `GET /v1/logs` and `GET /v1/stats` against the real binary, on the embedded store (SQLite in
//! the state folder) and on a real `redis-server`: paging without gaps or repeats while calls
//! arrive, stats that add up, retention, restarts, `/v1/check` verdicts taken from the upstream's
//! answer, and no local part ever stored.

use crate::common;
use crate::redis_server;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{wait_until, Conn, Gateway, GatewayBuilder, TEST_SECRET};
use redis_server::RedisServer;
use serde_json::Value;

const OTHER_SECRET: &str = "drg_other_project_key_0123456789abcdefghijklm";
/// The local part every check sends: it must never reach a store.
const LOCAL: &str = "someone.secret";
const WAIT: Duration = Duration::from_secs(10);

/// A backend answering `/v1/check/{target}` with a JSON verdict: `risk_score` 95 and
/// `disposable` for targets mentioning `dispo`, 10 and `safe` otherwise; targets mentioning
/// `noverdict` get JSON without a verdict.
struct JsonUpstream {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl JsonUpstream {
    fn start() -> JsonUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    thread::spawn(move || serve_json(stream));
                }
            }
        });
        JsonUpstream { addr, stop }
    }
}

impl Drop for JsonUpstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve_json(stream: TcpStream) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
        }
        let body = if path.contains("noverdict") {
            format!("{{\"checked\":{}}}", Value::from(path.as_str()))
        } else {
            let (score, reason) = if path.contains("dispo") {
                (95, "disposable")
            } else {
                (10, "safe")
            };
            format!(
                "{{\"email\":{},\"risk_score\":{score},\"reason\":\"{reason}\",\"detail\":{{\"x\":[1,2]}}}}",
                Value::from(path.as_str())
            )
        };
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if reader.get_mut().write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

fn builder() -> GatewayBuilder {
    Gateway::builder()
        .data("disposable.txt", "dispo.example\n")
        .key("other", OTHER_SECRET, "test", &[])
        .gateway_yaml("calls: { batch_interval_ms: 20, sweep_interval_seconds: 1 }")
}

fn text(r: &common::Response) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

fn get(gw: &Gateway, secret: &str, path: &str) -> common::Response {
    Conn::open_as(gw.addr, Some(secret))
        .unwrap()
        .get(path)
        .unwrap()
}

/// Every log entry of the key's project, newest first, paging `limit` at a time; `between`
/// runs after each page (to make calls while paging).
fn all_logs(gw: &Gateway, secret: &str, limit: usize, mut between: impl FnMut()) -> Vec<Value> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/logs?limit={limit}&cursor={c}"),
            None => format!("/v1/logs?limit={limit}"),
        };
        let r = get(gw, secret, &path);
        assert_eq!(r.status, 200, "{}", text(&r));
        let body = r.json();
        let page = body["items"].as_array().unwrap().clone();
        assert!(page.len() <= limit);
        items.extend(page);
        between();
        match &body["next_cursor"] {
            Value::Null => return items,
            Value::String(c) => cursor = Some(c.clone()),
            other => panic!("next_cursor {other}"),
        }
    }
}

fn log_count(gw: &Gateway, secret: &str) -> usize {
    all_logs(gw, secret, 100, || {}).len()
}

fn today_stats(gw: &Gateway, secret: &str) -> (u64, u64) {
    let r = get(gw, secret, "/v1/stats");
    assert_eq!(r.status, 200, "{}", text(&r));
    let chart = r.json()["chart"].as_array().unwrap().clone();
    let last = chart.last().unwrap();
    (
        last["total_requests"].as_u64().unwrap(),
        last["blocked_count"].as_u64().unwrap(),
    )
}

fn lookups(gw: &Gateway, names: impl IntoIterator<Item = String>) {
    let mut c = gw.conn();
    for name in names {
        let r = c.get(&format!("/v1/public/domain/{name}")).unwrap();
        assert_eq!(r.status, 200, "{name}: {}", text(&r));
    }
}

/// 120 lookups paged 7 at a time while other lookups keep arriving: every call exactly once,
/// newest first, and the calls made meanwhile never slip into later pages.
fn pages_without_gaps_or_repeats(gw: &Gateway) {
    let names: Vec<String> = (0..120).map(|i| format!("n{i}.example")).collect();
    lookups(gw, names.clone());
    wait_until(WAIT, || log_count(gw, TEST_SECRET) == 120);
    let mut extra = 0;
    let items = all_logs(gw, TEST_SECRET, 7, || {
        lookups(gw, [format!("late{extra}.example")]);
        extra += 1;
    });
    let got: Vec<&str> = items
        .iter()
        .map(|i| i["email_domain"].as_str().unwrap())
        .collect();
    let want: Vec<&str> = names.iter().rev().map(String::as_str).collect();
    assert_eq!(got, want);
    let ids: BTreeSet<&str> = items.iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 120, "ids are unique");
    let first = &items[0];
    assert_eq!(first["risk_score"], 20);
    assert_eq!(first["reason"], "safe");
    assert!(first["created_at"].as_str().unwrap().ends_with('Z'));
    // The calls made while paging are there, before all the earlier ones, on a fresh first
    // page (once the writer's next batch is in). Among themselves their order is the order
    // they were recorded in, once answered: two calls answered on two worker threads may be
    // recorded either way round, so the set is compared.
    wait_until(WAIT, || log_count(gw, TEST_SECRET) == 120 + extra);
    let r = get(gw, TEST_SECRET, &format!("/v1/logs?limit={extra}"));
    let first: BTreeSet<String> = r.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["email_domain"].as_str().unwrap().to_owned())
        .collect();
    let late: BTreeSet<String> = (0..extra).map(|i| format!("late{i}.example")).collect();
    assert_eq!(first, late);
    // Another project sees none of it.
    let r = get(gw, OTHER_SECRET, "/v1/logs");
    assert_eq!(
        r.json(),
        serde_json::json!({"items": [], "next_cursor": null})
    );
}

/// Ids and cursors are the project's own: another project's first entry has the first id of
/// its own log (`first_id`), whatever the busy project did, and a cursor given to one project
/// is refused to another.
fn ids_and_cursors_are_per_project(gw: &Gateway, first_id: impl Fn(&str) -> bool) {
    let r = Conn::open_as(gw.addr, Some(OTHER_SECRET))
        .unwrap()
        .get("/v1/public/domain/other.example")
        .unwrap();
    assert_eq!(r.status, 200, "{}", text(&r));
    wait_until(WAIT, || log_count(gw, OTHER_SECRET) == 1);
    let item = get(gw, OTHER_SECRET, "/v1/logs").json()["items"][0].clone();
    assert_eq!(item["email_domain"], "other.example");
    let id = item["id"].as_str().unwrap();
    assert!(first_id(id), "the other project's first id is {id}");
    let page = get(gw, TEST_SECRET, "/v1/logs?limit=1").json();
    let cursor = page["next_cursor"]
        .as_str()
        .expect("a second page")
        .to_owned();
    assert_eq!(
        get(gw, TEST_SECRET, &format!("/v1/logs?cursor={cursor}")).status,
        200
    );
    get(gw, OTHER_SECRET, &format!("/v1/logs?cursor={cursor}"))
        .assert_error(422, "validation_error");
}

/// Lookups and checks, safe and not: the stats of today add up; checks are logged with the
/// upstream's verdict under their domain; a check answered without a verdict is counted, not
/// logged.
fn stats_and_checks_add_up(gw: &Gateway) -> (u64, u64) {
    let (total0, blocked0) = today_stats(gw, TEST_SECRET);
    let logged0 = log_count(gw, TEST_SECRET);
    lookups(
        gw,
        ["a.dispo.example", "fine.example", "dispo.example"].map(String::from),
    );
    // A call is logged once answered, on the thread that answered: the last lookup's could
    // follow a check answered on another connection (and thread) meanwhile, and the log's order
    // below is the order calls were logged in.
    wait_until(WAIT, || log_count(gw, TEST_SECRET) == logged0 + 3);
    let mut c = gw.conn();
    for target in [
        format!("{LOCAL}@dispo.example"),
        format!("{LOCAL}@checked.example"),
        format!("{LOCAL}@noverdict.example"),
    ] {
        let r = c.get(&format!("/v1/check/{target}")).unwrap();
        assert_eq!(r.status, 200, "{}", text(&r));
        assert!(text(&r).contains("\"email\"") || text(&r).contains("checked"));
    }
    // 6 answered calls, 3 of them blocked (two disposable lookups and one disposable check).
    wait_until(WAIT, || {
        today_stats(gw, TEST_SECRET) == (total0 + 6, blocked0 + 3)
    });
    wait_until(WAIT, || log_count(gw, TEST_SECRET) == logged0 + 5);
    let r = get(gw, TEST_SECRET, "/v1/logs?limit=5");
    let items = r.json()["items"].as_array().unwrap().clone();
    let seen: Vec<(String, u64, String)> = items
        .iter()
        .map(|i| {
            (
                i["email_domain"].as_str().unwrap().to_owned(),
                i["risk_score"].as_u64().unwrap(),
                i["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        seen[..2],
        [
            ("checked.example".to_owned(), 10, "safe".to_owned()),
            ("dispo.example".to_owned(), 95, "disposable".to_owned()),
        ]
    );
    assert_eq!(seen[2].0, "dispo.example");
    assert_eq!(seen[2].2, "disposable");
    assert!(!text(&r).contains(LOCAL));
    // The chart: 30 consecutive days ending today (UTC), days without calls at zero.
    let chart = get(gw, TEST_SECRET, "/v1/stats").json()["chart"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(chart.len(), 30);
    let dates: Vec<chrono::NaiveDate> = chart
        .iter()
        .map(|d| d["date"].as_str().unwrap().parse().unwrap())
        .collect();
    assert!(dates
        .windows(2)
        .all(|w| w[1] - w[0] == chrono::TimeDelta::days(1)));
    assert_eq!(chart[0]["total_requests"], 0);
    (total0 + 6, blocked0 + 3)
}

/// Not counted, and keyed like every other `/v1/` route.
fn key_required_and_not_counted(gw: &Gateway) {
    let used = |gw: &Gateway| get(gw, TEST_SECRET, "/v1/usage").json()["month_count"].clone();
    let before = used(gw);
    for path in ["/v1/logs", "/v1/stats", "/v1/logs?limit=3"] {
        assert_eq!(get(gw, TEST_SECRET, path).status, 200);
        gw.conn_as(None)
            .get(path)
            .unwrap()
            .assert_error(401, "unauthorized");
        gw.conn_as(Some("drg_nope"))
            .get(path)
            .unwrap()
            .assert_error(401, "unauthorized");
    }
    assert_eq!(used(gw), before);
    for bad in [
        "limit=0",
        "limit=101",
        "limit=x",
        "cursor=a.b",
        "cursor=zzzz",
    ] {
        let r = get(gw, TEST_SECRET, &format!("/v1/logs?{bad}"));
        r.assert_error(422, "validation_error");
    }
}

fn store_files(dir: &std::path::Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    for name in ["calls.sqlite3", "calls.sqlite3-wal"] {
        if let Ok(b) = std::fs::read(dir.join("state").join(name)) {
            bytes.extend(b);
        }
    }
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn shifted_clock(hours: i64) -> String {
    (chrono::Utc::now() + chrono::TimeDelta::hours(hours))
        .format("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[test]
fn embedded_logs_and_stats() {
    let upstream = JsonUpstream::start();
    let gw = builder().upstream(upstream.addr).start();
    key_required_and_not_counted(&gw);
    pages_without_gaps_or_repeats(&gw);
    ids_and_cursors_are_per_project(&gw, |id| id == "1");
    let stats = stats_and_checks_add_up(&gw);
    let logged = log_count(&gw, TEST_SECRET);
    let dir = gw.stop();
    // The store file is in the state folder, holds the checked domain and never a local part.
    let bytes = store_files(dir.path());
    assert!(contains(&bytes, "checked.example"), "store file not found");
    assert!(!contains(&bytes, LOCAL), "a local part reached the store");

    // A restart keeps logs and stats.
    let gw = builder().upstream(upstream.addr).in_dir(dir).start();
    assert_eq!(log_count(&gw, TEST_SECRET), logged);
    assert_eq!(today_stats(&gw, TEST_SECRET), stats);
    let dir = gw.stop();

    // 25 hours later the test plan's 24 h retention has passed: nothing is shown, and the
    // sweep deletes the entries (the stats of yesterday stay in the chart).
    let gw = builder()
        .upstream(upstream.addr)
        .env(drg_gateway::server::CLOCK_START_ENV, &shifted_clock(25))
        .in_dir(dir)
        .start();
    assert_eq!(log_count(&gw, TEST_SECRET), 0);
    let chart = get(&gw, TEST_SECRET, "/v1/stats").json()["chart"].clone();
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let day = chart
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["date"] == today.as_str())
        .expect("today is in the chart of 25 h later");
    assert_eq!(day["total_requests"], stats.0);
    assert_eq!(chart[29]["total_requests"], 0);
    // The other project's one entry expires too.
    wait_until(WAIT, || {
        metric(&gw, "drg_calls_expired_total") == logged as u64 + 1
    });
    // Back in time, the read filter would show them again: the sweep deleted them for good.
    let dir = gw.stop();
    let gw = builder().upstream(upstream.addr).in_dir(dir).start();
    assert_eq!(log_count(&gw, TEST_SECRET), 0, "the sweep deleted them");
    assert_eq!(today_stats(&gw, TEST_SECRET), stats);
}

/// The nice value of each of the gateway's threads, by thread name (Linux's `/proc`; names are
/// cut to 15 bytes there).
fn thread_nice(gw: &Gateway) -> Vec<(String, i32)> {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", gw.pid())).unwrap();
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
        .map(|stat| {
            let open = stat.find('(').unwrap();
            let close = stat.rfind(')').unwrap();
            // After the name: state is the 3rd field of the line, nice the 19th.
            let nice = stat[close + 1..].split_whitespace().nth(16).unwrap();
            (stat[open + 1..close].to_string(), nice.parse().unwrap())
        })
        .collect()
}

fn nice_of(gw: &Gateway, thread: &str) -> Option<i32> {
    thread_nice(gw)
        .into_iter()
        .find_map(|(name, nice)| (name == thread).then_some(nice))
}

/// With the embedded store the call log's service thread and the writer run at nice 10, out of
/// the workers' way; the workers stay at 0.
#[test]
fn the_embedded_writer_runs_below_the_workers() {
    let gw = builder().start();
    wait_until(WAIT, || nice_of(&gw, "BG call logs") == Some(10));
    assert_eq!(nice_of(&gw, "drg-calls-write"), Some(10));
    let workers: Vec<_> = thread_nice(&gw)
        .into_iter()
        .filter(|(name, _)| name.starts_with("domain-risk"))
        .collect();
    assert!(!workers.is_empty());
    assert!(workers.iter().all(|(_, nice)| *nice == 0), "{workers:?}");
}

#[test]
fn checks_are_logged_with_the_backends_verdict_in_both_upstream_modes() {
    let upstream = JsonUpstream::start();
    for mode in ["proxy", "relay"] {
        let gw = builder()
            .upstream(upstream.addr)
            .upstream_yaml(&format!("mode: {mode}"))
            .start();
        stats_and_checks_add_up(&gw);
    }
}

fn metric(gw: &Gateway, name: &str) -> u64 {
    let metrics = text(&gw.admin_get("/metrics"));
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("{name} in {metrics}"))
        .parse()
        .unwrap()
}

/// Under steady traffic the writer stores once a tick, not without end: calls that arrive
/// during a write wait for the next tick instead of making a transaction of their own (which
/// wrote every B-tree page again for a handful of calls each).
#[test]
fn steady_traffic_is_stored_once_a_tick() {
    const TICK: Duration = Duration::from_millis(500);
    let gw = Gateway::builder()
        .gateway_yaml("calls: { batch_interval_ms: 500, max_per_project: 1000000 }")
        .start();
    let started = std::time::Instant::now();
    let mut c = gw.conn();
    let mut n = 0u64;
    while started.elapsed() < TICK * 5 {
        if n % 100 == 99 {
            // Within the requests one connection may carry.
            c = gw.conn();
        }
        let r = c.get(&format!("/v1/public/domain/s{n}.example")).unwrap();
        assert_eq!(r.status, 200, "{}", text(&r));
        n += 1;
    }
    let took = started.elapsed();
    wait_until(WAIT, || metric(&gw, "drg_calls_written_total") == n);
    let db = rusqlite::Connection::open_with_flags(
        gw.dir.path().join("state/calls.sqlite3"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let (chunks, entries): (i64, i64) = db
        .query_row("SELECT COUNT(*), SUM(entries) FROM chunks", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    let (chunks, entries) = (chunks as u64, entries as u64);
    assert_eq!(entries, n);
    // One transaction a tick (two more for the ticks at each end), plus one per 512 calls a
    // tick holds beyond the first 512.
    let ticks = took.as_millis() as u64 / TICK.as_millis() as u64 + 3;
    let most = ticks + n / 512;
    assert!(
        chunks <= most,
        "{n} calls in {took:?} stored in {chunks} transactions (at most {most})"
    );
    eprintln!("{n} calls in {took:?}: {chunks} transactions");
}

#[test]
fn full_queue_drops_and_counts() {
    let gw = Gateway::builder()
        .gateway_yaml("calls: { queue_capacity: 1, batch_interval_ms: 10000 }")
        .start();
    lookups(&gw, (0..20).map(|i| format!("q{i}.example")));
    // One fits in the queue (two if the writer's first batch came after the first call); the
    // requests never waited for the writer.
    let dropped = metric(&gw, "drg_calls_dropped_total");
    assert!((18..=19).contains(&dropped), "{dropped}");
}

#[test]
fn off_means_404_and_nothing_stored() {
    let gw = Gateway::builder()
        .gateway_yaml("calls: { enabled: false }")
        .start();
    lookups(&gw, ["a.example".to_owned()]);
    get(&gw, TEST_SECRET, "/v1/logs").assert_error(404, "not_found");
    get(&gw, TEST_SECRET, "/v1/stats").assert_error(404, "not_found");
    gw.conn_as(None)
        .get("/v1/logs")
        .unwrap()
        .assert_error(404, "not_found");
    assert!(!gw.dir.path().join("state/calls.sqlite3").exists());
}

fn redis_keys_dump(redis: &RedisServer) -> String {
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .args(["-p", &redis.port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut dump = String::new();
    for key in cli(&["--scan"]).lines() {
        dump.push_str(key);
        dump.push('\n');
        dump.push_str(&cli(&["XRANGE", key, "-", "+"]));
        dump.push_str(&cli(&["HGETALL", key]));
    }
    dump
}

#[test]
fn redis_logs_and_stats() {
    let redis = RedisServer::start(false);
    let upstream = JsonUpstream::start();
    let start = |clock: Option<String>| {
        let mut b = builder()
            .redis(&redis.url(), "fail_open")
            .upstream(upstream.addr);
        if let Some(c) = clock {
            b = b.env(drg_gateway::server::CLOCK_START_ENV, &c);
        }
        b.start()
    };
    let gw = start(None);
    key_required_and_not_counted(&gw);
    // The Redis link's driver task runs on the call log service's runtime, made on first use:
    // that thread keeps the workers' priority, so the reads below never wait behind them.
    assert_eq!(
        nice_of(&gw, "BG call logs"),
        Some(0),
        "{:?}",
        thread_nice(&gw)
    );
    pages_without_gaps_or_repeats(&gw);
    // A call is `<ms>-<n>/<i>`: its chunk's stream id, n counting entries of the same
    // millisecond of this project's own stream, then its place in the chunk.
    ids_and_cursors_are_per_project(&gw, |id| id.ends_with("-0/0"));
    let stats = stats_and_checks_add_up(&gw);
    let logged = log_count(&gw, TEST_SECRET);
    // A second gateway on the same Redis sees the same logs and stats.
    let gw2 = start(None);
    assert_eq!(log_count(&gw2, TEST_SECRET), logged);
    assert_eq!(today_stats(&gw2, TEST_SECRET), stats);
    drop(gw2);
    let dump = redis_keys_dump(&redis);
    assert!(dump.contains("calls:{test}:log"), "{dump}");
    assert!(dump.contains("checked.example"), "{dump}");
    assert!(!dump.contains(LOCAL), "a local part reached Redis");
    gw.stop();

    // Past the retention: hidden at once, then trimmed by the sweep.
    let gw = start(Some(shifted_clock(25)));
    assert_eq!(log_count(&gw, TEST_SECRET), 0);
    wait_until(WAIT, || {
        !redis_keys_dump(&redis).contains("checked.example")
    });
    gw.stop();
    let gw = start(None);
    assert_eq!(log_count(&gw, TEST_SECRET), 0);
    assert_eq!(today_stats(&gw, TEST_SECRET), stats);
}

fn redis_cli(redis: &RedisServer, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &redis.port.to_string()])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "redis-cli {args:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// On Redis a project's log keeps at least `max_per_project` calls and at most a chunk more
/// (whole oldest chunks go, trimmed once a batch of the writer by the script that appends it),
/// while its day counts keep every call. Its count of calls agrees with the log.
#[test]
fn redis_log_is_trimmed_to_about_max_per_project() {
    let redis = RedisServer::start(false);
    let gw = Gateway::builder()
        .redis(&redis.url(), "fail_open")
        .gateway_yaml("calls: { batch_interval_ms: 20, max_per_project: 100 }")
        .start();
    for round in 0..10 {
        let names: Vec<String> = (0..100).map(|i| format!("t{round}-{i}.example")).collect();
        let r = common::post_batch(&gw, TEST_SECRET, &names);
        assert_eq!(r.status, 200, "{}", text(&r));
    }
    wait_until(WAIT, || today_stats(&gw, TEST_SECRET).0 == 1000);
    let logged = log_count(&gw, TEST_SECRET);
    // A chunk holds up to 128 calls (two posts may share one).
    assert!((100..228).contains(&logged), "{logged} calls kept");
    let kept: usize = redis_cli(&redis, &["GET", "calls:{test}:kept"])
        .parse()
        .unwrap();
    assert_eq!(kept, logged);
    // Chunks, not an entry a call; text with the newest call's `t`, which is what an earlier
    // build reading the stream during an upgrade needs to skip them and to sweep by time.
    let entries: usize = redis_cli(&redis, &["XLEN", "calls:{test}:log"])
        .parse()
        .unwrap();
    assert!((1..=logged / 2).contains(&entries), "{entries} entries");
    let raw = Command::new("redis-cli")
        .args([
            "-p",
            &redis.port.to_string(),
            "XRANGE",
            "calls:{test}:log",
            "-",
            "+",
        ])
        .output()
        .unwrap()
        .stdout;
    let raw = String::from_utf8(raw).expect("chunks are text");
    for field in ["n", "t", "c"] {
        assert!(raw.lines().any(|l| l == field), "no field {field}: {raw}");
    }
    assert!(raw.contains(" safe t9-"), "{raw}");
    // The newest calls are the ones kept: of the last rounds only. (A batch's calls are logged
    // once it is answered, so on a loaded machine the next batch's may be logged among them:
    // which of two adjacent rounds is newest is not the point.)
    let rounds: Vec<u32> = all_logs(&gw, TEST_SECRET, 100, || {})
        .iter()
        .map(|e| {
            let d = e["email_domain"].as_str().unwrap();
            d[1..d.find('-').unwrap()].parse().unwrap()
        })
        .collect();
    assert!(rounds.iter().all(|r| *r >= 6), "{rounds:?}");
    assert!(rounds.contains(&9), "{rounds:?}");
}

/// A log written by an earlier build (an entry a call: `d`, `s`, `r`, `t`) stays readable beside
/// the chunks written after it, and pages run across both.
#[test]
fn redis_entries_of_earlier_builds_stay_readable() {
    let redis = RedisServer::start(false);
    let now_ms = chrono::Utc::now().timestamp_millis().to_string();
    for (i, name) in ["old-a.example", "old-b.example"].iter().enumerate() {
        let id = format!("{}-{i}", chrono::Utc::now().timestamp_millis() - 5_000);
        redis_cli(
            &redis,
            &[
                "XADD",
                "calls:{test}:log",
                &id,
                "d",
                name,
                "s",
                "95",
                "r",
                "disposable",
                "t",
                &now_ms,
            ],
        );
    }
    let gw = Gateway::builder()
        .redis(&redis.url(), "fail_open")
        .gateway_yaml("calls: { batch_interval_ms: 20 }")
        .start();
    let names: Vec<String> = (0..5).map(|i| format!("new{i}.example")).collect();
    lookups(&gw, names);
    wait_until(WAIT, || log_count(&gw, TEST_SECRET) == 7);
    let items = all_logs(&gw, TEST_SECRET, 2, || {});
    let domains: Vec<&str> = items
        .iter()
        .map(|i| i["email_domain"].as_str().unwrap())
        .collect();
    assert_eq!(
        domains,
        [
            "new4.example",
            "new3.example",
            "new2.example",
            "new1.example",
            "new0.example",
            "old-b.example",
            "old-a.example"
        ]
    );
    assert_eq!(items[6]["reason"], "disposable");
    // The log's count starts from the entries of the earlier build.
    assert_eq!(redis_cli(&redis, &["GET", "calls:{test}:kept"]), "7");
    let ids: std::collections::HashSet<&str> =
        items.iter().map(|i| i["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 7);
}

/// A project past its share of the writer's queue loses its own calls only: a big batch of one
/// project leaves another project's calls their place.
#[test]
fn a_projects_share_of_the_queue_drops_its_own_calls_only() {
    let queue = "calls: { queue_capacity: 100, queue_per_project: 10, batch_interval_ms: 10000 }";
    let gw = Gateway::builder()
        .key("other", OTHER_SECRET, "test", &[])
        .gateway_yaml(queue)
        .start();
    let names: Vec<String> = (0..50).map(|i| format!("b{i}.example")).collect();
    let r = common::post_batch(&gw, TEST_SECRET, &names);
    assert_eq!(r.status, 200, "{}", text(&r));
    let mut c = Conn::open_as(gw.addr, Some(OTHER_SECRET)).unwrap();
    for i in 0..10 {
        let r = c.get(&format!("/v1/public/domain/o{i}.example")).unwrap();
        assert_eq!(r.status, 200);
    }
    assert_eq!(metric(&gw, "drg_calls_over_share_total"), 40);
    assert_eq!(metric(&gw, "drg_calls_dropped_total"), 40);
    // The last drain at the stop stores what waited: 10 of the batch, all 10 of the other's.
    let dir = gw.stop();
    let gw = Gateway::builder()
        .key("other", OTHER_SECRET, "test", &[])
        .gateway_yaml(queue)
        .in_dir(dir)
        .start();
    assert_eq!(today_stats(&gw, TEST_SECRET).0, 10);
    assert_eq!(today_stats(&gw, OTHER_SECRET).0, 10);
}

/// A call answered after the stop began (a slow `/v1/check` still in flight when the drain
/// ends) reaches the logs and stats: the writer's last drain waits for the requests in flight,
/// as the quota's last sync does.
#[test]
fn calls_in_flight_at_a_stop_are_stored() {
    let upstream = common::Upstream::start(Duration::from_millis(2_500));
    let mut gw = Gateway::builder()
        .gateway_yaml(&format!(
            "upstream: {{ address: {}, read_timeout_ms: 10000 }}",
            upstream.addr
        ))
        .grace_seconds(6)
        .gateway_yaml("calls: { batch_interval_ms: 10000 }")
        .start();
    lookups(&gw, ["before.example".to_owned()]);
    let addr = gw.addr;
    let slow = thread::spawn(move || {
        let mut c = Conn::open(addr).unwrap();
        c.get("/v1/check/late.example").unwrap().status
    });
    // In flight once the backend has it (a fixed wait could signal before it even arrived).
    wait_until(Duration::from_secs(10), || upstream.requests().len() == 1);
    gw.signal("TERM");
    assert_eq!(slow.join().unwrap(), 200);
    assert!(gw.wait_exit(Duration::from_secs(20)), "{}", gw.log());
    let dir = std::mem::replace(&mut gw.dir, tempfile::tempdir().unwrap());
    let gw = Gateway::builder()
        .gateway_yaml("calls: { batch_interval_ms: 10000 }")
        .in_dir(dir)
        .start();
    assert_eq!(
        today_stats(&gw, TEST_SECRET).0,
        2,
        "the check answered after the stop began"
    );
}
