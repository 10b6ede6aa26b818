//! The one place that wires the gateway together: config, the first table and keys, the quota
//! store, the MX resolver, the public and admin listeners, and the background services
//! (reloaders, quota persistence or reconciliation) into a Pingora server.

use std::sync::Arc;

use arc_swap::ArcSwap;
use pingora::apps::HttpServerOptions;
use pingora::proxy::http_proxy;
use pingora::server::configuration::Opt;
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use pingora::services::ServiceWithDependents;

use crate::access::keys::KeyStore;
use crate::access::quota::config::{QuotaConfig, QuotaStoreKind};
use crate::access::quota::local::LocalStore;
use crate::access::quota::redis::RedisStore;
use crate::access::quota::services::{Persistence, Reconciler};
use crate::access::quota::{Clock, QuotaStore, SystemClock};
use crate::access::source::KeysSource;
use crate::config::{GatewayConfig, Settings};
use crate::data::files::{log_conflicts, summary, DataSources};
use crate::data::reload::Reloader;
use crate::domain::DomainTable;
use crate::edge::downstream::Guarded;
use crate::edge::gateway::Gateway;
use crate::mx::neighbourhood::service::MxService;
use crate::mx::neighbourhood::share::SharedIndex;
use crate::mx::neighbourhood::Neighbourhood;
use crate::mx::resolver::MxResolver;
use crate::ops::admin::Admin;
use crate::ops::connections::DownstreamStats;
use crate::ops::lifecycle::{settle_budget, Draining, DrainingShutdown, InFlight};
use crate::ops::metrics::Metrics;
use crate::state::Shared;

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
        // API-made keys keep working when the keys API is switched off (it only stops managing
        // them).
        managed: Some(
            settings
                .gateway
                .keys_api
                .managed_file(&settings.gateway.quota),
        ),
        publish_lock: Arc::default(),
        record_first_seen: false,
        set_aside: Arc::default(),
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

/// How `serve` starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServeMode {
    /// Take the listening sockets from the running gateway (over `upgrade_sock`, once it gets
    /// SIGQUIT) instead of binding them.
    pub upgrade: bool,
    /// Run in the background (Pingora's daemon mode: it writes `pid_file`).
    pub daemon: bool,
}

/// The parts the public listener's `Gateway` is made of besides `Shared`, and the background
/// services that keep them.
struct Parts {
    calls: Option<(
        crate::account::calls::Calls,
        crate::account::calls::CallWriter,
    )>,
    top_live: Option<(Arc<crate::flags::LiveTop>, crate::flags::keeper::Keeper)>,
    keys_api: Arc<crate::account::keys_api::KeysApi>,
    access_log: Option<crate::ops::access_log::AccessLog>,
    access_log_service: crate::ops::access_log::AccessLogService,
}

