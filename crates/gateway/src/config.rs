//! Typed settings from `conf/gateway.yaml`: Pingora's server keys plus our `gateway:` section.
//!
//! Loading reports every problem at once, each naming its key (`gateway.upstream.tls: ...`), so
//! an operator fixes a file in one pass. Relative paths are resolved against the file's folder.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pingora::server::configuration::ServerConf;
use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationSeconds};

use crate::edge::config::{BatchConfig, LimitsConfig, TlsConfig};
use crate::upstream::config::UpstreamConfig;
use drg_access::config::AccessConfig;
use drg_access::quota::config::QuotaConfig;
use drg_base::infra::units::secs;
use drg_domain::Scores;
use drg_evidence::data::config::{DataConfig, ReloadConfig};
use drg_evidence::mx::config::MxConfig;
use drg_projects::account::config::KeysApiConfig;
use drg_telemetry::config::{AccessLogConfig, AdminConfig};
use drg_webhook::guard::Listener;

/// Everything the gateway needs to start.
#[derive(Debug)]
pub struct Settings {
    /// Pingora's own server settings (threads, pid file, grace periods, ...).
    pub server: ServerConf,
    pub gateway: GatewayConfig,
    /// The file the settings came from.
    pub source: PathBuf,
    /// The private folder `serve` creates (mode 0700) and checks before starting: set when
    /// `pid_file` or `upgrade_sock` were left to their defaults inside `gateway.runtime_dir`.
    pub runtime_dir: Option<PathBuf>,
}

/// The `gateway:` section. Every field has a default; unknown keys are errors.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GatewayConfig {
    /// Address the HTTP listener binds, `ip:port`. `serve --listen` overrides it.
    pub listen: String,
    /// The backend that answers `/v1/check/...`.
    pub upstream: UpstreamConfig,
    /// Where the domain data lives.
    pub data: DataConfig,
    /// Risk score per outcome.
    pub scores: Scores,
    /// How data files are watched.
    pub reload: ReloadConfig,
    /// API keys and plans.
    pub access: AccessConfig,
    /// Where monthly counts are kept.
    pub quota: QuotaConfig,
    /// `/v1/keys`: projects managing their own keys.
    pub keys_api: KeysApiConfig,
    /// Private folder (created with mode 0700) for the pid file and the upgrade socket when
    /// the Pingora keys `pid_file` / `upgrade_sock` are not set. Default: `$RUNTIME_DIRECTORY`
    /// (systemd's `RuntimeDirectory=`), else `../state/run`; relative to the config file.
    pub runtime_dir: Option<PathBuf>,
    /// DNS lookups of MX records.
    pub mx: MxConfig,
    /// Domain age from the registries' RDAP servers.
    pub rdap: drg_evidence::rdap::config::RdapConfig,
    /// On SIGTERM, keep serving this many seconds with `/readyz` answering 503 (so load
    /// balancers stop sending traffic), then stop accepting and finish what is in flight.
    #[serde(rename = "drain_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub drain: Duration,
    /// Peers (CIDRs, e.g. `10.0.0.0/8`) whose `X-Forwarded-For` chain is kept when proxying;
    /// from anyone else only the socket peer address reaches the upstream.
    pub trusted_proxies: Vec<String>,
    /// Bounds on what one client connection may cost.
    pub limits: LimitsConfig,
    /// The operator-only listener.
    pub admin: AdminConfig,
    /// The JSON access log (one line per request).
    pub access_log: AccessLogConfig,
    /// Call logs and daily stats per project (`/v1/logs`, `/v1/stats`).
    pub calls: drg_projects::account::calls::CallsConfig,
    /// Live top-domains: flag counts, their ranking, persistence and sharing.
    pub top_domains: drg_projects::live_top::TopDomainsConfig,
    /// HTTPS on the public listener; absent: plain HTTP.
    pub tls: Option<TlsConfig>,
    /// OpenTelemetry traces (OTLP/HTTP); off unless an endpoint is set.
    pub tracing: drg_telemetry::trace::config::TracingConfig,
    /// `POST /v1/public/domains`: lookups in batches.
    pub batch: BatchConfig,
    /// Verdict changes: watched projects told when a domain they looked up changes verdict.
    pub changes: drg_projects::changes::ChangesConfig,
    /// `/v1/reports`: projects telling the operator a verdict is wrong.
    pub reports: drg_projects::account::reports::ReportsConfig,
    /// `/v1/webhooks`: projects' own webhooks (absent: off, the routes answer 404).
    pub webhooks: Option<drg_projects::account::webhooks::WebhooksConfig>,
    /// The control store on PostgreSQL (absent: the records a project creates are kept as the
    /// quota store's: the state folder, or Redis with a copy there).
    pub control: Option<drg_base::infra::control::config::ControlConfig>,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            listen: "127.0.0.1:8080".into(),
            upstream: UpstreamConfig::default(),
            data: DataConfig::default(),
            scores: Scores::default(),
            reload: ReloadConfig::default(),
            access: AccessConfig::default(),
            quota: QuotaConfig::default(),
            keys_api: KeysApiConfig::default(),
            runtime_dir: None,
            mx: MxConfig::default(),
            rdap: drg_evidence::rdap::config::RdapConfig::default(),
            drain: Duration::from_secs(2),
            trusted_proxies: Vec::new(),
            limits: LimitsConfig::default(),
            admin: AdminConfig::default(),
            access_log: AccessLogConfig::default(),
            calls: drg_projects::account::calls::CallsConfig::default(),
            top_domains: drg_projects::live_top::TopDomainsConfig::default(),
            tls: None,
            tracing: Default::default(),
            batch: BatchConfig::default(),
            changes: drg_projects::changes::ChangesConfig::default(),
            reports: Default::default(),
            webhooks: None,
            control: None,
        }
    }
}

