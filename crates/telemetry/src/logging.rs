//! Logging: env_logger behind a rate limiter for client-caused error lines, so that a flood of
//! broken or abandoned requests costs a counter increment each, not a log line each.
//!
//! A record is *client-caused* when it comes from Pingora (`pingora*` targets) at WARN or ERROR and
//! its message starts with one of the prefixes Pingora 0.9 uses for failures on the downstream side
//! ([`Category`] lists them), or when our own code logs it under the [`CLIENT`] target. Each
//! category may write [`ClientLogLimits::rate`] lines a second after a burst of
//! [`ClientLogLimits::burst`]; the rest are counted, and a flusher thread writes at most one line a
//! second: `suppressed N client-error log lines in the last Ns (category: n, ...)`. Every other
//! record goes straight to env_logger, so our own errors are never held back; `RUST_LOG` filters
//! as before. [`client_error_totals`] gives the counts for the metrics.
//!
//! Every line, ours and Pingora's, is formatted once and passed through
//! [`crate::redact::mask_emails`], so no email address (a path, an `Origin`, a request dump in
//! a Pingora error) reaches the log whole. A few Pingora lines logged at ERROR for events that
//! are normal in operation are written at the level they deserve ([`RELEVELLED`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use log::{Level, Log, Metadata, Record};

/// The target for lines our own code logs because of something a client did (a malformed or
/// abusive request): `log::warn!(target: logging::CLIENT, "...")`. Such lines, at any level, are
/// rate-limited and counted with Pingora's downstream errors, so never put a genuine server-side
/// fault under it.
pub const CLIENT: &str = "client";

/// Environment variable: client-error lines a second per category (default [`DEFAULT_RATE`]).
pub const RATE_ENV: &str = "DOMAIN_RISK_GATEWAY_LOG_CLIENT_RATE";
/// Environment variable: lines a category may write at once before the rate applies (default
/// [`DEFAULT_BURST`]).
pub const BURST_ENV: &str = "DOMAIN_RISK_GATEWAY_LOG_CLIENT_BURST";
/// Enough to see what kind of client trouble is going on, cheap enough that a flood of it
/// costs at most a few hundred bytes a second per category.
pub const DEFAULT_RATE: u32 = 5;
/// Lets a short episode (a handful of clients timing out together) be logged in full.
pub const DEFAULT_BURST: u32 = 20;

/// Where the summary lines come from (never rate-limited themselves).
const SUMMARY_TARGET: &str = module_path!();
/// How often the flusher may write a summary line.
const SUMMARY_INTERVAL: Duration = Duration::from_secs(1);

/// Why the logger could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("{var}: '{value}' is not a whole number of lines (0 or more)")]
    BadLimit { var: &'static str, value: String },
    #[error("a logger is already installed")]
    AlreadyInstalled,
}

/// A kind of client-caused log line; each has its own allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    /// The request could not be read: the client hung up mid-header or mid-body, stalled past a
    /// timeout, or a filter failed on its side (Pingora's `Fail to proxy: Downstream ...` and the
    /// other `<context>: Downstream ...` lines, `HTTP server fails to read from downstream`).
    DownstreamRead,
    /// The answer could not be written: the client left before it (`failed to send error response
    /// to downstream`, `HTTP server fails to write to downstream`, `... fails to finish the
    /// request`).
    DownstreamWrite,
    /// A TLS or HTTP/2 handshake with the client failed (`Downstream handshake error/timeout`,
    /// `H2 handshake error`).
    Handshake,
    /// Pingora warned about a malformed message (bad `Content-Length`, body bytes past its end,
    /// an h2 connection torn down for malformed streams, a bad `Accept-Encoding`).
    Malformed,
    /// Our own lines under the [`CLIENT`] target.
    Client,
}

impl Category {
    pub const ALL: [Category; 5] = [
        Category::DownstreamRead,
        Category::DownstreamWrite,
        Category::Handshake,
        Category::Malformed,
        Category::Client,
    ];