/// Builds everything from `settings` (a bad table, keys file or state file stops the start)
/// and serves until signalled. With `mode.upgrade` the listening sockets are taken from the
/// running gateway (Pingora's graceful upgrade) instead of bound.
pub fn run(settings: Settings, mode: ServeMode) -> Result<(), StartError> {
    let mut settings = settings;
    // A daemon's parent returns once the gateway serves (what systemd's `Type=forking` and the
    // upgrade dance expect), not at the fork.
    settings.server.daemon_wait_for_ready |= mode.daemon;
    let (sources, table, keys_source, keys) = first_load(&settings)?;
    let in_flight = InFlight::default();
    let settle = settle_budget(settings.server.grace_period_seconds);
    let (shared, services) = shared_state(&settings.gateway, table, keys, &in_flight, settle)?;
    let gateway = &settings.gateway;
    // A bad certificate pair stops the start, like a bad table.
    let tls = match &gateway.tls {
        Some(config) => Some(crate::edge::tls::listener(
            config,
            gateway.reload.poll_interval,
            &shared.metrics,
        )?),
        None => None,
    };
    settings.prepare_runtime_dir()?;
    let opt = (mode.upgrade || mode.daemon).then(|| Opt {
        upgrade: mode.upgrade,
        daemon: mode.daemon,
        ..Opt::default()
    });
    let mut server = Server::new_with_opt_and_conf(opt, settings.server);
    // As a service, so that in daemon mode the sockets are taken after the fork and the waiting
    // parent (`daemon_wait_for_ready`) is released; the listeners wait for it.
    let bootstrap = server.bootstrap_as_a_service();
    let mut parts = parts(gateway, &shared, &keys_source)?;
    if let Some((_, writer)) = &mut parts.calls {
        writer.settle_with(in_flight.clone(), settle);
    }
    let gateway_app = Gateway::new(shared.clone(), gateway)
        .with_relay(&gateway.upstream, &server.configuration)
        .with_access_log(parts.access_log.clone())
        .with_calls(parts.calls.as_ref().map(|(c, _)| c.clone()))
        .with_top_live(parts.top_live.as_ref().map(|(live, _)| live.clone()))
        .with_keys_api(Some(parts.keys_api.clone()));
    let (mut service, downstream) = public_service(&server, gateway_app, gateway, &in_flight);
    let scheme = match tls {
        Some(tls) => {
            service.add_tls_with_settings(&gateway.listen, None, tls.settings);
            server.add_service(background_service("tls reload", tls.reloader));
            "https"
        }
        None => {
            service.add_tcp(&gateway.listen);
            "http"
        }
    };
    server.add_service(service).add_dependency(&bootstrap);
    if let Some(listen) = &gateway.admin.listen {
        let admin = Admin {
            shared: shared.clone(),
            downstream,
            upstream: gateway.upstream.address.clone(),
        };
        server
            .add_service(admin_service(admin, listen))
            .add_dependency(&bootstrap);
    }
    let access_log = parts.access_log.clone();
    let inputs = (sources, keys_source);
    add_background_services(&mut server, gateway, &shared, inputs, parts, services)?;
    log::info!(
        "listening on {scheme}://{} (upstream {})",
        gateway.listen,
        gateway.upstream.address
    );
    server.run(RunArgs {
        shutdown_signal: Box::new(DrainingShutdown {
            draining: shared.draining.clone(),
            drain: gateway.drain,
        }),
    });
    finish(access_log.as_ref(), &shared);
    log::info!("stopped");
    Ok(())
}

/// After the server stopped: the access log's last lines written, the last spans exported.
fn finish(access_log: Option<&crate::ops::access_log::AccessLog>, shared: &Shared) {
    if let Some(log) = access_log {
        log.finish();
    }
    if let Some(tracing) = &shared.tracing {
        tracing.shutdown(std::time::Duration::from_secs(5));
    }
}

/// The first table and keys (either failing stops the start), and their sources for the
/// reloaders.
fn first_load(
    settings: &Settings,
) -> Result<(DataSources, DomainTable, KeysSource, KeyStore), StartError> {
    let sources = settings.gateway.data_sources();
    let table = sources.build()?;
    log::info!("domain table loaded: {}", summary(&table));
    log_conflicts(&table, &sources.dir);
    let mut keys_source = keys_source(settings);
    keys_source.record_first_seen = true;
    let keys = keys_source.load()?;
    log::info!(
        "keys loaded: {} keys from {}",
        keys.len(),
        keys_source.path.display()
    );
    Ok((sources, table, keys_source, keys))
}

/// The admin listener on `listen` (`ip:port` or `unix:/path`).
fn admin_service(admin: Admin, listen: &str) -> Service<Admin> {
    let mut service = Service::new("admin".to_owned(), admin);
    match listen.strip_prefix("unix:") {
        Some(path) => service.add_uds(path, None),
        None => service.add_tcp(listen),
    }
    log::info!("admin listener on {listen}");
    service
}

