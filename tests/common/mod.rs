//! Test harness: starts the real gateway binary on an ephemeral loopback port, talks HTTP/1.1 to
//! it over plain sockets (so keep-alive is observable), and runs stub upstreams.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_domain-risk-gateway");

/// `program` (the gateway binary, an example built on it) as a command with an empty OpenSSL
/// trust store (`SSL_CERT_FILE=/dev/null`). Each of the gateway's three upstream connectors
/// (Pingora's HTTP/1 and HTTP/2, the relay's) reads the system bundle twice at start: six parses,
/// three quarters of a debug gateway's start (0.53 s of CPU against 0.13 s, measured), paid by
/// hundreds of gateways in a test run. No test trusts a public CA; one that trusts its own sets
/// `SSL_CERT_FILE` itself, after this.
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    command.env("SSL_CERT_FILE", "/dev/null");
    command
}

/// A finished command as `(success, stdout, stderr)`.
#[allow(dead_code)]
pub fn outcome(out: std::process::Output) -> (bool, String, String) {
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The secret of the server key every test gateway has (plan `test`, a large limit).
pub const TEST_SECRET: &str = "drg_test_server_key_0123456789abcdefghijklmnopq";

/// `Authorization` header value for a secret.
pub fn bearer(secret: &str) -> String {
    format!("Bearer {secret}")
}

/// A free loopback port, for a server the test starts on it (which retries should the port be
/// taken meanwhile). Never as an address where nothing listens: use [`DeadPort`] for that.
///
/// Not the old bind-to-0-and-release: the kernel hands such a port out again (to another
/// test's `bind(0)`, or as an outgoing connection's source port) before the server binds it,
/// and with tests four at a time that happened. Ports come from below the kernel's ephemeral
/// range, where nothing is handed out unasked; each is taken once per process (a counter from
/// a per-process start), held for the process's life by a lock on a file, so test processes
/// side by side (another checkout's) never pick the same one, and checked free (TCP and UDP)
/// when picked.
pub fn free_port() -> u16 {
    static NEXT: Mutex<Option<u16>> = Mutex::new(None);
    let (low, high) = unassigned_ports();
    let span = u32::from(high - low);
    let mut next = NEXT.lock().unwrap();
    for _ in 0..span {
        let start = u32::from(next.unwrap_or(low + (std::process::id() % span) as u16) - low);
        let port = low + ((start + 1) % span) as u16;
        *next = Some(port);
        if reserve(port) {
            return port;
        }
    }
    panic!("no free loopback port in {low}..{high}");
}

/// A free port `p` whose `p + offset` is kept too (a Redis Cluster node's bus port), both below
/// the ephemeral range.
pub fn free_port_pair(offset: u16) -> u16 {
    let (low, high) = unassigned_ports();
    let span = u32::from(high - offset - low);
    let start = std::process::id() % span;
    for i in 0..span {
        let p = low + ((start + i) % span) as u16;
        if reserve(p) && reserve(p + offset) {
            return p;
        }
    }
    panic!("no free pair of loopback ports {offset} apart in {low}..{high}");
}

/// Binds `addr`, waiting while the port is still held: a process another test spawns forks
/// with every descriptor (closed only at its exec), so the old listener can outlive its close
/// by a moment, as a real backend restart waits for its port.
pub fn bind_again(addr: SocketAddr) -> TcpListener {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match TcpListener::bind(addr) {
            Ok(listener) => return listener,
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("binding {addr}: {e}"),
        }
    }
}

/// Keeps `port` for this test process if no test process holds it and it is free to bind
/// (TCP and UDP): a lock file in the temporary folder, held until the process ends.
pub fn reserve(port: u16) -> bool {
    static HELD: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("drg-test-ports");
    std::fs::create_dir_all(&dir).unwrap();
    let lock = std::fs::File::create(dir.join(port.to_string())).unwrap();
    if lock.try_lock().is_err() {
        return false;
    }
    let tcp = TcpListener::bind(("127.0.0.1", port));
    let udp = std::net::UdpSocket::bind(("127.0.0.1", port));
    if tcp.is_ok() && udp.is_ok() {
        HELD.lock().unwrap().push(lock);
        return true;
    }
    false
}

/// Ports no one is handed unasked: from 10,000 to the kernel's ephemeral range's start
/// (`net.ipv4.ip_local_port_range`, 32768 by default).
fn unassigned_ports() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    assert!(
        ephemeral_low > 11_000,
        "the ephemeral range starts at {ephemeral_low}: no room below it for test ports"
    );
    (10_000, ephemeral_low)
}

/// The start of the kernel's ephemeral port range (for tests of [`free_port`]).
pub fn ephemeral_ports_start() -> u16 {
    unassigned_ports().1
}

