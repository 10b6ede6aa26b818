//! MX evidence under load, end to end: the release binary on loopback, asking a real DNS server
//! on loopback (tests/common/dns.rs), driven by keep-alive HTTP/1.1 clients.
//!
//! A. Fairness of DNS work between projects. Project B's clients look up distinct company names
//!    (every one a DNS miss, MX `aspmx.l.google.com`, so "Google Workspace" when the evidence
//!    arrives in time) for 15 s, alone, then while project A posts a 1,000-name batch every
//!    second of names under zones that never answer. The DNS server holds each answer 5 ms, as
//!    a real resolver would. Alternating rounds, a fresh gateway and fresh names per run.
//!    Reported: B's requests, p50, p99, max and share of answers with MX evidence, and
//!    p99(with A) / p99(alone); the goal is B keeping its evidence and its p99 within 1.2x.
//! B. Lookup p99 across saves of a big MX-neighbourhood index. 200,000 domains on 20,000 hosts
//!    loaded from a snapshot, `save_interval_seconds: 10`; clients look up 2,000 names whose MX
//!    answers are cached (each still asks the index), while 50 new names a second teach it (a
//!    write lock, and a save that really runs) and, as a control, 20 names a second that do
//!    not exist go to DNS and teach nothing. Reported per 5-s window over 60 s: requests, p50,
//!    p99, max, and which windows saw the state file replaced; then each save up close (seen
//!    from outside, by its temporary file) and the paced DNS lookups around it.
//!
//! `cargo bench --bench evidence` (about four minutes; markdown tables on stdout).
//! `EVIDENCE_SCENARIO=a` or `=b` runs one scenario; `EVIDENCE_ROUNDS=n` sets A's rounds (3).

#[path = "../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "../tests/common/dns.rs"]
mod dns;

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{send, wait_until, Conn, Gateway, GatewayBuilder};
use dns::{DnsServer, Zone};
use serde_json::{json, Value};

const SECRET_A: &str = "drg_bench_project_a_key_0123456789abcdefghijkl";
const SECRET_B: &str = "drg_bench_project_b_key_0123456789abcdefghijkl";

/// A plan no run exhausts: the harness's `test` plan allows 1,000,000 lookups a month, which
/// a closed loop on loopback passes within a minute (and would then measure 429s).
const PLAN: &str = "bench";

/// Client threads: project B's in scenario A, the cached lookups' in scenario B.
const CLIENTS: usize = 4;

/// A: how long B measures per run, and the names it may use (each once; about four times
/// what its clients get through on loopback: a client out of names stops, never repeats one).
const FAIR_RUN: Duration = Duration::from_secs(15);
const FAIR_NAMES: usize = 40_000;
/// A: names per batch of project A, and the batches it may send at most (one a second).
const BATCH: usize = 1_000;
const MAX_BATCHES: u64 = 60;
/// A: what a real resolver takes to answer (canaries and TLDs are answered at once).
const DNS_DELAY: Duration = Duration::from_millis(5);

/// B: the index loaded at start, on this many hosts (ten per parent).
const INDEX_DOMAINS: usize = 200_000;
const INDEX_HOSTS: usize = 20_000;
/// B: cached names looked up in a loop, and new names taught per second.
const HOT_NAMES: usize = 2_000;
const NEW_PER_SECOND: u64 = 50;
/// B: names that do not exist (NXDOMAIN: a DNS lookup that teaches nothing) per second, a
/// control: if they are slow at a save too, the wait is not the index's write lock.
const ABSENT_PER_SECOND: u64 = 20;
const SAVE_RUN: Duration = Duration::from_secs(60);
const WINDOW: Duration = Duration::from_secs(5);
const SAVE_INTERVAL_SECONDS: u64 = 10;

/// Requests one client sends at most (a bound besides the time).
const MAX_PER_CLIENT: usize = 5_000_000;

