//! `serve --daemon` as the Debian unit runs it: the call store's SQLite file belongs to the
//! process that serves (its POSIX locks held there, no row lost across upgrades, an outside
//! reader and `kill -9`), the parent returns only once the listener accepts, and an upgrade with
//! nothing to take over exits non-zero. Run as `$(...)` would (stdout and stderr pipes read to
//! their end), it leaves both once it serves and still shows a failed start; it narrows the
//! caller's umask, never widens it.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;

const LOOKUP: &str = "/v1/public/domain/example.org";

/// A daemonized gateway (not our child), killed when the test ends, however it ends.
pub struct Daemon(pub u32);

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: a plain kill(2); the pid was read from the gateway's own pid file.
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGKILL) };
    }
}

pub fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

/// A config folder for daemons: the harness's, its listen address written into the config (so
/// the unit's own commands run unchanged), no process running on it.
pub struct Folder {
    pub dir: tempfile::TempDir,
    pub addr: std::net::SocketAddr,
}

impl Folder {
    pub fn new() -> Folder {
        Folder::with(Gateway::builder())
    }

    pub fn with(builder: GatewayBuilder) -> Folder {
        let gw = builder.start();
        let addr = gw.addr;
        let dir = gw.stop();
        let conf = dir.path().join("gateway.yaml");
        let text = std::fs::read_to_string(&conf).unwrap();
        let text = text.replace("  listen: 127.0.0.1:1\n", &format!("  listen: {addr}\n"));
        std::fs::write(&conf, text).unwrap();
        Folder { dir, addr }
    }

    pub fn conf(&self) -> PathBuf {
        self.dir.path().join("gateway.yaml")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    /// Runs the binary with `args` after `-c <conf>` (stderr, the daemon's too, to
    /// `daemon.log`); its exit status and how long it took.
    pub fn run(&self, args: &[&str], env: &[(&str, &str)]) -> (ExitStatus, Duration) {
        let conf = self.conf();
        let mut command = crate::common::command(BIN);
        command.arg("-c").arg(&conf).args(args);
        self.run_command(command, env)
    }

    pub fn run_command(
        &self,
        mut command: Command,
        env: &[(&str, &str)],
    ) -> (ExitStatus, Duration) {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("daemon.log"))
            .unwrap();
        let started = Instant::now();
        let status = command
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .status()
            .unwrap();
        (status, started.elapsed())
    }

    /// `serve` with `extra`, which must succeed.
    pub fn serve(&self, extra: &[&str]) -> Duration {
        let mut args = vec!["serve"];
        args.extend_from_slice(extra);
        let (status, took) = self.run(&args, &[]);
        assert!(status.success(), "{status}:\n{}", self.log());
        took
    }

    pub fn pid(&self) -> u32 {
        let text = std::fs::read_to_string(self.dir.path().join("pid")).unwrap();
        text.trim().parse().unwrap()
    }

    /// One request to the admin listener (a Unix socket in the folder).
    pub fn admin_get(&self, path: &str) -> std::io::Result<Response> {
        use std::io::Write;
        let stream = std::os::unix::net::UnixStream::connect(self.dir.path().join("admin.sock"))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut reader = std::io::BufReader::new(stream);
        write!(
            reader.get_mut(),
            "GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
        )?;
        read_response(&mut reader)
    }
}

/// Keep-alive clients on a counted route; counts the 200s they saw.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    clients: Vec<thread::JoinHandle<()>>,
}

impl Load {
    fn start(addr: std::net::SocketAddr, clients: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicUsize::new(0));
        let clients = (0..clients)
            .map(|_| {
                let (stop, ok) = (stop.clone(), ok.clone());
                thread::spawn(move || {
                    let mut conn = None;
                    while !stop.load(Ordering::Relaxed) {
                        let c = match &mut conn {
                            Some(c) => c,
                            None => match Conn::open(addr) {
                                Ok(c) => conn.insert(c),
                                Err(_) => continue,
                            },
                        };
                        match c.get(LOOKUP) {
                            Ok(r) => {
                                if r.status == 200 {
                                    ok.fetch_add(1, Ordering::Relaxed);
                                }
                                if r.header("connection") == Some("close") {
                                    conn = None;
                                }
                            }
                            Err(_) => conn = None,
                        }
                        // Steady load, not a flood: the suite runs four tests at a time on two
                        // cores, and an unpaced loop starved the others' deadlines.
                        thread::sleep(Duration::from_millis(2));
                    }
                })
            })
            .collect();
        Load { stop, ok, clients }
    }

    fn ok(&self) -> usize {
        self.ok.load(Ordering::Relaxed)
    }

    fn wait_for(&self, more: usize) {
        let from = self.ok();
        wait_until(Duration::from_secs(30), || self.ok() >= from + more);
    }

    fn finish(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.join().unwrap();
        }
        self.ok.load(Ordering::Relaxed)
    }
}

