//! The MX neighbourhood's costs: what a cached lookup pays with the index on against off (the
//! judge: one read lock and a few hash lookups), what queueing a listed name costs when the
//! index already knows it, the index's memory per 100k keys, and how fast `mx-snapshot`
//! resolves against a DNS server on loopback.
//!
//! `cargo bench --bench neighbourhood` (criterion groups, then the memory and snapshot-rate
//! lines on stdout). Figures in benches/RESULTS.md.

#[allow(dead_code)]
#[path = "../tests/common/dns.rs"]
mod dns;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use criterion::{criterion_group, Criterion, Throughput};
use drg_domain::classify::classify_match;
use drg_domain::mail::{MxEvidence, MxHost};
use drg_domain::neighbour_index::{NeighbourhoodIndex, NeighbourhoodRule, Teach, Teachers};
use drg_domain::providers::ProviderTable;
use drg_domain::{DomainName, DomainTable, ListKind, Scores, TableBuilder};
use drg_evidence::mx::config::{MxConfig, NeighbourhoodConfig};
use drg_evidence::mx::neighbourhood::Neighbourhood;
use drg_evidence::mx::resolver::MxResolver;

/// Counts live heap bytes, for the memory figure.
struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const RULE: NeighbourhoodRule = NeighbourhoodRule {
    min_listed: 5,
    min_share: 0.8,
    min_hosts: 3,
    hold_days: 30,
};

/// Keys of generated domain `i`: its host (one per 4 domains), the host's parent (one per 40)
/// and network (one per 20): the shape of real MX set-ups, ~0.4 keys per domain.
fn keys(i: usize) -> Vec<Box<str>> {
    vec![
        format!("host:mx{}.p{}.example", i / 4, i / 40).into(),
        format!("parent:p{}.example", i / 40).into(),
        format!(
            "network:10.{}.{}.0/24",
            (i / 20) / 256 % 256,
            (i / 20) % 256
        )
        .into(),
    ]
}

fn table() -> DomainTable {
    let mut b = TableBuilder::new();
    for i in (0..200_000).step_by(2) {
        b.add(
            &DomainName::parse(&format!("d{i}.com")).unwrap(),
            ListKind::Disposable,
        );
    }
    b.set_providers(
        ProviderTable::parse(
            "match,pattern,label,kind\nsuffix,google.com,Google,mailbox\n",
            "b",
        )
        .unwrap(),
    );
    b.build(Scores::default())
}

fn lookups(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let table = Arc::new(ArcSwap::from_pointee(table()));
    let nb = Arc::new(Neighbourhood::new(
        &NeighbourhoodConfig::default(),
        table.clone(),
        false,
    ));
    let config = MxConfig {
        servers: vec!["127.0.0.1:53".into()],
        ..MxConfig::default()
    };
    let off = Arc::new(MxResolver::new(&config).unwrap());
    let on = Arc::new(
        MxResolver::new(&config)
            .unwrap()
            .with_neighbourhood(nb.clone()),
    );
    // 100k domains in the index (half listed), taught as lookups would.
    for i in 0..100_000 {
        let hosts = vec![(
            format!("mx{}.p{}.example", i / 4, i / 40).into_boxed_str(),
            vec![format!(
                "10.{}.{}.0/24",
                (i / 20) / 256 % 256,
                (i / 20) % 256
            )],
        )];
        nb.learn(&format!("d{i}.com"), &hosts);
    }
    let evidence = |i: usize| {
        MxEvidence::Hosts(vec![MxHost {
            preference: 10,
            host: format!("mx{}.p{}.example", i / 4, i / 40).into(),
        }])
    };
    let hour = Duration::from_secs(3600);
    let snap = table.load_full();
    let mut g = c.benchmark_group("neighbourhood");
    g.throughput(Throughput::Elements(1));
    // d1.com: unlisted, its keys dominated (judged disposable); d100001.com: unknown to the
    // index (the common case of a name nobody on its host is listed for).
    for (label, i) in [("judged", 1usize), ("not_judged", 100_001)] {
        let name = DomainName::parse(&format!("d{i}.com")).unwrap();
        off.insert(name.as_str(), evidence(i), hour);
        on.insert(name.as_str(), evidence(i), hour);
        g.bench_function(format!("cached_lookup_index_off_{label}"), |b| {
            b.iter(|| {
                let (e, _) = rt.block_on(off.evidence(black_box(name.as_str()), "bench"));
                let v = classify_match(&snap, &name, snap.lookup(&name), Some(&e), None);
                black_box(v.record.risk_score)
            })
        });
        g.bench_function(format!("cached_lookup_index_on_{label}"), |b| {
            b.iter(|| {
                let (e, _) = rt.block_on(on.evidence(black_box(name.as_str()), "bench"));
                let finding = on.neighbourhood().and_then(|n| n.finding(&name, "bench"));
                let v = classify_match(&snap, &name, snap.lookup(&name), Some(&e), finding);
                black_box(v.record.risk_score)
            })
        });
    }
    let listed = DomainName::parse("d2.com").unwrap();
    g.bench_function("listed_lookup_already_known", |b| {
        b.iter(|| nb.consider_listed(black_box(&listed), "bench"))
    });
    g.finish();
}

