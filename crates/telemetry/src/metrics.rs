//! Prometheus metrics for the admin listener's `GET /metrics`: counters and histograms recorded as
//! requests, denials, upstream calls and reloads happen, and gauges read from the gateway's state
//! when scraped.
//!
//! The request path only touches handles resolved ahead of time (arrays indexed by enums, a lazily
//! filled slot per status code): no label strings are built or hashed per request. No series is
//! labelled by key (cardinality, and key ids are not for scrapers).

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::core::Collector;
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

mod rdap;

pub use rdap::RdapStats;

use crate::connections::DownstreamCounts;
use crate::logging::client_error_totals_by_category;

/// Request latency buckets (seconds): local answers take tens of microseconds, proxied ones
/// up to the upstream read timeout.
const REQUEST_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];
/// Upstream latency buckets (seconds), to the upstream's response header.
const UPSTREAM_BUCKETS: &[f64] = &[
    0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Status codes get a slot each: 0 for "no response sent" (or an impossible code), then 100..=599.
const STATUS_SLOTS: usize = 501;

/// The route class a request is counted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RouteClass {
    Domain,
    /// `POST /v1/public/domains`.
    Batch,
    TopDomains,
    Check,
    Usage,
    Logs,
    Stats,
    /// `GET /v1/changes`.
    Changes,
    Keys,
    /// `/v1/overrides`.
    Overrides,
    /// `/v1/webhooks`.
    Webhooks,
    /// `/v1/reports`.
    Reports,
    /// `GET /v1/audit`.
    Audit,
    OpenApi,
    Preflight,
    Health,
    Ready,
    /// The dashboard's files.
    Dashboard,
    NotFound,
    /// Refused before routing (framing), a method a route does not allow, or never routed.
    #[default]
    Other,
}

impl RouteClass {
    pub const ALL: [RouteClass; 20] = [
        RouteClass::Domain,
        RouteClass::Batch,
        RouteClass::TopDomains,
        RouteClass::Check,
        RouteClass::Usage,
        RouteClass::Logs,
        RouteClass::Stats,
        RouteClass::Changes,
        RouteClass::Keys,
        RouteClass::Overrides,
        RouteClass::Webhooks,
        RouteClass::Reports,
        RouteClass::Audit,
        RouteClass::OpenApi,
        RouteClass::Preflight,
        RouteClass::Health,
        RouteClass::Ready,
        RouteClass::Dashboard,
        RouteClass::NotFound,
        RouteClass::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            RouteClass::Domain => "domain",
            RouteClass::Batch => "batch",
            RouteClass::TopDomains => "top_domains",
            RouteClass::Check => "check",
            RouteClass::Usage => "usage",
            RouteClass::Logs => "logs",
            RouteClass::Stats => "stats",
            RouteClass::Changes => "changes",
            RouteClass::Keys => "keys",
            RouteClass::Overrides => "overrides",
            RouteClass::Webhooks => "webhooks",
            RouteClass::Reports => "reports",
            RouteClass::Audit => "audit",
            RouteClass::OpenApi => "openapi",
            RouteClass::Preflight => "preflight",
            RouteClass::Health => "health",
            RouteClass::Ready => "ready",
            RouteClass::Dashboard => "dashboard",
            RouteClass::NotFound => "not_found",
            RouteClass::Other => "other",
        }
    }
}

/// Why the access decision said no.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    Unauthorized,
    Forbidden,
    QuotaExceeded,
    /// The per-key limit of the account routes (`gateway.access.account_rate`), or the
    /// per-project rate of a plan (`rate_per_second`).
    RateLimited,
}

impl Denial {
    const ALL: [Denial; 4] = [
        Denial::Unauthorized,
        Denial::Forbidden,
        Denial::QuotaExceeded,
        Denial::RateLimited,
    ];

    fn label(self) -> &'static str {
        match self {
            Denial::Unauthorized => "unauthorized",
            Denial::Forbidden => "forbidden",
            Denial::QuotaExceeded => "quota_exceeded",
            Denial::RateLimited => "rate_limited",
        }
    }
}

/// How a call to the upstream failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamError {
    ConnectRefused,
    /// Any other connect failure: no route, TLS handshake, certificate.
    ConnectError,
    Timeout,
    /// The connection broke mid-exchange.
    Reset,
    /// The upstream answered something that is not a usable HTTP response.
    BadResponse,
}

