//! Graceful upgrade (`serve --upgrade` + SIGQUIT) and graceful restart (SIGTERM with
//! `drain_seconds`) under load, and what `/readyz` says meanwhile (also under a `fail_closed`
//! Redis store that is down).
//!
//! What counts as a failed request (the clients below apply it exactly): a request is *sent*
//! once its bytes are written without error on a connection the client had no reason to think
//! closed: no `Connection: close` on the previous answer, and no end-of-stream or reset waiting
//! on the socket just before the write. A sent request that gets no complete answer, or an
//! answer with any status but 200, is a failure. A connection found closed before the write is
//! replaced and the request sent on the new one, as HTTP clients do; those are counted apart.
//! During an upgrade a refused connect is a failure too (the listening socket never closes).

use crate::common;
use crate::redis_server;

use std::collections::BTreeMap;
use std::io::{BufReader, ErrorKind, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redis_server::RedisServer;

/// A counted route.
const LOOKUP: &str = "/v1/public/domain/example.org";
const CLIENTS: usize = 8;
/// The harness's `drain_seconds`.
const DRAIN: Duration = Duration::from_secs(1);
/// How far behind the accept loop may run on a loaded CI machine (see `restart_under_load`).
const ACCEPT_LAG: Duration = Duration::from_millis(200);

/// What one client saw.
#[derive(Debug, Default)]
struct Tally {
    /// 200 answers.
    ok: usize,
    /// Sent requests with any other answer, or none: each with why.
    failures: Vec<String>,
    /// Connections opened after the first one (after a `Connection: close` answer).
    reconnects: usize,
    /// Keep-alive connections found closed by the server before a request was written on them.
    closed_before_send: usize,
    /// Whether the client stopped because the listener was gone after a SIGTERM drain.
    stopped_after_drain: bool,
}

/// When a client stops on its own.
#[derive(Debug, Clone)]
enum Until {
    /// Only when told.
    Told,
    /// When told, or at the first request started once the drain is over, less `ACCEPT_LAG`
    /// (the time is set when the drain starts), that finds the listener gone: refused, or reset in the accept queue of a
    /// listener that closed. Before that time every request must be answered.
    DrainEnds(Arc<OnceLock<Instant>>),
}

impl Until {
    /// Whether a request started at `at` may find the listener gone.
    fn may_be_gone(&self, at: Instant) -> bool {
        match self {
            Until::Told => false,
            Until::DrainEnds(end) => end.get().is_some_and(|end| at >= *end),
        }
    }
}

/// The server closed `stream` (end-of-stream or an error is waiting), seen without blocking.
fn closed_by_server(stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    let closed = match stream.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => panic!("unsolicited bytes from the server"),
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    };
    stream.set_nonblocking(false).unwrap();
    closed
}

fn connect(addr: SocketAddr) -> std::io::Result<BufReader<TcpStream>> {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_nodelay(true)?;
    Ok(BufReader::new(s))
}