/// Proxy mode's attempts per request (Pingora's `max_retries` counts attempts, the first one
/// included) when the config does not set `max_retries`: the first, and one retry of an error
/// Pingora marks retryable (a pooled connection the backend had closed). Pingora's default, 16,
/// would send one check up to 16 times to a backend failing that way.
pub const PROXY_MAX_ATTEMPTS: usize = 2;

/// The variable systemd sets to the folders of `RuntimeDirectory=` (colon-separated).
pub const RUNTIME_DIRECTORY_ENV: &str = "RUNTIME_DIRECTORY";

/// `gateway.runtime_dir` when not set: systemd's runtime folder (the first, if several), else
/// `run` in the folder of `state_file` (the quota's, the state folder: the gateway's own to
/// write, so the packaged config also runs outside systemd, where `/run/...` does not exist).
fn default_runtime_dir(systemd: Option<std::ffi::OsString>, state_file: &Path) -> PathBuf {
    systemd
        .and_then(|v| {
            v.to_str()
                .and_then(|v| v.split(':').next())
                .filter(|first| !first.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| {
            state_file
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .join("run")
        })
}

/// Why the runtime folder (pid file, upgrade socket) cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeDirError {
    #[error("gateway.runtime_dir {path}: cannot create it: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("gateway.runtime_dir {path}: {problem}; it holds the pid file and the upgrade socket, so it must be a private folder: {fix}")]
    NotPrivate {
        path: PathBuf,
        problem: String,
        fix: &'static str,
    },
}

/// Creates `path` (mode 0700, parents too) if missing, then checks it is a real folder of this
/// user that no one else can write to: another local user who could put a file or a symbolic
/// link there could make us overwrite their target or hand our listening sockets to them.
pub fn ensure_private_dir(path: &Path) -> Result<(), RuntimeDirError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(path)
                .map_err(|source| RuntimeDirError::Create {
                    path: path.to_owned(),
                    source,
                })?;
            std::fs::symlink_metadata(path)
        }
        other => other,
    }
    .map_err(|source| RuntimeDirError::Create {
        path: path.to_owned(),
        source,
    })?;
    let refuse = |problem: String, fix| {
        Err(RuntimeDirError::NotPrivate {
            path: path.to_owned(),
            problem,
            fix,
        })
    };
    if meta.file_type().is_symlink() {
        return refuse(
            "is a symbolic link".into(),
            "set gateway.runtime_dir to the real folder",
        );
    }
    if !meta.is_dir() {
        return refuse(
            "is not a folder".into(),
            "move the file away or choose another gateway.runtime_dir",
        );
    }
    // SAFETY: geteuid has no arguments and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return refuse(
            format!(
                "is owned by uid {}, not by this user (uid {me})",
                meta.uid()
            ),
            "remove it or choose another gateway.runtime_dir",
        );
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return refuse(
            format!("is writable by its group or by others (mode {mode:04o})"),
            "chmod 700 it",
        );
    }
    Ok(())
}

