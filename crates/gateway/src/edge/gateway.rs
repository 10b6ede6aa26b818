//! The gateway: the glue between Pingora's phases and the parts.
//!
//! Here the `Gateway` (its state and construction), the per-request `RequestCtx`, and the phases
//! of a claimed request as its path through them. `request_filter` answers from
//! `dispatch` (framing refused, the route, the access decision of `admit`, the handlers: lookups
//! in `lookup`, account routes in [`drg_projects::account::routes`]) or sends `/v1/check` upstream,
//! with a request built by [`crate::upstream::request`] (never the client's): by `relay` from
//! the request filter (`upstream.mode: relay`), or through Pingora's proxy phases below
//! (`proxy`); `logging` leaves the request's `records`. Decisions are values from pure modules;
//! the glue only translates them into writes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, VARY};
use http::StatusCode;
use pingora::prelude::*;
use pingora::proxy::FailToProxy;
use pingora::server::configuration::ServerConf;
use pingora::upstreams::peer::HttpPeer;
use pingora::{ErrorSource, ErrorType};

use crate::config::GatewayConfig;
use crate::edge::cors::{self, merge_vary, VARY_ORIGIN};
use crate::edge::http::write;
use crate::state::Shared;
use crate::upstream::config::UpstreamConfig;
use crate::upstream::peer;
use crate::upstream::request::{UpstreamPolicy, X_REQUEST_ID};
use drg_access::policy::Limit;
use drg_access::quota::{ratelimit, Usage};
use drg_access::rate::{RateConfig, RateStanding};
use drg_access::Principal;
use drg_base::answer::{Answer, ApiError};
use drg_projects::account::calls::{Calls, Verdict};
use drg_telemetry::access_log::{AccessLog, Entry};
use drg_telemetry::metrics::RouteClass;
use drg_telemetry::request_ids::RequestIds;
use drg_telemetry::trace::spans::{self, Finished};
use drg_telemetry::trace::{Kind, Span};

mod admit;
mod dispatch;
mod lookup;
mod records;
mod relay;

// Header names and fixed values as constants: built at compile time, never per answer.
/// The major provider a looked-up name is likely a typo of, for signup forms that do not ask
/// for `?explain=true`.
const X_DID_YOU_MEAN: HeaderName = HeaderName::from_static("x-did-you-mean");
/// The error `early_request_filter` stops a CONNECT with, for `fail_to_proxy` to answer.
const CONNECT_REFUSED: &str = "CONNECT refused";
/// `Allow` of the 405 to a CONNECT: it names no route, so every method some route takes.
const CONNECT_ALLOW: &str = "GET, POST, DELETE, OPTIONS";
/// A plan in shadow mode would have refused this call: `quota_exceeded` or `rate_limited`.
const X_RATELIMIT_WOULD_REJECT: HeaderName = HeaderName::from_static("x-ratelimit-would-reject");
/// Which data answered (see [`DatasetVersion`](drg_domain::table::DatasetVersion)): on every
/// answer, ours replacing any the backend sent.
const X_DATASET_VERSION: HeaderName = HeaderName::from_static("x-dataset-version");

/// The proxy service's state, shared by all requests.
pub struct Gateway {
    shared: Shared,
    upstream: HttpPeer,
    policy: UpstreamPolicy,
    request_ids: RequestIds,
    /// `None` when the access log is off: then the request path builds no line.
    access_log: Option<AccessLog>,
    /// `None` when call logs are off (`gateway.calls.enabled: false`).
    calls: Option<Calls>,
    /// `GET /v1/changes` (`None`: off).
    changes: Option<drg_projects::changes::ChangesApi>,
    /// Flag counts of the live top-domains; `None` when off (the table's fixed ranking).
    top_live: Option<Arc<drg_projects::live_top::LiveTop>>,
    /// `/v1/keys`; its routes answer 404 when `None` or `keys_api.enabled` is false.
    keys_api: Option<Arc<drg_projects::account::keys_api::KeysApi>>,
    /// `/v1/overrides`; its routes answer 404 when `None` (an embedding host without them).
    overrides: Option<Arc<drg_projects::account::overrides::Overrides>>,
    /// `/v1/webhooks`; its routes answer 404 when `None` (`gateway.webhooks` unset).
    webhooks: Option<Arc<drg_projects::account::webhooks::Webhooks>>,
    /// `/v1/reports`; as `overrides`.
    reports: Option<Arc<drg_projects::account::reports::Reports>>,
    /// The audit trail (`GET /v1/audit`, and what the changing routes append); as `overrides`.
    audit: Option<Arc<drg_projects::account::audit::Audit>>,
    /// `gateway.upstream.mode: relay`: `/v1/check` is answered from the request filter;
    /// `None`: Pingora proxies it.
    relay: Option<crate::upstream::relay::Relay>,
    /// How long an HTTP/2 request may take to end its stream when its headers did not
    /// (`limits.header_timeout_ms`).
    h2_body_wait: Duration,
    /// Per key, the account routes' rate (`gateway.access.account_rate`).
    account_rate: drg_access::rate::KeyedLimiter,
    /// The account routes' rate, also the refused batch bodies' when the plan has none.
    account_rate_config: drg_access::rate::RateConfig,
    /// Per key, the batch bodies refused before their names could be counted (malformed,
    /// empty, slow, wrong media type, too large): at the plan's rate, else `account_rate`.
    refused_bodies: drg_access::rate::Limiter,
    /// `POST /v1/public/domains` (`gateway.batch`).
    batch: crate::edge::config::BatchConfig,
}

