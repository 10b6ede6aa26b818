//! The gateway: the only Pingora `ProxyHttp` implementation.
//!
//! `request_filter` refuses bad framing, routes each request, makes the access decision (one
//! place: `Gateway::authorize`) and either answers locally from the domain table or sends
//! `/v1/check` upstream, with a request built by [`crate::upstream::request`] (never the client's): by
//! [`crate::upstream::relay`] from the request filter (`upstream.mode: relay`), or through Pingora's proxy
//! phases below (`proxy`). Decisions are values from pure modules; this file only translates
//! them into writes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
    AUTHORIZATION, HOST, ORIGIN, REFERER, VARY,
};
use http::StatusCode;
use percent_encoding::percent_decode_str;
use pingora::prelude::*;
use pingora::proxy::FailToProxy;
use pingora::server::configuration::ServerConf;
use pingora::upstreams::peer::HttpPeer;
use pingora::{ErrorSource, ErrorType};

use crate::access::keys::KeyEntry;
use crate::access::policy::{Limit, Refusal};
use crate::access::quota::{ratelimit, Usage};
use crate::access::rate::{RateConfig, RateStanding};
use crate::access::{decide_lazily, Principal, Rejection};
use crate::account::calls::{Call, Calls, Verdict};
use crate::account::keys_api::KeysOp;
use crate::answer::{Answer, ApiError};
use crate::config::GatewayConfig;
use crate::domain::target::screen_target;
use crate::edge::http::write;
use crate::edge::route::{route, KeysCall, Route, RouteError};
use crate::ops::access_log::{AccessLog, Entry};
use crate::ops::lifecycle::Phase;
use crate::ops::metrics::{Denial, RouteClass, UpstreamError};
use crate::ops::trace::{Kind, Span};
use crate::state::Shared;
use crate::upstream::config::UpstreamConfig;
use crate::upstream::request::{UpstreamPolicy, X_REQUEST_ID};

mod lookup;

// Header names and fixed values as constants: built at compile time, never per answer.
const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const VARY_ORIGIN: HeaderValue = HeaderValue::from_static("Origin");
const EXPOSED_HEADERS: &str =
    "RateLimit, RateLimit-Policy, Retry-After, X-Request-Id, X-Dataset-Version, X-Did-You-Mean, X-RateLimit-Would-Reject";
/// The major provider a looked-up name is likely a typo of, for signup forms that do not ask
/// for `?explain=true`.
const X_DID_YOU_MEAN: HeaderName = HeaderName::from_static("x-did-you-mean");
/// How much of a refused HTTP/2 request body is read and dropped before answering.
const H2_DRAIN_BYTES: usize = 64 * 1024;
/// The error `early_request_filter` stops a CONNECT with, for `fail_to_proxy` to answer.
const CONNECT_REFUSED: &str = "CONNECT refused";
/// `Allow` of the 405 to a CONNECT: it names no route, so every method some route takes.
const CONNECT_ALLOW: &str = "GET, POST, DELETE, OPTIONS";
/// A plan in shadow mode would have refused this call: `quota_exceeded` or `rate_limited`.
const X_RATELIMIT_WOULD_REJECT: HeaderName = HeaderName::from_static("x-ratelimit-would-reject");
/// Which data answered (see [`DatasetVersion`](crate::domain::table::DatasetVersion)): on every
/// answer, ours replacing any the backend sent.
const X_DATASET_VERSION: HeaderName = HeaderName::from_static("x-dataset-version");

/// The proxy service's state, shared by all requests.
pub struct Gateway {
    shared: Shared,
    upstream: HttpPeer,
    policy: UpstreamPolicy,
    request_ids: RequestIds,
    /// `GET /v1/openapi.json`, rendered once; `None` (answered 500) if the embedded document
    /// were broken, which a unit test rules out.
    openapi: Option<Bytes>,
    /// `None` when the access log is off: then the request path builds no line.
    access_log: Option<AccessLog>,
    /// `None` when call logs are off (`gateway.calls.enabled: false`).
    calls: Option<Calls>,
    /// Flag counts of the live top-domains; `None` when off (the table's fixed ranking).
    top_live: Option<Arc<crate::flags::LiveTop>>,
    /// `/v1/keys`; its routes answer 404 when `None` or `keys_api.enabled` is false.
    keys_api: Option<Arc<crate::account::keys_api::KeysApi>>,
    /// `gateway.upstream.mode: relay`: `/v1/check` is answered from the request filter;
    /// `None`: Pingora proxies it.
    relay: Option<crate::upstream::relay::Relay>,
    /// How long an HTTP/2 request may take to end its stream when its headers did not
    /// (`limits.header_timeout_ms`).
    h2_body_wait: Duration,
    /// Per key, the account routes' rate (`gateway.access.account_rate`).
    account_rate: crate::access::rate::KeyedLimiter,
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
}