impl Settings {
    /// Creates and checks the private runtime folder if the pid file or upgrade socket is in it.
    pub fn prepare_runtime_dir(&self) -> Result<(), RuntimeDirError> {
        match &self.runtime_dir {
            Some(dir) => ensure_private_dir(dir),
            None => Ok(()),
        }
    }
}

/// Why settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid YAML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{path} has {} problem(s):\n  - {}", problems.len(), problems.join("\n  - "))]
    Invalid {
        path: PathBuf,
        problems: Vec<String>,
    },
}

impl Settings {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Settings::from_yaml(&text, path)
    }

    /// Parses and validates config text; `path` names it in errors and anchors relative paths.
    pub fn from_yaml(text: &str, path: &Path) -> Result<Settings, ConfigError> {
        let doc: serde_yaml::Value =
            serde_yaml::from_str(text).map_err(|e| ConfigError::Syntax {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        let mut problems = Vec::new();
        let empty = serde_yaml::Mapping::new();
        let top = match &doc {
            serde_yaml::Value::Mapping(m) => m,
            serde_yaml::Value::Null => &empty,
            _ => {
                problems.push("the file must be a mapping of keys to values".to_owned());
                &empty
            }
        };
        problems.extend(unknown_server_keys(top));

        let server = parse_server(text, top, &mut problems);

        let section = top
            .get("gateway")
            .cloned()
            .unwrap_or(serde_yaml::Value::Null);
        let gateway = parse_gateway(section, &mut problems);
        if let Some(g) = &gateway {
            problems.extend(g.problems());
        }
        if let Some(s) = &server {
            if s.threads == 0 {
                problems.push("threads: must be at least 1".to_owned());
            }
        }
        match (server, gateway) {
            (Some(server), Some(mut gateway)) if problems.is_empty() => {
                let base = path.parent().unwrap_or(Path::new("."));
                gateway.resolve_paths(base);
                let mut server = server;
                let runtime_dir = place_runtime_files(&mut server, &mut gateway, top, base);
                Ok(Settings {
                    server,
                    gateway,
                    source: path.to_owned(),
                    runtime_dir,
                })
            }
            _ => Err(ConfigError::Invalid {
                path: path.to_owned(),
                problems,
            }),
        }
    }

    /// Whether the listener is on a loopback address (where the demo key may be used).
    pub fn listens_on_loopback(&self) -> bool {
        self.gateway
            .listen
            .parse::<SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback())
    }

    /// Replaces the listen addresses given on the command line (`serve --listen`,
    /// `--admin-listen`), validating them as the config's own.
    pub fn override_listeners(&mut self, over: ListenOverride<'_>) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        if let Some(listen) = over.listen {
            match listen.parse::<SocketAddr>() {
                Ok(_) => self.gateway.listen = listen.to_owned(),
                Err(e) => problems.push(format!(
                    "--listen: '{listen}' is not an ip:port address ({e})"
                )),
            }
        }
        if let Some(admin) = over.admin {
            self.gateway.admin.listen = Some(admin.to_owned());
        }
        if over.listen.is_some() || over.admin.is_some() {
            let flags = over_flags(over);
            let admin = self.gateway.admin.problems(&self.gateway.listen);
            problems.extend(admin.into_iter().map(|p| format!("{flags}: {p}")));
            // The alerts' URL was checked against the configured listeners, not these.
            let listeners = self.gateway.own_listeners();
            let problem = self
                .gateway
                .quota
                .alerts
                .as_ref()
                .and_then(|a| a.destination_problem(&listeners));
            problems.extend(problem.map(|p| format!("{flags}: {p}")));
        }
        match problems.is_empty() {
            true => Ok(()),
            false => Err(ConfigError::Invalid {
                path: self.source.clone(),
                problems,
            }),
        }
    }
}

fn parse_gateway(section: serde_yaml::Value, problems: &mut Vec<String>) -> Option<GatewayConfig> {
    let section = match section {
        serde_yaml::Value::Null => serde_yaml::Value::Mapping(Default::default()),
        other => other,
    };
    let mut unknown = Vec::new();
    let mut track = serde_path_to_error::Track::new();
    let result = {
        let tracked = serde_path_to_error::Deserializer::new(section, &mut track);
        serde_ignored::deserialize(tracked, |p| unknown.push(p.to_string()))
    };
    for key in unknown {
        problems.push(format!("gateway.{key}: unknown key"));
    }
    match result {
        Ok(g) => Some(g),
        Err(e) => {
            let at = track.path().to_string();
            let at = if at == "." {
                String::new()
            } else {
                format!(".{at}")
            };
            problems.push(format!("gateway{at}: {e}"));
            None
        }
    }
}