/// Stored log entries and counted calls, read with a connection of our own.
fn stored(db: &Path) -> (u64, u64) {
    let conn = rusqlite::Connection::open(db).unwrap();
    let entries: i64 = conn
        .query_row("SELECT COALESCE(SUM(entries), 0) FROM chunks", [], |r| {
            r.get(0)
        })
        .unwrap();
    let counted: i64 = conn
        .query_row("SELECT COALESCE(SUM(total), 0) FROM daily", [], |r| {
            r.get(0)
        })
        .unwrap();
    (entries as u64, counted as u64)
}

/// The inodes `pid` holds POSIX locks on, from /proc/locks.
fn posix_locks_of(pid: u32) -> Vec<u64> {
    let text = std::fs::read_to_string("/proc/locks").unwrap();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let at = f.iter().position(|w| *w == "POSIX")?;
            (f.get(at + 3)? == &pid.to_string()).then_some(())?;
            f.get(at + 4)?.rsplit(':').next()?.parse().ok()
        })
        .collect()
}

/// `None` when the file is gone (another opener deleted the `-shm` it believed unused).
fn inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

fn month_count(addr: std::net::SocketAddr) -> u64 {
    let u = Conn::open(addr).unwrap().get("/v1/usage").unwrap().json();
    u["month_count"].as_u64().unwrap()
}

/// The daily totals `/v1/stats` shows (what the serving process stored, read by itself), or
/// its answer when it shows none.
fn stats_total(addr: std::net::SocketAddr) -> Result<u64, String> {
    let r = Conn::open(addr).unwrap().get("/v1/stats").unwrap();
    let s = r.json();
    let days = s["chart"]
        .as_array()
        .ok_or_else(|| format!("{} {s}", r.status))?;
    Ok(days
        .iter()
        .map(|d| d["total_requests"].as_u64().unwrap())
        .sum())
}

/// The upgrade as an operator does it by hand with a daemon: SIGQUIT to the running process,
/// `serve --upgrade --daemon`; then the old process's exit (it closes its SQLite connections).
fn upgrade(folder: &Folder, old: &Daemon) -> Daemon {
    send_signal(old.0, "QUIT");
    folder.serve(&["--upgrade", "--daemon"]);
    let new = Daemon(folder.pid());
    assert_ne!(new.0, old.0);
    wait_until(Duration::from_secs(30), || !alive(old.0));
    new
}