impl Gateway {
    pub fn new(shared: Shared, config: &GatewayConfig) -> Self {
        Gateway {
            shared,
            upstream: upstream_peer(&config.upstream),
            policy: UpstreamPolicy::from_config(
                &config.upstream,
                &config.trusted_proxies,
                config.tls.is_some(),
            ),
            request_ids: RequestIds::new(),
            openapi: crate::edge::openapi::json()
                .map_err(|e| log::error!("{e}"))
                .ok(),
            access_log: None,
            calls: None,
            top_live: None,
            keys_api: None,
            relay: None,
            h2_body_wait: config.limits.header_timeout,
            account_rate: crate::access::rate::KeyedLimiter::new(config.access.account_rate),
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
    pub fn with_keys_api(mut self, api: Option<Arc<crate::account::keys_api::KeysApi>>) -> Self {
        self.keys_api = api;
        self
    }

    /// Counts flagged lookups into `live` and serves top-domains from its ranking.
    pub fn with_top_live(mut self, live: Option<Arc<crate::flags::LiveTop>>) -> Self {
        self.top_live = live;
        self
    }

    /// Records answered lookups and checks for `/v1/logs` and `/v1/stats` (`None`: off, and
    /// those routes answer 404).
    pub fn with_calls(mut self, calls: Option<Calls>) -> Self {
        self.calls = calls;
        self
    }

    /// Writes one access log line per request to `log`.
    pub fn with_access_log(mut self, log: Option<AccessLog>) -> Self {
        self.access_log = log;
        self
    }

    /// Answers a routed request locally, or returns `None` when it is to be proxied.
    /// The request's answer, or `None` for one that goes upstream; either way its
    /// `X-Dataset-Version` is known after (a lookup sets the one of the table it read).
    async fn handle(&self, session: &mut Session, ctx: &mut RequestCtx) -> Option<Answer> {
        let answer = self.answer(session, ctx).await;
        if ctx.dataset.is_none() {
            ctx.dataset = Some(self.shared.table.load().version().header().clone());
        }
        answer
    }

    async fn answer(&self, session: &mut Session, ctx: &mut RequestCtx) -> Option<Answer> {
        ctx.api = session.req_header().uri.path().starts_with("/v1/");
        if let Some(refused) = self.refuse_framing(session, ctx).await {
            return Some(refused);
        }
        let header = session.req_header();
        let routed = route(&header.method, header.uri.path(), header.uri.query());
        ctx.route = crate::edge::route::class_of(&routed);
        let route = match self.available(routed) {
            Ok(route) => route,
            Err(answer) => return Some(answer),
        };
        if let Err(rejection) = self.authorize(session, &route, ctx).await {
            return Some(rejection);
        }
        match route {
            Route::Health => Some(Answer::raw(
                StatusCode::OK,
                Bytes::from_static(br#"{"status":"ok"}"#),
            )),
            Route::Ready => Some(self.readiness(session)),
            Route::OpenApi => Some(match &self.openapi {
                Some(doc) => Answer::raw(StatusCode::OK, doc.clone()),
                None => ApiError::Internal("no OpenAPI document".into()).into(),
            }),
            Route::Preflight => Some(preflight(session)),
            Route::Dashboard(asset) => Some(crate::edge::dashboard::answer(asset)),
            Route::Usage => Some(self.usage(ctx)),
            Route::Logs { cursor, limit } => Some(self.logs(ctx, cursor.as_deref(), limit).await),
            Route::Stats => Some(self.stats(ctx).await),
            Route::Keys(call) => {
                let op = match call {
                    KeysCall::List => KeysOp::List,
                    KeysCall::Create => KeysOp::Create,
                    KeysCall::Revoke { id } => match decode(id) {
                        Ok(id) => KeysOp::Revoke(id.into_owned()),
                        Err(e) => return Some(e.into()),
                    },
                };
                Some(self.keys(session, ctx, op).await)
            }
            Route::Domain { raw, explain } => Some(self.domain(raw, explain, ctx).await),
            Route::Batch { explain } => Some(self.batch(session, ctx, explain).await),
            Route::TopDomains { limit } => Some(self.top_domains(limit)),
            Route::Check { raw } => match decode(raw)
                .and_then(|t| screen_target(&t).map_err(|e| ApiError::Validation(e.to_string())))
            {
                Ok(target) => {
                    if self.calls.is_some() {
                        ctx.call = Some(PendingCall {
                            domain: target.domain.as_str().into(),
                            verdict: None,
                        });
                    }
                    ctx.upstream_path = Some(target.upstream_path());
                    ctx.request_id = Some(self.request_id(session));
                    None
                }
                Err(e) => Some(e.into()),
            },
        }
    }

    /// Refuses request framing the API never accepts, before routing and before any key is
    /// checked (a refused request is never counted). Only `POST /v1/keys` may carry a (small)
    /// body; other methods on its path get theirs (405) rather than a framing error, with the
    /// body left unread.
    async fn refuse_framing(&self, session: &mut Session, ctx: &mut RequestCtx) -> Option<Answer> {
        let header = session.req_header();
        let path = header.uri.path();
        let body_limit = match &self.keys_api {
            Some(api) if path == crate::edge::route::KEYS_PATH => api.config.max_body_bytes,
            // Switched off, the route answers 404 (after routing), as `/v1/keys` does.
            _ if path == crate::edge::route::BATCH_PATH => self.batch.max_body_bytes,
            _ => 0,
        };
        let h2 = header.version == http::Version::HTTP_2;
        match crate::edge::framing::check_framing_with_body(
            header.version,
            &header.headers,
            body_limit,
        ) {
            // HTTP/2 frames a body by DATA frames, with or without `Content-Length` (and a
            // `content-length: 0` does not stop DATA from following): only the stream's end
            // says there is none. Reading it costs nothing when the headers ended the stream.
            Ok(0) if h2 => {
                if !self.h2_body_is_empty(session).await {
                    self.drain_h2_body(session).await;
                    let e = crate::edge::framing::unannounced_body(body_limit);
                    return Some(ApiError::BadRequest(e.to_string()).into());
                }
            }
            Ok(0) => {}
            // Unread until the handler reads it: if it never does, the connection cannot be
            // reused.
            Ok(_) => ctx.body_unread = true,
            Err(e) => {
                if h2 {
                    self.drain_h2_body(session).await;
                } else if e.leaves_bytes_unread() {
                    session.set_keepalive(None);
                }
                return Some(
                    match e {
                        crate::edge::framing::FramingError::BodyTooLarge(_) => {
                            ApiError::PayloadTooLarge(e.to_string())
                        }
                        _ => ApiError::BadRequest(e.to_string()),
                    }
                    .into(),
                );
            }
        }
        None
    }

    /// The route, unless it does not exist here: unknown, the wrong method, a bad query, or a
    /// part switched off (`keys_api.enabled: false`, call logs off: as if the routes did not
    /// exist, before any key is checked).
    fn available<'r>(&self, routed: Result<Route<'r>, RouteError>) -> Result<Route<'r>, Answer> {
        let route = match routed {
            Ok(route) => route,
            Err(RouteError::NotFound) => return Err(ApiError::NotFound.into()),
            Err(RouteError::MethodNotAllowed { allow }) => {
                return Err(ApiError::MethodNotAllowed { allow }.into())
            }
            Err(RouteError::BadQuery(_, detail)) => return Err(ApiError::Validation(detail).into()),
        };
        if matches!(route, Route::Keys(_))
            && !self.keys_api.as_ref().is_some_and(|a| a.config.enabled)
        {
            return Err(ApiError::NotFound.into());
        }
        if matches!(route, Route::Batch { .. }) && !self.batch.enabled {
            return Err(ApiError::NotFound.into());
        }
        // Call logs off: as if the routes did not exist, before any key is checked.
        if matches!(route, Route::Logs { .. } | Route::Stats) && self.calls.is_none() {
            return Err(ApiError::NotFound.into());
        }
        Ok(route)
    }

    /// Whether an HTTP/2 request carries no body: its stream ended with its headers, or only
    /// empty DATA frames came before the end, within the header deadline. A byte of body, a
    /// reset stream (the h2 layer resets one whose DATA exceed its `Content-Length`) or a
    /// client that never ends the stream: `false`.
    async fn h2_body_is_empty(&self, session: &mut Session) -> bool {
        let read = tokio::time::timeout(self.h2_body_wait, async {
            while let Some(chunk) = session.read_request_body().await? {
                if !chunk.is_empty() {
                    return Ok(false);
                }
            }
            Ok::<_, Box<Error>>(true)
        });
        matches!(read.await, Ok(Ok(true)))
    }

    /// Reads and drops what is left of a refused HTTP/2 request's body (at most
    /// [`H2_DRAIN_BYTES`], within the header deadline), so the client, still sending, gets the
    /// `400` rather than a reset stream. Past the bound the stream is reset: the connection and
    /// its other streams are unharmed either way.
    async fn drain_h2_body(&self, session: &mut Session) {
        let _ = tokio::time::timeout(self.h2_body_wait, async {
            let mut read = 0;
            while let Ok(Some(chunk)) = session.read_request_body().await {
                read += chunk.len();
                if read > H2_DRAIN_BYTES {
                    break;
                }
            }
        })
        .await;
    }

    /// The access decision: key (401), origin (403), quota (429), in that order. Every `/v1/`
    /// route but the CORS preflight passes through here; a call that passes is counted once,
    /// whatever its handler answers.
    async fn authorize(
        &self,
        session: &Session,
        route: &Route<'_>,
        ctx: &mut RequestCtx,
    ) -> Result<(), Answer> {
        if matches!(
            route,
            Route::Health | Route::Ready | Route::Preflight | Route::OpenApi | Route::Dashboard(_)
        ) {
            return Ok(());
        }
        let headers = &session.req_header().headers;
        let principal = match decide_lazily(
            &self.shared.keys.load(),
            headers.get(AUTHORIZATION).map(|v| v.as_bytes()),
            || {
                (
                    headers.get(ORIGIN).map(|v| v.as_bytes()),
                    headers.get(REFERER).map(|v| v.as_bytes()),
                )
            },
        ) {
            Ok(principal) => principal,
            Err(r) => {
                let (denial, error) = refusal(r);
                self.shared.metrics.deny(denial);
                ctx.decision = Some(match denial {
                    Denial::Forbidden => "forbidden",
                    _ => "unauthorized",
                });
                return Err(error.into());
            }
        };
        let key = principal.key.clone();
        ctx.principal = Some(principal);
        if let Some(route) = server_key_route(route) {
            if key.origins.is_some() {
                self.shared.metrics.deny(Denial::Forbidden);
                ctx.decision = Some("forbidden");
                return Err(ApiError::ServerKeyOnly(route).into());
            }
        }
        let now = self.shared.clock.now();
        key.touch(u64::try_from(now.timestamp()).unwrap_or(0));
        self.count(route, &key, now, ctx).await
    }

    /// The quota's part of the decision: an account route is rate-limited per key and reads the
    /// month without counting; every other call goes through the plan's rate and is counted
    /// once in the month, or is refused over either (unless the plan is in shadow mode).
    async fn count(
        &self,
        route: &Route<'_>,
        key: &KeyEntry,
        now: chrono::DateTime<chrono::Utc>,
        ctx: &mut RequestCtx,
    ) -> Result<(), Answer> {
        if matches!(
            route,
            Route::Usage | Route::Logs { .. } | Route::Stats | Route::Keys(_)
        ) {
            return self.account_call(key, now, ctx).await;
        }
        if matches!(route, Route::Batch { .. }) {
            // Counted by its handler, once the body says how many names it holds.
            return Ok(());
        }
        self.admit_calls(key, 1, false, now, ctx).await
    }

    /// The plan's rate and month for `calls` calls at once (one, or each name of a batch):
    /// taken whole or refused whole.
    async fn admit_calls(
        &self,
        key: &KeyEntry,
        calls: u64,
        batch: bool,
        now: chrono::DateTime<chrono::Utc>,
        ctx: &mut RequestCtx,
    ) -> Result<(), Answer> {
        let span = self.child_span(ctx, "quota", Kind::Internal);
        let admission = crate::access::policy::admit_n(&*self.shared.quota, key, calls, now).await;
        ctx.decision = Some(match admission.refusal {
            None => "allowed",
            Some(Refusal::Rate { .. }) => "rate_limited",
            Some(Refusal::Month) => "quota_exceeded",
            Some(Refusal::Unavailable) => "unavailable",
        });
        if let Some(span) = span {
            span.set("drg.decision", ctx.decision.unwrap_or_default());
            span.end();
        }
        ctx.usage = admission.usage;
        ctx.rate = admission.rate;
        if let Some(limit) = admission.would_reject {
            ctx.would_reject = Some(limit);
            self.shared.metrics.would_reject(match limit {
                Limit::Month => Denial::QuotaExceeded,
                Limit::Rate => Denial::RateLimited,
            });
        }
        if let (None | Some(Refusal::Month), Some(alerts), Some(usage)) =
            (admission.refusal, &self.shared.alerts, &ctx.usage)
        {
            // A call the month refuses carries the month's count too: once the month is used
            // up they are the project's only calls, and they offer what the outbox still lacks
            // (a failed write, a restart).
            alerts.observe(key, usage);
        }
        match admission.refusal {
            None => Ok(()),
            Some(Refusal::Rate { retry_after }) => {
                self.shared.metrics.deny(Denial::RateLimited);
                Err(ApiError::PlanRateLimited { retry_after }.into())
            }
            Some(Refusal::Month) => {
                self.shared.metrics.deny(Denial::QuotaExceeded);
                let usage = ctx.usage.unwrap_or(Usage {
                    used: key.monthly_limit,
                    limit: key.monthly_limit,
                    month: crate::access::quota::Month::containing(now),
                    now,
                });
                let remaining = usage.remaining();
                Err(ApiError::QuotaExceeded {
                    reset_at: usage.reset_at_iso(),
                    retry_after: usage.seconds_to_reset(),
                    batch: batch.then(|| {
                        (
                            remaining,
                            format!(
                                "the batch has {calls} names and {remaining} calls remain this month: nothing was counted"
                            ),
                        )
                    }),
                }
                .into())
            }
            Some(Refusal::Unavailable) => Err(ApiError::QuotaUnavailable.into()),
        }
    }

    /// An account route: rate-limited per key, the month read without counting.
    async fn account_call(
        &self,
        key: &KeyEntry,
        now: chrono::DateTime<chrono::Utc>,
        ctx: &mut RequestCtx,
    ) -> Result<(), Answer> {
        // Not counted in the month, so bounded here: each costs a store read, a keys
        // change a file rewrite and a reload on every gateway.
        let rate = self.account_rate.check(&key.id);
        if rate != crate::access::rate::RateDecision::Allowed {
            self.shared.metrics.deny(Denial::RateLimited);
            ctx.decision = Some("rate_limited");
            return Err(ApiError::RateLimited {
                retry_after: rate.retry_after_secs(),
            }
            .into());
        }
        let span = self.child_span(ctx, "quota", Kind::Internal);
        let usage = self
            .shared
            .quota
            .usage(&key.project, key.monthly_limit, now)
            .await;
        drop(span);
        match usage {
            Ok(usage) => ctx.usage = Some(usage),
            Err(_) => {
                ctx.decision = Some("unavailable");
                return Err(ApiError::QuotaUnavailable.into());
            }
        }
        ctx.decision = Some("allowed");
        Ok(())
    }

    fn usage(&self, ctx: &RequestCtx) -> Answer {
        match (&ctx.principal, &ctx.usage) {
            (Some(p), Some(u)) => crate::account::answers::usage(&p.key.plan, u),
            _ => ApiError::Internal("usage without a principal".into()).into(),
        }
    }

    /// `GET /v1/logs`: a page of the project's calls, newest first, within its retention.
    async fn logs(&self, ctx: &RequestCtx, cursor: Option<&str>, limit: usize) -> Answer {
        let (Some(calls), Some(p)) = (&self.calls, &ctx.principal) else {
            return ApiError::NotFound.into();
        };
        crate::account::answers::logs(calls, &p.key, self.shared.clock.now(), cursor, limit).await
    }

    /// `/v1/keys`: list, create (reading the small body here, bounded in size and time),
    /// revoke.
    async fn keys(&self, session: &mut Session, ctx: &mut RequestCtx, op: KeysOp) -> Answer {
        let (Some(api), Some(p)) = (&self.keys_api, &ctx.principal) else {
            return ApiError::NotFound.into();
        };
        let caller = p.key.clone();
        match op {
            KeysOp::List => api.list(&caller),
            KeysOp::Create => {
                let (limit, wait) = (api.config.max_body_bytes, api.config.body_timeout);
                match self.read_body(session, ctx, limit, wait).await {
                    Ok(body) => api.create(caller, body).await,
                    Err(e) => e.into(),
                }
            }
            KeysOp::Revoke(id) => api.revoke(caller, id).await,
        }
    }

    /// Reads a request body of at most `limit` bytes within `wait` (the routes that take one
    /// announced its length, checked against `limit` before routing).
    async fn read_body(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        limit: usize,
        wait: Duration,
    ) -> Result<Bytes, ApiError> {
        let read = tokio::time::timeout(wait, async {
            let mut body = bytes::BytesMut::new();
            while let Some(chunk) = session.read_request_body().await? {
                if body.len() + chunk.len() > limit {
                    return Ok(None);
                }
                body.extend_from_slice(&chunk);
            }
            Ok::<_, Box<Error>>(Some(body.freeze()))
        })
        .await;
        match read {
            Ok(Ok(Some(body))) => {
                ctx.body_unread = false;
                Ok(body)
            }
            Ok(Ok(None)) => Err(ApiError::PayloadTooLarge(format!(
                "request body larger than {limit} bytes"
            ))),
            Ok(Err(_)) | Err(_) => Err(ApiError::BadRequest(
                "the request body did not arrive in time".into(),
            )),
        }
    }

    /// `GET /v1/stats`: the project's calls per UTC day, the last 30 days.
    async fn stats(&self, ctx: &RequestCtx) -> Answer {
        let (Some(calls), Some(p)) = (&self.calls, &ctx.principal) else {
            return ApiError::NotFound.into();
        };
        let today = self.shared.clock.now().date_naive();
        crate::account::answers::stats(calls, &p.key.project, today).await
    }

    fn top_domains(&self, limit: usize) -> Answer {
        let body = match self.top_live.as_ref().and_then(|l| l.body(limit)) {
            Some(live) => live,
            None => self.shared.table.load().top().body(limit),
        };
        Answer::raw(StatusCode::OK, body)
    }

    /// Public readiness: the status alone. Process, key and store details are not for the
    /// internet (they belong on an operator-only listener).
    fn readiness(&self, session: &Session) -> Answer {
        let phase = self.shared.draining.phase();
        let body: &'static [u8] = if phase == Phase::HandingOff {
            br#"{"status":"upgrading"}"#
        } else if phase == Phase::Draining || session.is_process_shutting_down() {
            br#"{"status":"draining"}"#
        } else if self.shared.quota.refuses_calls() {
            br#"{"status":"quota_store_unavailable"}"#
        } else {
            return Answer::raw(StatusCode::OK, Bytes::from_static(br#"{"status":"ready"}"#));
        };
        Answer::raw(StatusCode::SERVICE_UNAVAILABLE, Bytes::from_static(body))
    }

    /// The request sent upstream, built from what we screened: the canonical path, our `Host`,
    /// the allowed client headers and ours. Nothing else of the client's request (query,
    /// absolute-form authority, cookies, forwarding headers) crosses.
    fn upstream_request(&self, session: &Session, ctx: &RequestCtx) -> Result<RequestHeader> {
        let (Some(path), Some(principal)) = (ctx.upstream_path.as_deref(), &ctx.principal) else {
            // Only a screened, authorised /v1/check call is ever sent upstream.
            return Error::e_explain(
                ErrorType::InternalError,
                "proxying a request that was not screened",
            );
        };
        let request_id = ctx.request_id.as_deref().unwrap_or_default();
        let peer = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        let headers = self.policy.headers(
            &session.req_header().headers,
            peer,
            &principal.key.id,
            request_id,
        );
        // The parts are filled directly (as for our answers, `crate::edge::http`): `append_header`
        // would render each name to bytes and parse it back, a tenth of a relayed call's cost.
        let mut map = http::HeaderMap::with_capacity(headers.len() + 1);
        map.insert(HOST, self.policy.host().clone());
        for (name, value) in headers {
            map.append(name, value);
        }
        // The backend continues our trace, under the upstream span.
        if let (Some(tracing), Some(span)) = (&self.shared.tracing, &ctx.upstream_span) {
            tracing.inject(span, &mut map);
        }
        let (mut parts, ()) = http::Request::new(()).into_parts();
        parts.method = http::Method::GET;
        parts.uri = http::Uri::try_from(path).map_err(|e| {
            Error::because(ErrorType::InternalError, "screened path is not a URI", e)
        })?;
        parts.version = http::Version::HTTP_11;
        parts.headers = map;
        Ok(RequestHeader::from(parts))
    }

    /// `/v1/check` in relay mode: what the proxy phases do (timing, metrics, 101 refused,
    /// our headers on the backend's answer, the call's verdict, errors as 502/504), around one
    /// exchange of [`crate::upstream::relay`].
    async fn relay_check(
        &self,
        relay: &crate::upstream::relay::Relay,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let mut seen = crate::upstream::relay::Seen::default();
        ctx.upstream_start = Some(Instant::now());
        ctx.upstream_span = self.child_span(ctx, "upstream", Kind::Client);
        let result = relay
            .exchange(|| self.upstream_request(session, ctx), &mut seen)
            .await;
        end_upstream_span(
            ctx,
            seen.status,
            result.as_ref().err().map(|e| e.to_string()),
        );
        ctx.upstream_status = seen.status;
        ctx.upstream_elapsed = seen
            .header_after
            .or_else(|| ctx.upstream_start.map(|s| s.elapsed()));
        if let Some(elapsed) = seen.header_after {
            self.shared.metrics.upstream_answered(elapsed);
        }
        let mut relayed = match result {
            Ok(relayed) => relayed,
            Err(e) => {
                if let Some(kind) = e.kind() {
                    self.shared.metrics.upstream_failed(kind);
                }
                let error = match &e {
                    crate::upstream::relay::RelayError::Upstream(e) => upstream_api_error(e),
                    crate::upstream::relay::RelayError::Request(_) => None,
                    other => Some(ApiError::UpstreamUnavailable(other.to_string())),
                };
                let mut answer: Answer = error
                    .unwrap_or_else(|| ApiError::Internal(e.to_string()))
                    .into();
                // As in proxy mode: an upstream failure closes the client's connection, and
                // says so.
                session.set_keepalive(None);
                access_headers(ctx, &mut answer.headers);
                return write(session, answer).await;
            }
        };
        if let (Some(calls), Some(call)) = (&self.calls, &mut ctx.call) {
            if relayed.status == StatusCode::OK && relayed.body.len() <= calls.check_body_max_bytes
            {
                call.verdict = crate::account::calls::upstream_verdict(&relayed.body);
            }
        }
        let mut ours = Vec::with_capacity(8);
        if let Some(id) = ctx
            .request_id
            .as_deref()
            .and_then(|id| HeaderValue::from_str(id).ok())
        {
            ours.push((X_REQUEST_ID, id));
        }
        access_headers(ctx, &mut ours);
        let header = relayed.response_header(ours, |h| merge_vary(h.get_all(VARY), "Origin"))?;
        crate::edge::http::write_header_and_body(session, header, std::mem::take(&mut relayed.body))
            .await
    }

    /// A child span of the request's, when the request is traced.
    fn child_span(&self, ctx: &RequestCtx, name: &'static str, kind: Kind) -> Option<Span> {
        let (Some(tracing), Some(parent)) = (&self.shared.tracing, &ctx.trace) else {
            return None;
        };
        // An unsampled request records nothing; only the upstream span is still made, as the
        // parent the backend is told of.
        if !parent.is_recording() && kind != Kind::Client {
            return None;
        }
        tracing.child(parent, name, kind)
    }

    /// Whether the socket peer is a trusted proxy: only such a caller's `traceparent` is
    /// followed (anyone else could pick trace ids and force sampling on).
    fn peer_trusted(&self, session: &Session) -> bool {
        session
            .client_addr()
            .and_then(|a| a.as_inet())
            .is_some_and(|a| self.policy.is_trusted(a.ip()))
    }

    /// The caller's request id when it sent a sane one, else a new one.
    fn request_id(&self, session: &Session) -> String {
        caller_request_id(session).map_or_else(|| self.request_ids.next(), str::to_owned)
    }

    /// The access log entry of a finished request.
    fn access_entry<'s>(
        session: &'s Session,
        ctx: &'s RequestCtx,
        status: u16,
        elapsed: Duration,
    ) -> Entry<'s> {
        let header = session.req_header();
        // Re-routing is cheaper than keeping the target in the context of every request when
        // the log is off.
        let target = match ctx.route {
            RouteClass::Domain | RouteClass::Check => {
                match route(&header.method, header.uri.path(), None) {
                    Ok(Route::Domain { raw, .. } | Route::Check { raw }) => Some(raw),
                    _ => None,
                }
            }
            _ => None,
        };
        let now = std::time::SystemTime::now();
        let time = now.checked_sub(elapsed).unwrap_or(now);
        Entry {
            time,
            request_id: ctx
                .request_id
                .as_deref()
                .or_else(|| caller_request_id(session)),
            method: header.method.as_str(),
            route: ctx.route.label(),
            target,
            status,
            duration: elapsed,
            upstream_status: ctx.upstream_status,
            upstream_duration: ctx.upstream_elapsed,
            key_id: ctx.principal.as_ref().map(|p| &*p.key.id),
            origin: header.headers.get(ORIGIN).map(HeaderValue::as_bytes),
            bytes_sent: session.body_bytes_sent(),
            would_reject: ctx.would_reject.map(Limit::code),
            trace_id: None,
        }
    }
}