/// Builds a gateway's config folder and starts the binary on it.
pub struct GatewayBuilder {
    files: BTreeMap<String, String>,
    gateway_yaml: Vec<String>,
    builtin: bool,
    upstream: String,
    keys: String,
    plans: BTreeMap<String, String>,
    /// Extra lines inside the `quota:` section (indented by four spaces).
    quota_extra: Vec<String>,
    env: Vec<(String, String)>,
    dir: Option<tempfile::TempDir>,
    dns: Option<SocketAddr>,
    /// Extra lines of the `mx:` section (with `dns`).
    mx_yaml: Vec<String>,
    /// The neighbourhood's look at every listed name, as shipped (on), unless a line sets it.
    look: bool,
    /// Lines of the `rdap:` section; none: RDAP off (tests reach no registry).
    rdap_yaml: Vec<String>,
    quota_yaml: Option<String>,
    /// Extra lines of the `data:` section.
    data_yaml: Vec<String>,
    /// The default upstream: a port held without listening, so connects are refused.
    dead_upstream: Option<DeadPort>,
    /// Extra lines of the default `upstream:` section (e.g. `mode: relay`).
    upstream_yaml: Vec<String>,
    /// `access.account_rate` (per second, burst); `None`: so high that tests polling the
    /// account routes never meet it (tests/tenancy.rs checks the limit itself).
    account_rate: Option<(u32, u32)>,
    /// Pingora's `grace_period_seconds` and `graceful_shutdown_timeout_seconds`.
    grace_seconds: u64,
}

/// A loopback port bound but never listened on: connecting to it is refused for as long as it
/// is held, and no other process can take it meanwhile.
pub struct DeadPort {
    _socket: socket2::Socket,
    pub addr: SocketAddr,
}

impl DeadPort {
    pub fn new() -> DeadPort {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        socket.bind(&any.into()).expect("bind");
        let addr = socket.local_addr().unwrap().as_socket().unwrap();
        DeadPort {
            _socket: socket,
            addr,
        }
    }
}

impl Default for GatewayBuilder {
    fn default() -> Self {
        let dead = DeadPort::new();
        GatewayBuilder {
            files: BTreeMap::new(),
            gateway_yaml: Vec::new(),
            builtin: false,
            upstream: dead.addr.to_string(),
            keys: drg_access::keys::key_entry_yaml("test", TEST_SECRET, "test", &[]),
            plans: [("test".to_owned(), "1000000".to_owned())].into(),
            env: Vec::new(),
            dir: None,
            dns: None,
            mx_yaml: Vec::new(),
            look: false,
            rdap_yaml: Vec::new(),
            quota_yaml: None,
            data_yaml: Vec::new(),
            dead_upstream: Some(dead),
            upstream_yaml: Vec::new(),
            account_rate: None,
            quota_extra: Vec::new(),
            grace_seconds: 1,
        }
    }
}

impl GatewayBuilder {
    /// Pingora's grace period and graceful shutdown timeout (1 s unless set): a final action
    /// waits half the grace period for requests still in flight.
    pub fn grace_seconds(mut self, seconds: u64) -> Self {
        self.grace_seconds = seconds;
        self
    }

    /// A data file (`disposable.txt`, `domains.csv`, ...) with this content.
    pub fn data(mut self, file: &str, content: &str) -> Self {
        self.files.insert(file.to_owned(), content.to_owned());
        self
    }

    /// Adds a key to the keys file.
    pub fn key(mut self, id: &str, secret: &str, plan: &str, origins: &[&str]) -> Self {
        let origins: Vec<String> = origins.iter().map(|o| o.to_string()).collect();
        self.keys.push_str(&drg_access::keys::key_entry_yaml(
            id, secret, plan, &origins,
        ));
        self
    }

    /// Adds a key of `project` (keys of a project share its quota) to the keys file.
    pub fn key_in_project(mut self, id: &str, secret: &str, plan: &str, project: &str) -> Self {
        let extras = drg_access::keys::EntryExtras {
            project: Some(project),
            ..Default::default()
        };
        self.keys.push_str(&drg_access::keys::key_entry_yaml_with(
            id,
            secret,
            plan,
            &[],
            &extras,
        ));
        self
    }

    /// Adds an entry written in full (e.g. by `key_entry_yaml_with`) to the keys file.
    pub fn key_entry(mut self, yaml: &str) -> Self {
        self.keys.push_str(yaml);
        self
    }

    /// Sets `access.account_rate`, the per-key limit of the account routes.
    pub fn account_rate(mut self, per_second: u32, burst: u32) -> Self {
        self.account_rate = Some((per_second, burst));
        self
    }

    /// Adds a plan with its monthly limit.
    pub fn plan(mut self, name: &str, limit: u64) -> Self {
        self.plans.insert(name.to_owned(), limit.to_string());
        self
    }

    /// Adds a plan in the long form, e.g. `{ monthly_limit: 100, rate_per_second: 5 }`.
    pub fn plan_yaml(mut self, name: &str, yaml: &str) -> Self {
        self.plans.insert(name.to_owned(), yaml.to_owned());
        self
    }

