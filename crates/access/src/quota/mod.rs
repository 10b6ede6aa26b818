//! Monthly quotas and per-second rates: calendar-month maths (UTC), the clock, and the
//! `QuotaStore` interface that the embedded store (and a shared one) implement.

pub mod alerts;
pub mod config;
pub mod local;
pub mod ratelimit;
pub mod redis;
pub mod services;

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Datelike, TimeZone, Utc};

use crate::rate::{RateConfig, RateStanding};

/// The limit a plan in shadow mode counts under: every call is counted (the count stays exact),
/// and the gateway compares it with the plan's limit itself. The embedded store's largest.
pub const SHADOW_LIMIT: u64 = local::MAX_MONTHLY_LIMIT;

/// A calendar month in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Month {
    pub year: i32,
    /// 1..=12
    pub month: u32,
}

impl Month {
    pub fn containing(t: DateTime<Utc>) -> Month {
        Month {
            year: t.year(),
            month: t.month(),
        }
    }

    /// Months since year 0: a compact, ordered id.
    pub fn index(self) -> u32 {
        (self.year.max(0) as u32) * 12 + (self.month - 1)
    }

    pub fn from_index(index: u32) -> Month {
        Month {
            year: (index / 12) as i32,
            month: index % 12 + 1,
        }
    }

    pub fn start(self) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(self.year, self.month, 1, 0, 0, 0)
            .single()
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    }

    pub fn next(self) -> Month {
        Month::from_index(self.index() + 1)
    }

    /// The instant the quota resets: 00:00 UTC on the 1st of the next month.
    pub fn reset_at(self) -> DateTime<Utc> {
        self.next().start()
    }

    /// Length of the month in seconds.
    pub fn seconds(self) -> i64 {
        (self.reset_at() - self.start()).num_seconds()
    }

    /// `YYYY-MM`, as in state files and Redis keys.
    pub fn label(self) -> String {
        format!("{:04}-{:02}", self.year, self.month)
    }

    pub fn parse_label(s: &str) -> Option<Month> {
        let (y, m) = s.split_once('-')?;
        let month: u32 = m.parse().ok()?;
        let year: i32 = y.parse().ok()?;
        // `YYYY-MM`: a larger year would overflow the month index (and the packed counter word),
        // so a state file holding one is refused rather than read as another month (fuzzing).
        ((1..=12).contains(&month) && (0..=9999).contains(&year)).then_some(Month { year, month })
    }
}

/// Where a key stands in its month.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub used: u64,
    pub limit: u64,
    pub month: Month,
    pub now: DateTime<Utc>,
}

impl Usage {
    pub fn remaining(&self) -> u64 {
        self.limit.saturating_sub(self.used)
    }

    pub fn reset_at(&self) -> DateTime<Utc> {
        self.month.reset_at()
    }

    /// Seconds until the reset, at least 1.
    pub fn seconds_to_reset(&self) -> i64 {
        (self.reset_at() - self.now).num_seconds().max(1)
    }

    /// ISO-8601 UTC, e.g. `2026-12-01T00:00:00Z`.
    pub fn reset_at_iso(&self) -> String {
        drg_base::infra::units::rfc3339(self.reset_at())
    }
}

/// The outcome of counting one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consumed {
    /// Counted; `used` includes this call.
    Allowed(Usage),
    /// Not counted: the month's quota is used up.
    Exceeded(Usage),
}

/// The store cannot decide (a shared store that is down under a `fail_closed` policy).
#[derive(Debug, thiserror::Error)]
#[error("quota store: {0}")]
pub struct QuotaError(pub String);

/// Counts `calls` calls (a batch; 1 for a single call) of `key_id` if all of them fit under
/// `limit` this month, atomically: the one way the gateway counts. The store's answer is taken
/// without a future when it has one at once ([`QuotaStore::consume_now`]: no boxed future on
/// every request), else waited for ([`QuotaStore::consume_n`]).
pub async fn consume(
    store: &dyn QuotaStore,
    key_id: &str,
    limit: u64,
    calls: u64,
    now: DateTime<Utc>,
) -> Result<Consumed, QuotaError> {
    match store.consume_now(key_id, limit, calls, now) {
        Some(consumed) => consumed,
        None => store.consume_n(key_id, limit, calls, now).await,
    }
}

/// Counts calls per key and calendar month. Callers count through [`consume`].
#[async_trait]
pub trait QuotaStore: Send + Sync {
    /// [`QuotaStore::consume_n`] when the store can answer without waiting (a store in this
    /// process, its key's slot not being claimed): no future to box on every request. `None`:
    /// ask `consume_n`.
    fn consume_now(
        &self,
        _key_id: &str,
        _limit: u64,
        _calls: u64,
        _now: DateTime<Utc>,
    ) -> Option<Result<Consumed, QuotaError>> {
        None
    }