impl UpstreamError {
    const ALL: [UpstreamError; 5] = [
        UpstreamError::ConnectRefused,
        UpstreamError::ConnectError,
        UpstreamError::Timeout,
        UpstreamError::Reset,
        UpstreamError::BadResponse,
    ];

    fn label(self) -> &'static str {
        match self {
            UpstreamError::ConnectRefused => "connect_refused",
            UpstreamError::ConnectError => "connect_error",
            UpstreamError::Timeout => "timeout",
            UpstreamError::Reset => "reset",
            UpstreamError::BadResponse => "bad_response",
        }
    }
}

/// What became of reloads, as counted.
fn reload_result(outcome: ReloadOutcome) -> &'static str {
    match outcome {
        ReloadOutcome::Published => "ok",
        ReloadOutcome::Failed => "error",
        ReloadOutcome::Refused => "refused",
    }
}

/// The registry and every handle the gateway records into; created once, shared by `Arc`.
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    /// `[route][status slot]`, each filled on the first request with that status.
    request_counts: [Box<[OnceLock<IntCounter>]>; RouteClass::ALL.len()],
    request_durations: [Histogram; RouteClass::ALL.len()],
    denials: [IntCounter; 4],
    /// Shadow-mode calls a limit would have refused: `[month, rate]`.
    would_reject: [IntCounter; 2],
    upstream_duration: Histogram,
    upstream_errors: [IntCounter; 5],
    reloads: IntCounterVec,
    reload_success: GaugeVec,
    access_log_lines: IntCounter,
    access_log_dropped: IntCounter,
    /// Names looked up in answered batches.
    batch_names: IntCounter,
    /// False under `admin.metrics: false`: the request path records nothing (the harness's
    /// metrics-off reference).
    recording: bool,
}

/// Registers a collector and hands its handle back (handles share their data with the registry).
fn registered<C: Collector + Clone + 'static>(
    registry: &Registry,
    collector: C,
) -> Result<C, prometheus::Error> {
    registry.register(Box::new(collector.clone()))?;
    Ok(collector)
}

/// A labelled counter, registered.
fn counter_vec(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
) -> Result<IntCounterVec, prometheus::Error> {
    registered(registry, IntCounterVec::new(Opts::new(name, help), labels)?)
}

/// The upstream's answer times and failures.
fn upstream_metrics(registry: &Registry) -> Result<(Histogram, IntCounterVec), prometheus::Error> {
    let duration = registered(
        registry,
        Histogram::with_opts(
            HistogramOpts::new(
                "drg_upstream_duration_seconds",
                "Time from choosing the upstream to its response header.",
            )
            .buckets(UPSTREAM_BUCKETS.to_vec()),
        )?,
    )?;
    let errors = counter_vec(
        registry,
        "drg_upstream_errors_total",
        "Failed upstream calls, by kind.",
        &["kind"],
    )?;
    Ok((duration, errors))
}

/// Calls refused by the access decision, and shadow-mode calls a limit would have refused.
fn denial_counters(
    registry: &Registry,
) -> Result<(IntCounterVec, IntCounterVec), prometheus::Error> {
    let denials = counter_vec(
        registry,
        "drg_denials_total",
        "Calls refused by the access decision, by reason.",
        &["reason"],
    )?;
    let would_reject = counter_vec(
        registry,
        "drg_would_reject_total",
        "Calls of plans in shadow mode served although a limit would have refused them, by reason.",
        &["reason"],
    )?;
    Ok((denials, would_reject))
}

/// The access log's written and dropped lines.
fn access_log_counters(registry: &Registry) -> Result<(IntCounter, IntCounter), prometheus::Error> {
    let lines = registered(
        registry,
        IntCounter::new("drg_access_log_lines_total", "Access log lines written.")?,
    )?;
    let dropped = registered(
        registry,
        IntCounter::new(
            "drg_access_log_dropped_total",
            "Access log lines dropped: the writer's queue was full, or the write failed.",
        )?,
    )?;
    Ok((lines, dropped))
}