    /// A stable name, for summary lines and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Category::DownstreamRead => "downstream_read",
            Category::DownstreamWrite => "downstream_write",
            Category::Handshake => "handshake",
            Category::Malformed => "malformed",
            Category::Client => "client",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Message prefixes of Pingora 0.9's downstream-side WARN/ERROR lines (pingora-proxy `lib.rs`,
/// pingora-core `apps/`, `services/listening.rs`, `protocols/http/`). `"<context> Downstream"`
/// matches Pingora errors whose source is the client: their display starts with `Downstream`.
const PINGORA_PREFIXES: &[(&str, Category)] = &[
    ("Fail to proxy: Downstream", Category::DownstreamRead),
    (
        "Fail to early filter request: Downstream",
        Category::DownstreamRead,
    ),
    (
        "Fail to filter request: Downstream",
        Category::DownstreamRead,
    ),
    (
        "Failed in downstream modules request filter: Downstream",
        Category::DownstreamRead,
    ),
    (
        "Error deciding if we should proxy to upstream: Downstream",
        Category::DownstreamRead,
    ),
    (
        "HTTP server fails to read from downstream",
        Category::DownstreamRead,
    ),
    (
        "failed to send error response to downstream",
        Category::DownstreamWrite,
    ),
    (
        "HTTP server fails to write to downstream",
        Category::DownstreamWrite,
    ),
    (
        "HTTP server fails to finish the request",
        Category::DownstreamWrite,
    ),
    ("Downstream handshake error", Category::Handshake),
    ("Downstream handshake timeout", Category::Handshake),
    ("H2 handshake error", Category::Handshake),
    ("invalid content-length header", Category::Malformed),
    ("negative content-length header", Category::Malformed),
    ("Peer sent more data than expected", Category::Malformed),
    (
        "tearing down downstream h2 connection after",
        Category::Malformed,
    ),
    ("Failed to parse accept-encoding", Category::Malformed),
];

/// Pingora 0.9 lines logged at ERROR for events that are normal in operation, and the level they
/// are written at instead: (target prefix, message prefix, level). An operator paged by these
/// would learn to ignore ERROR; matched on target and text because Pingora gives them no other
/// mark.
pub const RELEVELLED: &[(&str, &str, Level)] = &[
    // pingora-core `connectors/mod.rs` (`reused_stream`): a pooled backend connection was closed
    // by the backend (a restart, its idle timeout) while the pool's idle watcher still held it.
    // Pingora drops it and connects afresh; the call succeeds. Nothing failed.
    (
        "pingora_core::connectors",
        "failed to acquire reusable stream",
        Level::Info,
    ),
    // pingora-core `server/transfer_fd` (`accept_with_retry_timeout`): a `serve --upgrade` waits
    // for the old process to hand its sockets over, logging this every second (5 times at most)
    // until the old one gets SIGQUIT. Waiting is the procedure; a hand-over that never comes
    // fails the start with its own ERROR line.
    (
        "pingora_core::server::transfer_fd",
        "No incoming socket transfer",
        Level::Warn,
    ),
];

/// The level a record is written at: its own, or the one [`RELEVELLED`] gives it. Only ever
/// lowers an ERROR.
pub fn relevel(target: &str, level: Level, message: &str) -> Level {
    if level != Level::Error {
        return level;
    }
    RELEVELLED
        .iter()
        .find(|(t, m, _)| target.starts_with(t) && message.starts_with(m))
        .map_or(level, |&(_, _, to)| to)
}

/// Longer than the longest prefix above; a message is only formatted this far.
const PREFIX_BUF: usize = 64;

/// The client-caused category of a record, if it has one. Allocation-free: the message is
/// formatted into a small stack buffer, and only as far as the longest prefix.
pub fn classify(record: &Record<'_>) -> Option<Category> {
    match record.args().as_str() {
        Some(message) => classify_message(record.target(), record.level(), message),
        None => {
            let mut head = Head::default();
            // An error here only means the buffer is full: the head is what we need.
            let _ = fmt::write(&mut head, *record.args());
            classify_message(record.target(), record.level(), head.as_str())
        }
    }
}

/// [`classify`] for a record's parts, its message already formatted.
pub fn classify_message(target: &str, level: Level, message: &str) -> Option<Category> {
    if target == CLIENT
        || target
            .strip_prefix(CLIENT)
            .is_some_and(|rest| rest.starts_with("::"))
    {
        return Some(Category::Client);
    }
    if level > Level::Warn || !target.starts_with("pingora") {
        return None;
    }
    classify_pingora_message(message)
}

/// The category of a Pingora message by its prefix.
pub fn classify_pingora_message(message: &str) -> Option<Category> {
    PINGORA_PREFIXES
        .iter()
        .find(|(prefix, _)| message.starts_with(prefix))
        .map(|&(_, category)| category)
}

/// The first [`PREFIX_BUF`] bytes of a formatted message.
struct Head {
    buf: [u8; PREFIX_BUF],
    len: usize,
}

impl Default for Head {
    fn default() -> Self {
        Head {
            buf: [0; PREFIX_BUF],
            len: 0,
        }
    }
}

impl Head {
    fn as_str(&self) -> &str {
        let bytes = &self.buf[..self.len];
        // A cut in the middle of a character only loses that character.
        match std::str::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default(),
        }
    }
}

