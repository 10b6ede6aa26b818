//! The embedding API: the domain-risk routes as a middleware inside a Pingora proxy someone
//! else owns. The standalone gateway (`serve`) is built on it too: one wiring path.

use std::path::Path;
use std::sync::Arc;

use pingora::apps::ServerApp;
use pingora::proxy::ProxyHttp;
use pingora::server::configuration::ServerConf;
use pingora::server::{Server, ShutdownSignalWatch};
use pingora::services::listening::Service;
use pingora::services::ServiceHandle;

use crate::config::Settings;
use crate::edge::middleware::{NoHost, WithDomainRisk};
use crate::edge::mount::Mount;
use crate::edge::signals::DrainingShutdown;
use crate::server::Wired;

/// Why a [`Config`] could not be loaded or a [`DomainRisk`] could not be built. The message
/// names the file and the key at fault; every problem of a config file is listed at once.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The config file is unreadable, not YAML, or has problems (each named by its key).
    #[error(transparent)]
    Config(Box<dyn std::error::Error + Send + Sync>),
    /// What the config names could not be opened: the domain table, the keys file, a state
    /// file, a store, the call log, the access log.
    #[error(transparent)]
    Start(Box<dyn std::error::Error + Send + Sync>),
    /// The logger could not be installed (another one already is, or its settings are bad).
    #[error(transparent)]
    Logger(Box<dyn std::error::Error + Send + Sync>),
}

/// Installs the gateway's logger as the process's `log` logger, as the standalone gateway does:
/// `RUST_LOG` as env_logger reads it (default `info`); every line, the host's and Pingora's
/// included, with email addresses masked; client-caused error lines (Pingora's downstream
/// failures) rate-limited and counted in the metrics. Call it once, first. A host that keeps a
/// logger of its own loses the masking of lines that are not the gateway's.
pub fn install_logger() -> Result<(), Error> {
    drg_telemetry::logging::install().map_err(|e| Error::Logger(e.into()))
}

/// The gateway's configuration: the `gateway:` section of a YAML file (see
/// `docs/operations.md` for every key), read and checked as the standalone gateway reads it.
///
/// The file may also hold Pingora's own server keys (`threads`, `grace_period_seconds`, ...):
/// a host can hand the same file to `Server::new`, which reads those and ignores `gateway:`.
/// Relative paths in the section are taken from the file's folder.
#[derive(Debug)]
pub struct Config {
    settings: Settings,
}

impl Config {
    /// Reads and checks a config file.
    ///
    /// ```no_run
    /// # extern crate drg_gateway as domain_risk_gateway; // the API's crate re-exports these
    /// let config = domain_risk_gateway::Config::load("conf/gateway.yaml")?;
    /// # Ok::<(), domain_risk_gateway::Error>(())
    /// ```
    pub fn load(path: impl AsRef<Path>) -> Result<Config, Error> {
        Settings::load(path.as_ref())
            .map(Config::from_settings)
            .map_err(|e| Error::Config(e.into()))
    }

    /// Checks config text; `path` names it in errors, and relative paths in it are taken from
    /// `path`'s folder.
    ///
    /// ```
    /// # extern crate drg_gateway as domain_risk_gateway; // the API's crate re-exports these
    /// let yaml = "gateway:\n  mx:\n    enabled: false\n  data:\n    dir: /nowhere\n";
    /// let config = domain_risk_gateway::Config::from_yaml(yaml, "/etc/host/gateway.yaml")?;
    /// # Ok::<(), domain_risk_gateway::Error>(())
    /// ```
    pub fn from_yaml(text: &str, path: impl AsRef<Path>) -> Result<Config, Error> {
        Settings::from_yaml(text, path.as_ref())
            .map(Config::from_settings)
            .map_err(|e| Error::Config(e.into()))
    }

    pub(crate) fn from_settings(settings: Settings) -> Config {
        Config { settings }
    }
}

/// Builds a [`DomainRisk`] from a [`Config`]: see [`DomainRisk::builder`].
#[derive(Debug)]
#[must_use]
pub struct Builder {
    config: Config,
    mount: Mount,
}

impl Builder {
    /// Claims requests whose path starts with `prefix` too, besides `/v1/` (e.g. `/dashboard`
    /// for the browser dashboard). A prefix claims itself and what lies below it: `/dashboard`
    /// claims `/dashboard` and `/dashboard/app.js`, never `/dashboards`.
    pub fn mount(mut self, prefix: &str) -> Self {
        if let Mount::Prefixes(prefixes) = &mut self.mount {
            prefixes.push(prefix.to_owned());
        }
        self
    }

    /// The standalone gateway: every request is ours (health, readiness, 404s included).
    pub(crate) fn standalone(mut self) -> Self {
        self.mount = Mount::All;
        self
    }

    /// Loads the domain table and the keys, opens the stores and logs, and makes the background
    /// services that keep them (a bad table, keys file or state file is an error). `server` is
    /// the host's Pingora configuration (`server.configuration`): it sizes the keep-alive pool
    /// of `/v1/check`'s backend and bounds the drain at shutdown.
    pub fn build(self, server: &ServerConf) -> Result<DomainRisk, Error> {
        let wired = crate::server::wire(&self.config.settings, server).map_err(Error::Start)?;
        Ok(DomainRisk {
            wired,
            mount: Arc::new(self.mount),
            drain: self.config.settings.gateway.drain,
            limits: self.config.settings.gateway.limits.clone(),
        })
    }
}