/// `drg_build_info{version, git_hash} 1`.
fn build_info(registry: &Registry) -> Result<(), prometheus::Error> {
    let build = registered(
        registry,
        IntGaugeVec::new(
            Opts::new(
                "drg_build_info",
                "Always 1; the labels say which build runs.",
            ),
            &["version", "git_hash"],
        )?,
    )?;
    build
        .with_label_values(&[env!("CARGO_PKG_VERSION"), crate::GIT_HASH])
        .set(1);
    Ok(())
}

impl Metrics {
    /// Registers every metric. Fails only on a malformed metric definition.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let r = &registry;
        let requests = counter_vec(
            r,
            "drg_requests_total",
            "Requests answered, by route class and status.",
            &["route", "status"],
        )?;
        let durations = registered(
            r,
            HistogramVec::new(
                HistogramOpts::new(
                    "drg_request_duration_seconds",
                    "Time from the request header to the end of the answer, by route class.",
                )
                .buckets(REQUEST_BUCKETS.to_vec()),
                &["route"],
            )?,
        )?;
        let (denials, would_reject) = denial_counters(r)?;
        let (upstream_duration, upstream_errors) = upstream_metrics(r)?;
        let reloads = counter_vec(
            r,
            "drg_reloads_total",
            "Hot reloads, by source and result.",
            &["source", "result"],
        )?;
        let reload_success = registered(
            r,
            GaugeVec::new(
                Opts::new(
                    "drg_reload_last_success_timestamp_seconds",
                    "Unix time the source was last loaded (at start, or by a reload).",
                ),
                &["source"],
            )?,
        )?;
        let (access_log_lines, access_log_dropped) = access_log_counters(r)?;
        let batch_names = registered(
            r,
            IntCounter::new(
                "drg_batch_names_total",
                "Names looked up in answered batches (POST /v1/public/domains).",
            )?,
        )?;
        build_info(r)?;

