//! In-process micro-benchmarks of the per-request work: name parsing, table lookups at several
//! table sizes, classification, the MX cache, the access decision, quota counting and JSON
//! rendering.
//!
//! The operations features' per-request work (metrics recording, the access-log line) is here
//! too, to set against the per-request CPU the load harness measures.
//!
//! `cargo bench --bench micro` (add `-- lookup` etc. to filter). Throughput is per element.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use drg_access::keys::{key_entry_yaml, parse_keys};
use drg_access::origin::{Origin, OriginPattern};
use drg_access::quota::consume;
use drg_access::quota::local::LocalStore;
use drg_access::{decide, Credentials};
use drg_domain::mail::{MxEvidence, MxHost};
use drg_domain::providers::ProviderTable;
use drg_domain::{classify, DomainName, DomainTable, ListKind, Scores, TableBuilder};
use drg_evidence::mx::config::MxConfig;
use drg_evidence::mx::resolver::{CacheState, MxResolver};
use drg_telemetry::access_log::{format_line, Entry};
use drg_telemetry::metrics::{Metrics, RouteClass};

/// A table of `n` generated disposable domains (`d<i>.example-<i%97>.com`).
fn table(n: usize) -> DomainTable {
    let mut b = TableBuilder::with_capacity(n);
    for i in 0..n {
        b.add(
            &DomainName::parse(&format!("d{i}.com")).unwrap(),
            ListKind::Disposable,
        );
    }
    let providers = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/mx_providers.csv"
    ))
    .unwrap();
    b.set_providers(ProviderTable::parse(&providers, "mx_providers.csv").unwrap());
    b.build(Scores::default())
}

fn parsing(c: &mut Criterion) {
    let mut g = c.benchmark_group("name_parse");
    g.throughput(Throughput::Elements(1));
    for (label, input) in [
        ("ascii", "Mail.Example.COM"),
        ("subdomain", "a.b.c.mailinator.com."),
        ("idn", "bücher.de"),
        ("invalid", "a_b.com"),
    ] {
        g.bench_with_input(BenchmarkId::from_parameter(label), input, |b, i| {
            b.iter(|| DomainName::parse(black_box(i)))
        });
    }
    g.finish();
}

fn lookups(c: &mut Criterion) {
    let mut g = c.benchmark_group("table_lookup");
    g.throughput(Throughput::Elements(1));
    for n in [10_000usize, 100_000, 1_000_000] {
        let t = table(n);
        let hit = DomainName::parse(&format!("d{}.com", n / 2)).unwrap();
        let miss = DomainName::parse("not-listed-anywhere.com").unwrap();
        let walk = DomainName::parse(&format!("x.y.d{}.com", n / 3)).unwrap();
        for (label, name) in [("hit", &hit), ("miss", &miss), ("parent_walk", &walk)] {
            g.bench_with_input(BenchmarkId::new(label, n), name, |b, name| {
                b.iter(|| t.lookup(black_box(name)).rule)
            });
        }
    }
    g.finish();
}

fn build(c: &mut Criterion) {
    let mut g = c.benchmark_group("table_build");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    for n in [100_000usize, 1_000_000] {
        let text: String = (0..n).map(|i| format!("d{i}.com\n")).collect();
        g.throughput(Throughput::Elements(n as u64));
        g.bench_with_input(BenchmarkId::from_parameter(n), &text, |b, text| {
            b.iter(|| {
                let mut builder = TableBuilder::with_capacity(n);
                drg_domain::sources::add_domain_list(
                    &mut builder,
                    text,
                    "bench",
                    ListKind::Disposable,
                )
                .unwrap();
                builder.build(Scores::default())
            })
        });
    }
    g.finish();
}

fn classification(c: &mut Criterion) {
    let t = table(100_000);
    let listed = DomainName::parse("d42.com").unwrap();
    let unknown = DomainName::parse("corp.example").unwrap();
    let evidence = MxEvidence::Hosts(vec![
        MxHost {
            preference: 1,
            host: "aspmx.l.google.com".into(),
        },
        MxHost {
            preference: 5,
            host: "alt1.aspmx.l.google.com".into(),
        },
    ]);
    let mut g = c.benchmark_group("classify");
    g.throughput(Throughput::Elements(1));
    g.bench_function("listed", |b| {
        b.iter(|| classify(&t, black_box(&listed), None).record.risk_score)
    });
    g.bench_function("cached_mx_evidence", |b| {
        b.iter(|| {
            classify(&t, black_box(&unknown), Some(&evidence))
                .record
                .is_corporate_email
        })
    });
    g.bench_function("render_json", |b| {
        let v = classify(&t, &listed, None);
        b.iter(|| serde_json::to_vec(black_box(&v.record)).unwrap())
    });
    g.finish();
}

