//! A claimed request's answer: framing refused, the route found (or not, or switched off), the
//! access decision, then the route's handler: local answers here and in the parts, lookups in
//! `lookup`, `/v1/check` screened and left to the relay or the proxy phases.

use std::time::Duration;

use bytes::Bytes;
use http::header::ORIGIN;
use http::{Method, StatusCode};
use percent_encoding::percent_decode_str;
use pingora::prelude::*;

use super::{Gateway, PendingCall, RequestCtx};
use crate::edge::route::{route, KeysCall, OverridesCall, Route, RouteError, WebhooksCall};
use crate::edge::{bodies, cors};
use drg_base::answer::{Answer, ApiError};
use drg_domain::target::screen_target;
use drg_projects::account::keys_api::KeysOp;
use drg_projects::account::overrides::OverridesOp;
use drg_projects::account::routes::{Account, AccountRoute};
use drg_projects::account::usage::Features;
use drg_projects::account::webhooks::WebhooksOp;
use drg_telemetry::lifecycle::Phase;

impl Gateway {
    /// Answers a routed request locally, or returns `None` when it is to be proxied.
    /// The request's answer, or `None` for one that goes upstream; either way its
    /// `X-Dataset-Version` is known after (a lookup sets the one of the table it read).
    pub(super) async fn handle(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Option<Answer> {
        let answer = self.answer(session, ctx).await;
        if ctx.dataset.is_none() {
            ctx.dataset = Some(crate::edge::http::dataset_header(
                self.shared.table.load().version(),
            ));
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
            Route::OpenApi => Some(match crate::edge::openapi::served() {
                Some(doc) => Answer::raw(StatusCode::OK, doc),
                None => ApiError::Internal("no OpenAPI document".into()).into(),
            }),
            Route::Preflight => {
                let header = session.req_header();
                Some(cors::preflight(
                    header.uri.path(),
                    header.headers.get(ORIGIN),
                ))
            }
            Route::Dashboard(asset) => Some(crate::edge::dashboard::answer(asset)),
            Route::Usage => Some(self.account(ctx, AccountRoute::Usage).await),
            Route::Logs { cursor, limit } => {
                let cursor = cursor.as_deref();
                Some(
                    self.account(ctx, AccountRoute::Logs { cursor, limit })
                        .await,
                )
            }
            Route::Stats => Some(self.account(ctx, AccountRoute::Stats).await),
            Route::Changes {
                after,
                since,
                limit,
            } => Some(self.changes_page(ctx, after, since, limit).await),
            // The call is made owned (it borrows the request's header) before a body is read.
            Route::Keys(call) => Some(self.keys(keys_op(call), session, ctx).await),
            // The call is made owned (it borrows the request's header) before the body is read.
            Route::Overrides(call) => Some(self.overrides(overrides_op(call), session, ctx).await),
            Route::Webhooks(call) => Some(self.webhooks(webhooks_op(call), session, ctx).await),
            Route::Reports { post } => Some(self.reports(post, session, ctx).await),
            Route::Audit { cursor, limit } => Some(match (&self.audit, &ctx.principal) {
                (Some(audit), Some(p)) => {
                    audit.page(&p.key.project, cursor.as_deref(), limit).await
                }
                _ => ApiError::NotFound.into(),
            }),
            Route::Domain { raw, explain } => Some(self.domain(raw, explain, ctx).await),
            Route::Batch { explain } => Some(self.batch(session, ctx, explain).await),
            Route::TopDomains { limit } => Some(self.top_domains(limit)),
            Route::Check { raw } => self.check(raw, session, ctx),
        }
    }

    /// `/v1/check/{raw}`: the target screened (`422` when it is not an address or a domain),
    /// then left to the proxy (`None`) with the path the upstream gets.
    fn check(&self, raw: &str, session: &Session, ctx: &mut RequestCtx) -> Option<Answer> {
        let target = match decode(raw)
            .and_then(|t| screen_target(&t).map_err(|e| ApiError::Validation(e.to_string())))
        {
            Ok(target) => target,
            Err(e) => return Some(e.into()),
        };
        if self.calls.is_some() {
            ctx.call = Some(PendingCall {
                domain: target.domain.as_str().into(),
                verdict: None,
                lookup: false,
            });
        }
        ctx.upstream_path = Some(target.upstream_path());
        ctx.request_id = Some(self.request_id(session));
        None
    }

    /// Refuses request framing the API never accepts ([`bodies::refuse_framing`]). Only the
    /// methods that take a body may carry a (small) one: `POST /v1/keys` and a rotation, a
    /// batch, `PUT /v1/overrides/{d}`, `POST /v1/webhooks` and `POST /v1/reports`; a `GET`,
    /// `DELETE` or preflight with one is a `400`, as anywhere in the API; a method no route
    /// takes gets its `405` (the body left unread).
    async fn refuse_framing(&self, session: &mut Session, ctx: &mut RequestCtx) -> Option<Answer> {
        let header = session.req_header();
        let body_limit = body_limit(
            &header.method,
            header.uri.path(),
            self.keys_api.as_ref().map(|api| api.config.max_body_bytes),
            self.batch.max_body_bytes,
        );
        match bodies::refuse_framing(session, body_limit, self.h2_body_wait).await {
            // Unread until the handler reads it: if it never does, the connection cannot be
            // reused.
            Ok(unread) => {
                ctx.body_unread = unread;
                None
            }
            Err(refused) => Some(refused),
        }
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
        // `gateway.webhooks` unset: as if the routes did not exist.
        if matches!(route, Route::Webhooks(_)) && self.webhooks.is_none() {
            return Err(ApiError::NotFound.into());
        }
        // Verdict changes off (no plan watched): as if the route did not exist.
        if matches!(route, Route::Changes { .. }) && self.changes.is_none() {
            return Err(ApiError::NotFound.into());
        }
        Ok(route)
    }

    /// The optional parts that are on, told in `/v1/usage`: each is what keeps its routes from
    /// answering 404 here (`available`) and in their handlers, so that a client reading it asks
    /// only for routes that answer.
    fn features(&self) -> Features {
        Features {
            logs: self.calls.is_some(),
            changes: self.changes.is_some(),
            keys: self.keys_api.as_ref().is_some_and(|a| a.config.enabled),
            overrides: self.overrides.is_some(),
            reports: self.reports.is_some(),
            webhooks: self.webhooks.is_some(),
            audit: self.audit.is_some(),
        }
    }

    /// Reads a request body of at most `limit` bytes within `wait` ([`bodies::read`]): once
    /// read, the connection may be reused.
    pub(super) async fn read_body(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        limit: usize,
        wait: Duration,
    ) -> Result<Bytes, ApiError> {
        let body = bodies::read(session, limit, wait).await?;
        ctx.body_unread = false;
        Ok(body)
    }

    /// The body of `POST /v1/keys` or of a rotation, read bounded in size and time.
    async fn new_key(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Bytes, ApiError> {
        let Some(api) = &self.keys_api else {
            return Err(ApiError::NotFound);
        };
        let (limit, wait) = (api.config.max_body_bytes, api.config.body_timeout);
        self.read_body(session, ctx, limit, wait).await
    }

    /// A `/v1/keys` call, its id decoded: the body of a make or a rotation read (bounded in size
    /// and time), then answered.
    async fn keys(
        &self,
        op: Result<KeysOp, ApiError>,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Answer {
        let op = match op {
            Ok(KeysOp::Create(_)) => self.new_key(session, ctx).await.map(KeysOp::Create),
            Ok(KeysOp::Rotate { id, .. }) => {
                (self.new_key(session, ctx).await).map(|body| KeysOp::Rotate { id, body })
            }
            other => other,
        };
        let op = match op {
            Ok(op) => op,
            Err(e) => return e.into(),
        };
        // The change's audit entry is written in its transaction.
        self.account(ctx, AccountRoute::Keys(op)).await
    }

    /// An account route, answered by [`drg_projects::account::routes`] for the caller's key.
    async fn account(&self, ctx: &RequestCtx, route: AccountRoute<'_>) -> Answer {
        let account = Account {
            calls: self.calls.as_ref(),
            keys_api: self.keys_api.as_ref(),
            features: self.features(),
            clock: &*self.shared.clock,
        };
        let key = ctx.principal.as_ref().map(|p| &p.key);
        account.answer(route, key, ctx.usage.as_ref()).await
    }

    /// A `/v1/overrides` call for the caller's project, a `PUT`'s body read (bounded in size
    /// and time).
    async fn overrides(
        &self,
        op: Result<OverridesOp, ApiError>,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Answer {
        let (Some(api), Some(key)) = (
            &self.overrides,
            ctx.principal.as_ref().map(|p| p.key.clone()),
        ) else {
            return ApiError::NotFound.into();
        };
        let op = match op {
            Ok(OverridesOp::Put { domain, .. }) => {
                let limit = drg_projects::account::overrides::MAX_BODY_BYTES;
                let wait = self.h2_body_wait;
                self.read_body(session, ctx, limit, wait)
                    .await
                    .map(|body| OverridesOp::Put { domain, body })
            }
            other => other,
        };
        let op = match op {
            Ok(op) => op,
            Err(e) => return e.into(),
        };
        let once = match idempotency_key(session) {
            Ok(once) => once,
            Err(e) => return e.into(),
        };
        let now = self.shared.clock.now().timestamp();
        api.answer(op, &key, now, once.as_deref()).await
    }

    /// A `/v1/webhooks` call for the caller's project, a `POST`'s body read (bounded in size
    /// and time).
    async fn webhooks(
        &self,
        op: Result<WebhooksOp, ApiError>,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Answer {
        let (Some(api), Some(key)) = (
            &self.webhooks,
            ctx.principal.as_ref().map(|p| p.key.clone()),
        ) else {
            return ApiError::NotFound.into();
        };
        let op = match op {
            Ok(WebhooksOp::Create(_)) => {
                let limit = drg_projects::account::webhooks::api::MAX_BODY_BYTES;
                let wait = self.h2_body_wait;
                (self.read_body(session, ctx, limit, wait).await).map(WebhooksOp::Create)
            }
            other => other,
        };
        let op = match op {
            Ok(op) => op,
            Err(e) => return e.into(),
        };
        let once = match idempotency_key(session) {
            Ok(once) => once,
            Err(e) => return e.into(),
        };
        let now = self.shared.clock.now().timestamp();
        api.answer(op, &key, now, once.as_deref()).await
    }

    /// `/v1/reports` for the caller's project: its reports, or (`post`) a new one, its body
    /// read bounded in size and time.
    async fn reports(&self, post: bool, session: &mut Session, ctx: &mut RequestCtx) -> Answer {
        let (Some(api), Some(key)) = (&self.reports, ctx.principal.as_ref().map(|p| p.key.clone()))
        else {
            return ApiError::NotFound.into();
        };
        let body = if post {
            let limit = drg_projects::account::reports::MAX_BODY_BYTES;
            match self.read_body(session, ctx, limit, self.h2_body_wait).await {
                Ok(b) => Some(b),
                Err(e) => return e.into(),
            }
        } else {
            None
        };
        let once = match idempotency_key(session) {
            Ok(once) => once,
            Err(e) => return e.into(),
        };
        let now = self.shared.clock.now().timestamp();
        api.answer(body, &key, now, once.as_deref()).await
    }

    /// `GET /v1/changes` for the caller's project.
    async fn changes_page(&self, ctx: &RequestCtx, after: u64, since: i64, limit: usize) -> Answer {
        match (&self.changes, &ctx.principal) {
            (Some(changes), Some(p)) => changes.page(&p.key.project, after, since, limit).await,
            _ => ApiError::NotFound.into(),
        }
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
        } else if self.shared.quota.unready_for_eviction() {
            br#"{"status":"quota_store_evicts"}"#
        } else if self.shared.control.loading() {
            br#"{"status":"control_store_loading"}"#
        } else {
            return Answer::raw(StatusCode::OK, Bytes::from_static(br#"{"status":"ready"}"#));
        };
        Answer::raw(StatusCode::SERVICE_UNAVAILABLE, Bytes::from_static(body))
    }
}

/// The request's `Idempotency-Key` (`None`: none sent), or the `422` saying what is wrong
/// with it (two of them included: which one would count?).
fn idempotency_key(session: &Session) -> Result<Option<String>, ApiError> {
    use drg_base::infra::records::once::key_problem;
    let mut sent = session
        .req_header()
        .headers
        .get_all("idempotency-key")
        .iter();
    let (Some(value), None) = (sent.next(), sent.next()) else {
        let many = session.req_header().headers.contains_key("idempotency-key");
        return match many {
            true => Err(ApiError::Validation(
                "Idempotency-Key: sent more than once".into(),
            )),
            false => Ok(None),
        };
    };
    match key_problem(value.as_bytes()) {
        Some(problem) => Err(ApiError::Validation(problem.into())),
        None => Ok(Some(String::from_utf8_lossy(value.as_bytes()).into_owned())),
    }
}

/// A `/v1/overrides` call as the handler takes it: the name decoded, a `PUT`'s body not read
/// yet (empty).
fn overrides_op(call: OverridesCall<'_>) -> Result<OverridesOp, ApiError> {
    let owned = |raw| decode(raw).map(std::borrow::Cow::into_owned);
    Ok(match call {
        OverridesCall::List { cursor, limit } => OverridesOp::List {
            cursor: cursor.map(std::borrow::Cow::into_owned),
            limit,
        },
        OverridesCall::Delete { domain } => OverridesOp::Delete {
            domain: owned(domain)?,
        },
        OverridesCall::Put { domain } => OverridesOp::Put {
            domain: owned(domain)?,
            body: Bytes::new(),
        },
    })
}

/// A `/v1/webhooks` call as the handler takes it: the id decoded, a `POST`'s body not read yet
/// (empty).
fn webhooks_op(call: WebhooksCall<'_>) -> Result<WebhooksOp, ApiError> {
    Ok(match call {
        WebhooksCall::List { cursor, limit } => WebhooksOp::List {
            cursor: cursor.map(std::borrow::Cow::into_owned),
            limit,
        },
        WebhooksCall::Create => WebhooksOp::Create(Bytes::new()),
        WebhooksCall::Delete { id } => WebhooksOp::Delete {
            id: decode(id)?.into_owned(),
        },
    })
}

/// A `/v1/keys` call as the handler takes it: the id decoded, a body not read yet (empty).
fn keys_op(call: KeysCall<'_>) -> Result<KeysOp, ApiError> {
    let owned = |raw| decode(raw).map(std::borrow::Cow::into_owned);
    Ok(match call {
        KeysCall::List => KeysOp::List,
        KeysCall::Create => KeysOp::Create(Bytes::new()),
        KeysCall::Revoke { id } => KeysOp::Revoke(owned(id)?),
        KeysCall::Rotate { id } => KeysOp::Rotate {
            id: owned(id)?,
            body: Bytes::new(),
        },
    })
}

pub(super) fn decode(raw: &str) -> Result<std::borrow::Cow<'_, str>, ApiError> {
    // Most paths have no escape: the decoder would check the UTF-8 of a `str` again.
    if memchr::memchr(b'%', raw.as_bytes()).is_none() {
        return Ok(std::borrow::Cow::Borrowed(raw));
    }
    percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| ApiError::Validation("path is not valid UTF-8 after percent-decoding".into()))
}

/// The largest body `method` on `path` takes (0: none). Also while a route is off: its 404
/// comes after routing, as `/v1/keys`' does.
fn body_limit(method: &Method, path: &str, keys: Option<usize>, batch: usize) -> usize {
    use crate::edge::route::{
        takes_keys_body, BATCH_PATH, OVERRIDES_ITEM_PREFIX, REPORTS_PATH, WEBHOOKS_PATH,
    };
    let limit = match path {
        _ if takes_keys_body(path) => keys.unwrap_or(0),
        _ if path.starts_with(OVERRIDES_ITEM_PREFIX) => {
            drg_projects::account::overrides::MAX_BODY_BYTES
        }
        WEBHOOKS_PATH => drg_projects::account::webhooks::api::MAX_BODY_BYTES,
        REPORTS_PATH => drg_projects::account::reports::MAX_BODY_BYTES,
        BATCH_PATH => batch,
        // Most requests (every lookup): no body on this path whatever the method, and no
        // routing spent to say so.
        _ => return 0,
    };
    // A method the route takes without a body refuses one (`400`); a method the route does
    // not take gets the path's limit, so its answer is the route's `405` (the body unread).
    let bodiless = matches!(
        *method,
        Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS
    );
    let not_taken = || {
        matches!(
            crate::edge::route::route(method, path, None),
            Err(crate::edge::route::RouteError::MethodNotAllowed { .. })
        )
    };
    if bodiless && !not_taken() {
        return 0;
    }
    limit
}

#[cfg(test)]
mod body_tests {
    use super::*;

    #[test]
    fn only_the_methods_that_take_a_body_may_send_one() {
        let limit = |m: Method, p: &str| body_limit(&m, p, Some(4096), 65_536);
        assert_eq!(limit(Method::POST, "/v1/keys"), 4096);
        assert_eq!(limit(Method::POST, "/v1/keys/k1/rotate"), 4096);
        assert_eq!(limit(Method::POST, "/v1/public/domains"), 65_536);
        assert!(limit(Method::PUT, "/v1/overrides/a.com") > 0);
        assert!(limit(Method::POST, "/v1/webhooks") > 0);
        assert!(limit(Method::POST, "/v1/reports") > 0);
        for (m, p) in [
            (Method::GET, "/v1/keys"),
            (Method::GET, "/v1/webhooks"),
            (Method::GET, "/v1/reports"),
            (Method::GET, "/v1/overrides"),
            (Method::DELETE, "/v1/overrides/a.com"),
            (Method::DELETE, "/v1/webhooks/wh_1"),
            (Method::DELETE, "/v1/keys/k1"),
            (Method::OPTIONS, "/v1/webhooks"),
            (Method::GET, "/v1/public/domain/a.com"),
        ] {
            assert_eq!(limit(m.clone(), p), 0, "{m} {p}");
        }
        assert_eq!(body_limit(&Method::POST, "/v1/keys", None, 1), 0);
        // A method the route does not take, on a path that takes a body: its limit, so
        // routing answers 405.
        assert_eq!(
            limit(Method::TRACE, "/v1/webhooks"),
            limit(Method::POST, "/v1/webhooks")
        );
        assert_eq!(limit(Method::PATCH, "/v1/keys"), 4096);
        assert_eq!(limit(Method::DELETE, "/v1/keys"), 4096);
        assert_eq!(limit(Method::GET, "/v1/keys/k1/rotate"), 4096);
        assert!(limit(Method::GET, "/v1/overrides/a.com") > 0);
    }
}
