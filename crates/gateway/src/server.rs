//! The one place that wires the gateway together: config, the first table and keys, the quota
//! store, the MX resolver, the public and admin listeners, and the background services
//! (reloaders, quota persistence or reconciliation) into a Pingora server.

use std::sync::Arc;

use arc_swap::ArcSwap;
use pingora::apps::HttpServerOptions;
use pingora::proxy::http_proxy;
use pingora::server::configuration::ServerConf;
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use pingora::services::ServiceWithDependents;

use crate::config::{GatewayConfig, Settings};
use crate::edge::admin::Admin;
use crate::edge::downstream::ConnectionLimited;
use crate::edge::gateway::Gateway;
use crate::state::Shared;
use drg_access::keys::KeyStore;
use drg_access::quota::config::{QuotaConfig, QuotaStoreKind};
use drg_access::quota::local::LocalStore;
use drg_access::quota::redis::RedisStore;
use drg_access::quota::services::{Persistence, Reconciler};
use drg_access::quota::{Clock, QuotaStore, SystemClock};
use drg_access::source::KeysSource;
use drg_base::infra::control::Control;
use drg_base::reload::Reloader;
use drg_domain::DomainTable;
use drg_evidence::data::files::{log_conflicts, summary, DataSources};
use drg_evidence::mx::neighbourhood::service::MxService;
use drg_evidence::mx::neighbourhood::share::SharedIndex;
use drg_evidence::mx::neighbourhood::Neighbourhood;
use drg_evidence::mx::resolver::MxResolver;
use drg_telemetry::connections::DownstreamStats;
use drg_telemetry::lifecycle::{settle_budget, Draining, InFlight};
use drg_telemetry::metrics::Metrics;

/// A part's [`drg_base::service::Service`], run as one of Pingora's background services: the
/// parts know only the service contract, the host alone knows Pingora.
pub(crate) struct Hosted<S>(pub S);

#[async_trait::async_trait]
impl<S: drg_base::service::Service> pingora::services::background::BackgroundService for Hosted<S> {
    async fn start(&self, shutdown: pingora::server::ShutdownWatch) {
        self.0.run(shutdown).await;
    }
}

/// A part's service named `name`, ready for the server.
pub(crate) fn hosted<S: drg_base::service::Service>(name: &str, service: S) -> BoxedService {
    Box::new(background_service(name, Hosted(service)))
}

/// Why the server could not start; each error carries its own context.
pub type StartError = Box<dyn std::error::Error + Send + Sync>;

/// Starts the quota clock somewhere else in time (tests of month rollover, end to end).
pub const CLOCK_START_ENV: &str = "DOMAIN_RISK_GATEWAY_CLOCK_START";

/// Holds the Redis quota store's sync this many milliseconds after it sent calls to Redis and
/// before it writes its carried-calls file: a test's `kill -9` then lands in that window.
pub const CARRY_PAUSE_ENV: &str = "DOMAIN_RISK_GATEWAY_CARRY_PAUSE_MS";

/// The keys file as configured.
pub fn keys_source(settings: &Settings) -> KeysSource {
    let access = &settings.gateway.access;
    KeysSource {
        path: access.keys_file.clone(),
        plans: access.plans.clone(),
        refuse_demo_key: !access.allow_demo_key && !settings.listens_on_loopback(),
        // API-made keys keep working when the keys API is switched off (it only stops managing
        // them).
        managed: Some(managed_path(&settings.gateway)),
        publish_lock: Arc::default(),
        record_first_seen: false,
        set_aside: Arc::default(),
        held: Arc::default(),
        orphans: Arc::default(),
        // Gateways sharing PostgreSQL may hold different keys files (a rolling change): none
        // of them decides alone which operator keys exist.
        makers: if settings.gateway.control.is_some() {
            drg_access::managed::Makers::Shared
        } else {
            drg_access::managed::Makers::Here
        },
        verified_until: Arc::new(i64::MAX.into()),
        trust_seconds: i64::try_from(settings.gateway.keys_api.unverified_after.as_secs())
            .unwrap_or(i64::MAX),
    }
}