/// What the metrics count and the client is told for a refused key or origin.
fn refusal(r: Rejection) -> (Denial, ApiError) {
    match r {
        Rejection::MissingKey => (
            Denial::Unauthorized,
            ApiError::Unauthorized {
                invalid_token: false,
            },
        ),
        Rejection::InvalidKey => (
            Denial::Unauthorized,
            ApiError::Unauthorized {
                invalid_token: true,
            },
        ),
        Rejection::Forbidden { origin } => (
            Denial::Forbidden,
            ApiError::Forbidden(format!("Origin: {origin}")),
        ),
    }
}

/// The routes a browser key (one with `origins`, its secret in web pages) may not call: they
/// read the project's traffic or manage its keys. Named for the `403`'s detail.
fn server_key_route(route: &Route<'_>) -> Option<&'static str> {
    match route {
        Route::Logs { .. } => Some("GET /v1/logs"),
        Route::Stats => Some("GET /v1/stats"),
        Route::Keys(KeysCall::List) => Some("GET /v1/keys"),
        Route::Keys(KeysCall::Create) => Some("POST /v1/keys"),
        Route::Keys(KeysCall::Revoke { .. }) => Some("DELETE /v1/keys/{id}"),
        _ => None,
    }
}

/// The caller's `X-Request-Id` when it is sane: 1-128 visible ASCII characters.
fn caller_request_id(session: &Session) -> Option<&str> {
    session
        .req_header()
        .headers
        .get(X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
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
    match (&ctx.usage, &ctx.rate) {
        (Some(usage), None) => {
            out.push((RATELIMIT_POLICY, ratelimit::policy(usage)));
            if let Some(v) = ratelimit::remaining(usage) {
                out.push((RATELIMIT, v));
            }
        }
        (usage, Some((rate, standing))) => {
            if let Some((policy, now)) = ratelimit::with_rate(usage.as_ref(), rate, standing) {
                out.push((RATELIMIT_POLICY, policy));
                out.push((RATELIMIT, now));
            }
        }
        (None, None) => {}
    }
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
        out.push((ACCESS_CONTROL_ALLOW_ORIGIN, origin));
        out.push((
            ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSED_HEADERS),
        ));
    }
}