/// Top-level keys that are neither Pingora's nor `gateway` (Pingora itself ignores them).
/// Pingora's own server keys (an empty file: its defaults), with our retry default.
fn parse_server(
    text: &str,
    top: &serde_yaml::Mapping,
    problems: &mut Vec<String>,
) -> Option<ServerConf> {
    let yaml = if top.is_empty() {
        "---\nversion: 1"
    } else {
        text
    };
    match ServerConf::from_yaml(yaml) {
        Ok(mut conf) => {
            if !top.contains_key("max_retries") {
                conf.max_retries = PROXY_MAX_ATTEMPTS;
            }
            Some(conf)
        }
        Err(e) => {
            problems.push(format!("pingora server keys: {}", root_cause(&e)));
            None
        }
    }
}

/// Puts Pingora's pid file and upgrade socket, unless the file names them, in the runtime
/// folder (resolved against `base`); returns that folder when it holds either. Pingora's own
/// defaults are fixed names in /tmp, which another local user could take first.
fn place_runtime_files(
    server: &mut ServerConf,
    gateway: &mut GatewayConfig,
    top: &serde_yaml::Mapping,
    base: &Path,
) -> Option<PathBuf> {
    let runtime = match gateway.runtime_dir.take() {
        // Written in the file: relative to it, as every path there.
        Some(dir) => base.join(dir),
        // systemd's is absolute and the state file's resolved already (`resolve_paths`):
        // joined to `base` again, a relative config's `conf/../state` became
        // `conf/conf/../state`, the folder `conf/state`.
        None => default_runtime_dir(
            std::env::var_os(RUNTIME_DIRECTORY_ENV),
            &gateway.quota.state_file,
        ),
    };
    gateway.runtime_dir = Some(runtime.clone());
    let mut in_runtime_dir = false;
    for (key, target, file) in [
        ("pid_file", &mut server.pid_file, "gateway.pid"),
        ("upgrade_sock", &mut server.upgrade_sock, "upgrade.sock"),
    ] {
        if !top.contains_key(key) {
            *target = runtime.join(file).to_string_lossy().into_owned();
            in_runtime_dir = true;
        }
    }
    in_runtime_dir.then_some(runtime)
}

fn unknown_server_keys(top: &serde_yaml::Mapping) -> Vec<String> {
    let known: BTreeSet<String> = match serde_yaml::to_value(ServerConf::default()) {
        Ok(serde_yaml::Value::Mapping(m)) => m
            .keys()
            .filter_map(|k| k.as_str().map(str::to_owned))
            .collect(),
        _ => BTreeSet::new(),
    };
    top.keys()
        .filter_map(|k| k.as_str())
        .filter(|k| *k != "gateway" && !known.contains(*k))
        .map(|k| format!("{k}: unknown key (neither a Pingora server key nor `gateway`)"))
        .collect()
}

fn root_cause(e: &pingora::Error) -> String {
    let mut msg = e.to_string();
    if let Some(cause) = &e.cause {
        msg = format!("{msg}: {cause}");
    }
    msg.lines().next().unwrap_or_default().to_owned()
}

impl GatewayConfig {
    /// Makes every relative path absolute against `base`, the config file's folder.
    fn resolve_paths(&mut self, base: &Path) {
        let resolve = |path: &mut PathBuf| {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        };
        for path in [
            &mut self.data.dir,
            &mut self.data.sources_dir,
            &mut self.access.keys_file,
            &mut self.quota.state_file,
            &mut self.top_domains.state_file,
        ] {
            resolve(path);
        }
        let state_file = self.quota.state_file.clone();
        self.calls.resolve_path(base, &state_file);
        if let Some(path) = &mut self.keys_api.file {
            resolve(path);
        }
        if let Some(tls) = &mut self.tls {
            resolve(&mut tls.cert);
            resolve(&mut tls.key);
        }
        if let Some(path) = &mut self.access_log.path {
            resolve(path);
        }
        self.mx.neighbourhood.resolve_paths(base, &state_file);
        self.rdap.resolve_paths(base, &self.data.dir, &state_file);
        self.changes.resolve_paths(base);
        if let Some(alerts) = &mut self.quota.alerts {
            alerts.resolve_paths(base);
            alerts.outbox_file = Some(alerts.previous_outbox_path(&state_file));
        }
    }