#[test]
fn no_call_is_lost_across_daemon_upgrades_an_outside_reader_and_kill_9() {
    // Every entry kept (the default keeps a project's last 10,000); quota alerts on, for the
    // webhook outbox (no threshold is reached).
    let dir = tempfile::tempdir().unwrap();
    let secret = "a-webhook-secret-of-some-length";
    std::fs::write(dir.path().join("alert.secret"), secret).unwrap();
    let builder = Gateway::builder()
        .in_dir(dir)
        .gateway_yaml("calls:")
        .gateway_yaml("  max_per_project: 10000000")
        .quota_yaml("alerts: { url: 'http://127.0.0.1:9/x', allow_private: true, secret_file: alert.secret }");
    let folder = Folder::with(builder);
    let state = folder.dir.path().join("state");
    let db = state.join("calls.sqlite3");
    let outbox = state.join("webhooks.sqlite-shm");
    folder.serve(&["--daemon"]);
    let first = Daemon(folder.pid());
    let load = Load::start(folder.addr, 4);
    load.wait_for(200);
    let second = upgrade(&folder, &first);
    load.wait_for(200);
    let serving = upgrade(&folder, &second);
    load.wait_for(200);
    // An operator's look at the file while the gateway writes it.
    let seen = stored(&db);
    load.wait_for(300);
    let answered = load.finish() as u64;
    // Everything counted is written (the serving process's own view), then it dies.
    let counted = month_count(folder.addr);
    // Bounded, not asserted here: a process whose file was taken from under it never gets
    // there, and the figures below say by how much.
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats_total(folder.addr) != Ok(counted) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    let served = stats_total(folder.addr);
    let locks = posix_locks_of(serving.0);
    let shm = PathBuf::from(format!("{}-shm", db.display()));
    let files = [inode(&db), inode(&shm)];
    let outbox = inode(&outbox);
    // SAFETY: kill(2) to the daemon named by its pid file.
    unsafe { libc::kill(serving.0 as libc::pid_t, libc::SIGKILL) };
    wait_until(Duration::from_secs(10), || !alive(serving.0));
    let (entries, days) = stored(&db);
    let conn = rusqlite::Connection::open(&db).unwrap();
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    eprintln!(
        "daemon calls: {answered} answered, {counted} counted, {served:?} in /v1/stats before \
         kill -9, {entries} log entries and {days} in the daily counts after it ({seen:?} seen from outside mid-run); \
         POSIX locks of the serving pid {}: {locks:?} (calls file and -shm: {files:?}, \
         webhook outbox -shm: {outbox:?})",
        serving.0
    );
    assert_eq!(integrity, "ok");
    assert!(
        counted >= answered,
        "{counted} counted < {answered} answered"
    );
    assert_eq!((entries, days), (counted, counted), "{}", folder.log());
    assert!(
        locks.iter().any(|l| files.contains(&Some(*l))),
        "the serving process {} holds no lock on the calls file: {locks:?}",
        serving.0
    );
    assert!(
        outbox.is_some_and(|o| locks.contains(&o)),
        "the serving process {} holds no lock on the webhook outbox: {locks:?}",
        serving.0
    );
}

#[test]
fn an_upgrade_with_nothing_to_take_over_exits_non_zero() {
    let folder = Folder::new();
    let (status, took) = folder.run(&["serve", "--upgrade", "--daemon"], &[]);
    eprintln!("serve --upgrade --daemon with nothing running: {status} after {took:?}");
    assert!(!status.success(), "{status}:\n{}", folder.log());
    assert!(Conn::open(folder.addr).is_err(), "something serves");
}

#[test]
fn the_daemon_parent_returns_once_the_listeners_accept() {
    let folder = Folder::new();
    let took = folder.serve(&["--daemon"]);
    // At once: the listeners accept, and the pid file names the process that serves.
    let first = Daemon(folder.pid());
    assert!(listens_on(first.0, folder.addr.port()), "{}", folder.log());
    let r = Conn::open(folder.addr).unwrap().get(LOOKUP).unwrap();
    assert_eq!(r.status, 200);
    assert!(folder.admin_get("/readyz").is_ok());
    // And after an upgrade: the new process holds the socket when its parent returns.
    send_signal(first.0, "QUIT");
    let upgraded = folder.serve(&["--upgrade", "--daemon"]);
    let second = Daemon(folder.pid());
    assert_ne!(second.0, first.0);
    assert!(listens_on(second.0, folder.addr.port()), "{}", folder.log());
    eprintln!(
        "serve --daemon returned after {took:?}, serve --upgrade --daemon after {upgraded:?}"
    );
    // SAFETY: kill(2) to the daemon named by its pid file.
    unsafe { libc::kill(second.0 as libc::pid_t, libc::SIGTERM) };
    wait_until(Duration::from_secs(20), || {
        !alive(second.0) && !alive(first.0)
    });
}

/// What `serve --daemon` left its caller: its exit status, then what came on stderr once both
/// pipes ended, or `None` if they were still open after `within`.
struct Piped {
    status: ExitStatus,
    stderr: Option<String>,
}

/// `serve --daemon` on `folder` as `out=$(...)` runs it: stdout and stderr are pipes, each read
/// to its end by a thread of its own.
fn serve_piped(folder: &Folder, env: &[(&str, &str)], within: Duration) -> Piped {
    use std::io::Read;
    let mut child = crate::common::command(BIN)
        .arg("-c")
        .arg(folder.conf())
        .args(["serve", "--daemon"])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let out: Box<dyn Read + Send> = Box::new(child.stdout.take().unwrap());
    let err: Box<dyn Read + Send> = Box::new(child.stderr.take().unwrap());
    for (which, mut pipe) in [("stdout", out), ("stderr", err)] {
        let tx = tx.clone();
        // Left running if the pipe never ends: it ends with the daemon, killed by the test.
        thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            let _ = tx.send((which, text));
        });
    }
    let status = child.wait().unwrap();
    let deadline = Instant::now() + within;
    let mut stderr = None;
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(("stderr", text)) => stderr = Some(text),
            Ok(_) => {}
            Err(_) => {
                return Piped {
                    status,
                    stderr: None,
                }
            }
        }
    }
    Piped { status, stderr }
}