/// The answer to a CORS preflight: any origin may ask; the key decides on the real request.
fn preflight(session: &Session) -> Answer {
    let methods = match session.req_header().uri.path() {
        crate::edge::route::BATCH_PATH => "POST",
        crate::edge::route::KEYS_PATH => "GET, POST",
        _ => "GET",
    };
    let mut answer = Answer::raw(StatusCode::NO_CONTENT, Bytes::new())
        .with_header(
            ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(methods),
        )
        .with_header(
            ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("Authorization, Content-Type, X-Request-Id"),
        )
        .with_header(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("86400"));
    if let Some(origin) = session.req_header().headers.get(ORIGIN) {
        answer = answer.with_header(ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    }
    answer
}

/// A `Vary` value holding every field of `existing` plus `field` (once).
fn merge_vary<'a>(existing: impl IntoIterator<Item = &'a HeaderValue>, field: &str) -> HeaderValue {
    let mut fields: Vec<&str> = existing
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .collect();
    if fields.contains(&"*") {
        return HeaderValue::from_static("*");
    }
    if !fields.iter().any(|f| f.eq_ignore_ascii_case(field)) {
        fields.push(field);
    }
    HeaderValue::from_str(&fields.join(", ")).unwrap_or_else(|_| HeaderValue::from_static("*"))
}