        Ok(Metrics {
            request_counts: std::array::from_fn(|_| {
                (0..STATUS_SLOTS).map(|_| OnceLock::new()).collect()
            }),
            request_durations: RouteClass::ALL.map(|r| durations.with_label_values(&[r.label()])),
            denials: Denial::ALL.map(|d| denials.with_label_values(&[d.label()])),
            would_reject: [Denial::QuotaExceeded, Denial::RateLimited]
                .map(|d| would_reject.with_label_values(&[d.label()])),
            upstream_errors: UpstreamError::ALL
                .map(|k| upstream_errors.with_label_values(&[k.label()])),
            registry,
            requests,
            upstream_duration,
            reloads,
            reload_success,
            recording: true,
            access_log_lines,
            access_log_dropped,
            batch_names,
        })
    }

    /// Whether the request path records (`admin.metrics`); reloads and gauges always do.
    pub fn with_recording(mut self, on: bool) -> Self {
        self.recording = on;
        self
    }

    /// The access log's `(lines, dropped)` counters, kept whatever `recording` says: losing
    /// log lines is worth knowing even when request metrics are off.
    pub fn access_log_counters(&self) -> (IntCounter, IntCounter) {
        (
            self.access_log_lines.clone(),
            self.access_log_dropped.clone(),
        )
    }

    pub fn is_recording(&self) -> bool {
        self.recording
    }

    /// One answered request (`status` 0 when none was sent).
    pub fn request(&self, route: RouteClass, status: u16, elapsed: Duration) {
        if !self.recording {
            return;
        }
        let r = route as usize;
        let slot = match status {
            100..=599 => usize::from(status) - 99,
            _ => 0,
        };
        self.request_counts[r][slot]
            .get_or_init(|| {
                let code = if slot == 0 { 0 } else { status };
                self.requests
                    .with_label_values(&[route.label(), &code.to_string()])
            })
            .inc();
        self.request_durations[r].observe(elapsed.as_secs_f64());
    }

    /// An answered batch of `names` lookups.
    pub fn batch(&self, names: usize) {
        if self.recording {
            self.batch_names.inc_by(names as u64);
        }
    }

    pub fn deny(&self, reason: Denial) {
        if !self.recording {
            return;
        }
        self.denials[reason as usize].inc();
    }

    /// A shadow-mode call that `reason` (`QuotaExceeded` or `RateLimited`) would have refused.
    pub fn would_reject(&self, reason: Denial) {
        if !self.recording {
            return;
        }
        let i = usize::from(reason == Denial::RateLimited);
        self.would_reject[i].inc();
    }

    pub fn upstream_answered(&self, elapsed: Duration) {
        if !self.recording {
            return;
        }
        self.upstream_duration.observe(elapsed.as_secs_f64());
    }

    pub fn upstream_failed(&self, kind: UpstreamError) {
        if !self.recording {
            return;
        }
        self.upstream_errors[kind as usize].inc();
    }

    /// A gauge registered by a part that exists only under some config (e.g. TLS).
    pub fn gauge(&self, name: &str, help: &str) -> Result<Gauge, prometheus::Error> {
        registered(&self.registry, Gauge::new(name, help)?)
    }

    /// A labelled counter registered by a part that exists only under some config (e.g. URL
    /// sources).
    pub fn counter_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<IntCounterVec, prometheus::Error> {
        counter_vec(&self.registry, name, help, labels)
    }

    /// A labelled gauge registered by a part that exists only under some config.
    pub fn gauge_vec(
        &self,
        name: &str,
        help: &str,
        labels: &[&str],
    ) -> Result<GaugeVec, prometheus::Error> {
        registered(
            &self.registry,
            GaugeVec::new(Opts::new(name, help), labels)?,
        )
    }

    /// The hook a data reloader of `source` reports to. `source` was just loaded,
    /// so its last success is now.
    pub fn reload_hook(&self, source: &str) -> ReloadHook {
        let success = self.reload_success.with_label_values(&[source]);
        success.set(unix_now());
        let counters = [
            ReloadOutcome::Published,
            ReloadOutcome::Failed,
            ReloadOutcome::Refused,
        ]
        .map(|o| self.reloads.with_label_values(&[source, reload_result(o)]));
        Box::new(move |outcome| {
            counters[outcome as usize].inc();
            if outcome == ReloadOutcome::Published {
                success.set(unix_now());
            }
        })
    }

    /// The text exposition: everything recorded, plus `state` as read now.
    pub fn render(&self, state: &Scrape) -> Vec<u8> {
        let mut families = self.registry.gather();
        families.extend(state.families());
        families.sort_by(|a, b| a.name().cmp(b.name()));
        let mut out = Vec::with_capacity(16 * 1024);
        if let Err(e) = TextEncoder::new().encode(&families, &mut out) {
            log::error!("cannot encode the metrics: {e}");
        }
        out
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The gateway's state as read at scrape time.
pub struct Scrape {
    pub table_names: usize,
    /// The table's generation: 1 at start, one more at each reload that was taken.
    pub table_generation: u64,
    pub keys: usize,
    /// The managed file of API-made keys is read (false: unreadable, corrupt and set aside, or
    /// written by a newer gateway; the API-made keys are off).
    pub keys_managed_ok: bool,
    /// quota store's status.
    pub quota: serde_json::Value,
    /// `None` when MX lookups are disabled.
    pub mx: Option<MxStats>,
    /// `None` when RDAP is off.
    pub rdap: Option<RdapStats>,
    /// `None` when quota alerts are off.
    pub alerts: Option<AlertStats>,
    /// `None` when tracing is off.
    pub tracing: Option<crate::trace::TraceStats>,
    pub downstream: DownstreamCounts,
}

impl Scrape {
    fn families(&self) -> Vec<MetricFamily> {
        let mut f = Families::default();
        f.gauge(
            "drg_table_names",
            "Names in the domain table.",
            self.table_names as f64,
        );
        f.gauge(
            "drg_table_generation",
            "Generation of the domain table in service (1 at start, +1 per reload taken).",
            self.table_generation as f64,
        );
        f.gauge("drg_keys", "API keys loaded.", self.keys as f64);
        f.gauge(
            "drg_keys_managed_file_ok",
            "1 while the managed file of API-made keys is read; 0: it is unreadable, corrupt (set aside) or newer, and the API-made keys are off.",
            if self.keys_managed_ok { 1.0 } else { 0.0 },
        );
        quota_families(&mut f, &self.quota);
        if let Some(rdap) = &self.rdap {
            rdap::families(&mut f, rdap);
        }
        if let Some(mx) = &self.mx {
            mx_families(&mut f, mx);
        }
        if let Some(alerts) = &self.alerts {
            alert_families(&mut f, alerts);
        }
        if let Some(t) = &self.tracing {
            f.counter(
                "drg_trace_spans_exported_total",
                "Spans the collector accepted.",
                t.exported,
            );
            f.counter(
                "drg_trace_spans_dropped_total",
                "Spans dropped because the export queue was full (the collector slow or away).",
                t.dropped,
            );
            f.counter(
                "drg_trace_spans_export_failed_total",
                "Spans whose export failed after its retries.",
                t.export_failed,
            );
        }
        downstream_families(&mut f, &self.downstream);
        client_log_families(&mut f);
        f.0
    }
}

/// The quota store's gauges (and the embedded store's slot counts).
fn quota_families(f: &mut Families, quota: &serde_json::Value) {
    let redis = quota["store"] == "redis";
    // The embedded store is always there and has no breaker or pending counts.
    let up = !redis || quota["connected"].as_bool().unwrap_or(false);
    f.gauge(
        "drg_quota_store_up",
        "1 when the quota store is reachable (always for the embedded store).",
        f64::from(u8::from(up)),
    );
    if redis {
        f.counter(
            "drg_quota_counts_restored_total",
            "Month counts found missing in Redis (flushed, evicted) and set back to what this gateway had seen.",
            quota["counts_restored"].as_u64().unwrap_or(0),
        );
        f.counter(
            "drg_quota_lease_waits_total",
            "Calls that found their key's lease used up and waited for the next (batched counting): many mean batch_max lasts less than a round trip to Redis at the key's rate.",
            quota["lease_waits"].as_u64().unwrap_or(0),
        );
        f.counter_f64(
            "drg_quota_lease_wait_seconds_total",
            "Time calls spent waiting for their key's next lease (batched counting).",
            quota["lease_waited_us"].as_u64().unwrap_or(0) as f64 / 1e6,
        );
    }
    // Known only once a probe read it (the Redis store): absent until then.
    if let Some(policy) = quota["eviction_policy"].as_str() {
        f.gauge(
            "drg_quota_store_noeviction",
            "1 when Redis's maxmemory-policy is noeviction; 0 when Redis may evict API-made keys and month counts under memory pressure.",
            f64::from(u8::from(policy == "noeviction")),
        );
    }
    f.gauge(
        "drg_quota_breaker_open",
        "1 while the Redis circuit breaker is open.",
        f64::from(u8::from(quota["breaker_open"].as_bool().unwrap_or(false))),
    );
    f.gauge(
        "drg_quota_pending_local_counts",
        "Calls counted locally, not yet in Redis.",
        quota["pending_local_counts"].as_u64().unwrap_or(0) as f64,
    );
    if !redis {
        let n = |k: &str| quota[k].as_u64().unwrap_or(0);
        f.gauge(
            "drg_quota_slots",
            "Slots of the embedded store's counters file (one per project, never freed).",
            n("slots") as f64,
        );
        f.gauge(
            "drg_quota_slots_used",
            "Slots of the embedded store's counters file taken by projects.",
            n("slots_used") as f64,
        );
        f.counter(
            "drg_quota_slots_full_total",
            "Calls refused (503) because the counters file had no free slot for their project.",
            n("slots_full_calls"),
        );
        f.counter(
            "drg_quota_refused_calls_total",
            "Calls refused (503) because the embedded store had no slot to count them in (a full table included).",
            n("refused_calls"),
        );
    }
}

/// Quota alerts delivered, given up, waiting.
fn alert_families(f: &mut Families, a: &AlertStats) {
    f.counter(
        "drg_quota_alerts_sent_total",
        "Quota alerts this gateway delivered (the receiver answered 2xx).",
        a.sent,
    );
    f.counter(
        "drg_quota_alerts_failed_total",
        "Quota alerts given up: after max_attempts, or at once when the destination was refused.",
        a.failed,
    );
    f.counter(
        "drg_quota_alerts_refused_total",
        "Quota alerts given up because every address of the receiver's host was refused (private, link-local, the gateway's own listener).",
        a.refused,
    );
    f.counter(
        "drg_quota_alerts_attempt_errors_total",
        "Delivery attempts that failed (each retried with backoff until max_attempts).",
        a.attempt_errors,
    );
    f.counter(
        "drg_quota_alerts_insert_errors_total",
        "Writes of a noticed quota alert to the outbox that failed (a locked or full disk): each alert is written again after a backoff, and offered again by its project's calls until the outbox has it.",
        a.insert_errors,
    );
    f.counter(
        "drg_quota_alerts_dropped_total",
        "Quota alerts not recorded for now: the channel or the outbox (max_pending) was full; offered again until the outbox has them.",
        a.dropped,
    );
    f.gauge(
        "drg_quota_alerts_pending",
        "Quota alerts waiting for delivery, for their Redis claim, or for the outbox (held after a failed write).",
        a.pending as f64,
    );
    f.counter(
        "drg_quota_alerts_passes_total",
        "Passes of the quota alerts service (each takes in, claims and counts what waits; about one a second).",
        a.passes,
    );
}

/// The MX resolver's load and cache.
fn mx_families(f: &mut Families, mx: &MxStats) {
    f.gauge(
        "drg_mx_lookups_in_flight",
        "MX lookups holding a slot now.",
        mx.in_flight as f64,
    );
    f.counter(
        "drg_mx_lookups_refused_total",
        "MX lookups refused because the in-flight bound was reached.",
        mx.refused,
    );
    f.counter(
        "drg_mx_cache_hits_total",
        "MX lookups answered from the cache.",
        mx.cache_hits,
    );
    f.counter(
        "drg_mx_cache_misses_total",
        "MX lookups the cache could not answer (refused ones included).",
        mx.cache_misses,
    );
    f.gauge(
        "drg_mx_cache_entries",
        "Names in the MX cache.",
        mx.cache_entries as f64,
    );
    f.gauge(
        "drg_mx_breaker_open",
        "1 while MX evidence is off (no DNS server answers, or the resolver is untrusted): answers from the table alone.",
        if mx.breaker_open { 1.0 } else { 0.0 },
    );
    f.gauge(
        "drg_mx_resolver_trusted",
        "1 while the resolver shows the canary names' MX records (MX evidence believed).",
        if mx.resolver == "trusted" { 1.0 } else { 0.0 },
    );
    f.gauge(
        "drg_mx_resolver_untrusted",
        "1 while the resolver answers but not with the canaries' MX records (NXDOMAIN, SERVFAIL, empty): it is not believed.",
        if mx.resolver == "untrusted" { 1.0 } else { 0.0 },
    );
    f.counter(
        "drg_mx_breaker_trips_total",
        "Times MX evidence was switched off because no DNS server answered.",
        mx.breaker_trips,
    );
    f.counter(
        "drg_mx_breaker_skipped_total",
        "Lookups answered at once, without DNS, while the breaker was open.",
        mx.breaker_skipped,
    );
    if let Some(nb) = &mx.neighbourhood {
        neighbourhood_families(f, nb);
    }
}

/// What the MX neighbourhood index holds and decided.
fn neighbourhood_families(f: &mut Families, nb: &NeighbourhoodStats) {
    const KINDS: [&str; 3] = ["host", "parent", "network"];
    f.gauge(
        "drg_mx_neighbourhood_entries",
        "Keys (MX hosts, host parents, networks) in the MX neighbourhood index.",
        nb.keys.iter().sum::<u64>() as f64,
    );
    f.gauge(
        "drg_mx_neighbourhood_domains",
        "Distinct domains the MX neighbourhood index remembers.",
        nb.domains as f64,
    );
    let verdicts: Vec<(&str, u64)> = KINDS.iter().copied().zip(nb.verdicts).collect();
    f.counters(
        "drg_mx_neighbourhood_verdicts_total",
        "Unlisted domains answered disposable by the MX neighbourhood, by the kind of key that judged.",
        "key",
        &verdicts,
    );
    f.counter(
        "drg_mx_neighbourhood_taught_total",
        "Domains taught to the index (lookups, files, other gateways).",
        nb.taught,
    );
    f.counter(
        "drg_mx_neighbourhood_queue_dropped_total",
        "Listed names not queued for a background lookup because the queue was full.",
        nb.queue_dropped,
    );
    f.counter(
        "drg_mx_neighbourhood_moved_total",
        "Listed domains seen on new MX hosts after the gateway saw them elsewhere or with no mail.",
        nb.moved,
    );
    f.counter(
        "drg_mx_neighbourhood_repointed_total",
        "Listed domains seen on new MX hosts within 2 days of answering on their first ones: re-pointed by their holder, counted there at once.",
        nb.repointed,
    );
    f.counter(
        "drg_mx_neighbourhood_looked_total",
        "Listed names the gateway's own look resolved.",
        nb.looked,
    );
    f.counter(
        "drg_mx_neighbourhood_look_passes_total",
        "Passes of the gateway's own look over every listed name, completed.",
        nb.look_passes,
    );
    f.gauge(
        "drg_mx_neighbourhood_look_rate",
        "Listed names the gateway's own look starts a second now, as weighed against what the resolver sustains (0 before the first second weighed).",
        nb.look_rate as f64,
    );
}

/// What the public listener's connection limits did.
fn downstream_families(f: &mut Families, d: &DownstreamCounts) {
    f.gauge(
        "drg_downstream_open_connections",
        "Client connections open now.",
        d.open_connections as f64,
    );
    f.counter(
        "drg_downstream_refused_connections_total",
        "Client connections refused at the connection cap.",
        d.refused_connections,
    );
    f.counter(
        "drg_downstream_header_timeouts_total",
        "Client connections closed for a request header too slow to arrive.",
        d.header_timeouts,
    );
    f.counter(
        "drg_downstream_header_too_large_total",
        "Client connections closed for a request header too large.",
        d.header_too_large,
    );
    f.counter(
        "drg_downstream_idle_closed_total",
        "Idle client connections closed.",
        d.idle_closed,
    );
}

/// Client-caused log lines, written or only counted.
fn client_log_families(f: &mut Families) {
    let totals = client_error_totals_by_category();
    let lines: Vec<_> = totals.iter().map(|(c, t)| (c.name(), t.lines)).collect();
    let suppressed: Vec<_> = totals
        .iter()
        .map(|(c, t)| (c.name(), t.suppressed))
        .collect();
    f.counters(
        "drg_client_error_log_lines_total",
        "Client-caused log lines, written or suppressed, by category.",
        "category",
        &lines,
    );
    f.counters(
        "drg_client_error_log_suppressed_total",
        "Client-caused log lines only counted (rate limit), by category.",
        "category",
        &suppressed,
    );
}

/// Metric families built for one scrape (names and help are ours, so building cannot fail).
#[derive(Default)]
struct Families(Vec<MetricFamily>);

impl Families {
    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        if let Ok(g) = Gauge::new(name, help) {
            g.set(value);
            self.0.extend(g.collect());
        }
    }

    fn counter(&mut self, name: &str, help: &str, value: u64) {
        if let Ok(c) = IntCounter::new(name, help) {
            c.inc_by(value);
            self.0.extend(c.collect());
        }
    }

    fn counter_f64(&mut self, name: &str, help: &str, value: f64) {
        if let Ok(c) = prometheus::Counter::new(name, help) {
            c.inc_by(value);
            self.0.extend(c.collect());
        }
    }

    fn counters(&mut self, name: &str, help: &str, label: &str, values: &[(&str, u64)]) {
        // A family without a sample stops the text encoder (and every family after it).
        if values.is_empty() {
            return;
        }
        if let Ok(v) = IntCounterVec::new(Opts::new(name, help), &[label]) {
            for (l, n) in values {
                v.with_label_values(&[*l]).inc_by(*n);
            }
            self.0.extend(v.collect());
        }
    }
}