fn main() {
    let which = std::env::var("EVIDENCE_SCENARIO").unwrap_or_default();
    let rounds: usize = std::env::var("EVIDENCE_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3)
        .max(1);
    if which.is_empty() || which == "a" {
        fairness(rounds);
    }
    if which.is_empty() || which == "b" {
        saves();
    }
}

/// A gateway on `dns` with the gateway's own MX defaults (the harness shortens some for tests)
/// and a real deployment's cache lifetimes, two projects on a plan no run exhausts, and the
/// shipped provider labels (so Google's MX host reads "Google Workspace").
fn builder(dns: SocketAddr) -> GatewayBuilder {
    Gateway::builder()
        .dns(dns)
        .data("mx_providers.csv", &dns::shipped_providers())
        .plan(PLAN, 1_000_000_000_000)
        .key_in_project("a", SECRET_A, PLAN, "project-a")
        .key_in_project("b", SECRET_B, PLAN, "project-b")
        .mx_yaml("budget_ms: 250")
        .mx_yaml("query_timeout_ms: 2000")
        .mx_yaml("max_inflight: 256")
        .mx_yaml("max_inflight_per_project: 64")
        .mx_yaml("min_ttl_seconds: 60")
        .mx_yaml("failure_ttl_seconds: 30")
}

fn resolver_state(gw: &Gateway) -> String {
    gw.admin_get("/readyz").json()["mx"]["resolver"]
        .as_str()
        .unwrap_or("?")
        .to_owned()
}

/// Waits until the gateway trusts its resolver: before that, MX evidence is off.
fn wait_trusted(gw: &Gateway) {
    wait_until(Duration::from_secs(30), || resolver_state(gw) == "trusted");
}

/// WARN and ERROR lines of the gateway's log (a few), so a surprise shows in the output.
fn log_problems(gw: &Gateway) -> Vec<String> {
    gw.log()
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .take(5)
        .map(str::to_owned)
        .collect()
}

/// One answered request: when it was sent (since the run's start) and how long it took.
#[derive(Clone, Copy)]
struct Sample {
    at: Duration,
    latency: Duration,
    evidence: bool,
}

/// What one client thread saw.
#[derive(Default)]
struct ClientRun {
    samples: Vec<Sample>,
    /// Answers other than 200, and requests that failed twice.
    errors: usize,
    /// Connections reopened: the gateway closes a kept-alive one after its request limit.
    reconnects: usize,
}

/// A keep-alive client: GETs `/v1/public/domain/{name}` for each name `next` gives, until it
/// gives none, `until` passed (since `t0`) or `MAX_PER_CLIENT` requests. Evidence: the answer
/// names an MX provider or says the domain has corporate mail.
fn client(
    addr: SocketAddr,
    secret: &str,
    t0: Instant,
    until: Duration,
    mut next: impl FnMut(usize) -> Option<String>,
) -> ClientRun {
    let mut run = ClientRun::default();
    let open = || Conn::open_as(addr, Some(secret)).expect("connect");
    let mut conn = open();
    for i in 0..MAX_PER_CLIENT {
        let Some(name) = next(i) else { break };
        let at = t0.elapsed();
        if at >= until {
            break;
        }
        let path = format!("/v1/public/domain/{name}");
        let mut sent = Instant::now();
        let mut answer = conn.get(&path);
        if answer.is_err() {
            // A connection closed under us: once more on a new one (that request is timed).
            run.reconnects += 1;
            conn = open();
            sent = Instant::now();
            answer = conn.get(&path);
        }
        let latency = sent.elapsed();
        let r = match answer {
            Ok(r) => r,
            Err(_) => {
                run.errors += 1;
                run.reconnects += 1;
                conn = open();
                continue;
            }
        };
        if r.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
        {
            run.reconnects += 1;
            conn = open();
        }
        if r.status != 200 {
            run.errors += 1;
            continue;
        }
        let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        let evidence = v["mx_provider_label"].is_string() || v["is_corporate_email"] == true;
        run.samples.push(Sample {
            at,
            latency,
            evidence,
        });
    }
    run
}

/// The 1-minute load average: the machine is shared (other builds), so each run says what
/// it ran beside.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// Latency summary of some samples (milliseconds).
#[derive(Clone, Copy, Default)]
struct Summary {
    requests: usize,
    p50: f64,
    p99: f64,
    max: f64,
    evidence: f64,
}

fn summarize(samples: &[Sample]) -> Summary {
    if samples.is_empty() {
        return Summary::default();
    }
    let mut us: Vec<u64> = samples
        .iter()
        .map(|s| s.latency.as_micros() as u64)
        .collect();
    us.sort_unstable();
    // Nearest rank.
    let rank = |q: f64| us[((q * us.len() as f64).ceil() as usize).clamp(1, us.len()) - 1];
    let ms = |v: u64| v as f64 / 1000.0;
    Summary {
        requests: us.len(),
        p50: ms(rank(0.50)),
        p99: ms(rank(0.99)),
        max: ms(us[us.len() - 1]),
        evidence: samples.iter().filter(|s| s.evidence).count() as f64 / samples.len() as f64,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

// ---------------------------------------------------------------------------------------------
// A. Fairness of DNS work between projects.

/// One run of scenario A, for the table.
struct FairRun {
    round: usize,
    noisy: bool,
    b: Summary,
    errors: usize,
    reconnects: usize,
    /// Project A's batches: how many, their median and longest time, answers other than 200.
    batches: usize,
    batch_p50_ms: f64,
    batch_max_ms: f64,
    batch_errors: usize,
    /// The load average before and after the run.
    load: (String, String),
    refused: f64,
    resolver_after: String,
    problems: Vec<String>,
}

fn fairness(rounds: usize) {
    println!("## A. Fairness of DNS work between projects\n");
    println!(
        "Project B: {CLIENTS} keep-alive clients, distinct names (each a DNS miss, MX \
         aspmx.l.google.com), {}s per run. Run 2 adds project A: a {BATCH}-name batch every \
         ~1 s of names under zones that never answer (fresh names and zones each batch). DNS \
         answers held {} ms. Gateway defaults: budget 250 ms, query timeout 2000 ms, 256 slots, \
         64 per project.\n",
        FAIR_RUN.as_secs(),
        DNS_DELAY.as_millis()
    );
    println!(
        "| round | run | B requests | B errors (reconnects) | p50 ms | p99 ms | max ms \
         | B with MX evidence | A batches | A batch p50 / max ms | A batch errors \
         | lookups refused (gateway) | resolver after | load avg before / after |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut runs = Vec::new();
    for round in 1..=rounds {
        for noisy in [false, true] {
            let run = fairness_run(round, noisy);
            println!(
                "| {} | {} | {} | {} ({}) | {:.2} | {:.2} | {:.2} | {:.1}% | {} | {} | {} | {} | {} | {} / {} |",
                run.round,
                if run.noisy { "2: B + A" } else { "1: B alone" },
                run.b.requests,
                run.errors,
                run.reconnects,
                run.b.p50,
                run.b.p99,
                run.b.max,
                run.b.evidence * 100.0,
                run.batches,
                if run.noisy {
                    format!("{:.1} / {:.1}", run.batch_p50_ms, run.batch_max_ms)
                } else {
                    "-".into()
                },
                run.batch_errors,
                run.refused,
                run.resolver_after,
                run.load.0,
                run.load.1,
            );
            runs.push(run);
        }
    }
    println!("\n| median over {rounds} rounds | B requests | p50 ms | p99 ms | max ms | B with MX evidence |");
    println!("|---|---|---|---|---|---|");
    let mut p99 = [0.0; 2];
    for (i, noisy) in [false, true].into_iter().enumerate() {
        let of: Vec<&FairRun> = runs.iter().filter(|r| r.noisy == noisy).collect();
        let m = |f: fn(&Summary) -> f64| median(of.iter().map(|r| f(&r.b)).collect());
        p99[i] = m(|s| s.p99);
        println!(
            "| {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1}% |",
            if noisy { "2: B + A" } else { "1: B alone" },
            m(|s| s.requests as f64),
            m(|s| s.p50),
            p99[i],
            m(|s| s.max),
            m(|s| s.evidence) * 100.0
        );
    }
    let paired: Vec<String> = runs
        .chunks(2)
        .filter(|c| c.len() == 2)
        .map(|c| format!("{:.2}", c[1].b.p99 / c[0].b.p99))
        .collect();
    println!(
        "\np99(run 2) / p99(run 1): {:.2} (medians); per round: {} (goal: <= 1.2, and B keeps \
         its MX evidence)",
        p99[1] / p99[0],
        paired.join(", ")
    );
    for run in &runs {
        for p in &run.problems {
            println!(
                "\nround {} run {}: gateway log: {p}",
                run.round,
                if run.noisy { 2 } else { 1 }
            );
        }
    }
    println!();
}

fn fairness_run(round: usize, noisy: bool) -> FairRun {
    // Fresh names per run (a gateway never sees one twice) and a fresh gateway: nothing cached.
    let tag = format!("r{round}{}", if noisy { "n" } else { "q" });
    let names: Vec<String> = (0..FAIR_NAMES)
        .map(|i| format!("company{i}-{tag}.test"))
        .collect();
    let zones: HashMap<String, Zone> = names
        .iter()
        .map(|n| {
            let zone = Zone {
                mx: vec![(10, "aspmx.l.google.com".to_owned())],
                a: None,
                ttl: 300,
            };
            (n.clone(), zone)
        })
        .collect();
    let load_before = load_average();
    let dns = DnsServer::start_slow(zones, DNS_DELAY);
    let gw = builder(dns.addr).start();
    wait_trusted(&gw);
    let stop = AtomicBool::new(false);
    let batch_times = Mutex::new(Vec::<Duration>::new());
    let batch_errors = Mutex::new(0usize);
    let per_client = FAIR_NAMES / CLIENTS;
    let b_runs: Vec<ClientRun> = thread::scope(|s| {
        let noise = noisy.then(|| {
            let (first, first_sent) = mpsc::channel();
            let (gw, stop, times, errors, tag) =
                (&gw, &stop, &batch_times, &batch_errors, tag.as_str());
            let handle = s.spawn(move || project_a(gw, stop, tag, first, times, errors));
            // B starts once A's first batch holds its share of the slots.
            first_sent
                .recv_timeout(Duration::from_secs(30))
                .expect("project A's first batch");
            handle
        });
        let t0 = Instant::now();
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let mine = &names[c * per_client..(c + 1) * per_client];
                let addr = gw.addr;
                s.spawn(move || client(addr, SECRET_B, t0, FAIR_RUN, |i| mine.get(i).cloned()))
            })
            .collect();
        let runs = clients.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, Ordering::SeqCst);
        if let Some(h) = noise {
            h.join().unwrap();
        }
        runs
    });
    let samples: Vec<Sample> = b_runs.iter().flat_map(|r| r.samples.clone()).collect();
    let exhausted = b_runs
        .iter()
        .any(|r| r.samples.len() + r.errors >= per_client);
    if exhausted {
        eprintln!("round {round}: a client used all its names before {FAIR_RUN:?}");
    }
    let times = batch_times.into_inner().unwrap();
    let times_ms: Vec<f64> = times.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    FairRun {
        round,
        noisy,
        b: summarize(&samples),
        errors: b_runs.iter().map(|r| r.errors).sum(),
        reconnects: b_runs.iter().map(|r| r.reconnects).sum(),
        batches: times.len(),
        batch_p50_ms: median(times_ms.clone()),
        batch_max_ms: times_ms.iter().copied().fold(0.0, f64::max),
        load: (load_before, load_average()),
        batch_errors: batch_errors.into_inner().unwrap(),
        refused: gw
            .metric("drg_mx_lookups_refused_total")
            .unwrap_or(f64::NAN),
        resolver_after: resolver_state(&gw),
        problems: log_problems(&gw),
    }
}

/// Project A: a batch of names under silent zones every ~1 s until `stop` (or `MAX_BATCHES`).
/// Fresh names and zones each batch: a zone that timed out is left alone for a while, so
/// reused zones would soon cost the gateway nothing.
fn project_a(
    gw: &Gateway,
    stop: &AtomicBool,
    tag: &str,
    first: mpsc::Sender<()>,
    times: &Mutex<Vec<Duration>>,
    errors: &Mutex<usize>,
) {
    let t0 = Instant::now();
    for batch in 0..MAX_BATCHES {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let names: Vec<String> = (0..BATCH)
            .map(|i| format!("n{i}.blackhole-{tag}-{batch}-{i}.test"))
            .collect();
        let body = json!({ "domains": names }).to_string();
        let sent = Instant::now();
        let r = send(
            gw,
            "POST",
            "/v1/public/domains",
            Some(SECRET_A),
            &[],
            Some(body.as_bytes()),
        );
        times.lock().unwrap().push(sent.elapsed());
        if r.status != 200 {
            *errors.lock().unwrap() += 1;
        }
        if batch == 0 {
            let _ = first.send(());
        }
        // The next batch on the next second, waiting in short steps to see a stop at once.
        let next = t0 + Duration::from_secs(batch + 1);
        while Instant::now() < next && !stop.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(10));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// B. Lookup p99 across saves of a big MX-neighbourhood index.

/// The MX host of index host number `j`: ten hosts per parent, 2,000 parents.
fn host(j: usize) -> String {
    format!("mx{}.hostco{}.test", j % 10, j / 10)
}

/// Days since 1970-01-01: a snapshot line older than 90 days is skipped.
fn today() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 86_400
}

/// A snapshot as `mx-snapshot` writes it: `INDEX_DOMAINS` domains spread over `INDEX_HOSTS`.
fn write_snapshot(path: &Path) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    writeln!(out, "{{\"format\":\"drg-mx-neighbourhood\",\"version\":1}}").unwrap();
    let seen = today();
    for i in 0..INDEX_DOMAINS {
        let j = i % INDEX_HOSTS;
        writeln!(
            out,
            "{{\"domain\":\"d{i}.com\",\"keys\":[\"host:{}\",\"parent:hostco{}.test\"],\"seen\":{seen}}}",
            host(j),
            j / 10
        )
        .unwrap();
    }
    out.flush().unwrap();
}

