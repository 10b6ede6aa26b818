//! The per-project rate check's cost per counted call: the month alone against the rate and the
//! month, on the embedded store (an in-process GCRA under a lock) and on Redis (one more script
//! round trip to a real redis-server on loopback). The rate is set high enough that every call
//! passes (the refused path does less work).
//!
//! `cargo bench --bench policy`. Figures in benches/RESULTS.md.

// The tests' helpers: free ports and polling, which the Redis helper uses too.
#[path = "../tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "../tests/common/redis_server.rs"]
mod redis_server;

use std::hint::black_box;
use std::sync::Arc;

use chrono::Utc;
use criterion::{criterion_group, Criterion};
use drg_access::quota::local::LocalStore;
use drg_access::quota::redis::RedisStore;
use drg_access::quota::{consume, Clock, QuotaStore, SystemClock};
use drg_access::rate::RateConfig;
use drg_base::infra::redis::config::RedisConfig;

const RATE: RateConfig = RateConfig {
    per_second: 1_000_000,
    burst: 1_000_000,
};
const LIMIT: u64 = 1 << 39;

fn pair(c: &mut Criterion, group: &str, store: Arc<dyn QuotaStore>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let project: Arc<str> = "bench".into();
    let mut g = c.benchmark_group(group);
    g.bench_function("month only", |b| {
        b.iter(|| {
            rt.block_on(consume(&*store, &project, LIMIT, 1, Utc::now()))
                .unwrap()
        })
    });
    g.bench_function("rate + month", |b| {
        b.iter(|| {
            rt.block_on(async {
                black_box(store.take_rate(&project, RATE).await.unwrap());
                consume(&*store, &project, LIMIT, 1, Utc::now())
                    .await
                    .unwrap()
            })
        })
    });
    g.finish();
}

fn policy(c: &mut Criterion) {
    pair(c, "embedded", Arc::new(LocalStore::in_memory()));
    let redis = redis_server::RedisServer::start(false);
    let config = RedisConfig {
        url: redis.url(),
        ..RedisConfig::default()
    };
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::default());
    pair(
        c,
        "redis",
        RedisStore::new(&config, clock).unwrap().shared(),
    );
}

criterion_group!(benches, policy);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