/// Ends the upstream span with what the backend answered, or why it did not.
fn end_upstream_span(ctx: &mut RequestCtx, status: Option<u16>, error: Option<String>) {
    let Some(span) = ctx.upstream_span.take() else {
        return;
    };
    if let Some(status) = status {
        span.set("http.response.status_code", i64::from(status));
    }
    if let Some(error) = error {
        span.fail(error);
    } else if status.is_some_and(|s| s >= 500) {
        span.fail("backend error");
    }
    span.end();
}

/// Ends the request's span with the route, the status, and who called with what decision
/// (never the target: it may be an email address).
fn end_request_span(span: Span, session: &Session, ctx: &RequestCtx, status: u16) {
    if !span.is_recording() {
        // Not sampled: nothing of it is exported, so nothing is written to it.
        return span.end();
    }
    span.rename(span_name(ctx.route));
    span.set(
        "http.request.method",
        session.req_header().method.to_string(),
    );
    span.set("http.route", ctx.route.label());
    span.set("http.response.status_code", i64::from(status));
    if let Some(p) = &ctx.principal {
        span.set("drg.key_id", p.key.id.to_string());
        span.set("drg.project", p.key.project.to_string());
    }
    if let Some(decision) = ctx.decision {
        span.set("drg.decision", decision);
    }
    if let Some(limit) = ctx.would_reject {
        span.set("drg.would_reject", limit.code());
    }
    if status >= 500 || status == 0 {
        span.fail("server error");
    }
    span.end();
}