impl fmt::Write for Head {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = PREFIX_BUF - self.len;
        let take = room.min(s.len());
        self.buf[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
        if self.len == PREFIX_BUF {
            // Stops the formatting of the rest of a long message.
            Err(fmt::Error)
        } else {
            Ok(())
        }
    }
}

/// How many client-error lines each category may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLogLimits {
    /// Lines a second, per category, once the burst is spent; 0 writes none (summaries only).
    pub rate: u32,
    /// Lines a category may write at once (at least 1 is used).
    pub burst: u32,
}

impl Default for ClientLogLimits {
    fn default() -> Self {
        ClientLogLimits {
            rate: DEFAULT_RATE,
            burst: DEFAULT_BURST,
        }
    }
}

impl ClientLogLimits {
    /// The defaults, overridden by [`RATE_ENV`] and [`BURST_ENV`] when set.
    pub fn from_env() -> Result<Self, LoggingError> {
        Self::from_lookup(|var| std::env::var(var).ok())
    }

    fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, LoggingError> {
        let read = |var: &'static str, default: u32| match lookup(var) {
            None => Ok(default),
            Some(value) => value
                .trim()
                .parse::<u32>()
                .map_err(|_| LoggingError::BadLimit { var, value }),
        };
        Ok(ClientLogLimits {
            rate: read(RATE_ENV, DEFAULT_RATE)?,
            burst: read(BURST_ENV, DEFAULT_BURST)?,
        })
    }
}

/// Never admits: the marker for a rate of 0.
const NEVER: u64 = u64::MAX;

/// A lock-free GCRA (virtual-scheduling token bucket) over a nanosecond clock given by the caller,
/// so it is tested with plain numbers.
#[derive(Debug)]
pub struct RateLimiter {
    /// Theoretical arrival time: when the bucket would be full again.
    tat: AtomicU64,
    /// Nanoseconds between lines at the steady rate, or [`NEVER`].
    interval: AtomicU64,
    /// How far ahead of now `tat` may run: `(burst - 1) * interval`.
    tolerance: AtomicU64,
}

impl RateLimiter {
    pub fn new(limits: ClientLogLimits) -> Self {
        let limiter = RateLimiter {
            tat: AtomicU64::new(0),
            interval: AtomicU64::new(NEVER),
            tolerance: AtomicU64::new(0),
        };
        limiter.set_limits(limits);
        limiter
    }

    /// Changes the allowance; lines already admitted stay counted against it.
    pub fn set_limits(&self, limits: ClientLogLimits) {
        let interval = match limits.rate {
            0 => NEVER,
            rate => 1_000_000_000 / u64::from(rate),
        };
        let tolerance = interval.saturating_mul(u64::from(limits.burst.max(1) - 1));
        self.interval.store(interval, Ordering::Relaxed);
        self.tolerance.store(tolerance, Ordering::Relaxed);
    }