/// The MX cache when it is full of live answers (the worst case for eviction): storing the
/// answer for a name it does not hold, and a hit. No DNS: answers are stored directly.
fn mx_cache(c: &mut Criterion) {
    const FULL: usize = 100_000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _runtime = rt.enter();
    let config = MxConfig {
        servers: vec!["127.0.0.1:53".into()],
        cache_entries: FULL,
        ..MxConfig::default()
    };
    let resolver = Arc::new(MxResolver::new(&config).unwrap());
    let evidence = || {
        MxEvidence::Hosts(vec![MxHost {
            preference: 10,
            host: "mx.example.net".into(),
        }])
    };
    let hour = Duration::from_secs(3600);
    for i in 0..FULL {
        resolver.insert(&format!("n{i}.example"), evidence(), hour);
    }
    let mut g = c.benchmark_group("mx_cache");
    g.throughput(Throughput::Elements(1));
    let hit = "n4242.example";
    assert_eq!(
        rt.block_on(resolver.evidence(hit, "bench")).1,
        CacheState::Hit
    );
    g.bench_function("hit_full_100k", |b| {
        b.iter(|| rt.block_on(resolver.evidence(black_box(hit), "bench")).1)
    });
    let mut name = String::new();
    let mut next = 0u64;
    g.bench_function("store_new_name_full_100k", |b| {
        b.iter(|| {
            next += 1;
            name.clear();
            write!(name, "new{next}.example").unwrap();
            resolver.insert(black_box(&name), evidence(), hour);
        })
    });
    g.finish();
}

fn access(c: &mut Criterion) {
    let plans: BTreeMap<String, u64> = [("pro".to_owned(), u64::MAX >> 30)].into();
    let mut g = c.benchmark_group("access");
    g.throughput(Throughput::Elements(1));
    for n in [10usize, 10_000] {
        let yaml: String = (0..n)
            .map(|i| {
                key_entry_yaml(
                    &format!("k{i}"),
                    &format!("drg_secret_{i:040}"),
                    "pro",
                    &["https://*.example.com".into()],
                )
            })
            .collect();
        let keys = parse_keys(&format!("keys:\n{yaml}"), "bench", &plans).unwrap();
        let auth = format!("Bearer drg_secret_{:040}", n / 2);
        g.bench_with_input(
            BenchmarkId::new("decide_key_and_origin", n),
            &keys,
            |b, keys| {
                b.iter(|| {
                    decide(
                        keys,
                        Credentials {
                            authorization: Some(black_box(auth.as_bytes())),
                            origin: Some(b"https://app.example.com"),
                            referer: None,
                        },
                        0,
                    )
                    .is_ok()
                })
            },
        );
    }
    let pattern = OriginPattern::parse("https://*.example.com").unwrap();
    g.bench_function("origin_match", |b| {
        b.iter(|| {
            let o = Origin::from_origin_header(black_box("https://app.example.com")).unwrap();
            pattern.matches(&o)
        })
    });
    let store = LocalStore::in_memory();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let now = chrono::Utc::now();
    g.bench_function("quota_consume_local", |b| {
        b.iter(|| {
            rt.block_on(consume(&store, black_box("k1"), u64::MAX >> 30, 1, now))
                .is_ok()
        })
    });
    g.finish();
}