/// Sends counted GETs over keep-alive until `stop` or `until`, applying the failure rule of
/// this file's header.
fn client(addr: SocketAddr, stop: Arc<AtomicBool>, until: Until, sent: Arc<AtomicUsize>) -> Tally {
    let mut t = Tally::default();
    let mut conn: Option<BufReader<TcpStream>> = None;
    let mut opened = 0usize;
    let request = format!(
        "GET {LOOKUP} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {TEST_SECRET}\r\n\r\n"
    );
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        if let Some(c) = &conn {
            if !c.buffer().is_empty() {
                t.failures.push("bytes after a complete answer".into());
            }
            if closed_by_server(c.get_ref()) {
                t.closed_before_send += 1;
                conn = None;
            }
        }
        let c = match &mut conn {
            Some(c) => c,
            None => match connect(addr) {
                Ok(c) => {
                    opened += 1;
                    conn.insert(c)
                }
                Err(_) if until.may_be_gone(started) => {
                    t.stopped_after_drain = true;
                    break;
                }
                Err(e) => {
                    t.failures.push(format!("connect: {e}"));
                    thread::sleep(Duration::from_millis(10));
                    continue;
                }
            },
        };
        if let Err(e) = c.get_mut().write_all(request.as_bytes()) {
            // Closed under us before the request went out: not sent, so sent again.
            t.closed_before_send += 1;
            eprintln!("write failed ({e}): resending on a new connection");
            conn = None;
            continue;
        }
        sent.fetch_add(1, Ordering::Relaxed);
        match read_response(c) {
            Ok(r) => {
                if r.status == 200 {
                    t.ok += 1;
                } else {
                    t.failures.push(format!(
                        "status {}: {}",
                        r.status,
                        String::from_utf8_lossy(&r.body)
                    ));
                }
                if r.header("connection")
                    .is_some_and(|v| v.eq_ignore_ascii_case("close"))
                {
                    conn = None;
                }
            }
            Err(_) if until.may_be_gone(started) => {
                t.stopped_after_drain = true;
                break;
            }
            Err(e) => {
                t.failures.push(format!("sent, no answer: {e}"));
                conn = None;
            }
        }
    }
    t.reconnects = opened.saturating_sub(1);
    t
}

/// `CLIENTS` clients hammering `addr` until `stop`.
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    clients: Vec<thread::JoinHandle<Tally>>,
}

impl Load {
    fn start(addr: SocketAddr, until: Until) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let clients = (0..CLIENTS)
            .map(|_| {
                let (stop, sent, until) = (stop.clone(), sent.clone(), until.clone());
                thread::spawn(move || client(addr, stop, until, sent))
            })
            .collect();
        Load {
            stop,
            sent,
            clients,
        }
    }

    fn sent(&self) -> usize {
        self.sent.load(Ordering::Relaxed)
    }

    /// Waits until `n` more requests went out (the load is really running).
    fn wait_for(&self, n: usize) {
        let from = self.sent();
        wait_until(Duration::from_secs(20), || self.sent() >= from + n);
    }

    fn finish(self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Tally::default();
        for c in self.clients {
            let t = c.join().unwrap();
            all.ok += t.ok;
            all.failures.extend(t.failures);
            all.reconnects += t.reconnects;
            all.closed_before_send += t.closed_before_send;
            all.stopped_after_drain |= t.stopped_after_drain;
        }
        all
    }
}

fn month_count(gw: &Gateway) -> u64 {
    let u = gw.get("/v1/usage").json();
    u["month_count"]
        .as_u64()
        .unwrap_or_else(|| panic!("no month_count: {u}"))
}

fn admin_readyz(gw: &Gateway) -> Option<(u16, serde_json::Value)> {
    let r = gw.try_admin_get("/readyz").ok()?;
    let v = r.json();
    Some((r.status, v))
}

