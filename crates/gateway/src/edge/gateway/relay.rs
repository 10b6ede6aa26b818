//! `/v1/check` to the backend: the request the gateway builds for it (never the client's), and
//! relay mode's exchange around [`crate::upstream::relay`], doing what the proxy phases do in
//! proxy mode (timing, metrics, our headers on the backend's answer, the call's verdict,
//! failures as `502`/`504`).

use std::time::Instant;

use http::header::{HeaderValue, HOST, VARY};
use http::StatusCode;
use pingora::prelude::*;
use pingora::ErrorType;

use super::{access_headers, Gateway, RequestCtx};
use crate::edge::cors::merge_vary;
use crate::edge::http::write;
use crate::upstream::peer::api_error;
use crate::upstream::relay::{Relay, RelayError, Seen};
use crate::upstream::request::X_REQUEST_ID;
use drg_base::answer::{Answer, ApiError};
use drg_telemetry::trace::{spans, Kind};

impl Gateway {
    /// The request sent upstream, built from what we screened: the canonical path, our `Host`,
    /// the allowed client headers and ours. Nothing else of the client's request (query,
    /// absolute-form authority, cookies, forwarding headers) crosses.
    pub(super) fn upstream_request(
        &self,
        session: &Session,
        ctx: &RequestCtx,
    ) -> Result<RequestHeader> {
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
    pub(super) async fn relay_check(
        &self,
        relay: &Relay,
        session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let mut seen = Seen::default();
        ctx.upstream_start = Some(Instant::now());
        ctx.upstream_span = self.child_span(ctx, "upstream", Kind::Client);
        let result = relay
            .exchange(|| self.upstream_request(session, ctx), &mut seen)
            .await;
        if let Some(span) = ctx.upstream_span.take() {
            let error = result.as_ref().err().map(|e| e.to_string());
            spans::end_upstream(span, seen.status, error);
        }
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
                    RelayError::Upstream(e) => api_error(e),
                    RelayError::Request(_) => None,
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
                call.verdict = drg_projects::account::calls::upstream_verdict(&relayed.body);
            }
        }
        let mut gateway_headers = Vec::with_capacity(8);
        if let Some(id) = ctx
            .request_id
            .as_deref()
            .and_then(|id| HeaderValue::from_str(id).ok())
        {
            gateway_headers.push((X_REQUEST_ID, id));
        }
        access_headers(ctx, &mut gateway_headers);
        let header =
            relayed.response_header(gateway_headers, |h| merge_vary(h.get_all(VARY), "Origin"))?;
        crate::edge::http::write_header_and_body(session, header, std::mem::take(&mut relayed.body))
            .await
    }
}
