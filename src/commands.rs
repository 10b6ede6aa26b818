//! What each CLI subcommand does; `main.rs` only parses arguments and calls these.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::apps::HttpServerOptions;
use pingora::proxy::http_proxy;
use pingora::server::{RunArgs, Server, ShutdownWatch};
use pingora::services::background::{background_service, BackgroundService};
use pingora::services::listening::Service;
use pingora::services::ServiceWithDependents;

use crate::access::keys::{generate_secret, key_entry_yaml, parse_keys, KeysSource};
use crate::access::quota::local::LocalStore;
use crate::access::quota::redis::RedisStore;
use crate::access::quota::{Clock, QuotaStore, SystemClock};
use crate::admin::Admin;
use crate::config::Settings;
use crate::config::{QuotaConfig, QuotaStoreKind};
use crate::data_files::{log_conflicts, summary, DataSources};
use crate::domain::classify::{classify_match, wants_mx};
use crate::domain::{DomainName, TableRule};
use crate::downstream::Guarded;
use crate::gateway::{Gateway, Shared};
use crate::lifecycle::{Draining, DrainingShutdown};
use crate::mx::resolver::MxResolver;
use crate::reload::Reloader;

/// A boxed error for command results: each carries its own context.
pub type CommandError = Box<dyn std::error::Error + Send + Sync>;

/// Starts the quota clock somewhere else in time (tests of month rollover, end to end).
pub const CLOCK_START_ENV: &str = "DOMAIN_RISK_GATEWAY_CLOCK_START";

/// Loads settings, applying `--listen`.
fn settings(conf: &Path, listen: Option<&str>) -> Result<Settings, CommandError> {
    let mut settings = Settings::load(conf)?;
    if let Some(listen) = listen {
        settings.override_listen(listen)?;
    }
    Ok(settings)
}

fn keys_source(settings: &Settings) -> KeysSource {
    let access = &settings.gateway.access;
    KeysSource {
        path: access.keys_file.clone(),
        plans: access.plans.clone(),
        refuse_demo_key: !access.allow_demo_key && !settings.listens_on_loopback(),
    }
}

fn clock() -> Result<SystemClock, CommandError> {
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

/// `serve`: builds the first table and key set (bad ones stop the start), then runs until
/// signalled.
pub fn serve(conf: &Path, listen: Option<&str>) -> Result<(), CommandError> {
    let settings = settings(conf, listen)?;
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
    let (quota, quota_service) = quota_store(&settings.gateway.quota)?;
    let clock: Arc<dyn Clock> = Arc::new(clock()?);

    let mx = if settings.gateway.mx.enabled {
        Some(Arc::new(MxResolver::new(&settings.gateway.mx)?))
    } else {
        None
    };
    let shared = Shared {
        table: Arc::new(ArcSwap::from_pointee(table)),
        keys: Arc::new(ArcSwap::from_pointee(keys)),
        quota,
        clock,
        mx,
        draining: Draining::default(),
    };
    let gateway = &settings.gateway;
    settings.prepare_runtime_dir()?;
    let mut server = Server::new_with_opt_and_conf(None, settings.server);
    server.bootstrap();
    let (table, keys, draining) = (
        shared.table.clone(),
        shared.keys.clone(),
        shared.draining.clone(),
    );
    let admin_state = (shared.quota.clone(), shared.draining.clone());
    let mut proxy = http_proxy(&server.configuration, Gateway::new(shared, gateway));
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
            table: table.clone(),
            keys: keys.clone(),
            quota: admin_state.0,
            draining: admin_state.1,
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
    let interval = gateway.reload.poll_interval();
    server.add_service(background_service(
        "data reload",
        Reloader::new(sources, table, interval),
    ));
    server.add_service(background_service(
        "keys reload",
        Reloader::new(keys_source, keys, interval),
    ));
    server.add_boxed_service(quota_service);
    log::info!(
        "listening on http://{} (upstream {})",
        gateway.listen,
        gateway.upstream.address
    );
    server.run(RunArgs {
        shutdown_signal: Box::new(DrainingShutdown {
            draining,
            drain: Duration::from_secs(gateway.drain_seconds),
        }),
    });
    log::info!("stopped");
    Ok(())
}

type BoxedService = Box<dyn ServiceWithDependents>;

/// The configured quota store and the background service that keeps it (persistence for the
/// local store, reconciliation for Redis).
fn quota_store(config: &QuotaConfig) -> Result<(Arc<dyn QuotaStore>, BoxedService), CommandError> {
    Ok(match config.store {
        QuotaStoreKind::Local => {
            let store = Arc::new(LocalStore::open(&config.state_file)?);
            let service = QuotaPersistence {
                store: store.clone(),
                interval: config.flush_interval(),
            };
            (
                store,
                Box::new(background_service("quota persistence", service)),
            )
        }
        QuotaStoreKind::Redis => {
            let store = Arc::new(RedisStore::new(&config.redis)?);
            log::info!("quota store: Redis at {}", redacted(&config.redis.url));
            let service = RedisReconciler {
                store: store.clone(),
                interval: config.redis.reconcile_interval(),
            };
            (
                store,
                Box::new(background_service("quota reconcile", service)),
            )
        }
    })
}

/// Writes quota counts to the state file every interval and once more at shutdown.
struct QuotaPersistence {
    store: Arc<LocalStore>,
    interval: Duration,
}

impl QuotaPersistence {
    async fn flush(&self) {
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || store.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => log::error!("{e}"),
            Err(e) => log::error!("quota flush task failed: {e}"),
        }
    }
}

#[async_trait]
impl BackgroundService for QuotaPersistence {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => self.flush().await,
                _ = shutdown.changed() => {
                    self.flush().await;
                    return;
                }
            }
        }
    }
}