fn mx_zone(host: String) -> Zone {
    Zone {
        mx: vec![(10, host)],
        a: None,
        ttl: 300,
    }
}

/// One save of the state file seen from outside: when its temporary file was first seen (the
/// write began; the copy and sort of the index under the read lock came just before) and when
/// it replaced the state file.
struct Save {
    writing: Option<Duration>,
    written: Duration,
}

/// Saves of the state file at `path` (times since `t0`), polled every 5 ms until `stop`.
fn watch_saves(path: &Path, t0: Instant, stop: &AtomicBool) -> Vec<Save> {
    let dir = path.parent().unwrap();
    // `fsutil::replace_with` writes `.<name>.<random>.tmp` beside the file, then renames it.
    let prefix = format!(".{}.", path.file_name().unwrap().to_str().unwrap());
    let temp_exists = || {
        std::fs::read_dir(dir).is_ok_and(|d| {
            d.flatten().any(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".tmp"))
            })
        })
    };
    let mtime = || std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let (mut last, mut writing, mut saves) = (mtime(), None, Vec::new());
    while !stop.load(Ordering::SeqCst) {
        if writing.is_none() && temp_exists() {
            writing = Some(t0.elapsed());
        }
        let now = mtime();
        if now != last {
            saves.push(Save {
                writing: writing.take(),
                written: t0.elapsed(),
            });
            last = now;
        }
        thread::sleep(Duration::from_millis(5));
    }
    saves
}

