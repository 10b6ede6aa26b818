//! The access decision of a routed request: the key and its origin (`401`, `403`), browser
//! keys kept off the account routes, then the quota: an account route's per-key rate and month
//! read, any other call's plan rate and month counted (`429`, `503`), or shadow mode's
//! `would_reject`. Decisions come from `access`; this turns them into the context, metrics,
//! alerts and answers.

use http::header::{AUTHORIZATION, ORIGIN, REFERER};
use pingora::prelude::*;

use super::{Gateway, RequestCtx};
use crate::edge::route::{KeysCall, OverridesCall, Route, WebhooksCall};
use drg_access::keys::KeyEntry;
use drg_access::policy::{Limit, Refusal};
use drg_access::quota::Usage;
use drg_access::{decide_remembering, Rejection};
use drg_base::answer::{Answer, ApiError};
use drg_telemetry::metrics::Denial;
use drg_telemetry::trace::Kind;

impl Gateway {
    /// The access decision: key (401), origin (403), quota (429), in that order. Every `/v1/`
    /// route but the CORS preflight passes through here; a call that passes is counted once,
    /// whatever its handler answers.
    pub(super) async fn authorize(
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
        // Read once a key is found, before its expiry is judged on this gateway's clock (no
        // sync needed): a request without a key reads none.
        let mut read = None;
        let principal = match decide_remembering(
            &self.shared.keys.load(),
            crate::edge::downstream::LimitedStream::token_memo(session),
            headers.get(AUTHORIZATION).map(|v| v.as_bytes()),
            || read.insert(self.shared.clock.now()).timestamp(),
            || {
                (
                    headers.get(ORIGIN).map(|v| v.as_bytes()),
                    headers.get(REFERER).map(|v| v.as_bytes()),
                )
            },
        ) {
            Ok(principal) => principal,
            Err(Rejection::Unverified) => {
                ctx.decision = Some("unavailable");
                return Err(ApiError::KeyUnverified.into());
            }
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
        let now = read.unwrap_or_else(|| self.shared.clock.now());
        if let Some(route) = server_key_route(route) {
            if principal.key.origins.is_some() {
                ctx.principal = Some(principal);
                self.shared.metrics.deny(Denial::Forbidden);
                ctx.decision = Some("forbidden");
                return Err(ApiError::ServerKeyOnly(route).into());
            }
        }
        principal
            .key
            .touch(u64::try_from(now.timestamp()).unwrap_or(0));
        // The principal goes into the context once counted (nothing in between reads it
        // there): a second handle on the key would be a count every worker bumps.
        let counted = self.count(route, &principal.key, now, ctx).await;
        ctx.principal = Some(principal);
        counted
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
            Route::Usage
                | Route::Logs { .. }
                | Route::Stats
                | Route::Changes { .. }
                | Route::Keys(_)
                | Route::Overrides(_)
                | Route::Webhooks(_)
                | Route::Reports { .. }
                | Route::Audit { .. }
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
    pub(super) async fn admit_calls(
        &self,
        key: &KeyEntry,
        calls: u64,
        batch: bool,
        now: chrono::DateTime<chrono::Utc>,
        ctx: &mut RequestCtx,
    ) -> Result<(), Answer> {
        let span = self.child_span(ctx, "quota", Kind::Internal);
        let admission = drg_access::policy::admit_n(&*self.shared.quota, key, calls, now).await;
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
                    month: drg_access::quota::Month::containing(now),
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

    /// A batch whose body was refused before its names could be counted (wrong media type,
    /// too large, slow, empty, malformed, too many names): nothing is counted in the month,
    /// but each takes one call of a per-key rate in this process (the plan's, else
    /// `access.account_rate`), so a key that sends only bad bodies is told `429` like one
    /// that sends good ones too fast. Without it such bodies were free of every limit.
    pub(super) fn refused_body(
        &self,
        key: &KeyEntry,
        refusal: Answer,
        ctx: &mut RequestCtx,
    ) -> Answer {
        let rate = key.rate.unwrap_or(self.account_rate_config);
        let standing = self.refused_bodies.check(&key.id, rate);
        let drg_access::rate::RateDecision::Limited { .. } = standing.decision else {
            return refusal;
        };
        if key.mode == drg_access::plan::PlanMode::Shadow {
            // Shadow mode refuses nothing: the answer says what enforce mode would have done.
            ctx.would_reject = Some(Limit::Rate);
            self.shared.metrics.would_reject(Denial::RateLimited);
            return refusal;
        }
        self.shared.metrics.deny(Denial::RateLimited);
        ctx.decision = Some("rate_limited");
        ApiError::RateLimited {
            retry_after: standing.decision.retry_after_secs(),
        }
        .into()
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
        if rate != drg_access::rate::RateDecision::Allowed {
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
        Rejection::Expired { at } => (
            Denial::Unauthorized,
            ApiError::KeyExpired(format!(
                "this API key expired at {}",
                drg_base::infra::units::utc_seconds(at).unwrap_or_default()
            )),
        ),
        Rejection::Forbidden { origin } => (
            Denial::Forbidden,
            ApiError::Forbidden(format!("Origin: {origin}")),
        ),
        // Answered before (no denial to count).
        Rejection::Unverified => (Denial::Unauthorized, ApiError::KeyUnverified),
    }
}

/// The routes a browser key (one with `origins`, its secret in web pages) may not call: they
/// read the project's traffic or manage its keys. Named for the `403`'s detail.
fn server_key_route(route: &Route<'_>) -> Option<&'static str> {
    match route {
        Route::Logs { .. } => Some("GET /v1/logs"),
        Route::Stats => Some("GET /v1/stats"),
        Route::Changes { .. } => Some("GET /v1/changes"),
        Route::Keys(KeysCall::List) => Some("GET /v1/keys"),
        Route::Keys(KeysCall::Create) => Some("POST /v1/keys"),
        Route::Keys(KeysCall::Revoke { .. }) => Some("DELETE /v1/keys/{id}"),
        Route::Overrides(OverridesCall::List { .. }) => Some("GET /v1/overrides"),
        Route::Overrides(OverridesCall::Put { .. }) => Some("PUT /v1/overrides/{domain}"),
        Route::Overrides(OverridesCall::Delete { .. }) => Some("DELETE /v1/overrides/{domain}"),
        Route::Webhooks(WebhooksCall::List { .. }) => Some("GET /v1/webhooks"),
        Route::Webhooks(WebhooksCall::Create) => Some("POST /v1/webhooks"),
        Route::Webhooks(WebhooksCall::Delete { .. }) => Some("DELETE /v1/webhooks/{id}"),
        Route::Reports { post: false } => Some("GET /v1/reports"),
        Route::Reports { post: true } => Some("POST /v1/reports"),
        Route::Audit { .. } => Some("GET /v1/audit"),
        Route::Keys(KeysCall::Rotate { .. }) => Some("POST /v1/keys/{id}/rotate"),
        _ => None,
    }
}