/// Where descriptor `fd` of `pid` points (`/dev/null`, `pipe:[...]`, a path).
fn fd_target(pid: u32, fd: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|e| e.to_string())
}

#[test]
fn the_daemon_leaves_its_callers_pipes_once_it_serves() {
    let folder = Folder::new();
    let started = Instant::now();
    let piped = serve_piped(&folder, &[], Duration::from_secs(10));
    let took = started.elapsed();
    // Killed when the test ends, however it ends.
    let daemon = Daemon(folder.pid());
    assert!(
        piped.status.success(),
        "{}: {:?}",
        piped.status,
        piped.stderr
    );
    let fds: Vec<String> = (0..3).map(|fd| fd_target(daemon.0, fd)).collect();
    eprintln!(
        "serve --daemon with piped stdout and stderr: both ended after {took:?}; the daemon's \
         stdin, stdout, stderr: {fds:?}"
    );
    assert!(
        piped.stderr.is_some(),
        "the daemon (pid {}) still holds its caller's stdout or stderr 10 s after its parent \
         exited (its descriptors 0-2: {fds:?})",
        daemon.0
    );
    assert_eq!(fds, ["/dev/null"; 3]);
    let r = Conn::open(folder.addr).unwrap().get(LOOKUP).unwrap();
    assert_eq!(r.status, 200);
    // SAFETY: kill(2) to the daemon named by its pid file.
    unsafe { libc::kill(daemon.0 as libc::pid_t, libc::SIGTERM) };
    wait_until(Duration::from_secs(20), || !alive(daemon.0));
}

#[test]
fn a_daemon_that_cannot_start_says_why_on_its_callers_stderr() {
    let folder = Folder::new();
    // check-config passes it; the start fails (the quota clock cannot be read).
    let broken = [("DOMAIN_RISK_GATEWAY_CLOCK_START", "not a time")];
    let piped = serve_piped(&folder, &broken, Duration::from_secs(10));
    let stderr = piped.stderr.expect("the pipes ended");
    eprintln!(
        "serve --daemon that cannot start: {}, stderr:\n{stderr}",
        piped.status
    );
    assert!(!piped.status.success());
    assert!(stderr.contains("is not RFC 3339"), "{stderr}");
    assert!(stderr.contains("stopped before serving"), "{stderr}");
    assert!(Conn::open(folder.addr).is_err(), "something serves");
}

#[test]
fn the_daemon_narrows_its_callers_umask_and_never_widens_it() {
    use std::os::unix::process::CommandExt;
    let folder = Folder::new();
    let umask_of = |pid: u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("Umask:")).unwrap();
        line.split_whitespace().nth(1).unwrap().to_owned()
    };
    let mut seen = Vec::new();
    for (caller, expected) in [(0o077, "0077"), (0o022, "0027")] {
        let mut command = crate::common::command(BIN);
        command
            .arg("-c")
            .arg(folder.conf())
            .args(["serve", "--daemon"]);
        // SAFETY: umask(2) only, between fork and exec.
        unsafe {
            command.pre_exec(move || {
                libc::umask(caller);
                Ok(())
            })
        };
        let (status, _) = folder.run_command(command, &[]);
        assert!(status.success(), "{status}:\n{}", folder.log());
        let daemon = Daemon(folder.pid());
        let umask = umask_of(daemon.0);
        seen.push(format!("{caller:04o} -> {umask}"));
        assert_eq!(
            umask, expected,
            "the daemon's umask, its caller's {caller:04o}"
        );
        // SAFETY: kill(2) to the daemon named by its pid file.
        unsafe { libc::kill(daemon.0 as libc::pid_t, libc::SIGTERM) };
        wait_until(Duration::from_secs(20), || !alive(daemon.0));
    }
    eprintln!("the daemon's umask from its caller's: {seen:?}");
}