    /// The domain table's inputs as this configuration names them.
    pub fn data_sources(&self) -> drg_evidence::data::files::DataSources {
        drg_evidence::data::files::DataSources::from_config(
            &self.data,
            self.scores,
            self.reload.max_shrink_percent,
        )
    }

    /// The listeners of this gateway on an `ip:port` (public, admin), which quota alerts may
    /// never be sent to.
    pub fn own_listeners(&self) -> Vec<Listener> {
        let admin = self.admin.listen.as_deref();
        [
            Listener::parse("gateway.listen", &self.listen),
            admin.and_then(|a| Listener::parse("gateway.admin.listen", a)),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// Semantic problems, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Err(e) = self.listen.parse::<SocketAddr>() {
            out.push(format!(
                "gateway.listen: '{}' is not an ip:port address ({e})",
                self.listen
            ));
        }
        out.extend(self.upstream.problems());
        out.extend(crate::upstream::config::trusted_proxy_problems(
            &self.trusted_proxies,
        ));
        out.extend(self.admin.problems(&self.listen));
        out.extend(self.quota.problems(&self.own_listeners()));
        out.extend(self.mx.problems());
        if self.rdap.enabled {
            out.extend(self.rdap.problems());
        }
        out.extend(self.access.problems(self.quota.store));
        out.extend(self.reload.problems());
        out.extend(self.limits.problems());
        out.extend(self.access_log.problems());
        out.extend(self.top_domains.problems());
        out.extend(self.calls.problems());
        out.extend(self.changes.problems(&self.own_listeners()));
        if self.changes.enabled() && !self.calls.enabled {
            out.push(
                "gateway.changes: watching verdicts needs the call logs (gateway.calls.enabled: true)"
                    .to_owned(),
            );
        }
        out.extend(self.tracing.problems());
        out.extend(self.data.source_problems());
        out.extend(self.keys_api.problems());
        out.extend(self.batch.problems());
        out.extend(self.reports.problems());
        if let Some(webhooks) = &self.webhooks {
            out.extend(webhooks.problems(&self.own_listeners()));
        }
        if let Some(control) = &self.control {
            out.extend(control.problems("gateway.control"));
        }
        if secs(self.drain) > 300 {
            out.push(format!(
                "gateway.drain_seconds: {} is outside 0..=300",
                secs(self.drain)
            ));
        }
        out.extend(
            self.scores
                .problems()
                .into_iter()
                .map(|p| format!("gateway.{p}")),
        );
        out
    }
}

/// Listen addresses given on the command line, over the config's (`serve --listen`,
/// `--admin-listen`): how a second gateway runs beside the first on the same config.
#[derive(Debug, Default, Clone, Copy)]
pub struct ListenOverride<'a> {
    /// The public listener, `ip:port`.
    pub listen: Option<&'a str>,
    /// The admin listener, `ip:port` or `unix:/path`.
    pub admin: Option<&'a str>,
}