    /// Whether a line at `now` (nanoseconds on any monotonic clock) may be written.
    pub fn admit(&self, now: u64) -> bool {
        let interval = self.interval.load(Ordering::Relaxed);
        if interval == NEVER {
            return false;
        }
        let tolerance = self.tolerance.load(Ordering::Relaxed);
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let start = tat.max(now);
            if start - now > tolerance {
                return false;
            }
            match self.tat.compare_exchange_weak(
                tat,
                start.saturating_add(interval),
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(current) => tat = current,
            }
        }
    }
}

/// Client-error lines seen and suppressed, since the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientErrorTotals {
    /// Every client-caused line that passed the `RUST_LOG` filter, written or not.
    pub lines: u64,
    /// Those that were only counted.
    pub suppressed: u64,
}

/// The per-category limiters and counters.
#[derive(Debug)]
pub struct ClientErrorLimiter {
    limiters: [RateLimiter; 5],
    lines: [AtomicU64; 5],
    suppressed: [AtomicU64; 5],
}

impl ClientErrorLimiter {
    pub fn new(limits: ClientLogLimits) -> Self {
        ClientErrorLimiter {
            limiters: std::array::from_fn(|_| RateLimiter::new(limits)),
            lines: Default::default(),
            suppressed: Default::default(),
        }
    }

    pub fn set_limits(&self, limits: ClientLogLimits) {
        for limiter in &self.limiters {
            limiter.set_limits(limits);
        }
    }

    /// Counts a line of `category` at `now` (nanoseconds) and says whether to write it.
    pub fn admit(&self, category: Category, now: u64) -> bool {
        let i = category.index();
        self.lines[i].fetch_add(1, Ordering::Relaxed);
        let admitted = self.limiters[i].admit(now);
        if !admitted {
            self.suppressed[i].fetch_add(1, Ordering::Relaxed);
        }
        admitted
    }

    pub fn totals(&self, category: Category) -> ClientErrorTotals {
        let i = category.index();
        ClientErrorTotals {
            lines: self.lines[i].load(Ordering::Relaxed),
            suppressed: self.suppressed[i].load(Ordering::Relaxed),
        }
    }

    /// Suppressed counts per category, in [`Category::ALL`] order.
    fn suppressed_counts(&self) -> [u64; 5] {
        std::array::from_fn(|i| self.suppressed[i].load(Ordering::Relaxed))
    }
}

/// The summary for lines suppressed since the last one: `None` when there were none.
/// `since` and `now` are per-category suppressed counts, in [`Category::ALL`] order.
pub fn summary_line(since: &[u64; 5], now: &[u64; 5], elapsed: Duration) -> Option<String> {
    let deltas: Vec<(Category, u64)> = Category::ALL
        .iter()
        .zip(since.iter().zip(now))
        .map(|(&category, (a, b))| (category, b.saturating_sub(*a)))
        .filter(|&(_, n)| n > 0)
        .collect();
    let total: u64 = deltas.iter().map(|&(_, n)| n).sum();
    if total == 0 {
        return None;
    }
    let seconds = elapsed.as_secs_f64().round().max(1.0) as u64;
    let parts: Vec<String> = deltas
        .iter()
        .map(|(category, n)| format!("{}: {n}", category.name()))
        .collect();
    Some(format!(
        "suppressed {total} client-error log lines in the last {seconds}s ({})",
        parts.join(", ")
    ))
}

/// env_logger with client-caused lines rate-limited.
pub struct GatewayLogger {
    inner: env_logger::Logger,
    clients: ClientErrorLimiter,
    started: Instant,
    flusher_started: AtomicBool,
}