/// Heap bytes of an index holding `domains` generated domains, per 100k keys.
fn memory() {
    for domains in [100_000usize, 250_000] {
        let before = LIVE.load(Ordering::Relaxed);
        let mut ix = NeighbourhoodIndex::new(RULE, domains + 1);
        for i in 0..domains {
            let listed = (i % 2 == 0).then_some("disposable.txt");
            // Listed ones as the lists' snapshot teaches them.
            let how = Teach {
                teachers: Teachers::GLOBAL,
                ..Teach::default()
            };
            ix.teach(&format!("d{i}.com"), &keys(i), listed, how, 20_000);
        }
        let bytes = (LIVE.load(Ordering::Relaxed) - before) as f64;
        println!(
            "neighbourhood memory: {domains} domains, {} keys: {:.1} MiB ({:.1} MiB per 100k keys, {:.0} bytes per domain)",
            ix.keys(),
            bytes / 1048576.0,
            bytes / 1048576.0 / (ix.keys() as f64 / 100_000.0),
            bytes / domains as f64
        );
        black_box(&ix);
    }
}

/// `mx-snapshot` (the release binary) over `n` listed names against the loopback DNS server.
fn snapshot_rate(n: usize) {
    let mut zones = HashMap::new();
    let mut listed = Vec::new();
    for i in 0..n {
        let host = format!("mx{}.burner{}.test", i % 50, i % 7);
        zones.insert(
            host.clone(),
            dns::Zone {
                mx: vec![],
                a: Some(Ipv4Addr::new(10, 9, (i % 50) as u8, 1)),
                ttl: 300,
            },
        );
        let d = format!("listed{i}.test");
        zones.insert(
            d.clone(),
            dns::Zone {
                mx: vec![(10, host)],
                a: None,
                ttl: 300,
            },
        );
        listed.push(d);
    }
    let server = dns::DnsServer::start(zones);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    std::fs::write(dir.path().join("data/disposable.txt"), listed.join("\n")).unwrap();
    let conf = dir.path().join("gateway.yaml");
    std::fs::write(
        &conf,
        format!(
            "gateway:\n  data: {{ dir: data, builtin_disposable: false }}\n  mx: {{ servers: [\"{}\"] }}\n",
            server.addr
        ),
    )
    .unwrap();
    for (concurrency, rate) in [(32, 100_000), (128, 100_000)] {
        let out = dir.path().join(format!("snap-{concurrency}.jsonl"));
        let started = Instant::now();
        let run = std::process::Command::new(env!("CARGO_BIN_EXE_domain-risk-gateway"))
            .args(["mx-snapshot", "-c", conf.to_str().unwrap(), "--out"])
            .arg(&out)
            .args([
                "--concurrency",
                &concurrency.to_string(),
                "--rate",
                &rate.to_string(),
            ])
            .output()
            .unwrap();
        let secs = started.elapsed().as_secs_f64();
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        println!(
            "mx-snapshot: {n} names, concurrency {concurrency}: {:.2} s, {:.0} names/s (process included); {}",
            secs,
            n as f64 / secs,
            String::from_utf8_lossy(&run.stdout).trim()
        );
    }
}

criterion_group!(benches, lookups);

fn main() {
    memory();
    snapshot_rate(5_000);
    benches();
    Criterion::default().configure_from_args().final_summary();
}
