//! The traffic policy of one counted call: the plan's per-second rate first (a call it refuses is
//! not counted in the month), then the month; enforced, or in shadow mode only reported. Free of
//! HTTP: the edge turns the outcome into an answer and headers.

use chrono::{DateTime, Utc};

use crate::keys::KeyEntry;
use crate::plan::PlanMode;
use crate::quota::{Consumed, QuotaStore, Usage, SHADOW_LIMIT};
use crate::rate::{RateConfig, RateDecision, RateStanding};

/// A limit of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Month,
    Rate,
}

impl Limit {
    /// The error code a refusal for it carries (and `X-RateLimit-Would-Reject` names).
    pub fn code(self) -> &'static str {
        match self {
            Limit::Month => "quota_exceeded",
            Limit::Rate => "rate_limited",
        }
    }
}

/// Why an enforced plan refuses the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Over the per-second rate: retry after this many seconds (rounded up).
    Rate { retry_after: u64 },
    /// The month is used up (`Admission::usage` says until when).
    Month,
    /// The store cannot decide (Redis down under `fail_closed`).
    Unavailable,
}

/// What the policy made of one call.
#[derive(Debug, Clone, Copy, Default)]
pub struct Admission {
    /// The month after this call, with the plan's limit (absent when the month was not asked).
    pub usage: Option<Usage>,
    /// The plan's rate and where it stands (absent without a rate).
    pub rate: Option<(RateConfig, RateStanding)>,
    /// Shadow mode: the first limit enforce mode would have refused the call for.
    pub would_reject: Option<Limit>,
    pub refusal: Option<Refusal>,
}

/// Applies `key`'s plan to one call at `now`: takes its place in the rate, counts it in the
/// month. In shadow mode nothing is refused, and the month counts every call served (the count
/// stays exact; the plan's limit is compared here).
pub async fn admit(store: &dyn QuotaStore, key: &KeyEntry, now: DateTime<Utc>) -> Admission {
    admit_n(store, key, 1, now).await
}

/// [`admit`] for `calls` calls at once (a batch of lookups): each is one call, and the batch is
/// taken whole or refused whole, in the rate as in the month.
pub async fn admit_n(
    store: &dyn QuotaStore,
    key: &KeyEntry,
    calls: u64,
    now: DateTime<Utc>,
) -> Admission {
    let shadow = key.mode == PlanMode::Shadow;
    let mut out = Admission::default();
    if let Some(rate) = key.rate {
        let standing = match store.take_rate_n(&key.project, rate, calls).await {
            Ok(standing) => standing,
            Err(_) => return refused(out, Refusal::Unavailable),
        };
        out.rate = Some((rate, standing));
        if let RateDecision::Limited { .. } = standing.decision {
            if !shadow {
                let retry_after = standing.decision.retry_after_secs();
                return refused(out, Refusal::Rate { retry_after });
            }
            out.would_reject = Some(Limit::Rate);
        }
    }
    let limit = if shadow {
        SHADOW_LIMIT.max(key.monthly_limit)
    } else {
        key.monthly_limit
    };
    let consumed = crate::quota::consume(store, &key.project, limit, calls, now).await;
    match consumed {
        Ok(Consumed::Allowed(usage)) => {
            let usage = Usage {
                limit: key.monthly_limit,
                ..usage
            };
            if usage.used > usage.limit {
                out.would_reject.get_or_insert(Limit::Month);
            }
            out.usage = Some(usage);
            out
        }
        Ok(Consumed::Exceeded(usage)) => {
            out.usage = Some(Usage {
                limit: key.monthly_limit,
                ..usage
            });
            give_back_rate(store, key, calls, &mut out).await;
            refused(out, Refusal::Month)
        }
        // Only a shared store under `fail_closed` says no; it logs the outage itself.
        Err(_) => {
            give_back_rate(store, key, calls, &mut out).await;
            refused(out, Refusal::Unavailable)
        }
    }
}

/// The month refused what the rate let through: the rate gets it back, so a refused call (a
/// whole refused batch) spends nothing and the project's next calls are not rate-limited for it.
async fn give_back_rate(store: &dyn QuotaStore, key: &KeyEntry, calls: u64, out: &mut Admission) {
    let (Some(rate), Some((_, standing))) = (key.rate, out.rate) else {
        return;
    };
    if standing.decision != RateDecision::Allowed {
        return;
    }
    if let Ok(after) = store.give_back_rate_n(&key.project, rate, calls).await {
        out.rate = Some((rate, after));
    }
}

