//! The one place that wires the gateway together: config, the first table and keys, the quota
//! store, the MX resolver, the public and admin listeners, and the background services
//! (reloaders, quota persistence or reconciliation) into a Pingora server.

use std::sync::Arc;

use arc_swap::ArcSwap;
use pingora::apps::HttpServerOptions;
use pingora::proxy::http_proxy;
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use pingora::services::ServiceWithDependents;

use crate::access::keys::KeysSource;
use crate::access::quota::local::LocalStore;
use crate::access::quota::redis::RedisStore;
use crate::access::quota::services::{Persistence, Reconciler};
use crate::access::quota::{Clock, QuotaStore, SystemClock};
use crate::admin::Admin;
use crate::config::{QuotaConfig, QuotaStoreKind, Settings};
use crate::data_files::{log_conflicts, summary, DataSources};
use crate::downstream::Guarded;
use crate::gateway::{Gateway, Shared};
use crate::lifecycle::{Draining, DrainingShutdown};
use crate::metrics::Metrics;
use crate::mx::resolver::MxResolver;
use crate::reload::Reloader;

/// Why the server could not start; each error carries its own context.
pub type StartError = Box<dyn std::error::Error + Send + Sync>;

/// Starts the quota clock somewhere else in time (tests of month rollover, end to end).
pub const CLOCK_START_ENV: &str = "DOMAIN_RISK_GATEWAY_CLOCK_START";

/// The keys file as configured.
pub fn keys_source(settings: &Settings) -> KeysSource {
    let access = &settings.gateway.access;
    KeysSource {
        path: access.keys_file.clone(),
        plans: access.plans.clone(),
        refuse_demo_key: !access.allow_demo_key && !settings.listens_on_loopback(),
    }
}

fn clock() -> Result<SystemClock, StartError> {
    match std::env::var(CLOCK_START_ENV) {
        Ok(start) => {
            let start = chrono::DateTime::parse_from_rfc3339(&start)
                .map_err(|e| format!("{CLOCK_START_ENV}: '{start}' is not RFC 3339: {e}"))?;
            log::warn!("{CLOCK_START_ENV} is set: the quota clock starts at {start}");
            Ok(SystemClock::starting_at(start.into()))
        }
        Err(_) => Ok(SystemClock::default()),
    }
}

/// Builds everything from `settings` (a bad table, keys file or state file stops the start)
/// and serves until signalled.
pub fn run(settings: Settings) -> Result<(), StartError> {
    let sources = DataSources::from_config(&settings.gateway);
    let table = sources.build()?;
    log::info!("domain table loaded: {}", summary(&table));
    log_conflicts(&table, &sources.dir);
    let keys_source = keys_source(&settings);
    let keys = keys_source.load()?;
    log::info!(
        "keys loaded: {} keys from {}",
        keys.len(),
        keys_source.path.display()
    );
    let gateway = &settings.gateway;
    let clock: Arc<dyn Clock> = Arc::new(clock()?);
    let (quota, quota_service) = quota_store(&gateway.quota, &clock)?;
    let mx = match gateway.mx.enabled {
        true => Some(Arc::new(MxResolver::new(&gateway.mx)?)),
        false => None,
    };
    let shared = Shared {
        table: Arc::new(ArcSwap::from_pointee(table)),
        keys: Arc::new(ArcSwap::from_pointee(keys)),
        quota,
        clock,
        mx,
        draining: Draining::default(),
        metrics: Arc::new(Metrics::new()?),
    };
    settings.prepare_runtime_dir()?;
    let mut server = Server::new_with_opt_and_conf(None, settings.server);
    server.bootstrap();

    let mut proxy = http_proxy(&server.configuration, Gateway::new(shared.clone(), gateway));
    let mut options = HttpServerOptions::default();
    // Pingora counts reuses after the first request.
    options.keepalive_request_limit = Some(gateway.limits.max_requests_per_connection - 1);
    proxy.server_options = Some(options);
    let guarded = Guarded::new(proxy, &gateway.limits);
    let downstream = guarded.stats();
    let mut service = Service::new("domain-risk gateway".to_owned(), guarded);
    service.add_tcp(&gateway.listen);
    server.add_service(service);

    if let Some(listen) = &gateway.admin.listen {
        let admin = Admin {
            shared: shared.clone(),
            downstream,
            upstream: gateway.upstream.address.clone(),
        };
        let mut service = Service::new("admin".to_owned(), admin);
        match listen.strip_prefix("unix:") {
            Some(path) => service.add_uds(path, None),
            None => service.add_tcp(listen),
        }
        log::info!("admin listener on {listen}");
        server.add_service(service);
    }

    let interval = gateway.reload.poll_interval;
    server.add_service(background_service(
        "data reload",
        Reloader::new(sources, shared.table.clone(), interval)
            .with_hook(shared.metrics.reload_hook("table")),
    ));
    server.add_service(background_service(
        "keys reload",
        Reloader::new(keys_source, shared.keys.clone(), interval)
            .with_hook(shared.metrics.reload_hook("keys")),
    ));
    server.add_boxed_service(quota_service);
    log::info!(
        "listening on http://{} (upstream {})",
        gateway.listen,
        gateway.upstream.address
    );
    server.run(RunArgs {
        shutdown_signal: Box::new(DrainingShutdown {
            draining: shared.draining.clone(),
            drain: gateway.drain,
        }),
    });
    log::info!("stopped");
    Ok(())
}

type BoxedService = Box<dyn ServiceWithDependents>;

/// The configured quota store and the background service that keeps it.
fn quota_store(
    config: &QuotaConfig,
    clock: &Arc<dyn Clock>,
) -> Result<(Arc<dyn QuotaStore>, BoxedService), StartError> {
    Ok(match config.store {
        QuotaStoreKind::Local => {
            let store = Arc::new(LocalStore::open(&config.state_file)?);
            let service = Persistence {
                store: store.clone(),
                interval: config.flush_interval,
            };
            (
                store,
                Box::new(background_service("quota persistence", service)),
            )
        }
        QuotaStoreKind::Redis => {
            let store = Arc::new(RedisStore::new(&config.redis, clock.clone())?);
            log::info!("quota store: Redis at {}", redacted(&config.redis.url));
            let service = Reconciler {
                store: store.clone(),
                interval: config.redis.sync_every(),
            };
            (
                store,
                Box::new(background_service("quota reconcile", service)),
            )
        }
    })
}

/// A Redis URL without its password, for logs.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_owned(),
    }
}