pub use drg_base::reload::{ReloadHook, ReloadOutcome};

/// Counters of the MX resolver since it started, and its current load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MxStats {
    /// Lookups holding a slot now: waited on by a request or finishing in the background.
    pub in_flight: u64,
    /// Lookups refused because `max_inflight` were running (each answered unknown at once).
    pub refused: u64,
    /// Lookups answered from the cache.
    pub cache_hits: u64,
    /// Lookups the cache could not answer: each started a query, joined one in flight, or was
    /// refused (`refused` is part of this count).
    pub cache_misses: u64,
    /// Names in the cache now, expired ones not yet replaced or evicted included.
    pub cache_entries: u64,
    /// MX evidence is off (no DNS server answers, or the resolver is untrusted): lookups are
    /// skipped.
    pub breaker_open: bool,
    /// What the canaries say of the resolver: `unchecked`, `trusted`, `untrusted`, `silent`.
    pub resolver: &'static str,
    pub breaker_trips: u64,
    pub breaker_skipped: u64,
    /// The neighbourhood index, when it is on.
    pub neighbourhood: Option<NeighbourhoodStats>,
}

/// Counters of the quota alerts since start, and the outbox's waiting alerts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AlertStats {
    pub sent: u64,
    pub failed: u64,
    pub attempt_errors: u64,
    /// Failed writes of a noticed alert to the outbox.
    pub insert_errors: u64,
    pub refused: u64,
    pub dropped: u64,
    /// Waiting in the outbox, and held for it after a failed write.
    pub pending: u64,
    /// The service's passes since start.
    pub passes: u64,
}

