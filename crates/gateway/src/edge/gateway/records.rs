//! What a request leaves behind: its request id (the caller's when sane), its access-log
//! entry, and the calls recorded for `/v1/logs` and `/v1/stats`.

use std::time::Duration;

use http::header::{HeaderValue, ORIGIN};
use pingora::prelude::*;

use super::{Gateway, RequestCtx};
use crate::edge::route::{route, Route};
use crate::upstream::request::X_REQUEST_ID;
use drg_access::policy::Limit;
use drg_projects::account::calls::Call;
use drg_telemetry::access_log::Entry;
use drg_telemetry::metrics::RouteClass;

impl Gateway {
    /// The caller's request id when it sent a sane one, else a new one.
    pub(super) fn request_id(&self, session: &Session) -> String {
        caller_request_id(session).map_or_else(|| self.request_ids.next(), str::to_owned)
    }

    /// Hands a request's calls (one, or a batch's) to the call log, once it was answered `200`
    /// with a principal.
    pub(super) fn record_calls(&self, ctx: &mut RequestCtx) {
        let (Some(calls), Some(p)) = (&self.calls, &ctx.principal) else {
            return;
        };
        // The time the call was counted at (one clock read fewer per call); the clock's
        // own when the store failed open and left no usage.
        let at = ctx.usage.map_or_else(|| self.shared.clock.now(), |u| u.now);
        let retention = drg_projects::account::calls::retention_of(&p.key);
        for call in ctx.call.take().into_iter().chain(ctx.batch_calls.drain(..)) {
            calls.sink.record(Call {
                project: p.key.project.clone(),
                retention,
                email_domain: call.domain,
                verdict: call.verdict,
                lookup: call.lookup,
                at,
                queued: Some(p.key.queued_calls().clone()),
            });
        }
    }

    /// The access log entry of a finished request.
    pub(super) fn access_entry<'s>(
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

/// The caller's `X-Request-Id` when it is sane: 1-128 visible ASCII characters.
fn caller_request_id(session: &Session) -> Option<&str> {
    session
        .req_header()
        .headers
        .get(X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
}