/// The domain-risk gateway as a middleware: its state, its background services, and the
/// wrapper that mounts its routes in front of a host's [`ProxyHttp`].
///
/// ```no_run
/// # extern crate drg_gateway as domain_risk_gateway; // the API's crate re-exports these
/// use pingora::prelude::*;
/// use pingora::server::RunArgs;
/// use domain_risk_gateway::{Config, DomainRisk};
///
/// struct Host; // the host's own proxy: its upstream, its routes
///
/// #[async_trait::async_trait]
/// impl ProxyHttp for Host {
///     type CTX = ();
///     fn new_ctx(&self) {}
///     async fn upstream_peer(&self, _: &mut Session, _: &mut ()) -> Result<Box<HttpPeer>> {
///         Ok(Box::new(HttpPeer::new("127.0.0.1:3000", false, String::new())))
///     }
/// }
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut server = Server::new(None)?;
/// server.bootstrap();
/// let risk = DomainRisk::builder(Config::load("gateway.yaml")?).build(&server.configuration)?;
/// // `/v1/...` is answered by the gateway (key, origin, quota); everything else by `Host`.
/// let mut proxy = risk.proxy_service(&server.configuration, Host);
/// proxy.add_tcp("0.0.0.0:8080");
/// server.add_service(proxy);
/// let shutdown_signal = risk.shutdown_signal();
/// let finish = risk.add_services_to(&mut server, None);
/// server.run(RunArgs { shutdown_signal });
/// finish.finish();
/// # Ok(())
/// # }
/// ```
pub struct DomainRisk {
    wired: Wired,
    mount: Arc<Mount>,
    drain: std::time::Duration,
    limits: crate::edge::config::LimitsConfig,
}

impl DomainRisk {
    /// Starts building from `config`; the routes are mounted under `/v1/` (see
    /// [`Builder::mount`] for more).
    pub fn builder(config: Config) -> Builder {
        Builder {
            config,
            mount: Mount::Prefixes(vec!["/v1/".to_owned()]),
        }
    }

    /// Wraps the host's proxy: requests under the mounted prefixes are the gateway's, every
    /// other request is the host's, through the host's own callbacks (see
    /// [`WithDomainRisk`]). Use it with the host's own `http_proxy_service`; or see
    /// [`DomainRisk::proxy_service`], which also applies `gateway.limits`.
    pub fn wrap<H>(&self, host: H) -> WithDomainRisk<H> {
        WithDomainRisk::new(self.wired.gateway.clone(), self.mount.clone(), host)
    }

    /// A listening service (not bound yet: `add_tcp`, `add_tls_with_settings`, ...) of the
    /// host's proxy wrapped by [`DomainRisk::wrap`], behind the gateway's per-connection limits
    /// (`gateway.limits`: connections, header size and time, requests per connection, HTTP/2
    /// settings), which then bound every request on it, the host's included. Its open
    /// connections show on the admin listener and are waited for at shutdown.
    pub fn proxy_service<H>(
        &self,
        server: &Arc<ServerConf>,
        host: H,
    ) -> Service<impl ServerApp + Send + Sync + 'static>
    where
        H: ProxyHttp + Send + Sync + 'static,
        H::CTX: Send + Sync,
    {
        let stats = self.wired.downstream.clone();
        crate::server::guarded_service(server, self.wrap(host), &self.limits, stats, false)
    }

    /// The standalone gateway's listening service: every request is the gateway's, and a
    /// CONNECT is refused in the contract's shape.
    pub(crate) fn standalone_service(
        &self,
        server: &Arc<ServerConf>,
    ) -> Service<impl ServerApp + Send + Sync + 'static> {
        let stats = self.wired.downstream.clone();
        crate::server::guarded_service(server, self.wrap(NoHost), &self.limits, stats, true)
    }

    /// Adds the background services to `server`: the reloaders of the domain table and the
    /// keys, the quota store's persistence (or Redis reconciliation), the call-log, access-log
    /// and top-domains writers, quota alerts, MX lookups, and the admin listener if
    /// `gateway.admin.listen` is set (after `bootstrap`, when the host bootstraps as a
    /// service). Returns what to call once `Server::run` has returned.
    pub fn add_services_to(self, server: &mut Server, bootstrap: Option<&ServiceHandle>) -> Finish {
        let Wired {
            shared,
            access_log,
            services,
            admin,
            ..
        } = self.wired;
        for service in services {
            server.add_boxed_service(service);
        }
        if let Some(admin) = admin {
            let handle = server.add_service(admin);
            if let Some(bootstrap) = bootstrap {
                handle.add_dependency(bootstrap);
            }
        }
        Finish { shared, access_log }
    }

    /// The shutdown signal to run the host's server with (`RunArgs { shutdown_signal }`): on
    /// SIGTERM the gateway's readiness (`/readyz` on the admin listener) answers 503 for
    /// `gateway.drain_seconds` before Pingora stops accepting, so load balancers move away
    /// first; SIGQUIT hands the sockets over (graceful upgrade); SIGINT stops at once.
    pub fn shutdown_signal(&self) -> Box<dyn ShutdownSignalWatch> {
        Box::new(DrainingShutdown {
            draining: self.wired.shared.draining.clone(),
            drain: self.drain,
        })
    }

    pub(crate) fn wired(&self) -> &Wired {
        &self.wired
    }
}

/// What is left to do once the server has stopped: see [`Finish::finish`].
#[must_use = "call finish() after Server::run returns, or the last access-log lines and spans are lost"]
pub struct Finish {
    shared: crate::state::Shared,
    access_log: Option<drg_telemetry::access_log::AccessLog>,
}

impl Finish {
    /// Writes the access log's last lines and exports the last trace spans (call it after
    /// `Server::run` returns; `Server::run_forever` exits the process before).
    pub fn finish(self) {
        crate::server::finish(self.access_log.as_ref(), &self.shared);
    }
}