/// The cache of the control store's API-made keys the keys reloader merges (read at start until
/// the store answers; see [`drg_projects::account::keys_api::control`]).
fn managed_path(gateway: &GatewayConfig) -> std::path::PathBuf {
    home(gateway).folder.join("keys.control-cache.json")
}

/// Each kind of record's report of a revision gone back, for the admin `/readyz`.
fn went_back(parts: &Parts, shared: &Shared) -> Vec<crate::edge::admin::WentBackOf> {
    let (o, r, d) = (
        parts.overrides.snapshot.clone(),
        parts.reports.snapshot.clone(),
        parts.reports.decisions.clone(),
    );
    let keys = parts.keys_api.clone();
    let mut out: Vec<crate::edge::admin::WentBackOf> = vec![
        Box::new(move || keys.went_back()),
        Box::new(move || o.went_back()),
        Box::new(move || r.went_back()),
        Box::new(move || d.went_back()),
    ];
    if let Some(hooks) = shared.webhooks.as_ref().map(|h| h.snapshot().clone()) {
        out.push(Box::new(move || hooks.went_back()));
    }
    out
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

/// The pause [`CARRY_PAUSE_ENV`] asks for, if any.
fn carry_pause() -> Result<Option<std::time::Duration>, StartError> {
    let Ok(ms) = std::env::var(CARRY_PAUSE_ENV) else {
        return Ok(None);
    };
    let ms: u64 = ms
        .parse()
        .map_err(|e| format!("{CARRY_PAUSE_ENV}: '{ms}' is not a number of milliseconds: {e}"))?;
    log::warn!("{CARRY_PAUSE_ENV} is set: the quota sync waits {ms} ms before keeping its calls");
    Ok(Some(std::time::Duration::from_millis(ms)))
}

/// Everything the gateway is made of, built from its config: what a
/// [`DomainRisk`](crate::DomainRisk) holds, embedded or standalone.
pub(crate) struct Wired {
    /// The request phases (and their state) of every request the gateway claims.
    pub gateway: Arc<Gateway>,
    pub shared: Shared,
    /// The open connections of a listener guarded by `gateway.limits` (zero without one).
    pub downstream: Arc<DownstreamStats>,
    pub access_log: Option<drg_telemetry::access_log::AccessLog>,
    /// The background services: reloaders, stores' persistence, writers, MX, alerts.
    pub services: Vec<BoxedService>,
    /// The admin listener (`gateway.admin.listen`), not bound yet.
    pub admin: Option<Service<Admin>>,
}

/// The parts the public listener's `Gateway` is made of besides `Shared`, and the background
/// services that keep them.
struct Parts {
    calls: Option<(
        drg_projects::account::calls::Calls,
        drg_projects::account::calls::CallWriter,
    )>,
    top_live: Option<(
        Arc<drg_projects::live_top::LiveTop>,
        drg_projects::live_top::keeper::Keeper,
    )>,
    keys_api: Arc<drg_projects::account::keys_api::KeysApi>,
    /// `/v1/overrides` and their store.
    overrides: Arc<drg_projects::account::overrides::Overrides>,
    /// `/v1/reports` and their store.
    reports: Arc<drg_projects::account::reports::Reports>,
    /// `/v1/webhooks` (`gateway.webhooks`; `None`: off), over `Shared::webhooks`.
    webhooks: Option<Arc<drg_projects::account::webhooks::Webhooks>>,
    /// The audit trail.
    audit: Arc<drg_projects::account::audit::Audit>,
    access_log: Option<drg_telemetry::access_log::AccessLog>,
    access_log_service: drg_telemetry::access_log::AccessLogService,
}

/// Builds everything from `settings` (a bad table, keys file or state file stops the start):
/// the one wiring path of the standalone gateway and of an embedding host. `server` is the
/// Pingora server's configuration (it sizes the relay's keep-alive pool).
pub(crate) fn wire(settings: &Settings, server: &ServerConf) -> Result<Wired, StartError> {
    let (sources, table, keys_source, keys) = first_load(settings)?;
    let in_flight = InFlight::default();
    let settle = settle_budget(server.grace_period_seconds);
    let gateway = &settings.gateway;
    let mut services = Vec::new();
    let webhooks = match crate::webhooks::build(gateway)? {
        Some((webhooks, engine)) => {
            services.push(hosted("webhooks", engine));
            Some(webhooks)
        }
        None => None,
    };
    let (shared, more) = shared_state(
        gateway,
        (table, keys),
        &in_flight,
        settle,
        webhooks.as_ref(),
    )?;
    services.extend(more);
    let mut parts = parts(gateway, &shared, &keys_source)?;
    if let Some((_, writer)) = &mut parts.calls {
        writer.settle_with(in_flight.clone(), settle);
    }
    if let (Some(w), Some(api)) = (&webhooks, &parts.webhooks) {
        w.with_projects(gateway, api.hooks());
    }
    let changes = verdict_changes(
        gateway,
        &shared,
        &mut parts,
        &mut services,
        webhooks.as_ref(),
    )?;
    let app = Gateway::new(shared.clone(), gateway)
        .with_relay(&gateway.upstream, server)
        .with_access_log(parts.access_log.clone())
        .with_calls(parts.calls.as_ref().map(|(c, _)| c.clone()))
        .with_changes(changes)
        .with_top_live(parts.top_live.as_ref().map(|(live, _)| live.clone()))
        .with_keys_api(Some(parts.keys_api.clone()))
        .with_overrides(parts.overrides.clone())
        .with_webhooks(parts.webhooks.clone())
        .with_reports(parts.reports.clone())
        .with_audit(parts.audit.clone());
    let downstream = Arc::new(DownstreamStats::default());
    let open = downstream.clone();
    in_flight.track(move || open.counts().open_connections);
    let admin = gateway.admin.listen.as_deref().map(|listen| {
        let admin = Admin {
            shared: shared.clone(),
            downstream: downstream.clone(),
            upstream: gateway.upstream.address.clone(),
            keys_api: Some(parts.keys_api.clone()),
            reports: Some(parts.reports.clone()),
            went_back: went_back(&parts, &shared),
        };
        admin_service(admin, listen)
    });
    let access_log = parts.access_log.clone();
    let inputs = (sources, keys_source);
    background_services(&mut services, gateway, &shared, inputs, parts)?;
    Ok(Wired {
        gateway: Arc::new(app),
        shared,
        downstream,
        access_log,
        services,
        admin,
    })
}

/// Quota alerts: the operator's (`gateway.quota.alerts`) and, with `gateway.webhooks`, the
/// projects' own (at the default thresholds when the operator set none).
fn quota_alerts(
    gateway: &GatewayConfig,
    clock: &Arc<dyn Clock>,
    webhooks: &crate::webhooks::Webhooks,
    services: &mut Vec<BoxedService>,
) -> Result<Option<Arc<drg_access::quota::alerts::Alerts>>, StartError> {
    let config = match (&gateway.quota.alerts, &gateway.webhooks) {
        (Some(config), _) => config.clone(),
        (None, Some(_)) => drg_access::quota::alerts::config::AlertsConfig::default(),
        (None, None) => return Ok(None),
    };
    let redis = home(gateway).shared;
    // The previous release's own outbox: its alerts are carried into the webhook engine's.
    let previous = config.previous_outbox_path(&gateway.quota.state_file);
    let (alerts, service) = drg_access::quota::alerts::service::build(
        &config,
        previous,
        redis,
        webhooks.producer(),
        clock.now(),
    )
    .map_err(|e| e.to_string())?;
    let _ = webhooks.counts.alerts.set(service.counters());
    // The host only: webhook URLs often carry a token in their path or query.
    let host = config
        .url
        .as_ref()
        .and_then(|u| u.parse::<http::Uri>().ok());
    log::info!(
        "quota alerts: to {}{} at {:?}% of the monthly limit",
        host.as_ref()
            .and_then(|u| u.host())
            .unwrap_or("no operator receiver"),
        if gateway.webhooks.is_some() {
            " and the projects' webhooks"
        } else {
            ""
        },
        config.thresholds
    );
    services.push(hosted("quota alerts", service));
    Ok(Some(alerts))
}

/// Verdict changes (`gateway.changes`, when a plan is watched): the store, the call writer's
/// observer and the service; the handle `GET /v1/changes` reads.
fn verdict_changes(
    gateway: &GatewayConfig,
    shared: &Shared,
    parts: &mut Parts,
    services: &mut Vec<BoxedService>,
    webhooks: Option<&crate::webhooks::Webhooks>,
) -> Result<Option<drg_projects::changes::ChangesApi>, StartError> {
    use drg_projects::changes::{
        embedded::EmbeddedChanges, redis::RedisChanges, ChangeStore, Counters,
    };
    let config = &gateway.changes;
    let Some((_, writer)) = parts.calls.as_mut().filter(|_| config.enabled()) else {
        return Ok(None);
    };
    let store: Arc<dyn ChangeStore> = match home(gateway).shared {
        None => Arc::new(EmbeddedChanges::new(
            config.file_path(&gateway.quota.state_file),
        )?),
        Some(redis) => Arc::new(RedisChanges::new(redis)?),
    };
    let counters = Arc::new(Counters::register(&shared.metrics)?);
    if let Some(w) = webhooks {
        let _ = w.counts.changes.set(counters.clone());
    }
    let judge = drg_projects::changes::judge::Judge {
        overrides: shared.overrides.clone(),
        accepted: shared.accepted.clone(),
        table: shared.table.clone(),
        mx: shared.mx.clone(),
        rdap: shared.rdap.clone(),
    };
    let (watch, service) = drg_projects::changes::service::build(
        config,
        store.clone(),
        judge,
        shared.keys.clone(),
        webhooks.map(crate::webhooks::Webhooks::producer),
        counters.clone(),
    )?;
    writer.observed_by(Arc::new(watch));
    services.push(hosted("verdict changes", service));
    log::info!(
        "verdict changes: watching the plans {:?}{}",
        config.watch_days.keys().collect::<Vec<_>>(),
        if config.webhook.is_some() {
            ", sent by webhook"
        } else {
            ""
        }
    );
    Ok(Some(drg_projects::changes::ChangesApi { store, counters }))
}

/// After the server stopped: the access log's last lines written, the last spans exported.
pub(crate) fn finish(access_log: Option<&drg_telemetry::access_log::AccessLog>, shared: &Shared) {
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
    (table, keys): (DomainTable, KeyStore),
    in_flight: &InFlight,
    settle: std::time::Duration,
    webhooks: Option<&crate::webhooks::Webhooks>,
) -> Result<(Shared, Vec<BoxedService>), StartError> {
    let clock: Arc<dyn Clock> = Arc::new(clock()?);
    let (quota, quota_service) = quota_store(&gateway.quota, &clock, in_flight, settle)?;
    let mut services = vec![quota_service];
    let alerts = match webhooks {
        Some(w) => quota_alerts(gateway, &clock, w, &mut services)?,
        None => None,
    };
    let table = Arc::new(ArcSwap::from_pointee(table));
    let control = control_store(gateway)?;
    let mx = mx_resolver(gateway, &table)?;
    let rdap = match gateway.rdap.enabled {
        true => Some(Arc::new(drg_evidence::rdap::service::Rdap::new(
            &gateway.rdap,
        ))),
        false => None,
    };
    let shared = Shared {
        table,
        keys: Arc::new(ArcSwap::from_pointee(keys)),
        quota,
        clock,
        mx,
        rdap,
        alerts,
        tracing: drg_telemetry::trace::Tracing::new(&gateway.tracing),
        draining: Draining::default(),
        metrics: Arc::new(Metrics::new()?.with_recording(gateway.admin.metrics)),
        overrides: Arc::new(ArcSwap::from_pointee(
            drg_domain::overrides::OverrideSet::default(),
        )),
        accepted: Arc::default(),
        webhooks: project_hooks(gateway, &control),
        control,
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
    let mut resolver = MxResolver::new(&gateway.mx)?.with_providers(table.clone());
    let config = &gateway.mx.neighbourhood;
    for warning in [config.retired(), config.hold_capped()]
        .into_iter()
        .flatten()
    {
        log::warn!("{warning}");
    }
    if config.enabled {
        let sharing = home(gateway).shared.is_some();
        let index = Arc::new(Neighbourhood::new(config, table.clone(), sharing));
        if sharing {
            // One verdict for a name on every gateway on the Redis (`holds.rs`).
            index.set_shared_holds(Arc::new(
                drg_evidence::mx::neighbourhood::holds::SharedHolds::new(&gateway.quota.redis),
            ));
        }
        if let Some(snapshot) = &config.snapshot {
            index.load(snapshot, "snapshot", true);
        }
        index.load(&config.state_path(), "state file", false);
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
    let calls = drg_projects::account::calls::from_config(
        &gateway.calls,
        &gateway.quota,
        &shared.metrics,
        shared.keys.clone(),
        shared.clock.clone(),
    )?;
    let top_live = drg_projects::live_top::keeper::Keeper::new(
        &gateway.top_domains,
        home(gateway).shared,
        shared.table.clone(),
        shared.clock.clone(),
        &shared.metrics,
    )?;
    // `/v1/keys` (`keys_api.enabled: false`: its routes answer 404).
    let keys_api = Arc::new(drg_projects::account::keys_api::KeysApi::new(
        shared.keys.clone(),
        (keys_source.held.clone(), keys_source.verified_until.clone()),
        managed_path(gateway),
        &shared.control,
        gateway.access.plans.clone(),
        gateway.keys_api.clone(),
        keys_source.publish_lock.clone(),
        shared.clock.clone(),
        &shared.metrics,
    )?);
    // Set once: a second wiring in one process (tests) keeps the first's channel.
    let _ = keys_source.orphans.set(keys_api.orphans());
    let (overrides, reports) = project_records(gateway, shared);
    let audit = Arc::new(drg_projects::account::audit::Audit::open(&shared.control));
    let (lines, dropped) = shared.metrics.access_log_counters();
    let (access_log, access_log_service) =
        drg_telemetry::access_log::open(&gateway.access_log, lines, dropped)?;
    Ok(Parts {
        calls,
        top_live,
        keys_api,
        overrides,
        reports,
        webhooks: project_webhooks(gateway, shared),
        audit,
        access_log,
        access_log_service,
    })
}

/// Where this gateway keeps its state, and what it shares with the other gateways: the state
/// folder (where `quota.state_file` is) and, with `quota.store: redis`, Redis. Chosen here once;
/// every part is handed it.
struct Home<'a> {
    folder: &'a std::path::Path,
    shared: Option<&'a drg_base::infra::redis::config::RedisConfig>,
}

fn home(gateway: &GatewayConfig) -> Home<'_> {
    let redis = gateway.quota.store == QuotaStoreKind::Redis;
    Home {
        folder: (gateway.quota.state_file.parent()).unwrap_or(std::path::Path::new(".")),
        shared: redis.then_some(&gateway.quota.redis),
    }
}

/// `/v1/overrides` and `/v1/reports`, kept in the control store.
fn project_records(
    gateway: &GatewayConfig,
    shared: &Shared,
) -> (
    Arc<drg_projects::account::overrides::Overrides>,
    Arc<drg_projects::account::reports::Reports>,
) {
    let control = &shared.control;
    let overrides = drg_projects::account::overrides::Overrides::open(
        shared.overrides.clone(),
        control,
        gateway.access.plans.clone(),
    );
    let reports = drg_projects::account::reports::Reports::open(
        gateway.reports.clone(),
        shared.accepted.clone(),
        control,
        gateway.access.plans.clone(),
    );
    (Arc::new(overrides), Arc::new(reports))
}

/// The projects' webhooks (`gateway.webhooks`; `None`: off), kept as `/v1/overrides` are: what
/// delivery reads (`Shared::webhooks`). Opened once: the one poll keeps every clone.
fn project_hooks(
    gateway: &GatewayConfig,
    control: &Arc<Control>,
) -> Option<drg_projects::account::webhooks::ProjectHooks> {
    let config = gateway.webhooks.as_ref()?;
    log::info!(
        "webhooks: projects may make their own (allow_private: {})",
        config.allow_private
    );
    Some(drg_projects::account::webhooks::ProjectHooks::open(control))
}

/// The control store: PostgreSQL when `gateway.control` names one, else SQLite in the state
/// folder (nothing connects until the first call). An earlier release's records left in the
/// state folder or on the shared Redis are named, with the command that moves them.
fn control_store(gateway: &GatewayConfig) -> Result<Arc<Control>, StartError> {
    let folder = home(gateway).folder;
    let control = Control::open(gateway.control.as_ref(), folder)
        .map_err(|e| format!("gateway.control: {e}"))?;
    log::info!(
        "control store: {} (API-made keys, overrides, webhooks, reports and verdicts, the \
         audit trail)",
        control.described()
    );
    if gateway.control.is_none() && home(gateway).shared.is_some() {
        log::warn!(
            "the quota store is the shared Redis, but API-made keys, overrides, webhooks, \
             reports and verdicts are kept in this gateway's state folder (Redis holds counts only): \
             gateways that share them need one control store, `gateway.control.url` on \
             PostgreSQL (docs/scaling.md)"
        );
    }
    if gateway.keys_api.shared_poll_ms.is_some() {
        log::warn!(
            "gateway.keys_api.shared_poll_ms decides nothing now: API-made keys follow the \
             control store (gateway.control.poll_ms); remove it"
        );
    }
    let managed = gateway.keys_api.managed_file(&gateway.quota);
    let left = drg_projects::account::migrate::left_behind(folder, &managed);
    if !left.is_empty() {
        log::warn!(
            "keys and records an earlier release kept are not served until moved: {}; run \
             `domain-risk-gateway migrate` once (docs/operations.md)",
            left.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(control)
}

/// `/v1/webhooks` over the projects' webhooks `shared` holds (`None`: off).
fn project_webhooks(
    gateway: &GatewayConfig,
    shared: &Shared,
) -> Option<Arc<drg_projects::account::webhooks::Webhooks>> {
    let (config, hooks) = gateway.webhooks.as_ref().zip(shared.webhooks.clone())?;
    Some(Arc::new(drg_projects::account::webhooks::Webhooks::new(
        hooks,
        config,
        gateway.access.plans.clone(),
    )))
}

/// A public listener's service (not bound yet): `app` behind Pingora's HTTP options and the
/// per-connection limits of `gateway.limits`, counted in `downstream`. `refuse_connect`: CONNECT
/// reaches the app to be refused in the contract's shape (the standalone gateway); otherwise
/// Pingora refuses it itself, as a host proxy expects.
pub(crate) fn guarded_service<A>(
    server: &Arc<ServerConf>,
    app: A,
    limits: &crate::edge::config::LimitsConfig,
    downstream: Arc<DownstreamStats>,
    refuse_connect: bool,
) -> Service<ConnectionLimited<pingora::proxy::HttpProxy<A>>>
where
    A: pingora::proxy::ProxyHttp + Send + Sync + 'static,
    A::CTX: Send + Sync,
{
    let mut proxy = http_proxy(server, app);
    let mut options = HttpServerOptions::default();
    options.allow_connect_method_proxying = refuse_connect;
    // Pingora counts reuses after the first request.
    options.keepalive_request_limit = Some(limits.max_requests_per_connection - 1);
    // HTTP/2 (TLS with `h2`) has its own idle timeout and header-list bound.
    options.h2_idle_timeout = Some(limits.idle_timeout);
    proxy.h2_options = Some(crate::edge::tls::h2_options(limits));
    proxy.server_options = Some(options);
    let guarded = ConnectionLimited::new(proxy, limits).with_stats(downstream);
    Service::new("domain-risk gateway".to_owned(), guarded)
}

/// The reloaders (table, URL sources, keys), the keys' last-use saver, the access-log writer,
/// the call-log writer, the top-domains keeper and the MX service, after the quota's.
fn background_services(
    services: &mut Vec<BoxedService>,
    gateway: &GatewayConfig,
    shared: &Shared,
    (sources, keys_source): (DataSources, KeysSource),
    parts: Parts,
) -> Result<(), StartError> {
    let interval = gateway.reload.poll_interval;
    services.push(hosted(
        "data reload",
        Reloader::new(sources, shared.table.clone(), interval)
            .with_priority(gateway.reload.build_priority)
            .with_hook(shared.metrics.reload_hook("table")),
    ));
    // URL sources: fetched in the background into cached files the data reloader watches.
    if !gateway.data.sources.is_empty() {
        drg_evidence::data::sources::prepare_dir(&gateway.data.sources_dir)?;
        let fetcher = drg_evidence::data::sources::Fetcher::new(
            &gateway.data,
            gateway.reload.max_shrink_percent,
            &shared.metrics,
        )?;
        services.push(hosted("source fetch", fetcher));
    }
    services.push(hosted(
        "keys reload",
        Reloader::new(keys_source, shared.keys.clone(), interval)
            .with_hook(shared.metrics.reload_hook("keys")),
    ));
    // The store's keys are followed also with the keys API off: they keep working.
    services.push(hosted(
        "keys follow",
        drg_projects::account::keys_api::follow(&parts.keys_api),
    ));
    services.push(hosted(
        "keys cache",
        drg_projects::account::keys_api::CacheSaver(parts.keys_api.clone()),
    ));
    if gateway.keys_api.enabled {
        services.push(hosted(
            "keys last use",
            drg_projects::account::keys_api::LastUsedSaver(parts.keys_api),
        ));
    }
    services.extend(record_polls(&parts.overrides, &parts.reports, shared));
    services.push(hosted("access log", parts.access_log_service));
    if let Some((_, writer)) = parts.calls {
        services.push(hosted("call logs", writer));
    }
    if let Some((_, keeper)) = parts.top_live {
        services.push(hosted("top-domains", keeper));
    }
    if let Some(rdap) = &shared.rdap {
        services.push(hosted(
            "rdap",
            drg_evidence::rdap::service::RdapService(rdap.clone()),
        ));
    }
    if let Some(mx) = &shared.mx {
        let sharing = mx.neighbourhood().is_some() && home(gateway).shared.is_some();
        let index = sharing
            .then(|| SharedIndex::new(&gateway.quota.redis, gateway.mx.neighbourhood.max_entries));
        let service = MxService::new(mx.clone(), gateway.mx.probe_interval, index);
        services.push(hosted("mx", service));
    }
    Ok(())
}

pub(crate) type BoxedService = Box<dyn ServiceWithDependents>;

/// The polls of the projects' records: overrides, reports and (when on) webhooks; on
/// PostgreSQL, the connection that hears their changes at once.
fn record_polls(
    overrides: &drg_projects::account::overrides::Overrides,
    reports: &drg_projects::account::reports::Reports,
    shared: &Shared,
) -> Vec<BoxedService> {
    use drg_base::infra::control::follow::Following;
    let mut polls: Vec<BoxedService> = vec![
        hosted("overrides", Following(overrides.snapshot.clone())),
        hosted("reports", Following(reports.snapshot.clone())),
        hosted("verdicts", Following(reports.decisions.clone())),
    ];
    if let Some(hooks) = &shared.webhooks {
        let poll = Following(hooks.snapshot().clone());
        polls.push(hosted("webhooks", poll));
    }
    let revisions = drg_base::infra::control::watch::Revisions(shared.control.clone());
    polls.push(hosted("control store revisions", revisions));
    if shared.control.engine() == drg_base::infra::control::Engine::Postgres {
        let listen = drg_base::infra::control::listen::Listen(shared.control.clone());
        polls.push(hosted("control store changes", listen));
    }
    polls
}

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
            (store, hosted("quota persistence", service))
        }
        QuotaStoreKind::Redis => {
            let store = RedisStore::new(&config.redis, clock.clone())?.with_carried_folder(
                drg_access::quota::redis::carried::folder_of(&config.state_file),
            );
            let store = store.with_carry_pause(carry_pause()?);
            store.adopt_carried();
            let store = store.shared();
            log::info!("quota store: {}", config.redis.describe(redacted));
            let service = Reconciler {
                store: store.clone(),
                interval: config.redis.sync_every(),
                probe_interval: config.redis.breaker_open,
                in_flight: in_flight.clone(),
                settle_within,
            };
            (store, hosted("quota reconcile", service))
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