/// The flags an override came from, to name them in its problems.
fn over_flags(over: ListenOverride<'_>) -> String {
    let listen = over.listen.map(|l| format!("--listen {l}"));
    let admin = over.admin.map(|a| format!("--admin-listen {a}"));
    [listen, admin]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::config::UpstreamMode;
    use drg_evidence::data::config::SourceKind;

    fn load(text: &str) -> Result<Settings, ConfigError> {
        Settings::from_yaml(text, Path::new("/etc/drg/gateway.yaml"))
    }

    #[test]
    fn empty_file_gives_defaults_with_paths_resolved() {
        let s = load("").unwrap();
        assert_eq!(s.gateway.listen, "127.0.0.1:8080");
        assert_eq!(s.gateway.data.dir, PathBuf::from("/etc/drg/../data"));
        assert_eq!(s.gateway.upstream.server_name(), "127.0.0.1");
    }

    #[test]
    fn pingora_keys_and_our_section_are_read() {
        let s = load(
            "version: 1\nthreads: 3\ngrace_period_seconds: 1\ngateway:\n  listen: 127.0.0.1:9\n  upstream: { address: 'api.example:443', tls: true }\n  scores: { unknown: 25 }\n",
        )
        .unwrap();
        assert_eq!(s.server.threads, 3);
        assert_eq!(s.server.grace_period_seconds, Some(1));
        assert!(s.gateway.upstream.tls);
        assert_eq!(s.gateway.upstream.server_name(), "api.example");
        assert_eq!(s.gateway.scores.unknown, 25);
        assert_eq!(s.gateway.scores.disposable, 100);
    }

    #[test]
    fn proxy_mode_retries_once_unless_max_retries_is_set() {
        assert_eq!(load("").unwrap().server.max_retries, PROXY_MAX_ATTEMPTS);
        assert_eq!(
            load("version: 1\nmax_retries: 5\n")
                .unwrap()
                .server
                .max_retries,
            5
        );
    }

    #[test]
    fn every_problem_is_reported_at_once_naming_its_key() {
        let err = load(
            "thread: 2\ngateway:\n  listen: nowhere\n  colour: blue\n  upstream: { adress: x, read_timeout_ms: 0 }\n  scores: { unknown: 70 }\n  reload: { poll_interval_ms: 5000 }\n",
        )
        .unwrap_err();
        let ConfigError::Invalid { problems, .. } = err else {
            panic!("expected Invalid, got {err}");
        };
        let text = problems.join("\n");
        for needle in [
            "thread: unknown key",
            "gateway.colour: unknown key",
            "gateway.upstream.adress: unknown key",
            "gateway.listen: 'nowhere'",
            "gateway.upstream.read_timeout_ms: 0",
            "gateway.scores.unknown: 70",
            "gateway.reload.poll_interval_ms: 5000",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        assert_eq!(problems.len(), 7, "{text}");
    }

    #[test]
    fn type_errors_name_the_field() {
        let err = load("gateway:\n  upstream:\n    connect_timeout_ms: soon\n").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("gateway.upstream.connect_timeout_ms: invalid type"),
            "{msg}"
        );
    }

    #[test]
    fn upstream_mode_and_body_bound_are_read_and_checked() {
        let s = load("").unwrap();
        assert_eq!(s.gateway.upstream.mode, UpstreamMode::Relay);
        assert_eq!(s.gateway.upstream.max_body_bytes, 1024 * 1024);
        let s = load("gateway:\n  upstream: { mode: proxy, max_body_bytes: 4096 }\n").unwrap();
        assert_eq!(s.gateway.upstream.mode, UpstreamMode::Proxy);
        assert_eq!(s.gateway.upstream.max_body_bytes, 4096);
        let msg = load("gateway:\n  upstream: { mode: tunnel }\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("gateway.upstream.mode: unknown variant"),
            "{msg}"
        );
        let msg = load("gateway:\n  upstream: { max_body_bytes: 0 }\n")
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("gateway.upstream.max_body_bytes: 0 is outside"),
            "{msg}"
        );
    }

    #[test]
    fn syntax_errors_are_reported() {
        assert!(matches!(load("a: [b"), Err(ConfigError::Syntax { .. })));
    }

    #[test]
    fn tls_paths_are_relative_to_the_config_file_and_both_needed() {
        let s = load("gateway:\n  tls: { cert: tls/cert.pem, key: /k/key.pem }\n").unwrap();
        let tls = s.gateway.tls.unwrap();
        assert_eq!(tls.cert, PathBuf::from("/etc/drg/tls/cert.pem"));
        assert_eq!(tls.key, PathBuf::from("/k/key.pem"));
        assert!(!tls.h2);
        assert_eq!(load("").unwrap().gateway.tls, None);
        let err = load("gateway:\n  tls: { cert: c.pem, h2: true }\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("gateway.tls"), "{err}");
        assert!(err.contains("missing field `key`"), "{err}");
    }

    #[test]
    fn plans_take_both_forms_and_the_keys_api_its_defaults() {
        let s = load(
            "gateway:\n  access:\n    plans: { free: 5, team: { monthly_limit: 9, max_keys: 3 } }\n",
        )
        .unwrap();
        use drg_access::plan::AsPlan;
        let team = s.gateway.access.plans["team"].resolve("team");
        assert_eq!((team.monthly_limit, team.max_keys), (9, 3));
        assert_eq!(s.gateway.access.plans["free"].resolve("free").max_keys, 1);
        let api = &s.gateway.keys_api;
        assert!(api.enabled);
        assert_eq!(
            api.managed_file(&s.gateway.quota),
            PathBuf::from("/etc/drg/../state/keys.managed.json")
        );
        let s = load("gateway:\n  keys_api: { file: k/m.json }\n").unwrap();
        assert_eq!(
            s.gateway.keys_api.managed_file(&s.gateway.quota),
            PathBuf::from("/etc/drg/k/m.json")
        );
        let err = load(
            "gateway:\n  access:\n    plans: { pro: { monthly_limit: 1, max_keys: 0 } }\n  keys_api: { max_body_bytes: 1, body_timeout_ms: 1, last_used_flush_seconds: 0, colour: 1 }\n",
        )
        .unwrap_err()
        .to_string();
        for needle in [
            "gateway.access.plans.pro.max_keys: 0 is outside",
            "gateway.keys_api.max_body_bytes: 1 is outside",
            "gateway.keys_api.body_timeout_ms: 1 is outside",
            "gateway.keys_api.last_used_flush_seconds: 0 is outside",
            "gateway.keys_api.colour: unknown key",
        ] {
            assert!(err.contains(needle), "missing {needle:?} in {err}");
        }
        // The Redis key store's poll is gone; a config that sets it still loads (a WARN at start).
        let s = load("gateway:\n  keys_api: { shared_poll_ms: 1000 }\n").unwrap();
        assert_eq!(s.gateway.keys_api.shared_poll_ms, Some(1000));
    }

    #[test]
    fn a_monthly_limit_the_embedded_store_cannot_count_is_refused() {
        use drg_access::quota::local::MAX_MONTHLY_LIMIT;
        let plans = |a: u64, b: u64| {
            format!(
                "gateway:\n  access:\n    plans: {{ big: {a}, huge: {{ monthly_limit: {b} }} }}\n"
            )
        };
        assert!(load(&plans(MAX_MONTHLY_LIMIT, 5)).is_ok());
        let err = load(&plans(MAX_MONTHLY_LIMIT + 1, u64::MAX))
            .unwrap_err()
            .to_string();
        // Every offending plan is named, with the limit.
        for needle in [
            format!(
                "gateway.access.plans.big.monthly_limit: {} is above {MAX_MONTHLY_LIMIT}",
                MAX_MONTHLY_LIMIT + 1
            ),
            format!(
                "gateway.access.plans.huge.monthly_limit: {} is above {MAX_MONTHLY_LIMIT}",
                u64::MAX
            ),
        ] {
            assert!(err.contains(&needle), "missing {needle:?} in {err}");
        }
        // The Redis store counts in its own keys: not limited by the counters file's word.
        let redis = format!(
            "{}  quota: {{ store: redis, redis: {{ url: 'redis://127.0.0.1:6379' }} }}\n",
            plans(MAX_MONTHLY_LIMIT + 1, 5)
        );
        assert!(load(&redis).is_ok(), "{:?}", load(&redis).err());
    }

    #[test]
    fn access_log_is_off_by_default_and_its_path_relative() {
        let s = load("").unwrap();
        assert!(!s.gateway.access_log.enabled);
        assert_eq!(s.gateway.access_log.path, None);
        assert_eq!(s.gateway.access_log.buffer_lines, 8_192);
        let s = load("gateway:\n  access_log: { enabled: true, path: log/access.log }\n").unwrap();
        assert_eq!(
            s.gateway.access_log.path,
            Some(PathBuf::from("/etc/drg/log/access.log"))
        );
        let err = load(
            "gateway:\n  access_log: { buffer_lines: 0, flush_interval_ms: 1, path: '', colour: 1 }\n",
        )
        .unwrap_err()
        .to_string();
        for needle in [
            "gateway.access_log.buffer_lines: 0",
            "gateway.access_log.flush_interval_ms: 1 ",
            "gateway.access_log.path: empty",
            "gateway.access_log.colour: unknown key",
        ] {
            assert!(err.contains(needle), "missing {needle:?} in {err}");
        }
    }

    #[test]
    fn url_sources_get_defaults_and_their_folder_is_relative_to_the_config_file() {
        let s = load(
            "gateway:\n  data:\n    sources:\n      - { name: block, url: 'https://lists.example/b.conf', kind: disposable }\n",
        )
        .unwrap();
        let data = &s.gateway.data;
        assert_eq!(data.sources_dir, PathBuf::from("/etc/drg/../state/sources"));
        let source = &data.sources[0];
        assert_eq!(source.kind, SourceKind::Disposable);
        assert_eq!(source.refresh, Duration::from_secs(3_600));
        assert_eq!(source.max_bytes, 32 * 1024 * 1024);
        assert_eq!(source.timeout, Duration::from_millis(30_000));
        let err = load(
            "gateway:\n  data:\n    sources:\n      - { name: a, url: 'http://h/a', kind: free, max_bytes: 0, timeout_ms: 5 }\n      - { name: A, url: 'h/a', kind: records }\n",
        )
        .unwrap_err()
        .to_string();
        for needle in [
            "gateway.data.sources[0].max_bytes: 0 is outside",
            "gateway.data.sources[0].timeout_ms: 5 is outside",
            "gateway.data.sources[1].name: 'A' is used twice",
            "gateway.data.sources[1].url: 'h/a' is not an http:// or https:// URL",
        ] {
            assert!(err.contains(needle), "missing {needle:?} in {err}");
        }
        let err = load(
            "gateway:\n  data:\n    sources:\n      - { name: b, url: 'http://h/b', kind: list }\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("gateway.data.sources[0].kind: unknown variant `list`"),
            "{err}"
        );
    }

    #[test]
    fn pid_file_and_upgrade_socket_default_into_the_runtime_dir() {
        let s = load("gateway:\n  runtime_dir: run\n").unwrap();
        assert_eq!(s.server.pid_file, "/etc/drg/run/gateway.pid");
        assert_eq!(s.server.upgrade_sock, "/etc/drg/run/upgrade.sock");
        assert_eq!(s.runtime_dir, Some(PathBuf::from("/etc/drg/run")));
        // An explicit key is kept; the folder is still needed for the other one.
        let s = load("pid_file: /var/run/drg.pid\n").unwrap();
        assert_eq!(s.server.pid_file, "/var/run/drg.pid");
        assert!(s.server.upgrade_sock.ends_with("/upgrade.sock"));
        assert!(s.runtime_dir.is_some());
        let s = load("pid_file: /a/pid\nupgrade_sock: /a/sock\n").unwrap();
        assert_eq!(s.runtime_dir, None, "nothing in it: not created");
    }

    #[test]
    fn the_runtime_dir_defaults_to_systemds_then_beside_the_state() {
        let state = Path::new("../state/quota.counters");
        assert_eq!(
            default_runtime_dir(None, state),
            PathBuf::from("../state/run")
        );
        assert_eq!(
            default_runtime_dir(Some("/run/drg:/run/other".into()), state),
            PathBuf::from("/run/drg")
        );
        assert_eq!(
            default_runtime_dir(Some("".into()), state),
            PathBuf::from("../state/run")
        );
        let packaged = Path::new("/var/lib/domain-risk-gateway/quota.counters");
        assert_eq!(
            default_runtime_dir(None, packaged),
            PathBuf::from("/var/lib/domain-risk-gateway/run")
        );
        assert_eq!(
            default_runtime_dir(None, Path::new("quota.counters")),
            PathBuf::from("./run")
        );
        assert!(load("gateway:\n  reload: { max_shrink_percent: 101 }\n")
            .unwrap_err()
            .to_string()
            .contains("gateway.reload.max_shrink_percent: 101"));
    }

    #[test]
    fn a_relative_configs_runtime_dir_is_resolved_once() {
        let mut server = ServerConf::default();
        let mut gateway = GatewayConfig::default();
        gateway.quota.state_file = PathBuf::from("conf/../state/quota.counters");
        let top = serde_yaml::Mapping::new();
        let runtime = place_runtime_files(&mut server, &mut gateway, &top, Path::new("conf"));
        // Unless systemd gives its own (then absolute, whatever the base).
        if std::env::var_os(RUNTIME_DIRECTORY_ENV).is_none() {
            assert_eq!(runtime, Some(PathBuf::from("conf/../state/run")));
            assert_eq!(server.pid_file, "conf/../state/run/gateway.pid");
        }
        gateway.runtime_dir = Some(PathBuf::from("run"));
        let runtime = place_runtime_files(&mut server, &mut gateway, &top, Path::new("conf"));
        assert_eq!(
            runtime,
            Some(PathBuf::from("conf/run")),
            "written: beside the file"
        );
    }

    #[test]
    fn the_runtime_dir_is_created_private_and_a_shared_one_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state/run");
        ensure_private_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        ensure_private_dir(&dir).unwrap();

        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();
        let err = ensure_private_dir(&dir).unwrap_err().to_string();
        assert!(err.contains("writable by its group"), "{err}");
        assert!(err.contains("chmod 700"), "{err}");

        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(tmp.path().join("state"), &link).unwrap();
        let err = ensure_private_dir(&link).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
    }
}