    /// An environment variable for the gateway process.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Count quotas in Redis at `url` with this failure policy.
    pub fn redis(self, url: &str, policy: &str) -> Self {
        self.redis_with(url, policy, "")
    }

    /// Like [`redis`](Self::redis), with extra keys for the `redis:` block (`key: value, ...`).
    pub fn redis_with(mut self, url: &str, policy: &str, extra: &str) -> Self {
        let extra: String = extra
            .split(',')
            .filter(|kv| !kv.trim().is_empty())
            .map(|kv| format!("      {}\n", kv.trim()))
            .collect();
        // The state folder in the test's own folder: its default (`../state` beside the config)
        // would be /tmp/state, shared with every other gateway on the machine (the managed keys
        // file lives there, see KeysApiConfig::managed_file).
        self.quota_yaml = Some(format!(
            "  quota:\n    store: redis\n    state_file: state/quota.counters\n    redis:\n      url: {url}\n      failure_policy: {policy}\n      call_timeout_ms: 500\n      connect_timeout_ms: 1000\n      breaker_open_ms: 300\n      reconcile_interval_ms: 100\n{extra}"
        ));
        self
    }

    /// The whole `quota:` section, one line (indented by two spaces), e.g.
    /// `quota: { state_file: state/quota.counters, slots: 2 }`.
    pub fn quota_section(mut self, line: &str) -> Self {
        self.quota_yaml = Some(format!("  {line}\n"));
        self
    }

    /// An extra line inside the `quota:` section, e.g. `alerts: { url: ..., secret_file: s }`.
    pub fn quota_yaml(mut self, line: &str) -> Self {
        self.quota_extra.push(line.to_owned());
        self
    }

    /// Turn MX lookups on, against this DNS server.
    pub fn dns(mut self, addr: SocketAddr) -> Self {
        self.dns = Some(addr);
        self
    }

    /// An extra line inside the `mx:` section (with `dns`), e.g. `max_inflight: 4`; a key the
    /// harness sets (`budget_ms: 300`, `query_timeout_ms: 1500`, `min_ttl_seconds: 1`,
    /// `failure_ttl_seconds: 1`) replaces its default.
    pub fn mx_yaml(mut self, line: &str) -> Self {
        self.mx_yaml.push(line.to_owned());
        self
    }

    /// The neighbourhood's look at every listed name on (as shipped, at 1,000 names a second)
    /// or off (the harness's default: its DNS servers count queries).
    pub fn look(mut self, on: bool) -> Self {
        self.look = on;
        self
    }

    /// A line of the `rdap:` section (RDAP is off unless a test gives one), e.g.
    /// `servers: {com: "http://127.0.0.1:9/"}`.
    pub fn rdap_yaml(mut self, line: &str) -> Self {
        self.rdap_yaml.push(line.to_owned());
        self
    }

    /// Reuse the folder (config, data, keys, quota state) of a stopped gateway.
    pub fn in_dir(mut self, dir: tempfile::TempDir) -> Self {
        self.dir = Some(dir);
        self
    }

    /// Include the built-in mailchecker list (off by default, to keep tests exact).
    pub fn builtin(mut self, on: bool) -> Self {
        self.builtin = on;
        self
    }

    pub fn upstream(mut self, addr: SocketAddr) -> Self {
        self.upstream = addr.to_string();
        self.dead_upstream = None;
        self
    }

    /// An extra line inside the `data:` section (indented by four spaces), e.g. `sources: [...]`.
    pub fn data_yaml(mut self, line: &str) -> Self {
        self.data_yaml.push(line.to_owned());
        self
    }

    /// Extra lines of the default `upstream:` section, e.g. `mode: relay` (ignored when a
    /// `gateway_yaml` line sets the whole section).
    pub fn upstream_yaml(mut self, line: &str) -> Self {
        self.upstream_yaml.push(line.to_owned());
        self
    }

    /// Extra lines inside the `gateway:` section (indented by two spaces).
    pub fn gateway_yaml(mut self, line: &str) -> Self {
        self.gateway_yaml.push(line.to_owned());
        self
    }

    pub fn start(self) -> Gateway {
        self.start_with(serve_command)
    }