/// What every request and service shares: the first table and keys, the quota store (and the
/// service that keeps it), the clock, the MX resolver, the metrics.
fn shared_state(
    gateway: &GatewayConfig,
    table: DomainTable,
    keys: KeyStore,
    in_flight: &InFlight,
    settle: std::time::Duration,
) -> Result<(Shared, Vec<BoxedService>), StartError> {
    let clock: Arc<dyn Clock> = Arc::new(clock()?);
    let (quota, quota_service) = quota_store(&gateway.quota, &clock, in_flight, settle)?;
    let mut services = vec![quota_service];
    let alerts = match &gateway.quota.alerts {
        Some(config) => {
            let redis =
                (gateway.quota.store == QuotaStoreKind::Redis).then_some(&gateway.quota.redis);
            let outbox = config.outbox_path(&gateway.quota.state_file);
            let listeners = gateway.own_listeners();
            let (alerts, service) = crate::access::alerts::service::build(
                config,
                outbox,
                redis,
                &listeners,
                clock.now(),
            )?;
            // The host only: webhook URLs often carry a token in their path or query.
            let host = config.url.parse::<http::Uri>().ok();
            log::info!(
                "quota alerts: to {} at {:?}% of the monthly limit",
                host.as_ref().and_then(|u| u.host()).unwrap_or("?"),
                config.thresholds
            );
            services.push(Box::new(background_service("quota alerts", service)) as BoxedService);
            Some(alerts)
        }
        None => None,
    };
    let table = Arc::new(ArcSwap::from_pointee(table));
    let mx = mx_resolver(gateway, &table)?;
    let shared = Shared {
        table,
        keys: Arc::new(ArcSwap::from_pointee(keys)),
        quota,
        clock,
        mx,
        alerts,
        tracing: crate::ops::trace::Tracing::new(&gateway.tracing),
        draining: Draining::default(),
        metrics: Arc::new(Metrics::new()?.with_recording(gateway.admin.metrics)),
    };
    Ok((shared, services))
}

/// The MX resolver (`None` when MX is off) and its neighbourhood index, loaded from the
/// snapshot and then the state file.
fn mx_resolver(
    gateway: &GatewayConfig,
    table: &Arc<ArcSwap<DomainTable>>,
) -> Result<Option<Arc<MxResolver>>, StartError> {
    if !gateway.mx.enabled {
        return Ok(None);
    }
    let mut resolver = MxResolver::new(&gateway.mx)?;
    let config = &gateway.mx.neighbourhood;
    if config.enabled {
        let sharing = gateway.quota.store == QuotaStoreKind::Redis;
        let index = Arc::new(Neighbourhood::new(config, table.clone(), sharing));
        if let Some(snapshot) = &config.snapshot {
            index.load(snapshot, "snapshot");
        }
        index.load(&config.state_path(), "state file");
        resolver = resolver.with_neighbourhood(index);
    }
    Ok(Some(Arc::new(resolver)))
}

/// Call logs, live top-domains, the keys API and the access log (a call store or access log
/// that does not open stops the start; a bad top-domains state file is logged and ignored).
fn parts(
    gateway: &GatewayConfig,
    shared: &Shared,
    keys_source: &KeysSource,
) -> Result<Parts, StartError> {
    let calls = crate::account::calls::from_config(
        &gateway.calls,
        &gateway.quota,
        &shared.metrics,
        shared.keys.clone(),
        shared.clock.clone(),
    )?;
    let top_live = crate::flags::keeper::Keeper::new(
        &gateway.top_domains,
        (gateway.quota.store == QuotaStoreKind::Redis).then_some(&gateway.quota.redis),
        shared.table.clone(),
        shared.clock.clone(),
        &shared.metrics,
    )?;
    // `/v1/keys` (`keys_api.enabled: false`: its routes answer 404).
    let keys_api = Arc::new(crate::account::keys_api::KeysApi::new(
        shared.keys.clone(),
        gateway.keys_api.managed_file(&gateway.quota),
        gateway.access.plans.clone(),
        gateway.keys_api.clone(),
        keys_source.publish_lock.clone(),
        &shared.metrics,
    )?);
    let (lines, dropped) = shared.metrics.access_log_counters();
    let (access_log, access_log_service) =
        crate::ops::access_log::open(&gateway.access_log, lines, dropped)?;
    Ok(Parts {
        calls,
        top_live,
        keys_api,
        access_log,
        access_log_service,
    })
}

