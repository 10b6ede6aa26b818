//! A real `redis-server` on a loopback port, owned by one test; and real deployments of several:
//! a 3-master Redis Cluster ([`RedisCluster`]) and a master with a replica watched by Sentinel
//! ([`RedisSentinel`]).
//!
//! redis-server cannot bind port 0 and report the port, so a free port is picked and may be taken
//! by someone else before the server binds it. A start that fails with "Address already in use"
//! is therefore retried on another port, and the server counts as up only once the one answering
//! on the port is our own process (its `process_id`), never a stranger holding the port.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// Fresh ports tried before giving up on a start.
const START_ATTEMPTS: usize = 20;
/// How long one launch may take to answer PING.
const LAUNCH_DEADLINE: Duration = Duration::from_secs(10);
/// How long a restart waits for its port to be free again (it cannot move: gateways know it).
const RESTART_DEADLINE: Duration = Duration::from_secs(10);

pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    aof: bool,
    /// Arguments after the usual ones (cluster mode, replica of, sentinel directives).
    extra: Vec<String>,
    /// Starts from a config file (Sentinel needs one it can rewrite), emptied at each launch.
    config_file: bool,
}

/// How one launch of redis-server ended.
enum Launch {
    Ready,
    AddressInUse,
    Failed(String),
}

impl RedisServer {
    /// Starts redis-server (with append-only persistence when `aof`).
    pub fn start(aof: bool) -> RedisServer {
        Self::start_with(aof, Vec::new(), false)
    }

    /// Starts redis-server with `extra` arguments (and from an empty config file if asked).
    pub fn start_with(aof: bool, extra: Vec<String>, config_file: bool) -> RedisServer {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let mut s = RedisServer {
            port: 0,
            dir,
            child: None,
            aof,
            extra,
            config_file,
        };
        for _ in 0..START_ATTEMPTS {
            s.port = if s.extra.iter().any(|a| a == "--cluster-enabled") {
                cluster_port()
            } else {
                crate::common::free_port()
            };
            match s.launch() {
                Launch::Ready => return s,
                Launch::AddressInUse => continue,
                Launch::Failed(log) => panic!("redis-server failed on port {}:\n{log}", s.port),
            }
        }
        panic!("redis-server found no free port in {START_ATTEMPTS} attempts");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn launch(&mut self) -> Launch {
        // redis-server appends to its log: start from an empty one so only this launch is read.
        let _ = std::fs::remove_file(self.log_path());
        let mut command = Command::new("redis-server");
        if self.config_file {
            let conf = self.dir.path().join("redis.conf");
            std::fs::write(&conf, "").unwrap();
            command.arg(conf);
        }
        let child = command
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                if self.aof { "yes" } else { "no" },
                "--appendfsync",
                "always",
                "--dir",
                self.data_dir().to_str().unwrap(),
                "--logfile",
                self.log_path().to_str().unwrap(),
            ])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server not found: the test command installs it (scripts/test)");
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + LAUNCH_DEADLINE;
        while Instant::now() < deadline {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                let log = std::fs::read_to_string(self.log_path()).unwrap_or_default();
                return if log.contains("Address already in use") {
                    Launch::AddressInUse
                } else {
                    Launch::Failed(format!("exited with {status}\n{log}"))
                };
            }
            if self.answering_pid() == Some(pid) {
                return Launch::Ready;
            }
            thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Launch::Failed(format!(
            "did not answer within {LAUNCH_DEADLINE:?}\n{}",
            std::fs::read_to_string(self.log_path()).unwrap_or_default()
        ))
    }

    /// The pid of the redis-server answering on our port, if one does and has its data loaded.
    fn answering_pid(&self) -> Option<u32> {
        let mut c = self
            .client()
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        // INFO answers while an AOF or RDB file is still being loaded, when every other command
        // is refused with LOADING: ready means loaded (a Sentinel has no such section).
        let persistence: String = redis::cmd("INFO")
            .arg("persistence")
            .query(&mut c)
            .unwrap_or_default();
        if persistence.lines().any(|l| l.trim() == "loading:1") {
            return None;
        }
        let info: String = redis::cmd("INFO").arg("server").query(&mut c).ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok())
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).unwrap()
    }

    /// Runs a command and returns its integer (or nil as None) answer.
    pub fn int(&self, args: &[&str]) -> Option<i64> {
        let mut c = self.client().get_connection().unwrap();
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query::<Option<i64>>(&mut c).unwrap()
    }

    /// Kills the server at once (no shutdown save): an outage.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and data folder. Should another process hold the port
    /// meanwhile, waits for it to be released rather than moving (the gateways know this port).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + RESTART_DEADLINE;
        loop {
            match self.launch() {
                Launch::Ready => return,
                Launch::AddressInUse if Instant::now() < deadline => {
                    thread::sleep(Duration::from_millis(100))
                }
                Launch::AddressInUse => {
                    panic!(
                        "redis-server port {} stayed taken by another process",
                        self.port
                    )
                }
                Launch::Failed(log) => {
                    panic!("redis-server restart failed on port {}:\n{log}", self.port)
                }
            }
        }
    }

    /// Stops the process (SIGSTOP) without closing anything: what clients send meanwhile waits
    /// unread in its sockets and is run, in order, on [`resume`](Self::resume). To the clients,
    /// every reply is late.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP, true);
    }

    pub fn resume(&self) {
        self.signal(libc::SIGCONT, false);
    }

    fn signal(&self, signal: libc::c_int, stopped: bool) {
        let pid = self.child.as_ref().expect("redis-server is running").id();
        // SAFETY: a plain kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(pid as libc::pid_t, signal) }, 0);
        // The signal is delivered asynchronously: wait until the process state shows it.
        crate::common::wait_until(Duration::from_secs(5), || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // `pid (comm) state ...`: the state follows the last ')'.
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|s| s.trim().chars().next());
            (state == Some('T')) == stopped
        });
    }

    /// The folder redis-server keeps its data (the append-only file) in.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether this machine's Redis can run a cluster (`redis-cli --cluster`); says why not if not.