    /// Writes the config folder and starts `command(conf, listen address)` on it: another
    /// program built on the gateway (`examples/embed.rs`) instead of the binary's `serve`.
    pub fn start_with(self, command: impl Fn(&str, &str) -> Command) -> Gateway {
        let dir = self.dir.unwrap_or_else(|| tempfile::tempdir().unwrap());
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(
            dir.path().join("keys.yaml"),
            format!("keys:\n{}", self.keys),
        )
        .unwrap();
        let plans: Vec<String> = self
            .plans
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        for (name, content) in &self.files {
            std::fs::write(data.join(name), content).unwrap();
        }
        let conf = dir.path().join("gateway.yaml");
        let extra: String = self
            .gateway_yaml
            .iter()
            .map(|l| format!("  {l}\n"))
            .collect();
        let upstream_block = if extra.contains("upstream:") {
            String::new()
        } else {
            format!(
                "  upstream:\n    address: {}\n    connect_timeout_ms: 500\n    read_timeout_ms: 1000\n{}",
                self.upstream,
                self.upstream_yaml
                    .iter()
                    .map(|l| format!("    {l}\n"))
                    .collect::<String>()
            )
        };
        std::fs::write(
            &conf,
            format!(
                "version: 1\nthreads: 2\npid_file: {d}/pid\nupgrade_sock: {d}/upgrade.sock\n\
                 grace_period_seconds: {grace}\ngraceful_shutdown_timeout_seconds: {grace}\n\
                 gateway:\n  listen: 127.0.0.1:1\n  drain_seconds: 1\n  admin:\n    listen: unix:{d}/admin.sock\n{upstream_block}  data:\n    dir: data\n    builtin_disposable: {b}\n{data_extra}  reload:\n    poll_interval_ms: 100\n\
                 \x20 access:\n    keys_file: keys.yaml\n    plans: {{ {p} }}\n    account_rate: {{ per_second: {rate}, burst: {burst} }}\n\
                 {quota}{mx}{rdap}{top}{extra}",
                d = dir.path().display(),
                grace = self.grace_seconds,
                b = self.builtin,
                data_extra = self
                    .data_yaml
                    .iter()
                    .map(|l| format!("    {l}\n"))
                    .collect::<String>(),
                p = plans.join(", "),
                rate = self.account_rate.map_or(100_000, |r| r.0),
                burst = self.account_rate.map_or(100_000, |r| r.1),
                // Each gateway's top-domains counts stay in its own folder.
                top = if extra.contains("top_domains:") {
                    ""
                } else {
                    "  top_domains:\n    state_file: state/top_domains.json\n"
                },
                quota = self.quota_yaml.unwrap_or_else(|| {
                    "  quota:\n    state_file: state/quota.json\n    flush_interval_ms: 200\n".to_owned()
                }) + &self
                    .quota_extra
                    .iter()
                    .map(|l| format!("    {l}\n"))
                    .collect::<String>(),
                rdap = if self.rdap_yaml.is_empty() {
                    "  rdap:\n    enabled: false\n".to_owned()
                } else {
                    format!(
                        "  rdap:\n{}",
                        self.rdap_yaml.iter().map(|l| format!("    {l}\n")).collect::<String>()
                    )
                },
                mx = match self.dns {
                    Some(addr) => {
                        // A default the test sets itself in `mx_yaml` is left out (YAML refuses
                        // a key twice).
                        let defaults: String = [
                            ("budget_ms", "300"),
                            ("query_timeout_ms", "1500"),
                            ("min_ttl_seconds", "1"),
                            ("failure_ttl_seconds", "1"),
                        ]
                        .iter()
                        .filter(|(k, _)| {
                            !self
                                .mx_yaml
                                .iter()
                                .any(|l| l.trim_start().starts_with(&format!("{k}:")))
                        })
                        .map(|(k, v)| format!("    {k}: {v}\n"))
                        .collect();
                        format!(
                            "  mx:\n    servers: [\"{addr}\"]\n{defaults}{}",
                            with_look(&self.mx_yaml, self.look)
                                .iter()
                                .map(|l| format!("    {l}\n"))
                                .collect::<String>()
                        )
                    }
                    None => "  mx:\n    enabled: false\n".to_owned(),
                },
            ),
        )
        .unwrap();
        let mut gw = Gateway::spawn_with(dir, conf, &self.env, command);
        gw.dead_upstream = self.dead_upstream;
        gw
    }
}

/// The `mx:` lines with the neighbourhood's look at every listed name `on` or off unless a line
/// sets it: a test's DNS server counts its queries, and a test of the look turns it on.
fn with_look(lines: &[String], on: bool) -> Vec<String> {
    let mut out: Vec<String> = lines.to_vec();
    let look = match on {
        true => "look: { enabled: true, rate: 1000, every_secs: 86400 }",
        false => "look: { enabled: false }",
    };
    match out
        .iter_mut()
        .find(|l| l.trim_start().starts_with("neighbourhood:"))
    {
        Some(l) if l.contains("look") || l.contains("enabled: false") => {}
        Some(l) => *l = l.replacen('{', &format!("{{ {look},"), 1),
        None => out.push(format!("neighbourhood: {{ {look} }}")),
    }
    out
}

