//! What each CLI subcommand does; `main.rs` only parses arguments and calls these.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use pingora::proxy::http_proxy_service;
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;

use crate::config::Settings;
use crate::data_files::{log_conflicts, summary, DataSources};
use crate::domain::{classify, DomainName, TableRule};
use crate::gateway::Gateway;
use crate::lifecycle::{Draining, DrainingShutdown};
use crate::reload::Reloader;

/// A boxed error for command results: each carries its own context.
pub type CommandError = Box<dyn std::error::Error + Send + Sync>;

/// Loads settings, applying `--listen`.
fn settings(conf: &Path, listen: Option<&str>) -> Result<Settings, CommandError> {
    let mut settings = Settings::load(conf)?;
    if let Some(listen) = listen {
        settings.override_listen(listen)?;
    }
    Ok(settings)
}

/// `serve`: builds the first table (a bad one stops the start), then runs until signalled.
pub fn serve(conf: &Path, listen: Option<&str>) -> Result<(), CommandError> {
    let settings = settings(conf, listen)?;
    let sources = DataSources::from_config(&settings.gateway);
    let table = sources.build()?;
    log::info!("domain table loaded: {}", summary(&table));
    log_conflicts(&table, &sources.dir);
    let table = Arc::new(ArcSwap::from_pointee(table));

    let gateway = &settings.gateway;
    let mut server = Server::new_with_opt_and_conf(None, settings.server);
    server.bootstrap();
    let draining = Draining::default();
    let mut proxy = http_proxy_service(
        &server.configuration,
        Gateway::new(table.clone(), &gateway.upstream, draining.clone()),
    );
    proxy.add_tcp(&gateway.listen);
    server.add_service(proxy);
    server.add_service(background_service(
        "data reload",
        Reloader::new(sources, table, gateway.reload.poll_interval()),
    ));
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
    Ok(())
}

/// `check-config`: validates the config and builds the table without serving.
pub fn check_config(conf: &Path) -> Result<String, CommandError> {
    let settings = settings(conf, None)?;
    let table = DataSources::from_config(&settings.gateway).build()?;
    Ok(format!(
        "{}: ok; listen {}; upstream {}; data {}: {}",
        conf.display(),
        settings.gateway.listen,
        settings.gateway.upstream.address,
        settings.gateway.data.dir.display(),
        summary(&table)
    ))
}

/// `lookup <domain>`: the record and the rule that decided it, without a server.
pub fn lookup(conf: &Path, domain: &str) -> Result<String, CommandError> {
    let settings = settings(conf, None)?;
    let table = DataSources::from_config(&settings.gateway).build()?;
    let name = DomainName::parse(domain).map_err(|e| format!("'{domain}': {e}"))?;
    let verdict = classify(&table, &name);
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
    Ok(format!("{record}\nrule: {rule}"))
}
