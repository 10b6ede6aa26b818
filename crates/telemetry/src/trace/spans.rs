//! The gateway's spans by name and attribute: a request span named from its route class (never
//! the path) with the route, status, key, project and decision; the upstream span's outcome.
//! No target (it may be an email address), header value or secret is ever set.

use super::{Kind, Span, Tracing};
use crate::metrics::RouteClass;

/// What a finished request's span records: handed over by the edge, which knows the request.
pub struct Finished<'a> {
    pub method: &'a http::Method,
    pub route: RouteClass,
    pub status: u16,
    /// The caller's key id and project, once the key checks passed.
    pub key: Option<(&'a str, &'a str)>,
    /// What the access decision came to (`allowed`, `unauthorized`, ...).
    pub decision: Option<&'static str>,
    /// Shadow mode: the limit enforce mode would have refused the call for.
    pub would_reject: Option<&'static str>,
}

/// A child span of the request's `parent`, when the request is traced.
pub fn child(
    tracing: Option<&Tracing>,
    parent: Option<&Span>,
    name: &'static str,
    kind: Kind,
) -> Option<Span> {
    let (Some(tracing), Some(parent)) = (tracing, parent) else {
        return None;
    };
    // An unsampled request records nothing; only the upstream span is still made, as the
    // parent the backend is told of.
    if !parent.is_recording() && kind != Kind::Client {
        return None;
    }
    tracing.child(parent, name, kind)
}

/// Ends the upstream span with what the backend answered, or why it did not.
pub fn end_upstream(span: Span, status: Option<u16>, error: Option<String>) {
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
pub fn end_request(span: Span, request: &Finished<'_>) {
    if !span.is_recording() {
        // Not sampled: nothing of it is exported, so nothing is written to it.
        return span.end();
    }
    span.rename(name(request.route));
    span.set("http.request.method", request.method.to_string());
    span.set("http.route", request.route.label());
    span.set("http.response.status_code", i64::from(request.status));
    if let Some((key_id, project)) = request.key {
        span.set("drg.key_id", key_id.to_string());
        span.set("drg.project", project.to_string());
    }
    if let Some(decision) = request.decision {
        span.set("drg.decision", decision);
    }
    if let Some(limit) = request.would_reject {
        span.set("drg.would_reject", limit);
    }
    if request.status >= 500 || request.status == 0 {
        span.fail("server error");
    }
    span.end();
}

/// The request span's name: the method and route template, never the raw path.
fn name(route: RouteClass) -> &'static str {
    match route {
        RouteClass::Domain => "GET /v1/public/domain/{domain}",
        RouteClass::Batch => "POST /v1/public/domains",
        RouteClass::TopDomains => "GET /v1/public/top-domains",
        RouteClass::Check => "GET /v1/check/{target}",
        RouteClass::Usage => "GET /v1/usage",
        RouteClass::Logs => "GET /v1/logs",
        RouteClass::Stats => "GET /v1/stats",
        RouteClass::Changes => "GET /v1/changes",
        RouteClass::Keys => "/v1/keys",
        RouteClass::Overrides => "/v1/overrides",
        RouteClass::Webhooks => "/v1/webhooks",
        RouteClass::Reports => "/v1/reports",
        RouteClass::Audit => "/v1/audit",
        RouteClass::OpenApi => "GET /v1/openapi.json",
        RouteClass::Preflight => "OPTIONS /v1/*",
        RouteClass::Health => "GET /healthz",
        RouteClass::Ready => "GET /readyz",
        RouteClass::Dashboard => "GET /dashboard",
        RouteClass::NotFound => "not found",
        RouteClass::Other => "other",
    }
}
