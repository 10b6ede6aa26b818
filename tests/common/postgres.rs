//! A real PostgreSQL on a loopback port, owned by one test: a throwaway cluster (`initdb` in a
//! temporary folder, Debian's `postgresql` package), started with `pg_ctl`, stopped with it when
//! the test ends. As root (CI), the server runs as the `postgres` user the package made, since
//! PostgreSQL refuses to run as root.
//!
//! `initdb` runs once a test process (about a second of CPU, dozens of tests): each test's
//! cluster is a copy of that template (~0.1 s), removed with the test's folder.
//!
//! A free port is picked and may be taken before the server binds it: a start that fails is
//! retried on another port.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::common::free_port;

/// Fresh ports tried before giving up on a start.
const START_ATTEMPTS: usize = 5;

pub struct Postgres {
    pub port: u16,
    dir: tempfile::TempDir,
    bin: PathBuf,
}

/// The newest installed server's programs (`/usr/lib/postgresql/<version>/bin`).
fn bin_dir() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL's server is installed (Debian's postgresql package; scripts/test)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("pg_ctl").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .expect("a PostgreSQL server under /usr/lib/postgresql")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// `program` with `args`, as the `postgres` user when this process is root.
fn run(program: &Path, args: &[&str]) -> Output {
    let mut cmd = if is_root() {
        let runuser = ["/usr/sbin/runuser", "/sbin/runuser"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("runuser");
        let mut c = Command::new(runuser);
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    cmd.args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", program.display()))
}

/// Makes `dir` the `postgres` user's when this process is root (the server writes there).
fn hand_to_postgres(dir: &Path) {
    if is_root() {
        let owner = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(owner.success(), "chown of the cluster's folder");
    }
}

/// The folder whose `data` is a fresh cluster (`initdb`: user `drg`, trust, UTF8), made on the
/// first call and removed when the test process exits.
fn template(bin: &Path) -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    extern "C" fn remove_template() {
        if let Some(dir) = TEMPLATE.get() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    TEMPLATE.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("drg-pg-template")
            .tempdir()
            .unwrap()
            .keep();
        hand_to_postgres(&dir);
        let data = dir.join("data");
        let out = run(
            &bin.join("initdb"),
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "drg",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                // 1 MB write-ahead segments, not 16: each test copies the cluster.
                "--wal-segsize=1",
            ],
        );
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // SAFETY: registers a plain function, run once at exit.
        unsafe { libc::atexit(remove_template) };
        dir
    })
}

impl Postgres {
    /// A new cluster, started; user `drg`, no password (trust on loopback).
    pub fn start() -> Postgres {
        let dir = tempfile::tempdir().unwrap();
        let bin = bin_dir();
        hand_to_postgres(dir.path());
        let copied = Command::new("cp")
            .arg("-a")
            .arg(template(&bin).join("data"))
            .arg(dir.path().join("data"))
            .status()
            .unwrap();
        assert!(copied.success(), "a copy of the template cluster");
        let mut pg = Postgres { port: 0, dir, bin };
        for _ in 0..START_ATTEMPTS {
            pg.port = free_port();
            if pg.launch() {
                return pg;
            }
        }
        panic!("PostgreSQL did not start: {}", pg.log());
    }

    fn data(&self) -> String {
        self.dir.path().join("data").to_str().unwrap().to_owned()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// Starts the server on `self.port`; whether it came up.
    fn launch(&self) -> bool {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("log");
        let out = run(
            &self.bin.join("pg_ctl"),
            &[
                "-D",
                &self.data(),
                "-l",
                log.to_str().unwrap(),
                "-o",
                &opts,
                "-w",
                "-t",
                "30",
                "start",
            ],
        );
        out.status.success()
    }

    /// `postgres://drg@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://drg@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs `sql` with `psql`, its output (tuples only, unaligned).
    pub fn psql(&self, sql: &str) -> String {
        self.try_psql(sql)
            .unwrap_or_else(|e| panic!("psql {sql}: {e}"))
    }

    /// Runs `sql` with `psql`: its output, or what it said on failing.
    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-X",
                "-q",
                "-t",
                "-A",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                &self.url(),
                "-c",
                sql,
            ])
            .output()
            .unwrap();
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// A `psql` session left open: what it is sent runs in order, and what its transaction
    /// holds (a row's lock) stays held until it ends or the session is dropped.
    pub fn session(&self) -> Session {
        let child = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-t", "-A", "-d", &self.url()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        Session { child }
    }

    /// Stops the server (fast: open connections are ended).
    pub fn stop(&self) {
        run(
            &self.bin.join("pg_ctl"),
            &["-D", &self.data(), "-m", "fast", "-w", "stop"],
        );
    }

    /// Freezes the server (`SIGSTOP` to the postmaster and every backend), as a VM paused or
    /// a process descheduled mid-write: connections stay open, statements sent wait.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a paused server go on with what it was sent.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// `signal` to the postmaster and its children.
    fn signal(&self, signal: libc::c_int) {
        let pid_file = std::fs::read_to_string(self.dir.path().join("data/postmaster.pid"))
            .expect("the server is running");
        let postmaster: i32 = pid_file.lines().next().unwrap().trim().parse().unwrap();
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // `pid (comm) state ppid ...`: the parent follows the state, after the last ')'.
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<i32>().ok());
            if ppid == Some(postmaster) {
                pids.push(pid);
            }
        }
        for pid in pids {
            // SAFETY: a plain kill(2); the processes are this test's server's.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// Starts it again on the same port (gateways know it).
    pub fn restart(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.launch() {
            assert!(
                Instant::now() < deadline,
                "PostgreSQL did not start again: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        run(
            &self.bin.join("pg_ctl"),
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }
}

/// An open `psql` session ([`Postgres::session`]); killed when dropped.
pub struct Session {
    child: std::process::Child,
}

impl Session {
    /// Sends `sql` and waits until the server answered all of it (a marker it prints after).
    pub fn run(&mut self, sql: &str) {
        use std::io::{BufRead, Write};
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{sql}\nSELECT 'drg-session-done';").unwrap();
        stdin.flush().unwrap();
        let out = self.child.stdout.as_mut().unwrap();
        let mut lines = std::io::BufReader::new(out).lines();
        while let Some(Ok(line)) = lines.next() {
            if line.trim() == "drg-session-done" {
                return;
            }
        }
        panic!("psql ended before answering {sql}");
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