/// Per-request state.
#[derive(Debug, Default)]
pub struct RequestCtx {
    request_id: Option<String>,
    /// Set once the key and origin checks passed.
    principal: Option<Principal>,
    /// The key's month after this call was counted (absent if the store failed open).
    usage: Option<Usage>,
    /// The plan's per-second rate and where the project stands in it.
    rate: Option<(RateConfig, RateStanding)>,
    /// Shadow mode: the limit enforce mode would have refused this call for.
    would_reject: Option<Limit>,
    /// What the access decision came to (`allowed`, `unauthorized`, ...), for the trace.
    decision: Option<&'static str>,
    /// The request's span, when tracing is on (and this request is traced).
    trace: Option<Span>,
    /// The upstream exchange's span: the parent the backend is told of.
    upstream_span: Option<Span>,
    /// The request is on `/v1/`: its answers vary by Origin.
    api: bool,
    /// The path of the upstream request, rebuilt from the screened `/v1/check` target.
    upstream_path: Option<String>,
    /// What the request is counted under in the metrics.
    route: RouteClass,
    start: Option<Instant>,
    upstream_start: Option<Instant>,
    /// The backend's status, for the access log.
    upstream_status: Option<u16>,
    /// Time to the backend's response header, or to the failure.
    upstream_elapsed: Option<Duration>,
    /// `X-Dataset-Version` of the table the request used (pre-rendered by the table).
    dataset: Option<HeaderValue>,
    /// A `POST /v1/keys` body was announced and not read (yet): the connection cannot be
    /// reused unless it is.
    body_unread: bool,
    /// The call to record for `/v1/logs` and `/v1/stats` once answered (call logs on only).
    call: Option<PendingCall>,
    /// A batch's calls to record, one per name answered with a record.
    batch_calls: Vec<PendingCall>,
    /// The `/v1/check` answer's body so far, read for its verdict (bounded; `None` once over
    /// the bound or when not wanted).
    check_body: Option<Vec<u8>>,
}

/// What a lookup or check call will be logged as.
#[derive(Debug)]
struct PendingCall {
    /// The looked-up domain, or the checked address's domain (never its local part).
    domain: Box<str>,
    /// `None` for a check whose answer has not (yet) given a readable verdict.
    verdict: Option<Verdict>,
    /// A lookup answered from the table (not a relayed check).
    lookup: bool,
}

impl Gateway {
    pub fn new(shared: Shared, config: &GatewayConfig) -> Self {
        Gateway {
            shared,
            upstream: peer::http_peer(&config.upstream),
            policy: UpstreamPolicy::from_config(
                &config.upstream,
                &config.trusted_proxies,
                config.tls.is_some(),
            ),
            request_ids: RequestIds::new(),
            access_log: None,
            calls: None,
            changes: None,
            top_live: None,
            keys_api: None,
            overrides: None,
            webhooks: None,
            reports: None,
            audit: None,
            relay: None,
            h2_body_wait: config.limits.header_timeout,
            account_rate: drg_access::rate::KeyedLimiter::new(config.access.account_rate),
            refused_bodies: drg_access::rate::Limiter::default(),
            account_rate_config: config.access.account_rate,
            batch: config.batch.clone(),
        }
    }

