//! The JSON access log: one line per request the public listener answers, built on the request
//! path by a pure function ([`write_line`]) and written off it by a dedicated thread.
//!
//! A request appends its line to its thread's shard of a bounded buffer (no allocation, no
//! channel, no wake-up while the writer is busy); a full shard drops the line and counts it
//! (`drg_access_log_dropped_total`), so a slow disk or a stalled stderr pipe can never hold a
//! request up. The writer swaps the shards' buffers out every `LINGER` while lines come, and
//! parks when none do (the next line unparks it), so `tail -f` is a few milliseconds behind and
//! a busy gateway pays one write(2) per batch, not per line.
//! SIGUSR1 makes it reopen its file (logrotate's `create` mode); a failed reopen keeps the old
//! file. Emails are never written whole: the local part is masked to its first two characters,
//! in the target (percent-encoded at any depth or not) and in the free-text fields a client
//! fills (`Origin`, `X-Request-Id`), by [`crate::redact`].

use std::borrow::Cow;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use drg_base::service::{Service, Shutdown};
use percent_encoding::percent_decode_str;
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
/// How long the writer lets lines gather once one has come (at most `flush_interval_ms`).
const LINGER: Duration = Duration::from_millis(10);

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
    pub time: SystemTime,
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
    /// A plan in shadow mode would have refused the call: `quota_exceeded` or `rate_limited`.
    pub would_reject: Option<&'static str>,
    /// The request's trace id (32 hex digits), when tracing is on.
    pub trace_id: Option<&'a str>,
}

/// The line's JSON object, field order as documented.
#[derive(Serialize)]
struct Line<'a> {
    #[serde(serialize_with = "rfc3339_millis")]
    time: SystemTime,
    request_id: Option<Cow<'a, str>>,
    method: Cow<'a, str>,
    route: &'static str,
    target: Option<Target<'a>>,
    status: u16,
    duration_us: u64,
    upstream_status: Option<u16>,
    upstream_duration_us: Option<u64>,
    key_id: Option<&'a str>,
    origin: Option<Cow<'a, str>>,
    bytes_sent: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    would_reject: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<&'a str>,
}

fn rfc3339_millis<S: Serializer>(time: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    thread_local! {
        /// The formatted date and time of the last second seen on this thread: calendar maths
        /// and chrono's formatter (which parses its pattern on every call) were a measurable
        /// share of a line's cost.
        static SECOND: std::cell::Cell<(u64, [u8; 19])> = const { std::cell::Cell::new((u64::MAX, [0; 19])) };
    }
    let full = |s: S| s.collect_str(&DateTime::<Utc>::from(*time).format("%Y-%m-%dT%H:%M:%S%.3fZ"));
    let Ok(since) = time.duration_since(UNIX_EPOCH) else {
        return full(s);
    };
    let second = since.as_secs();
    let prefix = SECOND.with(|cached| {
        let (at, prefix) = cached.get();
        if at == second {
            return Some(prefix);
        }
        let text = DateTime::<Utc>::from(*time)
            .format("%Y-%m-%dT%H:%M:%S")
            .to_string();
        let prefix: [u8; 19] = text.as_bytes().try_into().ok()?;
        cached.set((second, prefix));
        Some(prefix)
    });
    // Years past 9999 do not fit the cache: chrono formats those in full.
    let Some(prefix) = prefix else {
        return full(s);
    };
    let millis = since.subsec_millis();
    let mut out = [0u8; 24];
    out[..19].copy_from_slice(&prefix);
    out[19] = b'.';
    out[20] = b'0' + (millis / 100) as u8;
    out[21] = b'0' + (millis / 10 % 10) as u8;
    out[22] = b'0' + (millis % 10) as u8;
    out[23] = b'Z';
    match std::str::from_utf8(&out) {
        Ok(text) => s.serialize_str(text),
        Err(_) => full(s),
    }
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
        // Whatever the route, anything with an `@` (or a `%40`, `%2540`, ... left after the one
        // decoding the routes do) is treated as an email: a domain route given an address must
        // not log it whole either. The mask comes before the cut, so a long local part cannot
        // pass for a domain.
        let masked = crate::redact::mask_address(&self.0);
        f.write_str(truncate_chars(&masked, MAX_TARGET_CHARS))
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

/// Text a client chose (a header, the method), for the log: addresses masked, then cut to `max`
/// bytes. Masked before the cut, which could leave the `%4` of a `%40` the mask would not see;
/// borrowed (no copy) when there is nothing to mask, as nearly always.
fn client_text(bytes: &[u8], max: usize) -> Cow<'_, str> {
    let masked = match String::from_utf8_lossy(bytes) {
        Cow::Borrowed(text) => crate::redact::mask_emails(text),
        Cow::Owned(text) => Cow::Owned(crate::redact::mask_emails(&text).into_owned()),
    };
    match masked {
        Cow::Borrowed(text) => Cow::Borrowed(truncate_bytes(text, max)),
        Cow::Owned(mut text) => {
            let end = truncate_bytes(&text, max).len();
            text.truncate(end);
            Cow::Owned(text)
        }
    }
}