/// Runs the binary with `args` (a command other than `serve`) and returns what it printed; a
/// non-zero exit fails the test with its standard error.
pub fn run_ok(args: &[&str]) -> String {
    let out = command(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The gateway binary's `serve` on `conf`, listening on `listen`.
pub fn serve_command(conf: &str, listen: &str) -> Command {
    let mut command = command(BIN);
    command.args(["-c", conf, "serve", "--listen", listen]);
    command
}

/// A running gateway process; killed on drop.
pub struct Gateway {
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub conf: PathBuf,
    child: Child,
    log: PathBuf,
    dead_upstream: Option<DeadPort>,
}

impl Gateway {
    pub fn builder() -> GatewayBuilder {
        GatewayBuilder::default()
    }

    /// Starts the binary on `conf` (its admin listener must be `unix:<dir>/admin.sock`), on a
    /// free loopback port.
    pub fn spawn(dir: tempfile::TempDir, conf: PathBuf, env: &[(String, String)]) -> Gateway {
        Gateway::spawn_with(dir, conf, env, serve_command)
    }

    /// Starts `command(conf, listen address)` on `conf`, on a free loopback port.
    pub fn spawn_with(
        dir: tempfile::TempDir,
        conf: PathBuf,
        env: &[(String, String)],
        command: impl Fn(&str, &str) -> Command,
    ) -> Gateway {
        let log = dir.path().join("gateway.log");
        let mut dir = Some(dir);
        // A port picked free can be taken before the gateway binds it: try another one then.
        for attempt in 1..=3 {
            let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let child = command(conf.to_str().unwrap(), &addr.to_string())
                .env("RUST_LOG", "info")
                .envs(env.iter().map(|(k, v)| (k, v)))
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            let mut gw = Gateway {
                addr,
                dir: dir.take().unwrap(),
                conf: conf.clone(),
                child,
                log: log.clone(),
                dead_upstream: None,
            };
            match gw.wait_ready() {
                Ok(()) => return gw,
                Err(why) if attempt < 3 && why.contains("ddress") => {
                    dir = Some(std::mem::replace(&mut gw.dir, tempfile::tempdir().unwrap()));
                }
                Err(why) => panic!("{why}"),
            }
        }
        unreachable!()
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let tls = self.is_tls();
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Err(format!("gateway exited with {status}:\n{}", self.log()));
            }
            // A TLS listener does not speak plain HTTP: ask the admin socket instead.
            // Serving: ready, or unready only because its Redis may evict (a test of that
            // readiness starts the gateway in that state).
            let serving = |r: Response| {
                r.status == 200
                    || (r.status == 503
                        && String::from_utf8_lossy(&r.body).contains("quota_store_evicts"))
            };
            let ready = if tls {
                self.try_admin_get("/readyz").is_ok_and(serving)
            } else {
                Conn::open_as(self.addr, None)
                    .and_then(|mut c| c.get("/readyz"))
                    .is_ok_and(serving)
            };
            // Another test's gateway may hold the port if the bind raced: check that the
            // listening socket is this process's.
            if ready && listens_on(self.child.id(), self.addr.port()) {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(20));
        }
        Err(format!("gateway not ready in time:\n{}", self.log()))
    }

    /// Whether the config turns TLS on for the public listener (`gateway.tls`).
    pub fn is_tls(&self) -> bool {
        std::fs::read_to_string(&self.conf).is_ok_and(|c| c.contains("\n  tls:"))
    }

    /// One request to the admin listener, or why there is no answer (yet).
    pub fn try_admin_get(&self, path: &str) -> std::io::Result<Response> {
        let stream = std::os::unix::net::UnixStream::connect(self.dir.path().join("admin.sock"))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut reader = BufReader::new(stream);
        write!(
            reader.get_mut(),
            "GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
        )?;
        read_response(&mut reader)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn data_path(&self, file: &str) -> PathBuf {
        self.dir.path().join("data").join(file)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: &str) {
        send_signal(self.pid(), sig);
    }

    /// One request to the admin listener (a Unix socket in the gateway's folder).
    pub fn admin_get(&self, path: &str) -> Response {
        // The admin listener binds just after the public one the start waits for: its socket
        // may be a moment late on a loaded machine.
        let sock = self.dir.path().join("admin.sock");
        let deadline = Instant::now() + Duration::from_secs(10);
        let stream = loop {
            match std::os::unix::net::UnixStream::connect(&sock) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => panic!("admin listener: {e}"),
            }
        };
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut reader = BufReader::new(stream);
        write!(
            reader.get_mut(),
            "GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        read_response(&mut reader).expect("admin answer")
    }

    /// The value of one sample of the admin listener's `/metrics`, named with its labels as
    /// exposed (e.g. `drg_upstream_errors_total{kind="timeout"}`); `None` when it is not there.
    pub fn metric(&self, sample: &str) -> Option<f64> {
        let text = String::from_utf8(self.admin_get("/metrics").body).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
    }

    /// Waits until [`metric`](Self::metric) `sample` reads `value`: a request is counted once it
    /// is finished, which may be just after its answer arrived.
    pub fn wait_metric(&self, sample: &str, value: f64) {
        let started = Instant::now();
        loop {
            let now = self.metric(sample);
            if now == Some(value) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "{sample} is {now:?}, want {value}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// A connection that sends the test key with every request.
    pub fn conn(&self) -> Conn {
        Conn::open(self.addr).unwrap()
    }

    /// A connection that sends this key (or none).
    pub fn conn_as(&self, secret: Option<&str>) -> Conn {
        Conn::open_as(self.addr, secret).unwrap()
    }

    /// One request with the test key, on a fresh connection.
    pub fn get(&self, path: &str) -> Response {
        self.conn().get(path).unwrap()
    }

    /// `domain`'s explained record (`?explain=true`) as `secret`'s project asks; `200` expected.
    pub fn explain_as(&self, secret: &str, domain: &str) -> serde_json::Value {
        let r = Conn::open_as(self.addr, Some(secret))
            .unwrap()
            .get(&format!("/v1/public/domain/{domain}?explain=true"))
            .unwrap();
        assert_eq!(r.status, 200, "{domain}");
        r.json()
    }

    /// Stops the gateway gracefully (SIGTERM) and hands back its folder.
    pub fn stop(mut self) -> tempfile::TempDir {
        self.signal("TERM");
        assert!(
            self.wait_exit(Duration::from_secs(15)),
            "gateway did not stop:\n{}",
            self.log()
        );
        let dir = tempfile::tempdir().unwrap();
        std::mem::replace(&mut self.dir, dir)
    }

    /// Waits for the process to exit; returns whether it did in time.
    pub fn wait_exit(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return true;
            }
            thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request on a fresh connection (closed after it), with an optional body (JSON unless
/// `extra` names a `Content-Type`), extra headers and the key `secret` (none: no
/// `Authorization`).
pub fn send(
    gw: &Gateway,
    method: &str,
    path: &str,
    secret: Option<&str>,
    extra: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Response {
    let mut stream = TcpStream::connect(gw.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    if let Some(s) = secret {
        req.push_str(&format!("Authorization: Bearer {s}\r\n"));
    }
    for (k, v) in extra {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        // JSON unless the test names its own type.
        if !extra
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            req.push_str("Content-Type: application/json\r\n");
        }
        req.push_str(&format!("Content-Length: {}\r\n", b.len()));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).unwrap();
    if let Some(b) = body {
        stream.write_all(b).unwrap();
    }
    read_response(&mut BufReader::new(stream)).unwrap()
}

/// `POST /v1/public/domains` of `names` with the key `secret`, on a fresh connection.
pub fn post_batch(gw: &Gateway, secret: &str, names: &[String]) -> Response {
    let body = serde_json::json!({ "domains": names }).to_string();
    send(
        gw,
        "POST",
        "/v1/public/domains",
        Some(secret),
        &[],
        Some(body.as_bytes()),
    )
}

/// Sends raw bytes on a new connection and reads until the server closes it or goes quiet.
pub fn raw(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

/// Sends signal `sig` (a name such as `TERM`) to process `pid`, with kill(1).
pub fn send_signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid} failed");
}

/// Whether process `pid` holds the listening TCP socket of `port` (Linux `/proc`).
pub fn listens_on(pid: u32, port: u16) -> bool {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let local_port = f
                .get(1)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            // State 0A is LISTEN.
            if local_port == Some(port) && f.get(3) == Some(&"0A") {
                if let Some(inode) = f.get(9) {
                    inodes.push(format!("socket:[{inode}]"));
                }
            }
        }
    }
    // The process itself, or one it started (`unshare --fork` runs the gateway as its child).
    std::iter::once(pid).chain(descendants(pid)).any(|pid| {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return false;
        };
        fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| inodes.iter().any(|i| target.to_str() == Some(i)))
        })
    })
}

