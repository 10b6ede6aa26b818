//! A real `redis-server` on an ephemeral loopback port, owned by one test.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    aof: bool,
}

impl RedisServer {
    /// Starts redis-server (with append-only persistence when `aof`).
    pub fn start(aof: bool) -> RedisServer {
        let mut s = RedisServer {
            port: super::free_port(),
            dir: tempfile::tempdir().unwrap(),
            child: None,
            aof,
        };
        s.launch();
        s
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn launch(&mut self) {
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
                self.dir.path().to_str().unwrap(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server not found: the test command installs it (scripts/test)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(mut c) = self.client().get_connection() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return;
                }
            }
            thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not start on port {}", self.port);
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

    /// Starts it again on the same port and data folder.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().to_owned()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}