    /// Relays `/v1/check` itself when `gateway.upstream.mode` is `relay` (`server` sizes its
    /// keep-alive pool, as Pingora's proxy sizes its own).
    pub fn with_relay(mut self, config: &UpstreamConfig, server: &ServerConf) -> Self {
        self.relay =
            crate::upstream::relay::Relay::from_config(config, self.upstream.clone(), server);
        self
    }

    /// Serves `/v1/keys` (`None`: those routes answer 404).
    pub fn with_keys_api(
        mut self,
        api: Option<Arc<drg_projects::account::keys_api::KeysApi>>,
    ) -> Self {
        self.keys_api = api;
        self
    }

    /// Serves `/v1/overrides` from `overrides`.
    pub fn with_overrides(
        mut self,
        overrides: Arc<drg_projects::account::overrides::Overrides>,
    ) -> Self {
        self.overrides = Some(overrides);
        self
    }

    /// Serves `/v1/webhooks` from `webhooks` (`None`: those routes answer 404).
    pub fn with_webhooks(
        mut self,
        webhooks: Option<Arc<drg_projects::account::webhooks::Webhooks>>,
    ) -> Self {
        self.webhooks = webhooks;
        self
    }

    /// Keeps the audit trail in `audit` and serves `GET /v1/audit` from it.
    pub fn with_audit(mut self, audit: Arc<drg_projects::account::audit::Audit>) -> Self {
        self.audit = Some(audit);
        self
    }

    /// Serves `/v1/reports` from `reports`.
    pub fn with_reports(mut self, reports: Arc<drg_projects::account::reports::Reports>) -> Self {
        self.reports = Some(reports);
        self
    }

    /// Counts flagged lookups into `live` and serves top-domains from its ranking.
    pub fn with_top_live(mut self, live: Option<Arc<drg_projects::live_top::LiveTop>>) -> Self {
        self.top_live = live;
        self
    }

    /// Records answered lookups and checks for `/v1/logs` and `/v1/stats` (`None`: off, and
    /// those routes answer 404).
    pub fn with_calls(mut self, calls: Option<Calls>) -> Self {
        self.calls = calls;
        self
    }

    /// Answers `GET /v1/changes` (`None`: verdict changes off, the route answers 404).
    pub fn with_changes(mut self, changes: Option<drg_projects::changes::ChangesApi>) -> Self {
        self.changes = changes;
        self
    }

    /// Writes one access log line per request to `log`.
    pub fn with_access_log(mut self, log: Option<AccessLog>) -> Self {
        self.access_log = log;
        self
    }

    /// A child span of the request's, when the request is traced.
    fn child_span(&self, ctx: &RequestCtx, name: &'static str, kind: Kind) -> Option<Span> {
        spans::child(
            self.shared.tracing.as_deref(),
            ctx.trace.as_ref(),
            name,
            kind,
        )
    }

    /// Whether the socket peer is a trusted proxy: only such a caller's `traceparent` is
    /// followed (anyone else could pick trace ids and force sampling on).
    fn peer_trusted(&self, session: &Session) -> bool {
        session
            .client_addr()
            .and_then(|a| a.as_inet())
            .is_some_and(|a| self.policy.is_trusted(a.ip()))
    }
}

/// Headers of every answer: the dataset version; and for an authenticated `/v1/` call, the
/// quota state and CORS. Pushed onto the answer's own list: no list of their own per answer.
fn access_headers(ctx: &RequestCtx, out: &mut Vec<(HeaderName, HeaderValue)>) {
    out.reserve(6);
    if let Some(version) = &ctx.dataset {
        out.push((X_DATASET_VERSION, version.clone()));
    }
    if ctx.api {
        out.push((VARY, VARY_ORIGIN));
    }
    ratelimit::headers(ctx.usage.as_ref(), ctx.rate.as_ref(), out);
    if let Some(limit) = ctx.would_reject {
        out.push((
            X_RATELIMIT_WOULD_REJECT,
            HeaderValue::from_static(limit.code()),
        ));
    }
    if let Some(origin) = ctx
        .principal
        .as_ref()
        .and_then(|p| p.allowed_origin.as_deref())
        .and_then(|o| HeaderValue::from_str(o).ok())
    {
        cors::allow_origin(origin, out);
    }
}