/// Before a save's write began, the index was copied and sorted under its read lock (and aged
/// out under its write lock): lookups sent this long before the write count as during it.
const BEFORE_WRITE: Duration = Duration::from_millis(500);

/// The samples sent between `from` and `to`.
fn within(samples: &[Sample], from: Duration, to: Duration) -> Vec<Sample> {
    samples
        .iter()
        .filter(|x| x.at >= from && x.at <= to)
        .copied()
        .collect()
}

/// The `n` slowest samples: latency, and when each was sent.
fn slowest(samples: &[Sample], n: usize) -> String {
    let mut by_latency = samples.to_vec();
    by_latency.sort_by_key(|x| std::cmp::Reverse(x.latency));
    by_latency
        .iter()
        .take(n)
        .map(|x| {
            format!(
                "{:.0} ms at {:.2} s",
                x.latency.as_secs_f64() * 1000.0,
                x.at.as_secs_f64()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A client sending `names` at `per_second`, on schedule from `t0` (one connection: an answer
/// that is late delays the next request).
fn paced(addr: SocketAddr, t0: Instant, names: &[String], per_second: u64) -> ClientRun {
    let gap = Duration::from_micros(1_000_000 / per_second);
    client(addr, SECRET_B, t0, SAVE_RUN, |i| {
        let due = t0 + gap * i as u32;
        thread::sleep(due.saturating_duration_since(Instant::now()));
        names.get(i).cloned()
    })
}

fn saves() {
    let work = tempfile::tempdir().unwrap();
    let snapshot: PathBuf = work.path().join("snapshot.jsonl");
    write_snapshot(&snapshot);
    let hot: Vec<String> = (0..HOT_NAMES).map(|i| format!("hot{i}.com")).collect();
    let new_names = SAVE_RUN.as_secs() * NEW_PER_SECOND * 2;
    let fresh: Vec<String> = (0..new_names).map(|i| format!("fresh{i}.com")).collect();
    let absent: Vec<String> = (0..SAVE_RUN.as_secs() * ABSENT_PER_SECOND * 2)
        .map(|i| format!("nomail{i}.com"))
        .collect();
    // The hot and new names sit on hosts the index knows (spread by a prime stride).
    let mut zones = HashMap::new();
    for (i, n) in hot.iter().enumerate() {
        zones.insert(n.clone(), mx_zone(host(i * 7_919 % INDEX_HOSTS)));
    }
    for (i, n) in fresh.iter().enumerate() {
        zones.insert(n.clone(), mx_zone(host(i * 104_729 % INDEX_HOSTS)));
    }
    let dns = DnsServer::start(zones);
    let load_before = load_average();
    let loading = Instant::now();
    let gw = builder(dns.addr)
        .mx_yaml(&format!(
            "neighbourhood: {{ save_interval_seconds: {SAVE_INTERVAL_SECONDS}, max_entries: 250000, snapshot: {} }}",
            Value::from(snapshot.to_str().unwrap())
        ))
        .start();
    wait_until(Duration::from_secs(120), || {
        gw.metric("drg_mx_neighbourhood_domains").unwrap_or(0.0) >= INDEX_DOMAINS as f64
    });
    let loaded_in = loading.elapsed();
    wait_trusted(&gw);
    // Each hot name once: its MX answer cached, the domain taught; later lookups are cache
    // hits that still ask the index.
    let warm: Vec<ClientRun> = thread::scope(|s| {
        let per = HOT_NAMES / CLIENTS;
        let hot = &hot;
        let handles: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let addr = gw.addr;
                s.spawn(move || {
                    client(addr, SECRET_B, Instant::now(), SAVE_RUN, |i| {
                        (i < per).then(|| hot[c * per + i].clone())
                    })
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let warm_evidence = summarize(
        &warm
            .iter()
            .flat_map(|r| r.samples.clone())
            .collect::<Vec<_>>(),
    )
    .evidence;
    let domains_before = gw.metric("drg_mx_neighbourhood_domains").unwrap_or(0.0);
    let state = gw.dir.path().join("state/mx_neighbourhood.jsonl");
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let (hot_runs, trickle, control, save_times) = thread::scope(|s| {
        let (state, stop, hot, fresh, absent) = (&state, &stop, &hot, &fresh, &absent);
        let watcher = s.spawn(move || watch_saves(state, t0, stop));
        let addr = gw.addr;
        // New names at a steady rate: each a DNS lookup that teaches the index (write lock)
        // and marks it changed, so every save writes the whole file.
        let trickle = s.spawn(move || paced(addr, t0, fresh, NEW_PER_SECOND));
        let control = s.spawn(move || paced(addr, t0, absent, ABSENT_PER_SECOND));
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                s.spawn(move || {
                    client(addr, SECRET_B, t0, SAVE_RUN, |i| {
                        Some(hot[(c * HOT_NAMES / CLIENTS + i) % HOT_NAMES].clone())
                    })
                })
            })
            .collect();
        let runs: Vec<ClientRun> = clients.into_iter().map(|h| h.join().unwrap()).collect();
        let (trickle, control) = (trickle.join().unwrap(), control.join().unwrap());
        stop.store(true, Ordering::SeqCst);
        (runs, trickle, control, watcher.join().unwrap())
    });
    let samples: Vec<Sample> = hot_runs.iter().flat_map(|r| r.samples.clone()).collect();
    let errors: usize = hot_runs.iter().map(|r| r.errors).sum();
    let reconnects: usize = hot_runs.iter().map(|r| r.reconnects).sum();
    println!("## B. Lookup p99 across saves of a {INDEX_DOMAINS}-domain MX-neighbourhood index\n");
    println!(
        "Index loaded from a snapshot ({INDEX_DOMAINS} domains, {INDEX_HOSTS} hosts) in {:.1} s \
         (gateway start to the metric); {:.0} domains after warm-up. {CLIENTS} keep-alive \
         clients loop over {HOT_NAMES} cached names ({:.1}% answered with MX evidence at \
         warm-up); {NEW_PER_SECOND} new names/s teach the index, {ABSENT_PER_SECOND} names/s \
         that do not exist (NXDOMAIN) teach it nothing. save_interval_seconds: \
         {SAVE_INTERVAL_SECONDS} (its clock starts with the gateway, not with this run); a save \
         is seen from outside: its temporary file appearing (the write begins; the copy and \
         sort of the index under its read lock came just before) and replacing the state file \
         (polled every 5 ms).\n",
        loaded_in.as_secs_f64(),
        domains_before,
        warm_evidence * 100.0
    );
    println!(
        "| window start (s) | requests | p50 ms | p99 ms | max ms | state file replaced at (s) |"
    );
    println!("|---|---|---|---|---|---|");
    let windows = (SAVE_RUN.as_secs() / WINDOW.as_secs()) as u32;
    let mut p99s = Vec::new();
    for w in 0..windows {
        let (from, to) = (WINDOW * w, WINDOW * (w + 1));
        let inside: Vec<Sample> = samples
            .iter()
            .filter(|s| s.at >= from && s.at < to)
            .copied()
            .collect();
        let sum = summarize(&inside);
        let saved: Vec<String> = save_times
            .iter()
            .filter(|s| s.written >= from && s.written < to)
            .map(|s| format!("{:.2}", s.written.as_secs_f64()))
            .collect();
        p99s.push(sum.p99);
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {} |",
            from.as_secs(),
            sum.requests,
            sum.p50,
            sum.p99,
            sum.max,
            if saved.is_empty() {
                "-".to_owned()
            } else {
                saved.join(", ")
            }
        );
    }
    let all = summarize(&samples);
    let worst = p99s.iter().copied().fold(0.0, f64::max);
    let mid = median(p99s);
    println!(
        "\nAll windows: {} requests ({errors} errors, {reconnects} reconnects), p50 {:.2} ms, \
         p99 {:.2} ms, max {:.2} ms. Worst window p99 / median window p99: {worst:.2} / \
         {mid:.2} = {:.2}.\n",
        all.requests,
        all.p50,
        all.p99,
        all.max,
        worst / mid
    );
    println!("| paced lookups (one connection each) | requests | errors | p50 ms | p99 ms | max ms | slowest (latency at send time) |");
    println!("|---|---|---|---|---|---|---|");
    for (what, run) in [
        ("new names (DNS, teach the index)", &trickle),
        ("names that do not exist (DNS only)", &control),
    ] {
        let sum = summarize(&run.samples);
        println!(
            "| {what} | {} | {} | {:.2} | {:.2} | {:.2} | {} |",
            sum.requests,
            run.errors,
            sum.p50,
            sum.p99,
            sum.max,
            slowest(&run.samples, 5)
        );
    }
    println!(
        "\nSaves seen: {}. Index after: {:.0} domains.",
        save_times.len(),
        gw.metric("drg_mx_neighbourhood_domains")
            .unwrap_or(f64::NAN)
    );
    // Each save up close: what was sent from shortly before its write to its end, against
    // all the rest.
    println!(
        "\n| save | write began (s) | replaced (s) | cached lookups sent from {} ms before the \
         write to its end | p50 ms | p99 ms | max ms | new names: n, max ms | absent names: n, \
         max ms |",
        BEFORE_WRITE.as_millis()
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let span = |s: &Save| {
        let began = s.writing.unwrap_or(s.written);
        (began.saturating_sub(BEFORE_WRITE), s.written)
    };
    for (k, save) in save_times.iter().enumerate() {
        let (from, to) = span(save);
        let near = summarize(&within(&samples, from, to));
        let taught = summarize(&within(&trickle.samples, from, to));
        let absent = summarize(&within(&control.samples, from, to));
        println!(
            "| {} | {} | {:.2} | {} | {:.2} | {:.2} | {:.2} | {}, {:.2} | {}, {:.2} |",
            k + 1,
            save.writing
                .map_or("not seen".to_owned(), |w| format!("{:.2}", w.as_secs_f64())),
            save.written.as_secs_f64(),
            near.requests,
            near.p50,
            near.p99,
            near.max,
            taught.requests,
            taught.max,
            absent.requests,
            absent.max
        );
    }
    let outside = |x: &&Sample| {
        !save_times.iter().any(|s| {
            let (from, to) = span(s);
            x.at >= from && x.at <= to
        })
    };
    let away = |v: &[Sample]| summarize(&v.iter().filter(outside).copied().collect::<Vec<_>>());
    let (rest, taught, absent) = (
        away(&samples),
        away(&trickle.samples),
        away(&control.samples),
    );
    println!(
        "| none | - | - | {} (all other cached lookups) | {:.2} | {:.2} | {:.2} | {}, {:.2} | {}, {:.2} |",
        rest.requests,
        rest.p50,
        rest.p99,
        rest.max,
        taught.requests,
        taught.max,
        absent.requests,
        absent.max
    );
    println!(
        "\nLoad average before / after: {load_before} / {}.",
        load_average()
    );
    for p in log_problems(&gw) {
        println!("\ngateway log: {p}");
    }
}