/// The whole upgrade under load; returns the clients' tally.
fn upgrade_under_load(gw: &mut Gateway) -> Tally {
    let old_pid = gw.pid();
    let port = gw.addr.port();
    let load = Load::start(gw.addr, Until::Told);
    load.wait_for(500);

    let next = gw.start_successor();
    let new_pid = next.pid();
    // The successor is waiting for the sockets once its upgrade socket exists.
    let sock = gw.upgrade_sock();
    wait_until(Duration::from_secs(20), || sock.exists());
    let before = load.sent();
    let quit = Instant::now();
    gw.signal("QUIT");
    wait_until(Duration::from_secs(10), || listens_on(new_pid, port));
    let handed_off = quit.elapsed();

    // Both processes accept until the old one's close timeout ends. Whoever answers the admin
    // socket meanwhile: the old process is never ready again, the new one is.
    let mut old = gw.take_over(next);
    let mut answers: BTreeMap<(u32, u16, String), usize> = BTreeMap::new();
    while !old.exited() {
        assert!(quit.elapsed() < Duration::from_secs(30), "{}", old.log());
        if let Some((status, v)) = admin_readyz(gw) {
            let pid = v["pid"].as_u64().unwrap() as u32;
            let word = v["status"].as_str().unwrap().to_owned();
            *answers.entry((pid, status, word)).or_default() += 1;
        }
        thread::sleep(Duration::from_millis(20));
    }
    let old_gone = quit.elapsed();
    let during = load.sent() - before;
    for ((pid, status, word), n) in &answers {
        if *pid == old_pid {
            assert_eq!((*status, word.as_str()), (503, "upgrading"), "{n} answers");
        } else {
            assert_eq!(*pid, new_pid);
            assert_eq!((*status, word.as_str()), (200, "ready"), "{n} answers");
        }
    }
    // The new process serves alone now.
    load.wait_for(500);
    assert!(listens_on(new_pid, port));
    assert!(!listens_on(old_pid, port));
    let (status, v) = admin_readyz(gw).expect("admin socket after the upgrade");
    assert_eq!((status, v["pid"].as_u64()), (200, Some(u64::from(new_pid))));
    let t = load.finish();
    eprintln!(
        "upgrade figures: {} requests in all, {during} from SIGQUIT until the old process exited; \
         {} failed; {} reconnects after Connection: close, {} connections found closed before a \
         request; successor listening {handed_off:?} after SIGQUIT, old process gone after \
         {old_gone:?}; admin /readyz answers during the hand-off {answers:?}",
        t.ok + t.failures.len(),
        t.failures.len(),
        t.reconnects,
        t.closed_before_send,
    );
    assert!(
        t.failures.is_empty(),
        "{} failures, first: {:?}\nold:\n{}\nnew:\n{}",
        t.failures.len(),
        t.failures.first(),
        old.log(),
        gw.log()
    );
    assert!(old.log().contains("listener sockets sent"), "{}", old.log());
    t
}

#[test]
fn an_upgrade_under_load_fails_no_request_and_loses_no_count() {
    let mut gw = Gateway::builder().start();
    let ok = upgrade_under_load(&mut gw).ok as u64;
    // Both processes count in the one state file, and the old one has exited: every count it
    // made is there.
    assert_eq!(
        month_count(&gw),
        ok,
        "month_count against the 200s the clients saw"
    );
}

#[test]
fn an_upgrade_on_the_redis_store_fails_no_request_and_keeps_one_exact_count() {
    let redis = RedisServer::start(false);
    let mut gw = Gateway::builder()
        .redis(&redis.url(), "fail_closed")
        .start();
    let ok = upgrade_under_load(&mut gw).ok;
    assert_eq!(month_count(&gw), ok as u64);
    let key = format!("q:{{test}}:{}", chrono::Utc::now().format("%Y-%m"));
    assert_eq!(redis.int(&["GET", &key]), Some(ok as i64));
}