fn refused(mut out: Admission, why: Refusal) -> Admission {
    out.refusal = Some(why);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::local::LocalStore;

    fn key(monthly_limit: u64, rate: Option<RateConfig>, mode: PlanMode) -> KeyEntry {
        let mut key = KeyEntry::for_tests("k", "proj");
        key.monthly_limit = monthly_limit;
        key.rate = rate;
        key.mode = mode;
        key
    }

    fn now() -> DateTime<Utc> {
        "2026-11-23T12:00:00Z".parse().unwrap()
    }

    #[tokio::test]
    async fn the_rate_refuses_before_the_month_counts() {
        let store = LocalStore::in_memory();
        let rate = RateConfig {
            per_second: 1,
            burst: 2,
        };
        let k = key(100, Some(rate), PlanMode::Enforce);
        let a = admit(&store, &k, now()).await;
        assert_eq!(a.refusal, None);
        assert_eq!(a.usage.map(|u| u.used), Some(1));
        admit(&store, &k, now()).await;
        let over = admit(&store, &k, now()).await;
        assert_eq!(over.refusal, Some(Refusal::Rate { retry_after: 1 }));
        assert_eq!(over.usage, None, "the month was not asked");
        let month = store.usage("proj", 100, now()).await.unwrap();
        assert_eq!(month.used, 2, "the refused call is not counted");
    }

    #[tokio::test]
    async fn a_call_the_month_refuses_spends_no_rate() {
        let store = LocalStore::in_memory();
        let rate = RateConfig {
            per_second: 1,
            burst: 10,
        };
        let k = key(3, Some(rate), PlanMode::Enforce);
        assert_eq!(admit_n(&store, &k, 3, now()).await.refusal, None);
        // A batch of 7 and single calls, all over the month: refused for the month each time,
        // the rate given back each time (7 of the 10 left would make the next calls wait).
        for calls in [7, 1, 1, 7] {
            let a = admit_n(&store, &k, calls, now()).await;
            assert_eq!(a.refusal, Some(Refusal::Month), "{calls}");
            assert_eq!(
                a.rate.unwrap().1.remaining,
                7,
                "{calls}: what the header says"
            );
        }
        let month = store.usage("proj", 3, now()).await.unwrap();
        assert_eq!(month.used, 3);
        // Without the give-back the rate would say 0 left and refuse; it still has its 7.
        let plenty = key(100, Some(rate), PlanMode::Enforce);
        assert_eq!(admit_n(&store, &plenty, 7, now()).await.refusal, None);
    }

    #[tokio::test]
    async fn shadow_mode_serves_counts_and_reports() {
        let store = LocalStore::in_memory();
        let rate = RateConfig {
            per_second: 1,
            burst: 1,
        };
        let k = key(2, Some(rate), PlanMode::Shadow);
        let mut seen = Vec::new();
        for _ in 0..4 {
            let a = admit(&store, &k, now()).await;
            assert_eq!(a.refusal, None);
            seen.push(a.would_reject);
        }
        // The 2nd call is over the rate; the 3rd and 4th are over both (the rate is named first).
        assert_eq!(
            seen,
            [
                None,
                Some(Limit::Rate),
                Some(Limit::Rate),
                Some(Limit::Rate)
            ]
        );
        let k = key(2, None, PlanMode::Shadow);
        let a = admit(&store, &k, now()).await;
        assert_eq!(a.would_reject, Some(Limit::Month));
        let usage = a.usage.unwrap();
        assert_eq!((usage.used, usage.limit, usage.remaining()), (5, 2, 0));
    }

    #[tokio::test]
    async fn a_batch_is_taken_whole_or_refused_whole() {
        let store = LocalStore::in_memory();
        let k = key(10, None, PlanMode::Enforce);
        let a = admit_n(&store, &k, 7, now()).await;
        assert_eq!(a.refusal, None);
        assert_eq!(a.usage.map(|u| u.used), Some(7));
        let over = admit_n(&store, &k, 4, now()).await;
        assert_eq!(over.refusal, Some(Refusal::Month));
        assert_eq!(over.usage.map(|u| u.remaining()), Some(3));
        let fits = admit_n(&store, &k, 3, now()).await;
        assert_eq!(fits.refusal, None);
        assert_eq!(store.usage("proj", 10, now()).await.unwrap().used, 10);
        // The rate: a batch takes its calls from the burst, all or none.
        let rate = RateConfig {
            per_second: 1,
            burst: 5,
        };
        let k = key(1_000, Some(rate), PlanMode::Enforce);
        assert_eq!(admit_n(&store, &k, 4, now()).await.refusal, None);
        let over = admit_n(&store, &k, 2, now()).await;
        assert!(
            matches!(over.refusal, Some(Refusal::Rate { .. })),
            "{over:?}"
        );
        assert_eq!(over.usage, None, "the month was not asked");
    }

    #[tokio::test]
    async fn an_enforced_month_refuses_at_its_limit() {
        let store = LocalStore::in_memory();
        let k = key(1, None, PlanMode::Enforce);
        assert_eq!(admit(&store, &k, now()).await.refusal, None);
        let over = admit(&store, &k, now()).await;
        assert_eq!(over.refusal, Some(Refusal::Month));
        assert_eq!(over.usage.map(|u| u.used), Some(1));
    }
}