/// The request span's name: the method and route template, never the raw path.
fn span_name(route: RouteClass) -> &'static str {
    match route {
        RouteClass::Domain => "GET /v1/public/domain/{domain}",
        RouteClass::Batch => "POST /v1/public/domains",
        RouteClass::TopDomains => "GET /v1/public/top-domains",
        RouteClass::Check => "GET /v1/check/{target}",
        RouteClass::Usage => "GET /v1/usage",
        RouteClass::Logs => "GET /v1/logs",
        RouteClass::Stats => "GET /v1/stats",
        RouteClass::Keys => "/v1/keys",
        RouteClass::OpenApi => "GET /v1/openapi.json",
        RouteClass::Preflight => "OPTIONS /v1/*",
        RouteClass::Health => "GET /healthz",
        RouteClass::Ready => "GET /readyz",
        RouteClass::Dashboard => "GET /dashboard",
        RouteClass::NotFound => "not found",
        RouteClass::Other => "other",
    }
}

fn decode(raw: &str) -> Result<std::borrow::Cow<'_, str>, ApiError> {
    // Most paths have no escape: the decoder would check the UTF-8 of a `str` again.
    if memchr::memchr(b'%', raw.as_bytes()).is_none() {
        return Ok(std::borrow::Cow::Borrowed(raw));
    }
    percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| ApiError::Validation("path is not valid UTF-8 after percent-decoding".into()))
}