/// The processes `pid` started, and theirs (Linux `/proc/<pid>/task/*/children`).
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut next = vec![pid];
    while let Some(p) = next.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in text.split_whitespace().filter_map(|c| c.parse().ok()) {
                found.push(child);
                next.push(child);
            }
        }
    }
    found
}

/// The first value of header `name` (case-insensitive).
fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// An HTTP response as read off the wire.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// The body as text (lossy), for messages.
    #[allow(dead_code)]
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// Asserts a `422 validation_error` whose `detail` mentions `needle`.
    pub fn assert_invalid(&self, needle: &str, what: &str) {
        let detail = self.assert_error(422, "validation_error");
        assert!(
            detail.as_str().is_some_and(|d| d.contains(needle)),
            "{what}: {detail}"
        );
    }

    /// Asserts the contract's error body and returns its `detail`.
    pub fn assert_error(&self, status: u16, code: &str) -> serde_json::Value {
        assert_eq!(
            self.status,
            status,
            "{}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(
            self.header("content-type"),
            Some("application/json; charset=utf-8")
        );
        let v = self.json();
        assert_eq!(v["error"], code, "{v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(v.get("detail").is_some(), "no detail key: {v}");
        v["detail"].clone()
    }
}

/// One client connection, reused across requests (keep-alive). Like any HTTP client, it opens a
/// new connection after an answer that said `Connection: close` (the per-connection request
/// limit ends a long-lived client's connection that way; a load loop must not count it a failure).
pub struct Conn {
    reader: BufReader<TcpStream>,
    /// Sent as `Authorization: Bearer ...` unless a request sets its own.
    secret: Option<String>,
    addr: SocketAddr,
    /// The last answer said `Connection: close`: the next request goes on a new connection.
    server_closed: bool,
}

