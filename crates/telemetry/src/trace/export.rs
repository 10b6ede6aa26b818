//! The export side: OTLP/HTTP requests sent with the gateway's own HTTP client (ureq, OpenSSL:
//! no second TLS stack), and counters of what never reached the collector. The SDK's batch
//! processor exports on its own thread, so the blocking client never holds a request up.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;

/// The collector's answers are small; a larger one is cut off.
const MAX_ANSWER_BYTES: u64 = 1 << 20;

/// OTLP/HTTP over ureq, with `timeout` for each request.
#[derive(Debug, Clone)]
pub struct UreqClient {
    agent: ureq::Agent,
}

impl UreqClient {
    pub fn new(timeout: Duration) -> Self {
        let agent = ureq::Agent::config_builder()
            .tls_config(drg_base::infra::http::system_tls())
            .timeout_global(Some(timeout))
            // The exporter reads the status itself (it retries 429/502/503/504 only).
            .http_status_as_error(false)
            .max_redirects(0)
            .build()
            .new_agent();
        UreqClient { agent }
    }
}

#[async_trait::async_trait]
impl HttpClient for UreqClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        // Blocking, on the batch processor's own thread (it runs exports with `block_on`).
        let (parts, body) = request.into_parts();
        let mut answer = self
            .agent
            .run(http::Request::from_parts(parts, &body[..]))?;
        let status = answer.status();
        let headers = std::mem::take(answer.headers_mut());
        let bytes = answer
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER_BYTES)
            .read_to_vec()?;
        let mut out = Response::new(Bytes::from(bytes));
        *out.status_mut() = status;
        *out.headers_mut() = headers;
        Ok(out)
    }
}

/// What tracing lost: spans dropped at a full queue, spans whose export failed.
#[derive(Debug, Default)]
pub struct Losses {
    pub dropped: AtomicU64,
    pub export_failed: AtomicU64,
    pub exported: AtomicU64,
    /// Spans handed to the batch processor and not yet exported.
    queued: AtomicUsize,
    /// Exports in a row that failed.
    failures: AtomicU32,
    /// Until when (milliseconds on [`clock`]) nothing is exported: a collector that fails is
    /// asked again after 1 s, 2 s, 4 s ... at most [`MAX_BACKOFF`], and meanwhile spans are
    /// dropped where they end (counted as failed exports), before they cost a queue slot, a
    /// protobuf encoding or a request (with a collector answering 500, lookups ran at 0.55-0.93x
    /// of tracing off when every batch was sent).
    quiet_until: AtomicU64,
}

/// The longest wait between two exports to a collector that keeps failing.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Milliseconds since the first call (a monotonic clock for the backoff).
fn clock() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Losses {
    /// The collector is being left alone after failures.
    fn quiet(&self) -> bool {
        let until = self.quiet_until.load(Ordering::Relaxed);
        until != 0 && clock() < until
    }

    /// An export's outcome: a failure doubles the wait before the next one, a success ends it.
    fn exported_with(&self, ok: bool) {
        if ok {
            self.failures.store(0, Ordering::Relaxed);
            self.quiet_until.store(0, Ordering::Relaxed);
            return;
        }
        let streak = self.failures.fetch_add(1, Ordering::Relaxed).min(16);
        let wait = Duration::from_secs(1u64 << streak).min(MAX_BACKOFF);
        let wait = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
        self.quiet_until
            .store(clock().saturating_add(wait).max(1), Ordering::Relaxed);
    }
}

/// The exporter, counting what it sends and what fails.
#[derive(Debug)]
pub struct CountingExporter<E> {
    pub inner: E,
    pub losses: Arc<Losses>,
}

impl<E: SpanExporter> SpanExporter for CountingExporter<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        self.losses.queued.fetch_sub(n, Ordering::AcqRel);
        if self.losses.quiet() {
            // Queued before the backoff began: not sent either.
            self.losses
                .export_failed
                .fetch_add(n as u64, Ordering::Relaxed);
            return Ok(());
        }
        let result = self.inner.export(batch).await;
        self.losses.exported_with(result.is_ok());
        let counter = match result {
            Ok(()) => &self.losses.exported,
            Err(_) => &self.losses.export_failed,
        };
        counter.fetch_add(n as u64, Ordering::Relaxed);
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource)
    }
}

/// The batch processor behind a gate that counts what a full queue turns away (the SDK's own
/// count is private): the gate's count is never below the queue's, so the processor itself
/// never drops one unseen.
#[derive(Debug)]
pub struct LossCountingProcessor {
    pub inner: BatchSpanProcessor,
    pub capacity: usize,
    pub losses: Arc<Losses>,
}

impl SpanProcessor for LossCountingProcessor {
    fn on_start(&self, span: &mut opentelemetry_sdk::trace::Span, cx: &opentelemetry::Context) {
        self.inner.on_start(span, cx)
    }

    fn on_end(&self, span: SpanData) {
        if self.losses.quiet() {
            self.losses.export_failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self.losses.queued.fetch_add(1, Ordering::AcqRel) >= self.capacity {
            self.losses.queued.fetch_sub(1, Ordering::AcqRel);
            self.losses.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.inner.on_end(span)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_double_the_quiet_time_and_a_success_ends_it() {
        let l = Losses::default();
        assert!(!l.quiet());
        l.exported_with(false);
        assert!(l.quiet());
        let first = l.quiet_until.load(Ordering::Relaxed) - clock();
        assert!((900..=1_000).contains(&first), "{first}");
        l.exported_with(false);
        l.exported_with(false);
        let third = l.quiet_until.load(Ordering::Relaxed) - clock();
        assert!((3_900..=4_000).contains(&third), "{third}");
        for _ in 0..20 {
            l.exported_with(false);
        }
        let most = l.quiet_until.load(Ordering::Relaxed) - clock();
        assert!(most <= 60_000, "{most}");
        l.exported_with(true);
        assert!(!l.quiet());
    }
}