/// What the metrics and the access log add to one request.
fn operations(c: &mut Criterion) {
    let mut g = c.benchmark_group("operations");
    let metrics = Metrics::new().unwrap();
    let elapsed = Duration::from_micros(850);
    g.bench_function("metrics_request", |b| {
        b.iter(|| metrics.request(black_box(RouteClass::Domain), black_box(200), elapsed))
    });
    let entry = Entry {
        time: std::time::SystemTime::now(),
        request_id: None,
        method: "GET",
        route: RouteClass::Domain.label(),
        target: Some("x.mailinator.com"),
        status: 200,
        duration: elapsed,
        upstream_status: None,
        upstream_duration: None,
        key_id: Some("checkout-web"),
        origin: Some(b"https://shop.example"),
        bytes_sent: 156,
        would_reject: None,
        trace_id: None,
    };
    g.bench_function("access_log_line", |b| {
        b.iter(|| format_line(black_box(&entry)))
    });
    g.finish();
}

/// The cost of recording one flag on the lookup path (its thread's summary, under an
/// uncontended lock), for a name already counted and for a flood of new names (each one takes
/// over the smallest counter); and of one Space-Saving update on its own.
fn top_flags(c: &mut Criterion) {
    use drg_domain::heavy_hitters::{Label, SpaceSaving};
    use drg_domain::Reason;
    use drg_projects::live_top::LiveTop;
    let label = Label {
        reason: Reason::Disposable,
        score: 100,
    };
    let live = LiveTop::new(5_000, prometheus::IntCounter::new("f", "f").unwrap());
    let mut g = c.benchmark_group("top_flags");
    g.throughput(Throughput::Elements(1));
    g.bench_function("record_counted_name", |b| {
        b.iter(|| live.record_name(black_box("mailinator.com"), label))
    });
    let names: Vec<String> = (0..100_000).map(|i| format!("n{i}.example")).collect();
    let mut i = 0;
    g.bench_function("record_new_name_full_summary", |b| {
        b.iter(|| {
            i = (i + 1) % names.len();
            live.record_name(black_box(&names[i]), label)
        })
    });
    let mut summary = SpaceSaving::new(5_000);
    g.bench_function("space_saving_add", |b| {
        b.iter(|| {
            i = (i + 1) % names.len();
            summary.add(black_box(&names[i]), 1, label)
        })
    });
    g.finish();
}

/// The gateway's own work in writing an answer: a lookup body (direct against serde), the 401
/// body, top-domains at its default limit, and the response header of a lookup (content headers
/// plus the dataset version, `Vary` and both RateLimit headers).
fn hot_path(c: &mut Criterion) {
    use bytes::Bytes;
    use drg_base::answer::{Answer, ApiError};
    use drg_gateway::edge::http::response_header;
    use http::{HeaderName, HeaderValue, StatusCode};
    let t = table(10_000);
    let listed = DomainName::parse("d42.com").unwrap();
    let v = classify(&t, &listed, None);
    let mut g = c.benchmark_group("hot_path");
    g.throughput(Throughput::Elements(1));
    g.bench_function("lookup_body_serde", |b| {
        b.iter(|| serde_json::to_vec(black_box(&v.record)).unwrap())
    });
    g.bench_function("lookup_body_direct", |b| {
        b.iter(|| black_box(&v.record).to_json())
    });
    g.bench_function("unauthorized_answer", |b| {
        b.iter(|| {
            Answer::from(ApiError::Unauthorized {
                invalid_token: black_box(false),
            })
        })
    });
    g.bench_function("top_domains_body_default_limit", |b| {
        b.iter(|| t.top().body(black_box(100)))
    });
    let answer = Answer::raw(StatusCode::OK, Bytes::from(v.record.to_json()))
        .with_header(
            HeaderName::from_static("x-dataset-version"),
            HeaderValue::from_static("g1-aaee8e"),
        )
        .with_header(http::header::VARY, HeaderValue::from_static("Origin"))
        .with_header(
            HeaderName::from_static("ratelimit-policy"),
            HeaderValue::from_static("\"monthly\";q=1000000000000;w=2592000"),
        )
        .with_header(
            HeaderName::from_static("ratelimit"),
            HeaderValue::from_static("\"monthly\";r=999999999999;t=713076"),
        );
    g.bench_function("lookup_response_header", |b| {
        b.iter(|| response_header(black_box(&answer)).unwrap())
    });
    // The same header through Pingora's `append_header` (what `response_header` did before).
    g.bench_function("lookup_response_header_pingora_append", |b| {
        b.iter(|| {
            let a = black_box(&answer);
            let mut h =
                pingora::http::ResponseHeader::build_no_case(a.status, Some(2 + a.headers.len()))
                    .unwrap();
            h.insert_header(
                http::header::CONTENT_TYPE,
                "application/json; charset=utf-8",
            )
            .unwrap();
            h.insert_header(http::header::CONTENT_LENGTH, a.body.len())
                .unwrap();
            for (name, value) in &a.headers {
                h.append_header(name.clone(), value.clone()).unwrap();
            }
            h
        })
    });
    g.finish();
}