/// The answer to a failed upstream call (the same in proxy and relay mode); `None` when it is
/// the client's failure (nothing to answer).
fn upstream_api_error(e: &Error) -> Option<ApiError> {
    match (e.esource(), e.etype()) {
        (_, ErrorType::ConnectTimedout)
        | (ErrorSource::Upstream, ErrorType::ReadTimedout | ErrorType::WriteTimedout) => Some(
            ApiError::UpstreamTimeout(format!("upstream: {}", e.etype().as_str())),
        ),
        (ErrorSource::Upstream, _)
        | (
            _,
            ErrorType::ConnectRefused
            | ErrorType::ConnectNoRoute
            | ErrorType::ConnectError
            | ErrorType::TLSHandshakeFailure
            | ErrorType::TLSHandshakeTimedout
            | ErrorType::InvalidCert
            | ErrorType::HandshakeError,
        ) => Some(ApiError::UpstreamUnavailable(format!(
            "upstream: {}",
            e.etype().as_str()
        ))),
        (ErrorSource::Downstream, _) => None,
        _ => Some(ApiError::Internal(e.to_string())),
    }
}

/// The upstream peer for `config` (timeouts, TLS); also what the bench floor proxies with.
pub fn upstream_peer(config: &UpstreamConfig) -> HttpPeer {
    let mut peer = HttpPeer::new(config.address.as_str(), config.tls, config.server_name());
    peer.options.connection_timeout = Some(config.connect_timeout);
    peer.options.total_connection_timeout = Some(config.connect_timeout);
    peer.options.read_timeout = Some(config.read_timeout);
    peer.options.write_timeout = Some(config.read_timeout);
    peer.options.verify_cert = config.verify_cert;
    peer.options.verify_hostname = config.verify_cert;
    peer
}