    /// Counts `calls` calls (a batch) if all of them fit under `limit` this month, atomically:
    /// all or none. `Exceeded` carries the count as it stands, untouched.
    async fn consume_n(
        &self,
        key_id: &str,
        limit: u64,
        calls: u64,
        now: DateTime<Utc>,
    ) -> Result<Consumed, QuotaError>;

    /// The key's usage this month, counting nothing.
    async fn usage(
        &self,
        key_id: &str,
        limit: u64,
        now: DateTime<Utc>,
    ) -> Result<Usage, QuotaError>;

    /// Checks (and, when allowed, takes) one call of `project` at `rate`. The embedded store
    /// limits per gateway process; Redis for all gateways at once (under the same budget,
    /// breaker and failure policy as the count; `fail_open` limits per gateway meanwhile).
    async fn take_rate(
        &self,
        project: &Arc<str>,
        rate: RateConfig,
    ) -> Result<RateStanding, QuotaError> {
        self.take_rate_n(project, rate, 1).await
    }

    /// Checks (and, when allowed, takes) `calls` calls at once (`access::rate::gcra_n`).
    async fn take_rate_n(
        &self,
        project: &Arc<str>,
        rate: RateConfig,
        calls: u64,
    ) -> Result<RateStanding, QuotaError>;

    /// Gives back `calls` calls [`take_rate_n`](Self::take_rate_n) took for `project` (the
    /// month then refused them: a refused call spends nothing), atomically with other takes;
    /// the standing after it.
    async fn give_back_rate_n(
        &self,
        project: &Arc<str>,
        rate: RateConfig,
        calls: u64,
    ) -> Result<RateStanding, QuotaError>;

    /// The store's state, for `/readyz`.
    fn status(&self) -> serde_json::Value;

    /// Whether the store refuses every counted call now (`/readyz` answers 503 meanwhile).
    fn refuses_calls(&self) -> bool {
        false
    }

    /// Whether the shared store may lose what it holds (Redis evicts) and the operator asked
    /// for the gateway to be unready meanwhile (`/readyz` answers 503 `quota_store_evicts`).
    fn unready_for_eviction(&self) -> bool {
        false
    }
}

/// The time the quota is counted in. Injected so month rollovers are testable.
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
}

/// Real time, optionally shifted by a fixed offset (for testing rollovers end to end).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock {
    pub offset: chrono::Duration,
}

impl SystemClock {
    /// A clock that reads `start` now and runs at real speed from there.
    pub fn starting_at(start: DateTime<Utc>) -> Self {
        SystemClock {
            offset: start - Utc::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        // Unshifted (every real deployment): no calendar arithmetic on each call.
        if self.offset.is_zero() {
            return Utc::now();
        }
        Utc::now() + self.offset
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn months_are_utc_calendar_months() {
        let m = Month::containing(t("2026-02-14T10:00:00Z"));
        assert_eq!(m.label(), "2026-02");
        assert_eq!(m.seconds(), 28 * 86_400);
        assert_eq!(m.reset_at(), t("2026-03-01T00:00:00Z"));
        assert_eq!(
            Month::containing(t("2028-02-29T23:59:59Z")).seconds(),
            29 * 86_400
        );
        let dec = Month::containing(t("2026-12-31T23:59:59Z"));
        assert_eq!(dec.next().label(), "2027-01");
        assert_eq!(Month::from_index(dec.index()), dec);
        assert_eq!(Month::parse_label("2026-12"), Some(dec));
        assert_eq!(Month::parse_label("2026-13"), None);
        // Found by fuzzing the state file: a huge year overflowed the month index.
        assert_eq!(Month::parse_label("580100730-2"), None);
        assert_eq!(Month::parse_label("2000000-01"), None);
        assert_eq!(Month::parse_label("-1-01"), None);
    }

    #[test]
    fn usage_renders_the_draft_headers() {
        let now = t("2026-11-30T23:00:00Z");
        let u = Usage {
            used: 40,
            limit: 100,
            month: Month::containing(now),
            now,
        };
        assert_eq!(ratelimit::policy(&u), "\"monthly\";q=100;w=2592000");
        assert_eq!(ratelimit::remaining(&u).unwrap(), "\"monthly\";r=60;t=3600");
        assert_eq!(u.reset_at_iso(), "2026-12-01T00:00:00Z");
        let over = Usage { used: 120, ..u };
        assert_eq!(over.remaining(), 0);
    }
}
