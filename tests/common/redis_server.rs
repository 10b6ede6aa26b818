//! A real `redis-server` on a loopback port, owned by one test.
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
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let mut s = RedisServer {
            port: 0,
            dir,
            child: None,
            aof,
        };
        for _ in 0..START_ATTEMPTS {
            s.port = super::free_port();
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
        let child = Command::new("redis-server")
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

    /// The pid of the redis-server answering on our port, if one does.
    fn answering_pid(&self) -> Option<u32> {
        let mut c = self
            .client()
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
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
        super::wait_until(Duration::from_secs(5), || {
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