/// Request ids: a random per-process prefix and a counter, unique without a syscall per request.
struct RequestIds {
    prefix: u64,
    counter: AtomicU64,
}

impl RequestIds {
    fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is seeded from the OS; one hash of the time gives an unpredictable prefix.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        RequestIds {
            prefix: h.finish(),
            counter: AtomicU64::new(0),
        }
    }

    fn next(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{:08x}", self.prefix, n)
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
                        self.drain_h2_body(session).await;
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
                call.verdict = crate::account::calls::upstream_verdict(&buf);
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
        if let Some(kind) = UpstreamError::of(e) {
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
            upstream_api_error(e)
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
        if ctx.upstream_span.is_some() {
            end_upstream_span(ctx, ctx.upstream_status, e.map(|e| e.to_string()));
        }
        let trace_id = ctx.trace.as_ref().map(Span::trace_id);
        if let Some(span) = ctx.trace.take() {
            end_request_span(span, session, ctx, status);
        }
        self.shared.metrics.request(ctx.route, status, elapsed);
        if let Some(log) = &self.access_log {
            let entry = Self::access_entry(session, ctx, status, elapsed);
            log.send(&Entry {
                trace_id: trace_id.as_deref(),
                ..entry
            });
        }
        if let (Some(calls), Some(p), 200) = (&self.calls, &ctx.principal, status) {
            // The time the call was counted at (one clock read fewer per call); the clock's
            // own when the store failed open and left no usage.
            let at = ctx.usage.map_or_else(|| self.shared.clock.now(), |u| u.now);
            let retention = crate::account::calls::retention_of(&p.key);
            for call in ctx.call.take().into_iter().chain(ctx.batch_calls.drain(..)) {
                calls.sink.record(Call {
                    project: p.key.project.clone(),
                    retention,
                    email_domain: call.domain,
                    verdict: call.verdict,
                    at,
                    queued: Some(p.key.queued_calls().clone()),
                });
            }
        }
    }

    /// Pingora's error lines name the request with this. Its default, the raw path and `Host`,
    /// carries whatever address a client put there: masked here at the source (the logger
    /// masks every line as well).
    pub(crate) fn request_summary(&self, session: &Session, _ctx: &RequestCtx) -> String {
        let summary = session.as_downstream().request_summary();
        match crate::ops::redact::mask_emails(&summary) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vary_is_appended_to_not_replaced() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(
            merge_vary([&v("Accept-Encoding")], "Origin"),
            "Accept-Encoding, Origin"
        );
        assert_eq!(
            merge_vary([&v("origin, Accept")], "Origin"),
            "origin, Accept"
        );
        assert_eq!(
            merge_vary([&v("Accept"), &v("Cookie")], "Origin"),
            "Accept, Cookie, Origin"
        );
        assert_eq!(merge_vary([&v("*")], "Origin"), "*");
        assert_eq!(merge_vary(std::iter::empty(), "Origin"), "Origin");
    }
}
