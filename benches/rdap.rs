//! Domain age's costs: what a lookup pays to read a cached age (and to find a miss already
//! queued), what the young-domain rule adds to a classification, and how many distinct names an
//! hour the default pacing fetches from each registry (measured against RDAP servers on
//! loopback that answer at once).
//!
//! `cargo bench --bench rdap` (criterion groups, then the fetch-rate lines on stdout). Figures
//! in benches/RESULTS.md.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use drg_domain::age::{AgeRule, DomainAge};
use drg_domain::classify::{apply_age, classify};
use drg_domain::{DomainName, Scores, TableBuilder};
use drg_evidence::rdap::config::RdapConfig;
use drg_evidence::rdap::service::Rdap;

/// Cached names in the bench's cache.
const CACHED: usize = 100_000;

/// A config asking `servers` (TLD -> base URL), its files in `dir`.
fn config(dir: &std::path::Path, servers: BTreeMap<String, String>) -> RdapConfig {
    RdapConfig {
        servers,
        allow_plain_http: true,
        bootstrap_file: Some(dir.join("none.json")),
        bootstrap_url: None,
        state_file: Some(dir.join("rdap_cache.jsonl")),
        ..RdapConfig::default()
    }
}

fn lookups(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    // The cache, seeded through its state file as a restart would load it.
    let expires = chrono::Utc::now().timestamp() + 86_400;
    let lines: String = (0..CACHED)
        .map(|i| {
            format!("{{\"d\":\"name{i}.com\",\"k\":\"registered\",\"r\":20000,\"e\":{expires}}}\n")
        })
        .collect();
    std::fs::write(dir.path().join("rdap_cache.jsonl"), lines).unwrap();
    let servers = BTreeMap::from([("com".to_owned(), "http://127.0.0.1:9/".to_owned())]);
    let rdap = Rdap::new(&config(dir.path(), servers));
    let hit = DomainName::parse("www.name4242.com").unwrap();
    let miss = DomainName::parse("not-cached.com").unwrap();
    assert!(rdap.age(&hit, "p").is_some());
    // Queued once (no worker runs): every later lookup finds it waiting.
    assert!(rdap.age(&miss, "p").is_none());

    let mut g = c.benchmark_group("rdap");
    g.bench_function("age_cached", |b| {
        b.iter(|| black_box(rdap.age(black_box(&hit), "p")))
    });
    g.bench_function("age_miss_already_queued", |b| {
        b.iter(|| black_box(rdap.age(black_box(&miss), "p")))
    });
    let table = TableBuilder::new().build(Scores::default());
    let scores = Scores::default();
    let young = DomainAge::on(20_000, 20_010);
    g.bench_function("classify", |b| {
        b.iter(|| black_box(classify(&table, black_box(&hit), None).record.risk_score))
    });
    g.bench_function("classify_and_apply_age", |b| {
        b.iter(|| {
            let mut v = classify(&table, black_box(&hit), None);
            apply_age(
                &mut v,
                young,
                AgeRule {
                    young_days: 30,
                    established_days: 365,
                },
                &scores,
            );
            black_box(v.record.risk_score)
        })
    });
    g.finish();
}

/// An RDAP server on loopback answering 404 at once; returns its base URL and its count.
fn instant_server() -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            seen.fetch_add(1, Ordering::Relaxed);
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 2 {
                line.clear();
            }
            let _ = reader.get_mut().write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    (base, count)
}

/// Distinct names fetched per registry in `window` with the default pacing, two projects
/// offering 500 new names each over two registries.
fn fetch_rate() {
    let dir = tempfile::tempdir().unwrap();
    let (com, com_count) = instant_server();
    let (net, net_count) = instant_server();
    let servers = BTreeMap::from([("com".to_owned(), com), ("net".to_owned(), net)]);
    let rdap = Arc::new(Rdap::new(&config(dir.path(), servers)));
    let window = Duration::from_secs(10);
    let started = Instant::now();
    let workers = rdap.start_workers();
    for i in 0..500 {
        for (project, tld) in [("a", "com"), ("b", "net")] {
            let name = DomainName::parse(&format!("n{i}-{project}.{tld}")).unwrap();
            rdap.age(&name, project);
        }
    }
    std::thread::sleep(window.saturating_sub(started.elapsed()));
    let (c, n) = (
        com_count.load(Ordering::Relaxed),
        net_count.load(Ordering::Relaxed),
    );
    rdap.stop();
    for w in workers {
        let _ = w.join();
    }
    let per_hour = |k: usize| k as f64 * 3_600.0 / window.as_secs_f64();
    println!(
        "rdap fetch rate, defaults (min_interval_ms 1000, concurrency 4), {}s: .com {c} fetches ({:.0}/h), .net {n} ({:.0}/h); queued names are capped at 64 per project",
        window.as_secs(),
        per_hour(c),
        per_hour(n)
    );
}

criterion_group!(benches, lookups);

fn main() {
    benches();
    fetch_rate();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
}
