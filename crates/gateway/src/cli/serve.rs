//! `serve`: the standalone gateway, a host of the embedding API like any other: it builds a
//! [`DomainRisk`](crate::DomainRisk) that claims every request and serves it until signalled,
//! or takes over from a running one (`--upgrade`).

use std::path::Path;

use pingora::server::configuration::Opt;
use pingora::server::{RunArgs, Server};
use pingora::services::background::background_service;
use pingora::services::ServiceHandle;

use super::{settings, CommandError, ListenOverride};
use crate::config::Settings;

/// Builds the first table and key set (bad ones stop the start), then serves until signalled.
pub fn serve(conf: &Path, over: ListenOverride<'_>, mode: ServeMode) -> Result<(), CommandError> {
    run(settings(conf, over)?, mode)
}

/// How `serve` starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServeMode {
    /// Take the listening sockets from the running gateway (over `upgrade_sock`, once it gets
    /// SIGQUIT) instead of binding them.
    pub upgrade: bool,
    /// Run in the background: fork first, then build and serve; the parent exits 0 once the
    /// listeners accept (then `pid_file` names the daemon), 1 if the daemon failed first. With
    /// `upgrade`, the gateway named by `pid_file` is sent SIGQUIT once this one is built.
    pub daemon: bool,
}

/// The standalone gateway: builds it (a bad table, keys file or state file stops the start)
/// through the embedding API, as a host would, and serves until signalled. With `mode.upgrade`
/// the listening sockets are taken from the running gateway (Pingora's graceful upgrade)
/// instead of bound.
fn run(settings: Settings, mode: ServeMode) -> Result<(), CommandError> {
    let mut settings = settings;
    // The fork comes first, while the process has one thread and nothing open: every database,
    // lock, thread and runtime below belongs to the process that serves (see `daemon.rs`).
    let daemon = match mode.daemon || settings.server.daemon {
        true => Some(super::daemon::start(&settings.server)?),
        false => None,
    };
    settings.server.daemon = false;
    settings.server.daemon_wait_for_ready = false;
    let opt = mode.upgrade.then(|| Opt {
        upgrade: true,
        ..Opt::default()
    });
    let server_conf = std::mem::take(&mut settings.server);
    let gateway = settings.gateway.clone();
    let runtime_dir = settings.runtime_dir.clone();
    let risk = crate::DomainRisk::builder(crate::Config::from_settings(settings))
        .standalone()
        .build(&server_conf)?;
    // A bad certificate pair stops the start, like a bad table.
    let tls = match &gateway.tls {
        Some(config) => Some(crate::edge::tls::listener(
            config,
            gateway.reload.poll_interval,
            &risk.wired().shared.metrics,
        )?),
        None => None,
    };
    if let Some(dir) = &runtime_dir {
        crate::config::ensure_private_dir(dir)?;
    }
    if !mode.upgrade {
        // After the checks of the config's files, which name what to fix first; an upgrade
        // takes these very sockets over.
        super::taken::refuse_taken(&gateway)?;
    }
    let mut server = Server::new_with_opt_and_conf(opt, server_conf);
    // As a service, so that the listeners wait for the sockets of an upgrade.
    let bootstrap = server.bootstrap_as_a_service();
    let mut service = risk.standalone_service(&server.configuration);
    let scheme = match tls {
        Some(tls) => {
            service.add_tls_with_settings(&gateway.listen, None, tls.settings);
            server.add_service(background_service(
                "tls reload",
                crate::server::Hosted(tls.reloader),
            ));
            "https"
        }
        None => {
            service.add_tcp(&gateway.listen);
            "http"
        }
    };
    server.add_service(service).add_dependency(&bootstrap);
    let shutdown_signal = risk.shutdown_signal();
    let finish = risk.add_services_to(&mut server, Some(&bootstrap));
    if let Some(daemon) = daemon {
        release_when_serving(&mut server, daemon, &gateway, &bootstrap, mode.upgrade);
    }
    log::info!(
        "listening on {scheme}://{} (upstream {})",
        gateway.listen,
        gateway.upstream.address
    );
    server.run(RunArgs { shutdown_signal });
    finish.finish();
    log::info!("stopped");
    Ok(())
}

/// The daemon's parent returns once the listeners accept, the sockets taken over if `upgrade`.
fn release_when_serving(
    server: &mut Server,
    daemon: super::daemon::Daemon,
    gateway: &crate::config::GatewayConfig,
    bootstrap: &ServiceHandle,
    upgrade: bool,
) {
    let ready = super::ready::Ready {
        daemon: std::sync::Mutex::new(Some(daemon)),
        listens: std::iter::once(gateway.listen.clone())
            .chain(gateway.admin.listen.clone())
            .collect(),
    };
    server
        .add_service(background_service("daemon ready", ready))
        .add_dependency(bootstrap);
    if upgrade {
        // Only now, built: a start that failed before this left the running gateway serving.
        super::daemon::quit_running(&server.configuration.pid_file);
    }
}