/// `did_you_mean`: the typo suggestion over the shipped curated free list, for a typo, a
/// provider and unrelated names, long and short (what a lookup of an unknown or blocklisted name
/// adds).
fn typos(c: &mut Criterion) {
    let curated = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/free_providers.txt"
    ))
    .unwrap();
    let providers: Vec<&str> = curated
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect();
    let index = drg_domain::typos::TypoIndex::build(providers);
    let mut g = c.benchmark_group("typos");
    g.throughput(Throughput::Elements(1));
    for name in [
        "gmial.com",
        "hotmail.com",
        "acme-widgets.example",
        "d4242.com",
    ] {
        g.bench_with_input(BenchmarkId::new("suggest", name), name, |b, name| {
            b.iter(|| black_box(index.suggest(black_box(name))))
        });
    }
    g.finish();
}

/// Verdict changes off the request path: judging watched names again (a pass: the store's
/// pages and `Judge::judge` on each, nothing changed) and recording changes, on the embedded
/// store. The watch itself costs the lookup nothing: the call writer hands its calls over.
fn reclassification(c: &mut Criterion) {
    use arc_swap::ArcSwap;
    use drg_domain::Reason;
    use drg_projects::changes::embedded::EmbeddedChanges;
    use drg_projects::changes::judge::Judge;
    use drg_projects::changes::store::{ChangeStore, Proposed};
    use drg_projects::changes::{Seen, Told};
    const WATCHED: usize = 10_000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = EmbeddedChanges::new(dir.path().join("changes.sqlite3")).unwrap();
    let judge = Judge {
        overrides: Default::default(),
        accepted: Default::default(),
        table: Arc::new(ArcSwap::from_pointee(table(100_000))),
        mx: None,
        rdap: None,
    };
    // Half of them on the list (disposable), half not (safe), told what they are now.
    let seen: Vec<Seen> = (0..WATCHED)
        .map(|i| {
            let domain = if i % 2 == 0 {
                format!("d{i}.com")
            } else {
                format!("ok{i}.example")
            };
            let told = judge.judge(&domain, "bench", None).unwrap().told;
            Seen {
                project: "p".into(),
                domain: domain.into(),
                told,
                at_ms: 1_000,
            }
        })
        .collect();
    rt.block_on(store.watch(seen, 1_000_000)).unwrap();
    let mut g = c.benchmark_group("changes");
    g.sample_size(10);
    g.throughput(Throughput::Elements(WATCHED as u64));
    g.bench_function("pass_10k_watched", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut cursor = String::new();
                let mut changed = 0;
                loop {
                    let (page, next) = store.scan("p", &cursor, 200).await.unwrap();
                    for (domain, told) in page {
                        let now = judge.judge(&domain, "bench", None).unwrap();
                        changed += usize::from(now.told.differs(told));
                    }
                    match next {
                        Some(c) => cursor = c,
                        None => break changed,
                    }
                }
            })
        })
    });
    g.throughput(Throughput::Elements(1));
    let mut flip = false;
    let safe = judge.judge("ok1.example", "bench", None).unwrap().told;
    let dispo = Told {
        reason: Reason::Disposable,
        score: 100,
    };
    g.bench_function("record_one_change", |b| {
        b.iter(|| {
            let (from, to) = if flip { (dispo, safe) } else { (safe, dispo) };
            flip = !flip;
            let change = Proposed {
                domain: "ok1.example".into(),
                from,
                to,
                rule: "blocklist".into(),
                basis: "table",
                at_ms: 1_000,
                dataset_version: "g1-000000".into(),
            };
            rt.block_on(store.record("p", &change)).unwrap()
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    reclassification,
    typos,
    hot_path,
    top_flags,
    operations,
    parsing,
    lookups,
    classification,
    mx_cache,
    access,
    build
);
criterion_main!(benches);