fn cluster_support() -> Result<(), String> {
    match Command::new("redis-cli")
        .args(["--cluster", "help"])
        .output()
    {
        // It prints its commands and exits 1.
        Ok(out) if String::from_utf8_lossy(&out.stdout).contains("create") => Ok(()),
        Ok(out) => Err(format!(
            "redis-cli --cluster is not supported here: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!(
            "redis-cli not found ({e}): scripts/test installs it (Debian package redis-tools)"
        )),
    }
}

/// A free port for a cluster node whose bus port, 10000 above it, is kept too: a bus port
/// taken unkept was a port `free_port` had handed to another test (whose backend, restarted
/// on its port, found it in use: EADDRINUSE in CI).
fn cluster_port() -> u16 {
    crate::common::free_port_pair(10_000)
}

/// Redis Cluster on loopback: three masters (no replicas), every slot assigned.
pub struct RedisCluster {
    pub masters: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the cluster. A Redis without cluster support fails the test, saying why: a test
    /// that skipped would pass with nothing tested.
    pub fn start() -> RedisCluster {
        if let Err(why) = cluster_support() {
            panic!("{why}");
        }
        let args = [
            "--cluster-enabled",
            "yes",
            // Relative to the data folder: one per server.
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ];
        let masters: Vec<RedisServer> = (0..3)
            .map(|_| RedisServer::start_with(false, args.map(String::from).to_vec(), false))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(masters.iter().map(|m| format!("127.0.0.1:{}", m.port)))
            .arg("--cluster-yes")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { masters };
        cluster.wait_ok();
        cluster
    }

    /// Waits until every node knows the whole slot map (clients may read it from any of them).
    pub fn wait_ok(&self) {
        crate::common::wait_until(Duration::from_secs(30), || {
            self.masters.iter().all(|m| {
                m.info("CLUSTER", "INFO")
                    .is_some_and(|i| i.contains("cluster_state:ok"))
            })
        });
    }

    /// Seed URLs for the gateways (every master).
    pub fn seeds(&self) -> Vec<String> {
        self.masters.iter().map(RedisServer::url).collect()
    }

    /// `GET key` through the cluster (routed by slot), as an integer.
    pub fn int_get(&self, key: &str) -> Option<i64> {
        let client = redis::cluster::ClusterClient::new(self.seeds()).unwrap();
        let mut c = client.get_connection().unwrap();
        redis::cmd("GET").arg(key).query(&mut c).unwrap()
    }

    /// The master holding `key`.
    pub fn master_of(&self, key: &str) -> &RedisServer {
        self.masters
            .iter()
            .find(|m| {
                // Asked about a key it does not serve, a master answers MOVED; about a slot, 0.
                let slot = m.int(&["CLUSTER", "KEYSLOT", key]).unwrap().to_string();
                m.int(&["CLUSTER", "COUNTKEYSINSLOT", &slot]) > Some(0)
            })
            .unwrap_or_else(|| panic!("no master holds {key}"))
    }
}

/// A master, one replica and Sentinel processes watching them, on loopback.
pub struct RedisSentinel {
    pub name: String,
    /// The first master and its replica; their roles swap on a failover.
    pub servers: Vec<RedisServer>,
    pub sentinels: Vec<RedisServer>,
}