/// SIGTERM under load: half the clients stop when the public `/readyz` says 503 (as a load
/// balancer would take the instance out), the others go on until they find the listener gone
/// after the drain. None fails, and the count is the 200s they saw.
fn restart_under_load(builder: GatewayBuilder) -> (Gateway, Tally) {
    let mut gw = builder.start();
    let addr = gw.addr;
    let drain_end = Arc::new(OnceLock::new());
    let watchers = Load::start(addr, Until::Told);
    let stubborn = Load::start(addr, Until::DrainEnds(drain_end.clone()));
    watchers.wait_for(300);
    stubborn.wait_for(300);
    let term = Instant::now();
    // The drain starts when the gateway handles the signal, so it cannot end before this. A
    // connection the kernel completes just before the listener closes can still sit unaccepted
    // in its queue and be reset (docs/operations.md "Restart"); on a busy machine the accept loop runs that
    // far behind, so requests started in the drain's last ACCEPT_LAG may find the listener gone.
    drain_end.set(term + DRAIN - ACCEPT_LAG).unwrap();
    gw.signal("TERM");
    // Readiness says 503 at once, while the gateway still serves.
    let mut c = Conn::open_as(addr, None).unwrap();
    wait_until(Duration::from_secs(5), || {
        let r = c.get("/readyz").unwrap();
        if r.header("connection") == Some("close") {
            c = Conn::open_as(addr, None).unwrap();
        }
        r.status == 503 && r.json()["status"] == "draining"
    });
    let (status, v) = admin_readyz(&gw).expect("admin socket while draining");
    assert_eq!((status, v["status"].as_str()), (503, Some("draining")));
    let not_ready = term.elapsed();
    let mut t = watchers.finish();
    assert!(gw.wait_exit(Duration::from_secs(20)), "{}", gw.log());
    let exited = term.elapsed();
    let rest = stubborn.finish();
    assert!(
        rest.stopped_after_drain,
        "the listener is gone after the drain"
    );
    t.ok += rest.ok;
    t.failures.extend(rest.failures);
    t.reconnects += rest.reconnects;
    t.closed_before_send += rest.closed_before_send;
    eprintln!(
        "restart figures: {} requests answered, {} failed, {} reconnects after Connection: close, \
         {} connections found closed before a request; /readyz 503 {not_ready:?} after SIGTERM, \
         process gone after {exited:?}",
        t.ok,
        t.failures.len(),
        t.reconnects,
        t.closed_before_send
    );
    assert!(
        t.failures.is_empty(),
        "{} failures, first: {:?}\n{}",
        t.failures.len(),
        t.failures.first(),
        gw.log()
    );
    (gw, t)
}

#[test]
fn a_sigterm_restart_under_load_fails_no_request_and_loses_no_count() {
    let (mut gw, t) = restart_under_load(Gateway::builder());
    let dir = std::mem::replace(&mut gw.dir, tempfile::tempdir().unwrap());
    drop(gw);
    let gw = Gateway::builder().in_dir(dir).start();
    assert_eq!(month_count(&gw), t.ok as u64);
}

#[test]
fn a_sigterm_restart_on_the_redis_store_loses_no_count() {
    let redis = RedisServer::start(false);
    let (_gw, t) = restart_under_load(Gateway::builder().redis(&redis.url(), "fail_open"));
    let key = format!("q:{{test}}:{}", chrono::Utc::now().format("%Y-%m"));
    assert_eq!(redis.int(&["GET", &key]), Some(t.ok as i64));
}

#[test]
fn sigquit_without_a_successor_is_not_ready_then_stops() {
    let mut gw = Gateway::builder().start();
    gw.signal("QUIT");
    // Nobody takes the sockets: Pingora retries the hand-off for a few seconds, keeps serving for
    // its close timeout, then stops. Not ready from the signal on.
    wait_until(Duration::from_secs(5), || {
        admin_readyz(&gw).is_some_and(|(s, v)| s == 503 && v["status"] == "upgrading")
    });
    let r = gw.conn_as(None).get("/readyz").unwrap();
    assert_eq!(
        (r.status, r.json()["status"].as_str()),
        (503, Some("upgrading"))
    );
    // Still serving meanwhile, closing each connection after its answer.
    let r = gw.get(LOOKUP);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));
    assert!(gw.wait_exit(Duration::from_secs(30)), "{}", gw.log());
}

