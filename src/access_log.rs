//! The JSON access log: one line per request the public listener answers, built on the request
//! path by a pure function ([`format_line`]) and written off it by a dedicated thread.
//!
//! A request only pays for building its line and a non-blocking `try_send` into a bounded
//! channel; when the channel is full the line is dropped and counted
//! (`drg_access_log_dropped_total`), so a slow disk or a stalled stderr pipe can never hold a
//! request up. The writer thread buffers lines and flushes as soon as the channel runs empty (and
//! at least every `flush_interval_ms` under a steady stream), so `tail -f` sees lines at once.
//! SIGUSR1 makes it reopen its file (logrotate's `create` mode); a failed reopen keeps the old
//! file. Emails are never written whole: the local part is masked to its first two characters.

use std::borrow::Cow;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use percent_encoding::percent_decode_str;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::IntCounter;
use serde::{Serialize, Serializer};
use tokio::signal::unix::{signal, SignalKind};

use crate::config::AccessLogConfig;

/// Longest target kept, in characters (a domain has at most 253; the check route allows 254).
pub const MAX_TARGET_CHARS: usize = 256;
/// Longest origin kept, in bytes (anything longer is not an origin a browser sends).
pub const MAX_ORIGIN_BYTES: usize = 256;
/// Longest request id kept, in bytes (the gateway only keeps sane ids of at most 128).
const MAX_REQUEST_ID_BYTES: usize = 128;
/// The writer's buffer: large enough to batch a burst into few `write` calls.
const WRITE_BUFFER_BYTES: usize = 64 * 1024;
/// How long the shutdown waits for queued lines to reach the file.
const FINISH_WITHIN: Duration = Duration::from_secs(5);

/// Why the access log could not be opened at start.
#[derive(Debug, thiserror::Error)]
pub enum AccessLogError {
    #[error("gateway.access_log.path {path}: cannot open it for appending: {source}")]
    Open { path: PathBuf, source: io::Error },
}

/// What one request contributes to its line; every field borrowed from the request and its
/// context, so building it allocates nothing.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    /// When the request started.
    pub time: DateTime<Utc>,
    pub request_id: Option<&'a str>,
    pub method: &'a str,
    /// The route class, as in the metrics.
    pub route: &'static str,
    /// The raw (still percent-encoded) path parameter of a domain or check route.
    pub target: Option<&'a str>,
    /// 0 when no response was sent.
    pub status: u16,
    pub duration: Duration,
    pub upstream_status: Option<u16>,
    pub upstream_duration: Option<Duration>,
    pub key_id: Option<&'a str>,
    /// The `Origin` header's bytes, as received.
    pub origin: Option<&'a [u8]>,
    /// Response body bytes sent to the client.
    pub bytes_sent: usize,
}

/// The line's JSON object, field order as documented.
#[derive(Serialize)]
struct Line<'a> {
    #[serde(serialize_with = "rfc3339_millis")]
    time: DateTime<Utc>,
    request_id: Option<&'a str>,
    method: &'a str,
    route: &'static str,
    target: Option<Target<'a>>,
    status: u16,
    duration_us: u64,
    upstream_status: Option<u16>,
    upstream_duration_us: Option<u64>,
    key_id: Option<&'a str>,
    origin: Option<Cow<'a, str>>,
    bytes_sent: usize,
}

fn rfc3339_millis<S: Serializer>(time: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&time.format("%Y-%m-%dT%H:%M:%S%.3fZ"))
}

/// A target for the log: bounded, with an email's local part masked.
struct Target<'a>(Cow<'a, str>);

impl Serialize for Target<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl fmt::Display for Target<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Whatever the route, anything with an `@` is treated as an email (a domain route given
        // an address must not log it whole either). The mask comes before any cut, so a long
        // local part cannot pass for a domain.
        match self.0.rsplit_once('@') {
            Some((local, domain)) => {
                if local.chars().nth(2).is_some() {
                    f.write_str(truncate_chars(local, 2))?;
                }
                f.write_str("****@")?;
                f.write_str(truncate_chars(domain, MAX_TARGET_CHARS))
            }
            None => f.write_str(truncate_chars(&self.0, MAX_TARGET_CHARS)),
        }
    }
}