/// The public listener's service (not bound yet): the gateway behind Pingora's HTTP options and
/// our per-connection limits; and the limits' counters, for readiness and metrics.
fn public_service(
    server: &Server,
    gateway_app: Gateway,
    gateway: &GatewayConfig,
    in_flight: &InFlight,
) -> (
    Service<Guarded<pingora::proxy::HttpProxy<Gateway>>>,
    Arc<DownstreamStats>,
) {
    let mut proxy = http_proxy(&server.configuration, gateway_app);
    let mut options = HttpServerOptions::default();
    // Not to proxy CONNECT: Pingora would refuse it itself with a bare 405 (no body, no
    // `Allow`); let through, it is refused by the gateway, in the contract's shape.
    options.allow_connect_method_proxying = true;
    // Pingora counts reuses after the first request.
    options.keepalive_request_limit = Some(gateway.limits.max_requests_per_connection - 1);
    // HTTP/2 (TLS with `h2`) has its own idle timeout and header-list bound.
    options.h2_idle_timeout = Some(gateway.limits.idle_timeout);
    proxy.h2_options = Some(crate::edge::tls::h2_options(&gateway.limits));
    proxy.server_options = Some(options);
    let guarded = Guarded::new(proxy, &gateway.limits);
    let downstream = guarded.stats();
    let open = downstream.clone();
    in_flight.track(move || open.counts().open_connections);
    let service = Service::new("domain-risk gateway".to_owned(), guarded);
    (service, downstream)
}

/// The reloaders (table, URL sources, keys), the keys' last-use saver, the access-log writer,
/// the call-log writer and the top-domains keeper.
fn add_background_services(
    server: &mut Server,
    gateway: &GatewayConfig,
    shared: &Shared,
    (sources, keys_source): (DataSources, KeysSource),
    parts: Parts,
    quota_services: Vec<BoxedService>,
) -> Result<(), StartError> {
    for service in quota_services {
        server.add_boxed_service(service);
    }
    let interval = gateway.reload.poll_interval;
    server.add_service(background_service(
        "data reload",
        Reloader::new(sources, shared.table.clone(), interval)
            .with_priority(gateway.reload.build_priority)
            .with_hook(shared.metrics.reload_hook("table")),
    ));
    // URL sources: fetched in the background into cached files the data reloader watches.
    if !gateway.data.sources.is_empty() {
        crate::data::sources::prepare_dir(&gateway.data.sources_dir)?;
        let fetcher = crate::data::sources::Fetcher::new(
            &gateway.data,
            gateway.reload.max_shrink_percent,
            &shared.metrics,
        )?;
        server.add_service(background_service("source fetch", fetcher));
    }
    server.add_service(background_service(
        "keys reload",
        Reloader::new(keys_source, shared.keys.clone(), interval)
            .with_hook(shared.metrics.reload_hook("keys")),
    ));
    if gateway.keys_api.enabled {
        server.add_service(background_service(
            "keys last use",
            crate::account::keys_api::LastUsedSaver(parts.keys_api),
        ));
    }
    server.add_service(background_service("access log", parts.access_log_service));
    if let Some((_, writer)) = parts.calls {
        server.add_service(background_service("call logs", writer));
    }
    if let Some((_, keeper)) = parts.top_live {
        server.add_service(background_service("top-domains", keeper));
    }
    if let Some(mx) = &shared.mx {
        let sharing = mx.neighbourhood().is_some() && gateway.quota.store == QuotaStoreKind::Redis;
        let index = sharing
            .then(|| SharedIndex::new(&gateway.quota.redis, gateway.mx.neighbourhood.max_entries));
        let service = MxService::new(mx.clone(), gateway.mx.probe_interval, index);
        server.add_service(background_service("mx", service));
    }
    Ok(())
}

type BoxedService = Box<dyn ServiceWithDependents>;

/// The configured quota store and the background service that keeps it.
fn quota_store(
    config: &QuotaConfig,
    clock: &Arc<dyn Clock>,
    in_flight: &InFlight,
    settle_within: std::time::Duration,
) -> Result<(Arc<dyn QuotaStore>, BoxedService), StartError> {
    Ok(match config.store {
        QuotaStoreKind::Local => {
            let store = Arc::new(LocalStore::open(&config.state_file, config.slots)?);
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
            log::info!("quota store: {}", config.redis.describe(redacted));
            let service = Reconciler {
                store: store.clone(),
                interval: config.redis.sync_every(),
                probe_interval: config.redis.breaker_open,
                in_flight: in_flight.clone(),
                settle_within,
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