#[test]
fn readiness_follows_a_fail_closed_redis_without_traffic() {
    let mut redis = RedisServer::start(false);
    let gw = Gateway::builder()
        .redis(&redis.url(), "fail_closed")
        .start();
    let public = |gw: &Gateway| {
        let r = gw.conn_as(None).get("/readyz").unwrap();
        (r.status, r.json()["status"].as_str().unwrap().to_owned())
    };
    assert_eq!(public(&gw), (200, "ready".to_owned()));
    redis.kill();
    // No counted call is made: the background probe alone notices.
    wait_until(Duration::from_secs(10), || {
        public(&gw) == (503, "quota_store_unavailable".to_owned())
    });
    let (status, v) = admin_readyz(&gw).unwrap();
    assert_eq!(status, 503);
    assert_eq!(v["status"], "quota_store_unavailable");
    assert_eq!(v["quota"]["refusing_calls"], true, "{v}");
    // And it is the truth: a counted call is refused.
    assert_eq!(gw.get(LOOKUP).status, 503);
    redis.restart();
    wait_until(Duration::from_secs(10), || public(&gw).0 == 200);
    let (status, v) = admin_readyz(&gw).unwrap();
    assert_eq!(
        (status, &v["quota"]["refusing_calls"]),
        (200, &serde_json::json!(false))
    );
    assert_eq!(gw.get(LOOKUP).status, 200);
}

/// Kills a daemonized gateway (not our child) when the test ends, however it ends.
struct Daemon(u32);

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: a plain kill(2); the pid was read from the gateway's own pid file.
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGKILL) };
    }
}

fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

fn read_pid(path: &std::path::Path) -> u32 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The daemon upgrade by hand, SIGQUIT first: `serve --daemon` returns once the gateway is up
/// and writes the pid file; then SIGQUIT to it and `serve --upgrade --daemon`, whose parent
/// returns once the new process serves; the old exits. (The unit's own order, where the new
/// process sends SIGQUIT itself, is `service::a_failed_reload_...`.)
#[test]
fn the_daemon_upgrade_dance_by_hand() {
    // The harness writes the config (pid file and upgrade socket in the folder); the daemon runs
    // on it once the harness's own process has stopped.
    let gw = Gateway::builder().start();
    let addr = gw.addr;
    let dir = gw.stop();
    let (conf, pid_file) = (dir.path().join("gateway.yaml"), dir.path().join("pid"));
    // `--daemon` alone makes the parent wait until the gateway serves (no config key needed).
    let serve = |extra: &[&str]| {
        let mut args = vec!["-c", conf.to_str().unwrap(), "serve", "--listen"];
        let listen = addr.to_string();
        args.push(&listen);
        args.extend_from_slice(extra);
        // The daemon keeps the parent's stderr: a file, so that nothing waits for it to close.
        let log = dir.path().join("daemon.log");
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let status = crate::common::command(BIN)
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .status()
            .unwrap();
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(status.success(), "{log}");
    };
    let ready = |pid: u32| {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(listens_on(pid, addr.port())
            && Conn::open_as(addr, None)
                .and_then(|mut c| c.get("/readyz"))
                .is_ok_and(|r| r.status == 200))
        {
            let log = std::fs::read_to_string(dir.path().join("daemon.log")).unwrap_or_default();
            assert!(Instant::now() < deadline, "{pid} not serving:\n{log}");
            thread::sleep(Duration::from_millis(20));
        }
    };
    serve(&["--daemon"]);
    let old = Daemon(read_pid(&pid_file));
    ready(old.0);
    // By hand: the old process first, then the new one (which finds it handing over already).
    let quit = std::process::Command::new("kill")
        .args(["-QUIT", &old.0.to_string()])
        .status()
        .unwrap();
    assert!(quit.success());
    serve(&["--upgrade", "--daemon"]);
    let new = Daemon(read_pid(&pid_file));
    assert_ne!(new.0, old.0, "the pid file names the new process");
    ready(new.0);
    wait_until(Duration::from_secs(20), || !alive(old.0));
    let admin = std::os::unix::net::UnixStream::connect(dir.path().join("admin.sock")).unwrap();
    let mut reader = BufReader::new(admin);
    write!(
        reader.get_mut(),
        "GET /readyz HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let r = read_response(&mut reader).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["pid"].as_u64(), Some(u64::from(new.0)));
    // systemctl stop.
    // SAFETY: a plain kill(2) to the daemon named by its pid file.
    unsafe { libc::kill(new.0 as libc::pid_t, libc::SIGTERM) };
    wait_until(Duration::from_secs(20), || !alive(new.0));
}