/// The first `max` characters of `s`.
fn truncate_chars(s: &str, max: usize) -> &str {
    s.char_indices().nth(max).map_or(s, |(i, _)| &s[..i])
}

/// The first `max` bytes of `s`, cut back to a character boundary.
fn truncate_bytes(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The line for `entry`, newline included. serde_json escapes every quote, backslash and control
/// character, so no request value can end a field or a line early.
pub fn format_line(entry: &Entry<'_>) -> Vec<u8> {
    let origin = entry.origin.map(|o| {
        let o = &o[..o.len().min(MAX_ORIGIN_BYTES)];
        String::from_utf8_lossy(o)
    });
    let line = Line {
        time: entry.time,
        request_id: entry
            .request_id
            .map(|r| truncate_bytes(r, MAX_REQUEST_ID_BYTES)),
        method: truncate_bytes(entry.method, 16),
        route: entry.route,
        target: entry
            .target
            .map(|raw| Target(percent_decode_str(raw).decode_utf8_lossy())),
        status: entry.status,
        duration_us: micros(entry.duration),
        upstream_status: entry.upstream_status,
        upstream_duration_us: entry.upstream_duration.map(micros),
        key_id: entry.key_id,
        origin,
        bytes_sent: entry.bytes_sent,
    };
    let mut out = Vec::with_capacity(320);
    // Our own struct of strings and numbers: serialising it into a Vec cannot fail.
    if serde_json::to_writer(&mut out, &line).is_err() {
        out.clear();
        out.extend_from_slice(br#"{"error":"unloggable request"}"#);
    }
    out.push(b'\n');
    out
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

enum Msg {
    Line(Vec<u8>),
    /// Look at the reopen flag now.
    Wake,
    /// Write what is queued, flush and end.
    Stop,
}

/// The request side of the log; cheap to clone.
#[derive(Clone)]
pub struct AccessLog {
    tx: SyncSender<Msg>,
    dropped: IntCounter,
    shared: Arc<Control>,
}

/// What the request side, the signal service and the shutdown share.
struct Control {
    reopen: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl AccessLog {
    /// Queues a line without waiting; a full queue drops it (counted).
    pub fn send(&self, line: Vec<u8>) {
        if self.tx.try_send(Msg::Line(line)).is_err() {
            self.dropped.inc();
        }
    }

    /// Writes what is queued and stops the writer; called once the server has stopped serving.
    /// Bounded in time: a writer stuck on a blocked pipe does not hold the exit up.
    pub fn finish(&self) {
        let Some(thread) = self.shared.thread.lock().ok().and_then(|mut t| t.take()) else {
            return;
        };
        let deadline = Instant::now() + FINISH_WITHIN;
        let mut stop = Msg::Stop;
        loop {
            match self.tx.try_send(stop) {
                Ok(()) | Err(TrySendError::Disconnected(_)) => break,
                Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                    stop = m;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(TrySendError::Full(_)) => break,
            }
        }
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if thread.is_finished() {
            let _ = thread.join();
        } else {
            log::error!("access log: queued lines not written within {FINISH_WITHIN:?} at exit");
        }
    }

    fn request_reopen(&self) {
        self.shared.reopen.store(true, Ordering::Relaxed);
        // A full queue wakes the writer anyway; it looks at the flag after every line.
        let _ = self.tx.try_send(Msg::Wake);
    }
}

/// The writer thread's state.
struct Writer {
    rx: Receiver<Msg>,
    out: BufWriter<Box<dyn Write + Send>>,
    /// `None`: stderr, never reopened.
    path: Option<PathBuf>,
    control: Arc<Control>,
    flush_every: Duration,
    lines: IntCounter,
    dropped: IntCounter,
    /// Lines buffered since the last flush.
    pending: u64,
    /// Whether the last write failed (its error is logged once, not per line).
    failing: bool,
}

impl Writer {
    fn run(mut self) {
        let mut last_flush = Instant::now();
        loop {
            let msg = match self.rx.try_recv() {
                Ok(m) => Some(m),
                Err(TryRecvError::Disconnected) => break,
                Err(TryRecvError::Empty) => {
                    // Idle: what is buffered goes out now, so `tail -f` is never behind.
                    self.flush();
                    last_flush = Instant::now();
                    match self.rx.recv_timeout(self.flush_every) {
                        Ok(m) => Some(m),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
            };
            match msg {
                Some(Msg::Line(line)) => self.write(&line),
                Some(Msg::Stop) => break,
                Some(Msg::Wake) | None => {}
            }
            if self.control.reopen.swap(false, Ordering::Relaxed) {
                self.reopen();
            }
            if last_flush.elapsed() >= self.flush_every {
                self.flush();
                last_flush = Instant::now();
            }
        }
        self.flush();
    }

    fn write(&mut self, line: &[u8]) {
        match self.out.write_all(line) {
            Ok(()) => self.pending += 1,
            Err(e) => {
                self.dropped.inc();
                self.report(&e);
            }
        }
    }

    fn flush(&mut self) {
        if self.pending == 0 && self.out.buffer().is_empty() {
            return;
        }
        let buffered = self.pending;
        self.pending = 0;
        match self.out.flush() {
            Ok(()) => {
                self.lines.inc_by(buffered);
                self.failing = false;
            }
            Err(e) => {
                // The bytes the sink refused stay buffered and are retried with the next
                // flush, but a failing disk may never take them: the batch counts as dropped.
                self.dropped.inc_by(buffered);
                self.report(&e);
            }
        }
    }

    fn report(&mut self, e: &io::Error) {
        if !self.failing {
            self.failing = true;
            log::error!("access log: cannot write: {e}; lines are dropped until writes succeed");
        }
    }

    fn reopen(&mut self) {
        let Some(path) = self.path.clone() else {
            log::info!("SIGUSR1: the access log goes to stderr, nothing to reopen");
            return;
        };
        self.flush();
        match open_append(&path) {
            Ok(file) => {
                self.out = BufWriter::with_capacity(WRITE_BUFFER_BYTES, Box::new(file));
                log::info!("SIGUSR1: access log reopened at {}", path.display());
            }
            Err(e) => log::error!(
                "SIGUSR1: cannot reopen the access log {}: {e}; still writing to the old file",
                path.display()
            ),
        }
    }
}

fn open_append(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // Key ids and masked emails: readable by the owner and the log group, not by everyone.
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(path)
}

/// The background service: starts the writer thread (after Pingora may have forked into a
/// daemon, which would lose a thread started earlier) and turns SIGUSR1 into reopen requests.
pub struct AccessLogService {
    log: Option<AccessLog>,
    writer: Mutex<Option<Writer>>,
}

/// The access log as configured: the request-side handle (`None` when off) and the service that
/// runs the writer. Opens the file now, so a bad path stops the start with a clear error.
pub fn open(
    config: &AccessLogConfig,
    lines: IntCounter,
    dropped: IntCounter,
) -> Result<(Option<AccessLog>, AccessLogService), AccessLogError> {
    if !config.enabled {
        return Ok((
            None,
            AccessLogService {
                log: None,
                writer: Mutex::new(None),
            },
        ));
    }
    let out: Box<dyn Write + Send> = match &config.path {
        Some(path) => Box::new(open_append(path).map_err(|source| AccessLogError::Open {
            path: path.clone(),
            source,
        })?),
        None => Box::new(io::stderr()),
    };
    let (log, writer) = channel(
        out,
        config.path.clone(),
        config.buffer_lines,
        config.flush_interval,
        lines,
        dropped,
    );
    Ok((
        Some(log.clone()),
        AccessLogService {
            log: Some(log),
            writer: Mutex::new(Some(writer)),
        },
    ))
}

fn channel(
    out: Box<dyn Write + Send>,
    path: Option<PathBuf>,
    capacity: usize,
    flush_every: Duration,
    lines: IntCounter,
    dropped: IntCounter,
) -> (AccessLog, Writer) {
    let (tx, rx) = mpsc::sync_channel(capacity);
    let control = Arc::new(Control {
        reopen: AtomicBool::new(false),
        thread: Mutex::new(None),
    });
    let log = AccessLog {
        tx,
        dropped: dropped.clone(),
        shared: control.clone(),
    };
    let writer = Writer {
        rx,
        out: BufWriter::with_capacity(WRITE_BUFFER_BYTES, out),
        path,
        control,
        flush_every,
        lines,
        dropped,
        pending: 0,
        failing: false,
    };
    (log, writer)
}

fn spawn(log: &AccessLog, writer: Writer) {
    match std::thread::Builder::new()
        .name("access-log".into())
        .spawn(move || writer.run())
    {
        Ok(handle) => {
            if let Ok(mut slot) = log.shared.thread.lock() {
                *slot = Some(handle);
            }
        }
        Err(e) => log::error!("access log: cannot start the writer thread: {e}"),
    }
}

#[async_trait]
impl BackgroundService for AccessLogService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let writer = self.writer.lock().ok().and_then(|mut w| w.take());
        if let (Some(log), Some(writer)) = (&self.log, writer) {
            spawn(log, writer);
        }
        // Installed even with the log off: SIGUSR1's default action would end the process,
        // and a logrotate rule left behind must not take the gateway down.
        let mut usr1 = match signal(SignalKind::user_defined1()) {
            Ok(s) => s,
            Err(e) => {
                log::warn!("access log: SIGUSR1 unavailable: {e}");
                return;
            }
        };
        loop {
            tokio::select! {
                Some(()) = usr1.recv() => match &self.log {
                    Some(log) => log.request_reopen(),
                    None => log::info!("SIGUSR1: the access log is off, nothing to reopen"),
                },
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        // The writer keeps running: requests still in flight log after this.
                        // `AccessLog::finish` ends it once the server has stopped.
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel as unbounded;

    fn entry() -> Entry<'static> {
        Entry {
            time: DateTime::parse_from_rfc3339("2026-11-22T15:01:59.123456Z")
                .unwrap()
                .with_timezone(&Utc),
            request_id: Some("abc"),
            method: "GET",
            route: "domain",
            target: Some("example.com"),
            status: 200,
            duration: Duration::from_micros(42),
            upstream_status: None,
            upstream_duration: None,
            key_id: Some("k1"),
            origin: None,
            bytes_sent: 99,
        }
    }

    fn parse(line: &[u8]) -> serde_json::Value {
        assert_eq!(line.last(), Some(&b'\n'));
        let text = std::str::from_utf8(line).unwrap();
        assert_eq!(text.matches('\n').count(), 1, "one line: {text}");
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn a_line_has_every_field() {
        let v = parse(&format_line(&entry()));
        assert_eq!(
            v,
            serde_json::json!({
                "time": "2026-11-22T15:01:59.123Z", "request_id": "abc", "method": "GET",
                "route": "domain", "target": "example.com", "status": 200, "duration_us": 42,
                "upstream_status": null, "upstream_duration_us": null, "key_id": "k1",
                "origin": null, "bytes_sent": 99
            })
        );
    }

    fn target(raw: &str) -> serde_json::Value {
        let e = Entry {
            target: Some(raw),
            ..entry()
        };
        parse(&format_line(&e))["target"].clone()
    }

    #[test]
    fn email_local_parts_are_masked() {
        assert_eq!(target("john.doe@example.com"), "jo****@example.com");
        assert_eq!(target("joh@example.com"), "jo****@example.com");
        assert_eq!(target("jo@example.com"), "****@example.com");
        assert_eq!(target("j@example.com"), "****@example.com");
        assert_eq!(target("@example.com"), "****@example.com");
        // Percent-encoded `@`, multi-byte local parts, several `@`: never the whole address.
        assert_eq!(target("john%40example.com"), "jo****@example.com");
        assert_eq!(target("élodie@exemple.fr"), "él****@exemple.fr");
        assert_eq!(target("\"a@b\"@example.com"), "\"a****@example.com");
        assert_eq!(target("example.com"), "example.com");
    }

    #[test]
    fn hostile_values_stay_inside_their_field() {
        let origin = b"https://a.example\"\n,\"key_id\":\"admin\"}\r\n{\"x\":\"\\\x00\xff";
        let e = Entry {
            origin: Some(origin),
            target: Some("evil%0A%22%7D%0D%0A%7B%22status%22%3A200"),
            request_id: Some("id\"\n"),
            ..entry()
        };
        let v = parse(&format_line(&e));
        assert_eq!(
            v["origin"],
            "https://a.example\"\n,\"key_id\":\"admin\"}\r\n{\"x\":\"\\\u{0}\u{fffd}"
        );
        assert_eq!(v["key_id"], "k1");
        assert_eq!(v["target"], "evil\n\"}\r\n{\"status\":200");
        assert_eq!(v["status"], 200);
        assert_eq!(v["request_id"], "id\"\n");
    }

    #[test]
    fn long_values_are_bounded() {
        let long = "a".repeat(10_000);
        let origin = "o".repeat(10_000);
        let e = Entry {
            target: Some(&long),
            origin: Some(origin.as_bytes()),
            ..entry()
        };
        let v = parse(&format_line(&e));
        assert_eq!(v["target"].as_str().unwrap().len(), MAX_TARGET_CHARS);
        assert_eq!(v["origin"].as_str().unwrap().len(), MAX_ORIGIN_BYTES);
        assert_eq!(target(&format!("{long}@example.com")), "aa****@example.com");
        let v = target(&format!("jo@{long}"));
        assert_eq!(v.as_str().unwrap().len(), "****@".len() + MAX_TARGET_CHARS);
        assert_eq!(truncate_bytes("ééé", 3), "é");
    }

    fn counters() -> (IntCounter, IntCounter) {
        (
            IntCounter::new("lines", "l").unwrap(),
            IntCounter::new("dropped", "d").unwrap(),
        )
    }

    /// A sink whose writes wait for a go-ahead, announcing each one.
    struct Gate {
        entered: mpsc::Sender<()>,
        go: Receiver<()>,
        seen: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let _ = self.entered.send(());
            let _ = self.go.recv();
            self.seen.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_blocking() {
        let (entered_tx, entered) = unbounded();
        let (go, go_rx) = unbounded();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let gate = Gate {
            entered: entered_tx,
            go: go_rx,
            seen: seen.clone(),
        };
        let (lines, dropped) = counters();
        let (log, writer) = channel(
            Box::new(gate),
            None,
            2,
            Duration::from_secs(1),
            lines.clone(),
            dropped.clone(),
        );
        spawn(&log, writer);
        log.send(b"1\n".to_vec());
        // The writer took line 1 and is stuck writing it: the queue is empty and nothing drains.
        entered.recv().unwrap();
        log.send(b"2\n".to_vec());
        log.send(b"3\n".to_vec());
        assert_eq!(dropped.get(), 0);
        log.send(b"4\n".to_vec());
        log.send(b"5\n".to_vec());
        assert_eq!(dropped.get(), 2, "lines beyond the queue are dropped");
        // Unblock every write from now on.
        for _ in 0..100 {
            go.send(()).unwrap();
        }
        log.finish();
        assert_eq!(&*seen.lock().unwrap(), b"1\n2\n3\n");
        assert_eq!(lines.get(), 3);
        assert_eq!(dropped.get(), 2);
    }

    #[test]
    fn reopen_moves_to_a_new_file_and_a_failed_one_keeps_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let (lines, dropped) = counters();
        let (log, writer) = channel(
            Box::new(open_append(&path).unwrap()),
            Some(path.clone()),
            16,
            Duration::from_millis(50),
            lines.clone(),
            dropped,
        );
        spawn(&log, writer);
        let wait_for = |n: u64| {
            let start = Instant::now();
            while lines.get() < n {
                assert!(start.elapsed() < Duration::from_secs(10), "{n} lines");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        log.send(b"a\n".to_vec());
        wait_for(1);
        let rotated = dir.path().join("access.log.1");
        std::fs::rename(&path, &rotated).unwrap();
        log.request_reopen();
        // The reopen is done before the next line is written: this one goes to the new file.
        log.send(b"b\n".to_vec());
        wait_for(2);
        assert_eq!(std::fs::read_to_string(&rotated).unwrap(), "a\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "b\n");

        // The path's folder is gone: the reopen fails and the old file keeps the lines.
        let moved = dir.path().join("moved");
        std::fs::create_dir(&moved).unwrap();
        let kept = moved.join("kept.log");
        std::fs::rename(&path, &kept).unwrap();
        std::fs::create_dir(&path).unwrap();
        log.request_reopen();
        log.send(b"c\n".to_vec());
        log.finish();
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "b\nc\n");
    }
}