impl Conn {
    /// A connection that authenticates with the test key.
    pub fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        Conn::open_as(addr, Some(TEST_SECRET))
    }

    pub fn open_as(addr: SocketAddr, secret: Option<&str>) -> std::io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            reader: BufReader::new(stream),
            secret: secret.map(str::to_owned),
            addr,
            server_closed: false,
        })
    }

    pub fn get(&mut self, path: &str) -> std::io::Result<Response> {
        self.request("GET", path, &[])
    }

    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
    ) -> std::io::Result<Response> {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n");
        let own_auth = headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("authorization"));
        if let (Some(secret), false) = (&self.secret, own_auth) {
            req.push_str(&format!("Authorization: Bearer {secret}\r\n"));
        }
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        if self.server_closed {
            *self = Conn::open_as(self.addr, self.secret.as_deref())?;
        }
        self.reader.get_mut().write_all(req.as_bytes())?;
        let response = read_response(&mut self.reader)?;
        self.server_closed = response
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        Ok(response)
    }

    /// Whether the server closed this connection (reads EOF without blocking long).
    pub fn is_closed(&mut self) -> bool {
        let s = self.reader.get_mut();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut b = [0u8; 1];
        let closed = matches!(s.read(&mut b), Ok(0));
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        closed
    }
}

fn eof() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed")
}

/// Reads one HTTP/1.1 response (Content-Length or chunked body).
pub fn read_response<R: BufRead>(r: &mut R) -> std::io::Result<Response> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(eof());
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let headers = read_headers(r)?;
    let find = |n: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(n))
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if let Some(len) = find("content-length") {
        body.resize(len.trim().parse().unwrap(), 0);
        r.read_exact(&mut body)?;
    } else if find("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim(), 16)
                .map_err(|_| std::io::Error::other(format!("bad chunk size {size:?}")))?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else if status != 204 && status != 304 {
        r.read_to_end(&mut body)?;
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

pub fn read_headers<R: BufRead>(r: &mut R) -> std::io::Result<Vec<(String, String)>> {
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Err(eof());
        }
        let line = line.trim_end();
        if line.is_empty() {
            return Ok(headers);
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
}

/// A request as the stub upstream saw it.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

impl SeenRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }
}

/// A stub of the analysis backend on `127.0.0.1:0`: answers each request with a JSON echo after
/// an optional delay, and records what it saw.
pub struct Upstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<SeenRequest>>>,
    pub connections: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Upstream {
    pub fn start(delay: Duration) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, c, st) = (seen.clone(), connections.clone(), stop.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                c.fetch_add(1, Ordering::SeqCst);
                let s = s.clone();
                thread::spawn(move || serve_stub(stream, s, delay));
            }
        });
        Upstream {
            addr,
            seen,
            connections,
            stop,
        }
    }

    pub fn requests(&self) -> Vec<SeenRequest> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// A dataset version the stub backend sends on its own: the gateway must replace it with its own.
pub const STUB_DATASET_VERSION: &str = "X-Dataset-Version: g999-backend";

fn serve_stub(stream: TcpStream, seen: Arc<Mutex<Vec<SeenRequest>>>, delay: Duration) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_owned();
        let path = parts.next().unwrap_or_default().to_owned();
        let Ok(headers) = read_headers(&mut reader) else {
            return;
        };
        seen.lock().unwrap().push(SeenRequest {
            method,
            path: path.clone(),
            headers,
        });
        thread::sleep(delay);
        let body = format!("{{\"checked\":{}}}", serde_json::Value::String(path));
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{STUB_DATASET_VERSION}\r\n\r\n{body}",
            body.len()
        );
        if reader.get_mut().write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