/// The phases of a request that is ours, called by [`WithDomainRisk`](crate::edge::middleware::WithDomainRisk)
/// (the one `ProxyHttp` implementation): each named after the Pingora callback it serves.
impl Gateway {
    pub(crate) fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            start: Some(Instant::now()),
            ..RequestCtx::default()
        }
    }

    /// Pipelined requests are answered in order (Pingora reads them one at a time).
    pub(crate) async fn early_request_filter(
        &self,
        session: &mut Session,
        _ctx: &mut RequestCtx,
    ) -> Result<()> {
        if session.req_header().method == http::Method::CONNECT {
            // Pingora lets CONNECT this far (`allow_connect_method_proxying`) only so that its
            // refusal is ours: `fail_to_proxy` answers the contract's 405 and closes.
            let mut e = Error::explain(ErrorType::Custom(CONNECT_REFUSED), "CONNECT");
            e.as_down();
            return Err(e);
        }
        let downstream = session.as_downstream_mut();
        if !downstream.pipelining_enabled() {
            downstream.set_pipelining_enabled(true);
        }
        Ok(())
    }

    pub(crate) async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<bool> {
        if let Some(tracing) = &self.shared.tracing {
            ctx.trace = tracing.request(&session.req_header().headers, self.peer_trusted(session));
        }
        if self.shared.draining.is_draining() {
            // Each answer closes its connection, so clients open a fresh one (the new process's
            // after an upgrade) rather than meet an idle keep-alive closed under them at the stop.
            session.set_keepalive(None);
        }
        match self.handle(session, ctx).await {
            Some(mut answer) => {
                if ctx.body_unread {
                    // Refused before its body was read (no key, a wrong media type, ...): on
                    // HTTP/2 the rest is read and dropped so the client, still sending, gets the
                    // answer rather than a reset stream; HTTP/1.1 cannot reuse the connection.
                    if session.req_header().version == http::Version::HTTP_2 {
                        crate::edge::bodies::drain_h2(session, self.h2_body_wait).await;
                    } else {
                        session.set_keepalive(None);
                    }
                }
                access_headers(ctx, &mut answer.headers);
                write(session, answer).await?;
                Ok(true)
            }
            None => match &self.relay {
                Some(relay) => {
                    // Boxed: the exchange's state would otherwise widen the future of every
                    // request, local answers included (~550 instructions each, callgrind).
                    Box::pin(self.relay_check(relay, session, ctx)).await?;
                    Ok(true)
                }
                None => Ok(false),
            },
        }
    }

    pub(crate) async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        ctx.upstream_start = Some(Instant::now());
        ctx.upstream_span = self.child_span(ctx, "upstream", Kind::Client);
        Ok(Box::new(self.upstream.clone()))
    }

    /// Replaces the request Pingora would forward with one built from what we screened: the
    /// canonical path, our `Host`, the allowed client headers and ours. Nothing else of the
    /// client's request (query, absolute-form authority, cookies, forwarding headers) crosses.
    pub(crate) async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        *upstream_request = self.upstream_request(session, ctx)?;
        Ok(())
    }

    pub(crate) async fn response_filter(
        &self,
        _session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let Some(start) = ctx.upstream_start {
            let elapsed = start.elapsed();
            ctx.upstream_elapsed = Some(elapsed);
            self.shared.metrics.upstream_answered(elapsed);
        }
        ctx.upstream_status = Some(upstream_response.status.as_u16());
        if upstream_response.status == StatusCode::SWITCHING_PROTOCOLS {
            // We never ask for an upgrade: a backend switching protocols would open a tunnel
            // that later, key-less bytes of this connection could ride.
            return Err(Error::explain(
                ErrorType::InvalidHTTPHeader,
                "upstream answered 101 to a request without Upgrade",
            )
            .into_up());
        }
        if let Some(id) = ctx.request_id.as_deref() {
            upstream_response.insert_header(X_REQUEST_ID, id)?;
        }
        if let (Some(calls), Some(_)) = (&self.calls, &ctx.call) {
            if upstream_response.status == StatusCode::OK {
                let expected = upstream_response
                    .headers
                    .get(http::header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
                    .unwrap_or(1_024);
                ctx.check_body = Some(Vec::with_capacity(expected.min(calls.check_body_max_bytes)));
            }
        }
        let mut headers = Vec::new();
        access_headers(ctx, &mut headers);
        for (name, value) in headers {
            if name == VARY {
                // The backend's own Vary still holds: add Origin to it.
                let merged = merge_vary(upstream_response.headers.get_all(VARY), "Origin");
                upstream_response.insert_header(VARY, merged)?;
            } else {
                upstream_response.insert_header(name, value)?;
            }
        }
        Ok(())
    }

    /// Reads a `/v1/check` answer (up to `calls.check_body_max_bytes`) for the verdict its
    /// call is logged with; the body itself passes on untouched.
    pub(crate) fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<Duration>> {
        let (Some(calls), Some(buf)) = (&self.calls, &mut ctx.check_body) else {
            return Ok(None);
        };
        if let Some(chunk) = body {
            if buf.len() + chunk.len() > calls.check_body_max_bytes {
                ctx.check_body = None;
                return Ok(None);
            }
            buf.extend_from_slice(chunk);
        }
        if end_of_stream {
            if let (Some(buf), Some(call)) = (ctx.check_body.take(), &mut ctx.call) {
                call.verdict = drg_projects::account::calls::upstream_verdict(&buf);
            }
        }
        Ok(None)
    }

    /// There is one upstream: retrying a refused or timed-out connect only multiplies the wait.
    pub(crate) fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        _ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        e.set_retry(false);
        e
    }

    pub(crate) async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        if let Some(kind) = crate::upstream::errors::kind_of(e) {
            self.shared.metrics.upstream_failed(kind);
        }
        if ctx.upstream_elapsed.is_none() {
            ctx.upstream_elapsed = ctx.upstream_start.map(|s| s.elapsed());
        }
        let error = if e.etype() == &ErrorType::Custom(CONNECT_REFUSED) {
            Some(ApiError::MethodNotAllowed {
                allow: CONNECT_ALLOW,
            })
        } else {
            peer::api_error(e)
        };
        if session.response_written().is_some() {
            // The backend failed after its response header went out: a JSON error now would
            // turn its partial body into a well-framed, wrong answer. Abort the connection so
            // the client sees a truncated response.
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        }
        // The connection is closed after the error answer: say so in it.
        session.set_keepalive(None);
        let code = match error {
            Some(error) => {
                let status = error.status().as_u16();
                let mut answer: Answer = error.into();
                access_headers(ctx, &mut answer.headers);
                if let Err(we) = write(session, answer).await {
                    log::debug!("could not send the error answer: {we}");
                }
                status
            }
            None => 0,
        };
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    /// Runs once per request, whatever became of it.
    pub(crate) async fn logging(
        &self,
        session: &mut Session,
        e: Option<&Error>,
        ctx: &mut RequestCtx,
    ) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let elapsed = ctx.start.map(|s| s.elapsed()).unwrap_or_default();
        if let Some(span) = ctx.upstream_span.take() {
            spans::end_upstream(span, ctx.upstream_status, e.map(|e| e.to_string()));
        }
        let trace_id = ctx.trace.as_ref().map(Span::trace_id);
        if let Some(span) = ctx.trace.take() {
            let key = ctx
                .principal
                .as_ref()
                .map(|p| (&*p.key.id, &*p.key.project));
            let finished = Finished {
                method: &session.req_header().method,
                route: ctx.route,
                status,
                key,
                decision: ctx.decision,
                would_reject: ctx.would_reject.map(Limit::code),
            };
            spans::end_request(span, &finished);
        }
        self.shared.metrics.request(ctx.route, status, elapsed);
        if let Some(log) = &self.access_log {
            let entry = Self::access_entry(session, ctx, status, elapsed);
            log.send(&Entry {
                trace_id: trace_id.as_deref(),
                ..entry
            });
        }
        if status == 200 {
            self.record_calls(ctx);
        }
    }

    /// Pingora's error lines name the request with this. Its default, the raw path and `Host`,
    /// carries whatever address a client put there: masked here at the source (the logger
    /// masks every line as well).
    pub(crate) fn request_summary(&self, session: &Session, _ctx: &RequestCtx) -> String {
        let summary = session.as_downstream().request_summary();
        match drg_telemetry::redact::mask_emails(&summary) {
            std::borrow::Cow::Borrowed(_) => summary,
            std::borrow::Cow::Owned(masked) => masked,
        }
    }

    pub(crate) fn suppress_error_log(
        &self,
        _session: &Session,
        _ctx: &RequestCtx,
        error: &Error,
    ) -> bool {
        // Upstream failures are answered with 502/504 and are the backend's to report; clients
        // that hang up mid-request are theirs. Only our own errors are worth a log line.
        matches!(
            error.esource(),
            ErrorSource::Upstream | ErrorSource::Downstream
        )
    }
}
