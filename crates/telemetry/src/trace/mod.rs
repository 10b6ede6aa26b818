//! OpenTelemetry tracing: a span per request, child spans for the quota store, the MX lookup and
//! the upstream exchange, W3C trace context taken from trusted callers and passed to the backend,
//! exported by OTLP/HTTP in batches off the request path (`export.rs`).
//!
//! The SDK is built on the first span, not at start: a host's Pingora daemon mode forks after
//! start, and the batch processor's thread would not survive the fork (`serve --daemon` forks
//! before it builds anything). Spans are held in the
//! request's context ([`Span`]) and ended explicitly; never the thread's current context, which
//! does not follow a request across `.await`.

pub mod config;
pub mod export;
pub mod spans;

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};

use config::{env_set, TracingConfig};
use export::{CountingExporter, LossCountingProcessor, Losses, UreqClient};

pub use opentelemetry::trace::SpanKind as Kind;

/// The SDK, once built.
struct Live {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

/// Tracing, when it is on.
pub struct Tracing {
    config: TracingConfig,
    live: OnceLock<Option<Live>>,
    propagator: TraceContextPropagator,
    losses: Arc<Losses>,
}

/// Counters of the exports, for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TraceStats {
    pub exported: u64,
    pub dropped: u64,
    pub export_failed: u64,
}

impl Tracing {
    /// Tracing as `config` and the environment say (`None`: off).
    pub fn new(config: &TracingConfig) -> Option<Arc<Tracing>> {
        config.is_on().then(|| {
            Arc::new(Tracing {
                config: config.clone(),
                live: OnceLock::new(),
                propagator: TraceContextPropagator::new(),
                losses: Arc::default(),
            })
        })
    }

    fn live(&self) -> Option<&Live> {
        self.live
            .get_or_init(|| match self.build() {
                Ok(live) => Some(live),
                Err(e) => {
                    log::error!("tracing: cannot set the exporter up, no spans: {e}");
                    None
                }
            })
            .as_ref()
    }

    /// The SDK: the config's values where the standard `OTEL_*` variables do not say otherwise.
    fn build(&self) -> Result<Live, String> {
        let c = &self.config;
        let headers = c.headers.clone().into_iter().collect();
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(UreqClient::new(c.export_timeout))
            .with_protocol(Protocol::HttpBinary)
            .with_timeout(c.export_timeout)
            .with_headers(headers);
        let env_endpoint =
            env_set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") || env_set("OTEL_EXPORTER_OTLP_ENDPOINT");
        if let (false, Some(base)) = (env_endpoint, &c.otlp_endpoint) {
            exporter = exporter.with_endpoint(format!("{}/v1/traces", base.trim_end_matches('/')));
        }
        let exporter = CountingExporter {
            inner: exporter.build().map_err(|e| e.to_string())?,
            losses: self.losses.clone(),
        };
        let capacity = std::env::var("OTEL_BSP_MAX_QUEUE_SIZE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(c.queue_size);
        let batch = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_queue_size(capacity)
                    .build(),
            )
            .build();
        let mut resource = opentelemetry_sdk::Resource::builder();
        if !env_set("OTEL_SERVICE_NAME") {
            resource = resource.with_service_name(c.service_name.clone());
        }
        let mut provider = SdkTracerProvider::builder()
            .with_span_processor(LossCountingProcessor {
                inner: batch,
                capacity,
                losses: self.losses.clone(),
            })
            .with_resource(resource.build());
        if !env_set("OTEL_TRACES_SAMPLER") {
            let ratio = Sampler::TraceIdRatioBased(c.sample_ratio);
            provider = provider.with_sampler(Sampler::ParentBased(Box::new(ratio)));
        }
        let provider = provider.build();
        let tracer = provider.tracer("domain-risk-gateway");
        Ok(Live { provider, tracer })
    }

    /// The span of one request: a child of the caller's trace when `trust_parent` (the peer is
    /// a trusted proxy) and it sent a valid `traceparent`, else a new trace.
    pub fn request(&self, headers: &http::HeaderMap, trust_parent: bool) -> Option<Span> {
        let live = self.live()?;
        let parent = if trust_parent {
            self.propagator.extract(&HeaderExtractor(headers))
        } else {
            Context::new()
        };
        let span = live
            .tracer
            .span_builder("request")
            .with_kind(SpanKind::Server)
            .start_with_context(&live.tracer, &parent);
        Some(Span(parent.with_span(span)))
    }

    /// A child span of `parent`.
    pub fn child(&self, parent: &Span, name: &'static str, kind: SpanKind) -> Option<Span> {
        let live = self.live()?;
        let span = live
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .start_with_context(&live.tracer, &parent.0);
        Some(Span(parent.0.with_span(span)))
    }

    /// Writes `span`'s trace context (`traceparent`, `tracestate`) into `headers`.
    pub fn inject(&self, span: &Span, headers: &mut http::HeaderMap) {
        self.propagator
            .inject_context(&span.0, &mut HeaderInjector(headers));
        // The propagator writes an empty `tracestate` when there is none.
        if headers
            .get("tracestate")
            .is_some_and(|v| v.as_bytes().is_empty())
        {
            headers.remove("tracestate");
        }
    }

    /// Exports what is queued and stops the exporter, waiting at most `within`. Blocking.
    pub fn shutdown(&self, within: Duration) {
        if let Some(Some(live)) = self.live.get() {
            if let Err(e) = live.provider.shutdown_with_timeout(within) {
                log::warn!("tracing: shutdown: {e}");
            }
        }
    }

    pub fn stats(&self) -> TraceStats {
        let l = &self.losses;
        TraceStats {
            exported: l.exported.load(Ordering::Relaxed),
            dropped: l.dropped.load(Ordering::Relaxed),
            export_failed: l.export_failed.load(Ordering::Relaxed),
        }
    }
}

/// A span being recorded (ended by [`Span::end`], or when dropped).
#[derive(Debug)]
pub struct Span(Context);

impl Span {
    pub fn set(&self, key: &'static str, value: impl Into<Value>) {
        self.0.span().set_attribute(KeyValue::new(key, value));
    }

    pub fn rename(&self, name: &'static str) {
        self.0.span().update_name(name);
    }

    /// Marks the span failed.
    pub fn fail(&self, why: impl Into<std::borrow::Cow<'static, str>>) {
        self.0.span().set_status(Status::error(why));
    }

    /// The trace id, 32 hex digits.
    pub fn trace_id(&self) -> String {
        self.0.span().span_context().trace_id().to_string()
    }

    /// Whether the span is recorded (sampled).
    pub fn is_recording(&self) -> bool {
        self.0.span().is_recording()
    }

    pub fn end(self) {
        self.0.span().end();
    }
}