/// Writes a file atomically (temp file + rename), as operators are told to.
pub fn write_atomic(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp-write");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Runs `clients` concurrent keep-alive clients, spread over `addrs`, each sending `per_client`
/// GETs of `path` with `secret`; returns how many answers had each status.
pub fn hammer(
    addrs: &[SocketAddr],
    secret: &str,
    path: &str,
    clients: usize,
    per_client: usize,
) -> BTreeMap<u16, usize> {
    let handles: Vec<_> = (0..clients)
        .map(|i| {
            let (addr, secret, path) = (addrs[i % addrs.len()], secret.to_owned(), path.to_owned());
            thread::spawn(move || {
                let mut c = Conn::open_as(addr, Some(&secret)).unwrap();
                (0..per_client)
                    .map(|_| c.get(&path).unwrap().status)
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut counts = BTreeMap::new();
    for h in handles {
        for status in h.join().unwrap() {
            *counts.entry(status).or_insert(0) += 1;
        }
    }
    counts
}

/// The names of the public top-domains list, at most `limit`, in order.
pub fn top_domains(gw: &Gateway, limit: usize) -> Vec<String> {
    let r = gw.get(&format!("/v1/public/top-domains?limit={limit}"));
    assert_eq!(r.status, 200);
    r.json()["domains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["domain"].as_str().unwrap().to_owned())
        .collect()
}

/// How many times its bound a wait gives a condition before it fails the test. The bounds are
/// what an idle machine needs with room to spare; CI runs the whole suite side by side on two
/// cores, where a step that takes 9 ms here took a second (an HTTPS fetch) and two runs were
/// refused for a wait that ran out. Only a failing test waits the longer time: each wait
/// returns as soon as its condition holds. A test that claims a time asserts it apart, on the
/// duration the wait returns (`control_store.rs`, `keys_control.rs`).
const WAIT_SLACK: u32 = 3;

/// Polls `f` until it holds; panics after `within` ([`WAIT_SLACK`] times it). Returns how long
/// it took.
pub fn wait_until(within: Duration, f: impl FnMut() -> bool) -> Duration {
    wait_until_or(within, f, String::new)
}

/// [`wait_until`], and when it gives up, says what `context` tells (a gateway's log: what a
/// loaded CI machine did in the time is otherwise lost).
pub fn wait_until_or(
    within: Duration,
    mut f: impl FnMut() -> bool,
    context: impl FnOnce() -> String,
) -> Duration {
    let started = Instant::now();
    let limit = within * WAIT_SLACK;
    while started.elapsed() < limit {
        if f() {
            return started.elapsed();
        }
        thread::sleep(Duration::from_millis(20));
    }
    panic!(
        "condition not met within {limit:?} ({within:?} asked, {WAIT_SLACK} times it given)\n{}",
        context()
    );
}

/// A gateway process started beside a running [`Gateway`] (`serve --upgrade`); killed on drop.
pub struct Process {
    /// Taken by [`Gateway::take_over`].
    child: Option<Child>,
    log: PathBuf,
}

impl Process {
    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("process handed over")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("process handed over").id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: &str) {
        send_signal(self.pid(), sig);
    }

    /// Whether the process has exited (reaping it).
    pub fn exited(&mut self) -> bool {
        self.child().try_wait().unwrap().is_some()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Gateway {
    /// Starts `serve --upgrade` on this gateway's config and address. The new process waits (a
    /// few seconds at most) on the upgrade socket for the listening sockets, which this process
    /// sends when it gets SIGQUIT. Logs to `gateway-next.log` in the folder.
    pub fn start_successor(&self) -> Process {
        let log = self.dir.path().join("gateway-next.log");
        let child = command(BIN)
            .args([
                "-c",
                self.conf.to_str().unwrap(),
                "serve",
                "--upgrade",
                "--listen",
                &self.addr.to_string(),
            ])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Process {
            child: Some(child),
            log,
        }
    }

    /// The upgrade socket a successor listens on (the harness config puts it in the folder).
    pub fn upgrade_sock(&self) -> PathBuf {
        self.dir.path().join("upgrade.sock")
    }

    /// Makes `next` this gateway's process (same folder, address and admin socket) and hands
    /// back the previous one.
    pub fn take_over(&mut self, mut next: Process) -> Process {
        let child = next.child.take().expect("process handed over");
        let previous = std::mem::replace(&mut self.child, child);
        let log = std::mem::replace(&mut self.log, next.log.clone());
        Process {
            child: Some(previous),
            log,
        }
    }
}

/// A Python under `target/<name>` with `packages` (pinned `pkg==version`) installed from PyPI,
/// made on first use and reused; a failure to make it fails the test (never a skip).
pub fn python_venv(name: &str, packages: &[&str], probe: &str) -> PathBuf {
    static MAKING: Mutex<()> = Mutex::new(());
    let _one = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(name);
    let python = venv.join("bin/python");
    let ready = || {
        std::process::Command::new(&python)
            .args(["-c", probe])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ready() {
        let made = std::process::Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .unwrap();
        assert!(
            made.success(),
            "python3 -m venv failed (scripts/test installs python3-venv)"
        );
        let installed = std::process::Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .args(packages)
            .status()
            .unwrap();
        assert!(installed.success(), "pip install {packages:?} failed");
        assert!(ready(), "{probe} fails in {}", venv.display());
    }
    python
}