/// Adds the counts made during a Redis outage back to Redis, and reports what is pending.
struct RedisReconciler {
    store: Arc<RedisStore>,
    interval: Duration,
}

#[async_trait]
impl BackgroundService for RedisReconciler {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    self.store.sync(false).await;
                }
                _ = shutdown.changed() => {
                    let left = self.store.sync(true).await;
                    if left > 0 {
                        log::error!("quota store: {left} locally counted calls could not reach Redis before shutdown");
                    }
                    return;
                }
            }
        }
    }
}

/// A Redis URL without its password, for logs.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_owned(),
    }
}

/// `check-config`: validates the config, data and keys without serving.
pub fn check_config(conf: &Path) -> Result<String, CommandError> {
    let settings = settings(conf, None)?;
    let table = DataSources::from_config(&settings.gateway).build()?;
    let keys = keys_source(&settings).load()?;
    Ok(format!(
        "{}: ok; listen {}; upstream {}; {} keys; data {}: {}",
        conf.display(),
        settings.gateway.listen,
        settings.gateway.upstream.address,
        keys.len(),
        settings.gateway.data.dir.display(),
        summary(&table)
    ))
}

/// `lookup <domain>`: the record, the rule that decided it and the MX evidence, without a server.
pub fn lookup(conf: &Path, domain: &str) -> Result<String, CommandError> {
    let settings = settings(conf, None)?;
    let table = DataSources::from_config(&settings.gateway).build()?;
    let name = DomainName::parse(domain).map_err(|e| format!("'{domain}': {e}"))?;
    let found = table.lookup(&name);
    let mx = &settings.gateway.mx;
    let evidence = if mx.enabled && wants_mx(&found) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let resolver = Arc::new(MxResolver::new(mx)?);
        // No request is waiting here: give DNS its full query timeout, not the request budget.
        let (evidence, state) =
            runtime.block_on(resolver.evidence_within(name.as_str(), mx.query_timeout()));
        Some((evidence, state))
    } else {
        None
    };
    let verdict = classify_match(&table, &name, found, evidence.as_ref().map(|(e, _)| &**e));
    let rule = match verdict.rule {
        TableRule::Allowlist { at } if at == name.as_str() => "allowlist".to_owned(),
        TableRule::Allowlist { at } => format!("allowlist, via parent domain {at}"),
        TableRule::Record(_) => "explicit record (domains.csv)".to_owned(),
        TableRule::FreeProvider { at } if at == name.as_str() => "free-provider list".to_owned(),
        TableRule::FreeProvider { at } => format!("free-provider list, via parent domain {at}"),
        TableRule::Blocklist { at } if at == name.as_str() => "blocklist".to_owned(),
        TableRule::Blocklist { at } => format!("blocklist, via parent domain {at}"),
        TableRule::Unknown => "no entry (default)".to_owned(),
    };
    let record = serde_json::to_string_pretty(&verdict.record)?;
    let mut out = format!("{record}\nrule: {rule}");
    match &evidence {
        None if !mx.enabled => out.push_str("\nmx: lookups disabled (gateway.mx.enabled)"),
        None => out.push_str("\nmx: not needed (the table decided)"),
        Some((e, state)) => {
            out.push_str(&format!(
                "\nmx: {} ({state:?})",
                serde_json::to_string(&**e)?
            ));
            for h in e.hosts() {
                out.push_str(&format!("\n  {:>5} {}", h.preference, h.host));
            }
            match &verdict.provider {
                Some(p) => out.push_str(&format!(
                    "\nprovider: {} ({:?}), host {} matched {}",
                    p.label, p.kind, p.host, p.pattern
                )),
                None => out.push_str("\nprovider: not recognised"),
            }
        }
    }
    Ok(out)
}

/// `key new`: a new secret (printed once) and its keys-file entry, printed or appended.
pub fn key_new(
    conf: &Path,
    id: &str,
    plan: &str,
    origins: &[String],
    append: bool,
) -> Result<String, CommandError> {
    let settings = settings(conf, None)?;
    let secret = generate_secret()?;
    let entry = key_entry_yaml(id, &secret, plan, origins);
    let source = keys_source(&settings);
    let current = match std::fs::read_to_string(&source.path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("{}: {e}", source.path.display()).into()),
    };
    // An explicitly empty list (`keys: []`) becomes a block list the entry can join.
    let emptied = current.lines().any(|l| l.trim() == "keys: []");
    let current = if emptied {
        current.replacen("keys: []", "keys:", 1)
    } else {
        current
    };
    let header = if current.contains("keys:") {
        ""
    } else {
        "keys:\n"
    };
    let separator = if current.is_empty() || current.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    let updated = format!("{current}{separator}{header}{entry}");
    // Validate the file as it would become: a known plan, a unique id, valid origins.
    parse_keys(&updated, &source.path.display().to_string(), &source.plans)?;
    let mut out =
        format!("secret (shown once; store it now, it cannot be recovered):\n  {secret}\n");
    if append && emptied {
        // The list line itself changes: replace the file whole, atomically.
        let tmp = source.path.with_extension("yaml.new");
        std::fs::write(&tmp, &updated)?;
        std::fs::rename(&tmp, &source.path)?;
        out.push_str(&format!(
            "entry added to {} (live within a second):\n{entry}",
            source.path.display()
        ));
    } else if append {
        let mut f = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&source.path)?;
        f.write_all(format!("{separator}{header}{entry}").as_bytes())?;
        out.push_str(&format!(
            "entry appended to {} (live within a second):\n{entry}",
            source.path.display()
        ));
    } else {
        out.push_str(&format!(
            "entry for {} (add it under `keys:`):\n{entry}",
            source.path.display()
        ));
    }
    Ok(out)
}