impl GatewayLogger {
    pub fn new(inner: env_logger::Logger, limits: ClientLogLimits) -> Self {
        GatewayLogger {
            inner,
            clients: ClientErrorLimiter::new(limits),
            started: Instant::now(),
            flusher_started: AtomicBool::new(false),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The flusher starts with the first suppressed line rather than at install: Pingora may
    /// daemonize (fork) after the logger is installed, and a thread would not survive that.
    fn start_flusher(&'static self) {
        if self.flusher_started.swap(true, Ordering::Relaxed) {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("log-summary".into())
            .spawn(move || self.flush_summaries());
        if spawned.is_err() {
            // Try again with a later line; meanwhile the counts are kept.
            self.flusher_started.store(false, Ordering::Relaxed);
        }
    }

    fn flush_summaries(&self) {
        let mut last = [0; 5];
        let mut last_at = Instant::now();
        loop {
            std::thread::sleep(SUMMARY_INTERVAL);
            let now = self.clients.suppressed_counts();
            if let Some(line) = summary_line(&last, &now, last_at.elapsed()) {
                self.inner.log(
                    &Record::builder()
                        .level(Level::Warn)
                        .target(SUMMARY_TARGET)
                        .module_path_static(Some(SUMMARY_TARGET))
                        .args(format_args!("{line}"))
                        .build(),
                );
                self.inner.flush();
            }
            last = now;
            last_at = Instant::now();
        }
    }
}

impl GatewayLogger {
    /// Writes `record`, whose formatted message is `message`: re-levelled, rate-limited if
    /// client-caused, email addresses masked.
    fn write(&'static self, record: &Record<'_>, message: &str) {
        let target = record.target();
        let level = relevel(target, record.level(), message);
        if level != record.level()
            && !self
                .inner
                .enabled(&Metadata::builder().level(level).target(target).build())
        {
            return;
        }
        if let Some(category) = classify_message(target, level, message) {
            if !self.clients.admit(category, self.now()) {
                self.start_flusher();
                return;
            }
        }
        let masked = crate::redact::mask_emails(message);
        self.inner.log(
            &Record::builder()
                .level(level)
                .target(target)
                .module_path(record.module_path())
                .file(record.file())
                .line(record.line())
                .args(format_args!("{masked}"))
                .build(),
        );
    }
}

/// Largest formatting buffer a thread keeps between lines.
const KEPT_BUFFER: usize = 16 * 1024;

/// Calls `f` with the formatted message: a static one as it is, else formatted into this
/// thread's buffer (no allocation per line once it has grown).
fn with_message(args: &fmt::Arguments<'_>, f: impl FnOnce(&str)) {
    use std::cell::RefCell;
    thread_local! {
        static BUFFER: RefCell<String> = const { RefCell::new(String::new()) };
    }
    if let Some(message) = args.as_str() {
        return f(message);
    }
    let mut f = Some(f);
    // Fails only at thread exit, when the buffer is gone: `f` then gets a String of its own.
    let _ = BUFFER.try_with(|buffer| {
        // Busy: a line logged while another is written on this thread (a `Display` that logs).
        let Ok(mut buffer) = buffer.try_borrow_mut() else {
            return;
        };
        buffer.clear();
        // Formatting into a String fails only if a `Display` impl does: keep what it wrote.
        let _ = fmt::write(&mut *buffer, *args);
        if let Some(f) = f.take() {
            f(&buffer);
        }
        if buffer.capacity() > KEPT_BUFFER {
            *buffer = String::new();
        }
    });
    if let Some(f) = f {
        // Not `to_string`, which panics when a `Display` impl fails.
        let mut own = String::new();
        let _ = fmt::write(&mut own, *args);
        f(&own);
    }
}

impl Log for &'static GatewayLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        self.inner.enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        // Re-levelling only lowers a level: a record the filter refuses stays refused.
        if !self.inner.matches(record) {
            return;
        }
        with_message(record.args(), |message| self.write(record, message));
    }

    fn flush(&self) {
        self.inner.flush();
    }
}

static INSTALLED: OnceLock<&'static GatewayLogger> = OnceLock::new();

/// Installs the logger: `RUST_LOG` as env_logger reads it (default `info`), client-error limits
/// from the environment ([`ClientLogLimits::from_env`]).
pub fn install() -> Result<(), LoggingError> {
    let limits = ClientLogLimits::from_env()?;
    let inner =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).build();
    let max_level = inner.filter();
    let logger: &'static GatewayLogger = Box::leak(Box::new(GatewayLogger::new(inner, limits)));
    INSTALLED
        .set(logger)
        .map_err(|_| LoggingError::AlreadyInstalled)?;
    log::set_boxed_logger(Box::new(logger)).map_err(|_| LoggingError::AlreadyInstalled)?;
    log::set_max_level(max_level);
    Ok(())
}