/// What the MX neighbourhood index holds and decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NeighbourhoodStats {
    pub domains: u64,
    /// Keys by kind: host, parent, network.
    pub keys: [u64; 3],
    /// Verdicts by the kind of key that judged: host, parent, network.
    pub verdicts: [u64; 3],
    pub taught: u64,
    pub queue_dropped: u64,
    /// Listed domains seen on new hosts (they count there once they have held them).
    pub moved: u64,
    /// Listed domains seen re-pointed by their holder (they count on their new hosts at once).
    pub repointed: u64,
    /// Listed names the gateway's own look saw, and its passes done.
    pub looked: u64,
    pub look_passes: u64,
    /// The look's pace now, whole names a second (0 before it weighed one).
    pub look_rate: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape() -> Scrape {
        Scrape {
            table_names: 3,
            table_generation: 1,
            keys: 1,
            keys_managed_ok: true,
            quota: serde_json::json!({"store": "local"}),
            mx: None,
            rdap: None,
            alerts: None,
            tracing: None,
            downstream: DownstreamCounts {
                open_connections: 0,
                refused_connections: 0,
                header_timeouts: 0,
                header_too_large: 0,
                idle_closed: 0,
            },
        }
    }

    #[test]
    fn requests_are_counted_by_route_and_status() {
        let m = Metrics::new().unwrap();
        m.request(RouteClass::Domain, 200, Duration::from_micros(30));
        m.request(RouteClass::Domain, 200, Duration::from_micros(30));
        m.request(RouteClass::Check, 502, Duration::from_millis(3));
        m.request(RouteClass::Other, 0, Duration::ZERO);
        let text = String::from_utf8(m.render(&scrape())).unwrap();
        assert!(
            text.contains("drg_requests_total{route=\"domain\",status=\"200\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("drg_requests_total{route=\"check\",status=\"502\"} 1\n"));
        assert!(text.contains("drg_requests_total{route=\"other\",status=\"0\"} 1\n"));
        assert!(text.contains("drg_request_duration_seconds_count{route=\"domain\"} 2\n"));
        assert!(text.contains("drg_table_names 3\n"));
        assert!(text.contains("drg_table_generation 1\n"));
        assert!(text.contains("drg_quota_store_up 1\n"));
    }

    #[test]
    fn handle_arrays_are_indexed_in_declaration_order() {
        assert!(RouteClass::ALL
            .iter()
            .enumerate()
            .all(|(i, r)| *r as usize == i));
        assert!(Denial::ALL
            .iter()
            .enumerate()
            .all(|(i, d)| *d as usize == i));
        assert!(UpstreamError::ALL
            .iter()
            .enumerate()
            .all(|(i, k)| *k as usize == i));
    }

    #[test]
    fn reload_hook_counts_by_result() {
        let m = Metrics::new().unwrap();
        let hook = m.reload_hook("keys");
        hook(ReloadOutcome::Published);
        hook(ReloadOutcome::Refused);
        hook(ReloadOutcome::Refused);
        let text = String::from_utf8(m.render(&scrape())).unwrap();
        assert!(
            text.contains("drg_reloads_total{result=\"ok\",source=\"keys\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("drg_reloads_total{result=\"refused\",source=\"keys\"} 2\n"));
        assert!(text.contains("drg_reloads_total{result=\"error\",source=\"keys\"} 0\n"));
    }
}