/// Appends the line for `entry`, newline included, to `out`. serde_json escapes every quote,
/// backslash and control character, so no request value can end a field or a line early.
pub fn write_line(out: &mut Vec<u8>, entry: &Entry<'_>) {
    let line = Line {
        time: entry.time,
        request_id: entry
            .request_id
            .map(|r| client_text(r.as_bytes(), MAX_REQUEST_ID_BYTES)),
        method: client_text(entry.method.as_bytes(), 16),
        route: entry.route,
        target: entry
            .target
            .map(|raw| Target(percent_decode_str(raw).decode_utf8_lossy())),
        status: entry.status,
        duration_us: micros(entry.duration),
        upstream_status: entry.upstream_status,
        upstream_duration_us: entry.upstream_duration.map(micros),
        key_id: entry.key_id,
        origin: entry.origin.map(|o| client_text(o, MAX_ORIGIN_BYTES)),
        bytes_sent: entry.bytes_sent,
        would_reject: entry.would_reject,
        trace_id: entry.trace_id,
    };
    let start = out.len();
    // Our own struct of strings and numbers: serialising it into a Vec cannot fail.
    if serde_json::to_writer(&mut *out, &line).is_err() {
        out.truncate(start);
        out.extend_from_slice(br#"{"error":"unloggable request"}"#);
    }
    out.push(b'\n');
}

/// The line for `entry` on its own.
pub fn format_line(entry: &Entry<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(320);
    write_line(&mut out, entry);
    out
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Lines waiting for the writer, in one shard.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    lines: u64,
}

/// The request side of the log; cheap to clone.
#[derive(Clone)]
pub struct AccessLog {
    shared: Arc<Shared>,
}

/// What the request side, the writer, the signal service and the shutdown share.
struct Shared {
    /// Requests append to the shard of their thread: a worker thread's lock is only ever
    /// contended by the writer's swap, and a line costs no allocation, no channel and no wake-up.
    shards: Box<[Mutex<Batch>]>,
    /// Lines a shard may hold before new ones are dropped.
    shard_lines: u64,
    dropped: IntCounter,
    /// Set by the writer before it parks with nothing to write; the next line unparks it.
    idle: AtomicBool,
    reopen: AtomicBool,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Shared {
    fn wake(&self) {
        if let Ok(t) = self.thread.lock() {
            if let Some(t) = t.as_ref() {
                t.thread().unpark();
            }
        }
    }
}

/// This thread's shard number.
fn shard_index(shards: usize) -> usize {
    use std::sync::atomic::AtomicUsize;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|i| *i) % shards
}

impl AccessLog {
    /// Adds the line for `entry` without waiting; a full shard drops it (counted).
    pub fn send(&self, entry: &Entry<'_>) {
        self.push(|out| write_line(out, entry));
    }

    fn push(&self, write: impl FnOnce(&mut Vec<u8>)) {
        let shared = &self.shared;
        let Ok(mut batch) = shared.shards[shard_index(shared.shards.len())].lock() else {
            shared.dropped.inc();
            return;
        };
        if batch.lines >= shared.shard_lines {
            drop(batch);
            shared.dropped.inc();
            return;
        }
        write(&mut batch.bytes);
        batch.lines += 1;
        drop(batch);
        if shared.idle.load(Ordering::Relaxed) && shared.idle.swap(false, Ordering::AcqRel) {
            shared.wake();
        }
    }

    /// Writes what is queued and stops the writer; called once the server has stopped serving.
    /// Bounded in time: a writer stuck on a blocked pipe does not hold the exit up.
    pub fn finish(&self) {
        let Some(thread) = self.shared.thread.lock().ok().and_then(|mut t| t.take()) else {
            return;
        };
        self.shared.stop.store(true, Ordering::Release);
        thread.thread().unpark();
        let deadline = Instant::now() + FINISH_WITHIN;
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
        self.shared.reopen.store(true, Ordering::Release);
        self.shared.wake();
    }
}

/// The writer thread's state.
struct Writer {
    shared: Arc<Shared>,
    out: BufWriter<Box<dyn Write + Send>>,
    /// `None`: stderr, never reopened.
    path: Option<PathBuf>,
    flush_every: Duration,
    lines: IntCounter,
    dropped: IntCounter,
    /// Lines buffered since the last flush.
    pending: u64,
    /// Whether the last write failed (its error is logged once, not per line).
    failing: bool,
    /// The buffer swapped into a shard for the one taken out (keeps its capacity).
    spare: Vec<u8>,
}

impl Writer {
    fn run(mut self) {
        loop {
            let stop = self.shared.stop.load(Ordering::Acquire);
            // A reopen asked for before these lines were taken applies to them (SIGUSR1 after
            // the rename: what comes after goes to the new file).
            if self.shared.reopen.swap(false, Ordering::AcqRel) {
                self.reopen();
            }
            let wrote = self.drain();
            self.flush();
            if stop {
                return;
            }
            if wrote {
                // Let lines gather: one write(2) per batch, not per line.
                std::thread::park_timeout(LINGER.min(self.flush_every));
                continue;
            }
            // Nothing came: park until a line does (its sender unparks us) or the flush interval
            // passes. Lines added between the drain and `idle` are caught by this second look.
            self.shared.idle.store(true, Ordering::Release);
            if !self.drain() {
                std::thread::park_timeout(self.flush_every);
            }
            self.shared.idle.store(false, Ordering::Release);
        }
    }

    /// Writes every shard's lines; whether there were any.
    fn drain(&mut self) -> bool {
        let mut any = false;
        for i in 0..self.shared.shards.len() {
            let (bytes, lines) = {
                let Ok(mut batch) = self.shared.shards[i].lock() else {
                    continue;
                };
                if batch.lines == 0 {
                    continue;
                }
                self.spare.clear();
                let bytes = std::mem::replace(&mut batch.bytes, std::mem::take(&mut self.spare));
                (bytes, std::mem::take(&mut batch.lines))
            };
            self.write(&bytes, lines);
            self.spare = bytes;
            any = true;
        }
        any
    }

    fn write(&mut self, bytes: &[u8], lines: u64) {
        match self.out.write_all(bytes) {
            Ok(()) => self.pending += lines,
            Err(e) => {
                self.dropped.inc_by(lines);
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
        (config.buffer_lines, shard_count(config.buffer_lines)),
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

/// One shard per likely worker thread; each holds its share of `buffer_lines`.
fn shard_count(capacity: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(4, usize::from)
        .clamp(1, 64)
        .min(capacity.max(1))
}

fn channel(
    out: Box<dyn Write + Send>,
    path: Option<PathBuf>,
    (capacity, shards): (usize, usize),
    flush_every: Duration,
    lines: IntCounter,
    dropped: IntCounter,
) -> (AccessLog, Writer) {
    let shared = Arc::new(Shared {
        shards: (0..shards).map(|_| Mutex::new(Batch::default())).collect(),
        shard_lines: (capacity / shards).max(1) as u64,
        dropped: dropped.clone(),
        idle: AtomicBool::new(false),
        reopen: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        thread: Mutex::new(None),
    });
    let log = AccessLog {
        shared: shared.clone(),
    };
    let writer = Writer {
        shared,
        out: BufWriter::with_capacity(WRITE_BUFFER_BYTES, out),
        path,
        flush_every,
        lines,
        dropped,
        pending: 0,
        failing: false,
        spare: Vec::new(),
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
impl Service for AccessLogService {
    async fn run(&self, mut shutdown: Shutdown) {
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
    use std::sync::mpsc::{self, channel as unbounded, Receiver};

    impl AccessLog {
        fn send_raw(&self, line: &[u8]) {
            self.push(|out| out.extend_from_slice(line));
        }
    }

    fn entry() -> Entry<'static> {
        Entry {
            time: DateTime::parse_from_rfc3339("2026-11-22T15:01:59.123456Z")
                .unwrap()
                .into(),
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
            would_reject: None,
            trace_id: None,
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

    #[test]
    fn times_are_rfc3339_with_milliseconds_as_the_second_changes() {
        for (at, want) in [
            ("2026-11-22T15:01:59.005Z", "2026-11-22T15:01:59.005Z"),
            ("2026-11-22T15:01:59.999Z", "2026-11-22T15:01:59.999Z"),
            ("2026-11-22T15:02:00Z", "2026-11-22T15:02:00.000Z"),
            ("2026-12-31T23:59:59.100Z", "2026-12-31T23:59:59.100Z"),
        ] {
            let mut e = entry();
            e.time = DateTime::parse_from_rfc3339(at).unwrap().into();
            assert_eq!(parse(&format_line(&e))["time"], want);
        }
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
        // The routes decode once: a `%2540` arrives here as `%2540` still (one decoding below).
        assert_eq!(target("john.doe%2540example.com"), "jo****@example.com");
        assert_eq!(target("john.doe%252540example.com"), "jo****@example.com");
    }

    #[test]
    fn addresses_in_client_text_fields_are_masked() {
        let e = Entry {
            origin: Some(b"https://john.doe@example.com"),
            request_id: Some("req-john.doe%40example.com"),
            method: "john.doe%40x",
            ..entry()
        };
        let v = parse(&format_line(&e));
        assert_eq!(v["origin"], "https://jo****@example.com");
        assert_eq!(v["request_id"], "re****@example.com");
        assert_eq!(v["method"], "jo****@x");
        // A long origin is masked before it is cut.
        let long = format!("https://{}john.doe%40example.com", "a".repeat(240));
        let e = Entry {
            origin: Some(long.as_bytes()),
            ..entry()
        };
        let line = String::from_utf8(format_line(&e)).unwrap();
        assert!(!line.contains("john.doe"), "{line}");
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
        assert_eq!(v.as_str().unwrap().len(), MAX_TARGET_CHARS);
        assert!(v.as_str().unwrap().starts_with("****@aaa"));
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
            (2, 1),
            Duration::from_secs(1),
            lines.clone(),
            dropped.clone(),
        );
        spawn(&log, writer);
        log.send_raw(b"1\n");
        // The writer took line 1 and is stuck writing it: the queue is empty and nothing drains.
        entered.recv().unwrap();
        log.send_raw(b"2\n");
        log.send_raw(b"3\n");
        assert_eq!(dropped.get(), 0);
        log.send_raw(b"4\n");
        log.send_raw(b"5\n");
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
            (16, 1),
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
        log.send_raw(b"a\n");
        wait_for(1);
        let rotated = dir.path().join("access.log.1");
        std::fs::rename(&path, &rotated).unwrap();
        log.request_reopen();
        // The reopen is done before the next line is written: this one goes to the new file.
        log.send_raw(b"b\n");
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
        log.send_raw(b"c\n");
        log.finish();
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "b\nc\n");
    }
}