/// Changes the client-error limits of the installed logger (e.g. from config after it loaded).
pub fn set_client_limits(limits: ClientLogLimits) {
    if let Some(logger) = INSTALLED.get() {
        logger.clients.set_limits(limits);
    }
}

/// Client-error lines seen and suppressed since the start, over all categories (zero when the
/// logger is not installed).
pub fn client_error_totals() -> ClientErrorTotals {
    client_error_totals_by_category()
        .iter()
        .fold(ClientErrorTotals::default(), |sum, (_, t)| {
            ClientErrorTotals {
                lines: sum.lines + t.lines,
                suppressed: sum.suppressed + t.suppressed,
            }
        })
}

/// [`client_error_totals`] per category, in [`Category::ALL`] order.
pub fn client_error_totals_by_category() -> [(Category, ClientErrorTotals); 5] {
    std::array::from_fn(|i| {
        let category = Category::ALL[i];
        let totals = INSTALLED
            .get()
            .map(|logger| logger.clients.totals(category))
            .unwrap_or_default();
        (category, totals)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    const SECOND: u64 = 1_000_000_000;

    fn limits(rate: u32, burst: u32) -> ClientLogLimits {
        ClientLogLimits { rate, burst }
    }

    fn admitted(limiter: &RateLimiter, times: impl IntoIterator<Item = u64>) -> usize {
        times.into_iter().filter(|&t| limiter.admit(t)).count()
    }

    #[test]
    fn a_burst_then_the_rate() {
        let limiter = RateLimiter::new(limits(5, 20));
        // 1,000 lines at the same instant: only the burst goes through.
        assert_eq!(admitted(&limiter, std::iter::repeat_n(SECOND, 1000)), 20);
        // A flood over the next 10 s (one line per ms): 5 a second on top of the spent burst.
        let flood = (1..=10_000).map(|ms| SECOND + ms * 1_000_000);
        assert_eq!(admitted(&limiter, flood), 50);
    }

    #[test]
    fn quiet_time_refills_the_burst() {
        let limiter = RateLimiter::new(limits(5, 3));
        assert_eq!(admitted(&limiter, [0, 0, 0, 0]), 3);
        // 3 intervals (600 ms) later, 3 lines are allowed again, not more.
        assert_eq!(admitted(&limiter, std::iter::repeat_n(600_000_000, 5)), 3);
        // Long quiet does not bank more than the burst.
        assert_eq!(
            admitted(&limiter, std::iter::repeat_n(3600 * SECOND, 10)),
            3
        );
    }

    #[test]
    fn steady_lines_under_the_rate_all_pass() {
        let limiter = RateLimiter::new(limits(5, 1));
        assert_eq!(
            admitted(&limiter, (0..100).map(|i| i * SECOND / 4)),
            100,
            "4 a second is under 5 a second"
        );
    }

    #[test]
    fn rate_zero_writes_nothing_and_burst_zero_is_one() {
        let none = RateLimiter::new(limits(0, 10));
        assert_eq!(admitted(&none, (0..100).map(|i| i * SECOND)), 0);
        let one = RateLimiter::new(limits(1, 0));
        assert_eq!(admitted(&one, [0, 0, SECOND, SECOND]), 2);
    }

    #[test]
    fn limits_can_change_at_run_time() {
        let limiter = RateLimiter::new(limits(0, 1));
        assert!(!limiter.admit(0));
        limiter.set_limits(limits(1000, 1));
        assert_eq!(admitted(&limiter, (1..=1000).map(|i| i * 1_000_000)), 1000);
    }

    #[test]
    fn concurrent_admits_never_exceed_the_allowance() {
        let limiter = RateLimiter::new(limits(5, 50));
        let admitted_total: usize = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|_| s.spawn(|| admitted(&limiter, std::iter::repeat_n(SECOND, 10_000))))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted_total, 50);
    }

    #[test]
    fn categories_have_separate_allowances_and_counts() {
        let clients = ClientErrorLimiter::new(limits(5, 2));
        let read = (0..10)
            .filter(|_| clients.admit(Category::DownstreamRead, 0))
            .count();
        let write = (0..3)
            .filter(|_| clients.admit(Category::DownstreamWrite, 0))
            .count();
        assert_eq!((read, write), (2, 2));
        assert_eq!(
            clients.totals(Category::DownstreamRead),
            ClientErrorTotals {
                lines: 10,
                suppressed: 8
            }
        );
        assert_eq!(
            clients.totals(Category::DownstreamWrite),
            ClientErrorTotals {
                lines: 3,
                suppressed: 1
            }
        );
        assert_eq!(
            clients.totals(Category::Client),
            ClientErrorTotals::default()
        );
    }

    fn record_category(target: &str, level: Level, args: fmt::Arguments<'_>) -> Option<Category> {
        classify(
            &Record::builder()
                .target(target)
                .level(level)
                .args(args)
                .build(),
        )
    }

    #[test]
    fn pingora_downstream_errors_are_client_caused() {
        // As Pingora formats them: an error whose source is the client displays "Downstream ...".
        let e = "Downstream ConnectionClosed context: while reading request headers";
        let proxy = "pingora_proxy";
        assert_eq!(
            record_category(
                proxy,
                Level::Error,
                format_args!("Fail to proxy: {e}, downstream session type: HTTP/1.1")
            ),
            Some(Category::DownstreamRead)
        );
        assert_eq!(
            record_category(
                proxy,
                Level::Error,
                format_args!("failed to send error response to downstream: {e}")
            ),
            Some(Category::DownstreamWrite)
        );
        assert_eq!(
            record_category(
                "pingora_core::services::listening",
                Level::Error,
                format_args!("Downstream handshake timeout")
            ),
            Some(Category::Handshake)
        );
        assert_eq!(
            record_category(
                "pingora_core::protocols::http::v1::common",
                Level::Warn,
                format_args!("invalid content-length header value {}", "x".repeat(500))
            ),
            Some(Category::Malformed)
        );
    }

    #[test]
    fn other_errors_are_not_client_caused() {
        let proxy = "pingora_proxy";
        // The same message from our own module, at a lower level, or with an upstream source.
        let cases = [
            (
                "domain_risk_gateway::edge::gateway",
                Level::Error,
                "Fail to proxy: Downstream ConnectionClosed",
            ),
            (
                proxy,
                Level::Info,
                "Fail to proxy: Downstream ConnectionClosed",
            ),
            (
                proxy,
                Level::Error,
                "Fail to proxy: Upstream ConnectTimedout, status: 504",
            ),
            (
                "pingora_core::services::listening",
                Level::Error,
                "Accept() failed Too many open files",
            ),
            ("clients", Level::Error, "not the client target"),
        ];
        for (target, level, message) in cases {
            assert_eq!(
                record_category(target, level, format_args!("{message}")),
                None,
                "{target} {level} {message}"
            );
        }
    }

    #[test]
    fn our_client_target_is_client_caused_at_any_level() {
        for target in [CLIENT, "client::gateway"] {
            for level in [Level::Error, Level::Info, Level::Debug] {
                assert_eq!(
                    record_category(target, level, format_args!("bad request from {}", 1)),
                    Some(Category::Client)
                );
            }
        }
    }

    #[test]
    fn head_stops_at_the_buffer_and_never_splits_a_character() {
        let mut head = Head::default();
        let long = format!("{}é{}", "a".repeat(PREFIX_BUF - 1), "b".repeat(100));
        assert!(fmt::write(&mut head, format_args!("{long}")).is_err());
        assert_eq!(head.as_str(), "a".repeat(PREFIX_BUF - 1));
        let longest = PINGORA_PREFIXES.iter().map(|(p, _)| p.len()).max().unwrap();
        assert!(longest < PREFIX_BUF);
    }

    #[test]
    fn summary_lines_count_what_was_suppressed_since_the_last() {
        let none = [0; 5];
        assert_eq!(
            summary_line(&none, &none, Duration::from_secs(1)),
            None,
            "nothing suppressed, no line"
        );
        let since = [10, 0, 0, 0, 0];
        let now = [2_990, 0, 0, 4, 0];
        assert_eq!(
            summary_line(&since, &now, Duration::from_millis(1_020)).as_deref(),
            Some(
                "suppressed 2984 client-error log lines in the last 1s \
                 (downstream_read: 2980, malformed: 4)"
            )
        );
    }

    #[test]
    fn known_benign_pingora_errors_are_relevelled_and_nothing_else() {
        let connectors = "pingora_core::connectors";
        let transfer = "pingora_core::server::transfer_fd";
        let reuse = "failed to acquire reusable stream";
        let wait = "No incoming socket transfer, sleep 1s and try again";
        assert_eq!(relevel(connectors, Level::Error, reuse), Level::Info);
        assert_eq!(relevel(transfer, Level::Error, wait), Level::Warn);
        // Another message, another module, or a level already below ERROR: unchanged.
        let other = "Error accepting socket transfer: EBADF";
        assert_eq!(relevel(transfer, Level::Error, other), Level::Error);
        assert_eq!(
            relevel("domain_risk_gateway", Level::Error, reuse),
            Level::Error
        );
        assert_eq!(relevel(connectors, Level::Debug, reuse), Level::Debug);
    }

    /// A logger writing `LEVEL target message` lines into a buffer.
    fn capturing_logger(filter: &str) -> (&'static GatewayLogger, Arc<Mutex<Vec<u8>>>) {
        #[derive(Clone)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let out = Arc::new(Mutex::new(Vec::new()));
        let inner = env_logger::Builder::new()
            .parse_filters(filter)
            .format(|buf, r| {
                use std::io::Write;
                writeln!(buf, "{} {} {}", r.level(), r.target(), r.args())
            })
            .target(env_logger::Target::Pipe(Box::new(Sink(out.clone()))))
            .build();
        let logger = Box::leak(Box::new(GatewayLogger::new(inner, limits(1000, 1000))));
        (logger, out)
    }

    fn emit(logger: &'static GatewayLogger, target: &str, level: Level, args: fmt::Arguments) {
        logger.log(
            &Record::builder()
                .target(target)
                .level(level)
                .args(args)
                .build(),
        );
    }

    #[test]
    fn the_logger_relevels_and_masks_every_line() {
        let (logger, out) = capturing_logger("info");
        let connectors = "pingora_core::connectors";
        emit(
            logger,
            connectors,
            Level::Error,
            format_args!("failed to acquire reusable stream"),
        );
        let path = "/v1/check/john.doe%2540example.com";
        emit(
            logger,
            "pingora_proxy",
            Level::Error,
            format_args!("Fail to proxy: Internal, status: 500, GET {path}, Host: gw"),
        );
        emit(
            logger,
            "domain_risk_gateway",
            Level::Warn,
            format_args!("origin {}", "https://jane.roe@example.com"),
        );
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        assert!(
            text.contains("INFO pingora_core::connectors failed to acquire"),
            "{text}"
        );
        assert!(!text.contains("ERROR pingora_core::connectors"), "{text}");
        assert!(
            text.contains("GET /v1/check/jo****@example.com, Host: gw"),
            "{text}"
        );
        assert!(text.contains("origin https://ja****@example.com"), "{text}");
        assert!(
            !text.contains("john.doe") && !text.contains("jane.roe"),
            "{text}"
        );

        // Re-levelled below the filter: not written at all.
        let (logger, out) = capturing_logger("warn");
        emit(
            logger,
            connectors,
            Level::Error,
            format_args!("failed to acquire reusable stream"),
        );
        assert!(out.lock().unwrap().is_empty());
    }

    #[test]
    fn limits_come_from_the_environment_with_defaults() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |var: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == var)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            ClientLogLimits::from_lookup(env(&[])).unwrap(),
            ClientLogLimits::default()
        );
        assert_eq!(
            ClientLogLimits::from_lookup(env(&[(RATE_ENV, "0"), (BURST_ENV, " 3 ")])).unwrap(),
            limits(0, 3)
        );
        let err = ClientLogLimits::from_lookup(env(&[(RATE_ENV, "5/s")])).unwrap_err();
        assert!(err.to_string().contains(RATE_ENV), "{err}");
    }
}