impl RedisSentinel {
    /// Starts the set-up with `sentinels` Sentinel processes (quorum 1, so that any one can
    /// decide); returns once a sentinel knows the replica (a failover needs one).
    pub fn start(sentinels: usize) -> RedisSentinel {
        let name = "quota".to_owned();
        let master = RedisServer::start(false);
        let replica = RedisServer::start_with(
            false,
            vec![
                "--replicaof".into(),
                "127.0.0.1".into(),
                master.port.to_string(),
            ],
            false,
        );
        crate::common::wait_until(Duration::from_secs(20), || {
            replica
                .info("INFO", "replication")
                .is_some_and(|i| i.contains("master_link_status:up"))
        });
        let directives = |m: &RedisServer| -> Vec<String> {
            let p = m.port.to_string();
            [
                vec!["--sentinel", "monitor", &name, "127.0.0.1", &p, "1"],
                vec!["--sentinel", "down-after-milliseconds", &name, "1000"],
                vec!["--sentinel", "failover-timeout", &name, "5000"],
            ]
            .concat()
            .into_iter()
            .map(String::from)
            .collect()
        };
        let sentinels: Vec<RedisServer> = (0..sentinels)
            .map(|_| RedisServer::start_with(false, directives(&master), true))
            .collect();
        let s = RedisSentinel {
            name,
            servers: vec![master, replica],
            sentinels,
        };
        crate::common::wait_until(Duration::from_secs(30), || {
            s.sentinels.iter().all(|x| {
                x.info_args(&["SENTINEL", "REPLICAS", &s.name])
                    .is_some_and(|r| r.contains("slave"))
            })
        });
        s
    }

    /// Sentinel URLs for the gateways.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The port of the master the first sentinel names now.
    pub fn master_port(&self) -> u16 {
        let mut c = self.sentinels[0].client().get_connection().unwrap();
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.name)
            .query(&mut c)
            .unwrap();
        port
    }

    /// Forces a failover (the master is alive: the harder case, as it keeps taking writes until
    /// Sentinel demotes it) and returns once the sentinels name the replica as master.
    pub fn failover(&self) {
        let before = self.master_port();
        let mut c = self.sentinels[0].client().get_connection().unwrap();
        let _: String = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(&self.name)
            .query(&mut c)
            .unwrap();
        crate::common::wait_until(Duration::from_secs(30), || self.master_port() != before);
    }
}

impl RedisServer {
    /// A command's bulk-string answer (`INFO` sections and the like), `None` if it fails.
    pub fn info(&self, command: &str, arg: &str) -> Option<String> {
        let mut c = self.quick_connection()?;
        redis::cmd(command).arg(arg).query(&mut c).ok()
    }

    /// Any command's answer in its debug form (to look for a word in it), `None` if it fails.
    pub fn info_args(&self, args: &[&str]) -> Option<String> {
        let mut c = self.quick_connection()?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let v: redis::Value = cmd.query(&mut c).ok()?;
        Some(format!("{v:?}"))
    }

    fn quick_connection(&self) -> Option<redis::Connection> {
        self.client()
            .get_connection_with_timeout(Duration::from_secs(2))
            .ok()
    }
}

/// What the Redis quota store's carried-calls files in a gateway's `state` folder hold, all
/// together (empty when there are none).
pub fn carried_files(state: &std::path::Path) -> String {
    std::fs::read_dir(state)
        .map(|dir| {
            dir.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with("quota.carried.")
                })
                .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
}

/// The calls the carried-calls files in `state` name as not known to be in Redis: those never
/// sent (`calls`) and those sent under an id whose reply never came (`unsure`). A sync that
/// tries Redis while it is down moves an outage's calls from the first to the second, so a
/// test that waits for them to be kept must count both.
pub fn carried_calls(state: &std::path::Path) -> u64 {
    let Ok(dir) = std::fs::read_dir(state) else {
        return 0;
    };
    let mut total = 0;
    for e in dir.flatten() {
        if !e
            .file_name()
            .to_string_lossy()
            .starts_with("quota.carried.")
        {
            continue;
        }
        // A file being renamed into place may be read half-way: it counts as nothing yet.
        let Ok(body) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&body) else {
            continue;
        };
        for entry in json["entries"].as_array().into_iter().flatten() {
            total += entry["calls"].as_u64().unwrap_or(0);
            for batch in entry["unsure"].as_array().into_iter().flatten() {
                total += batch[1].as_u64().unwrap_or(0);
            }
        }
    }
    total
}
