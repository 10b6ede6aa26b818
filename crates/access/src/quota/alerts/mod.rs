//! Quota alerts: a signed POST to the operator's URL and to the project's own webhooks when a
//! project's month reaches a threshold (80, 90, 100% by default), once per (project, month,
//! threshold) across every gateway, never on the request path.
//!
//! The request path only notices ([`Alerts::observe`], for every counted call and every call the
//! month refuses): below the lowest threshold a call costs one multiplication; above it a lookup
//! in a map read without a lock (`ledger.rs`) and one atomic load. A threshold reached that the
//! outbox does not have and that is not already on its way goes on a bounded channel. The service
//! (`service.rs`) hands it to the webhook engine (`drg-webhook`), whose outbox is the alert's
//! one durable record: a hold keyed by (project, month, threshold), so an alert exists once
//! however many gateways on the host notice it, with one message per destination
//! (`handover.rs`), delivered signed, retried with backoff across restarts, only where the
//! destination guard allows. With the Redis quota store the hold is written held and released
//! only once a `SET` only the first gateway wins says so (`claim.rs`).
//!
//! An alert cannot be lost between the call and the outbox: it counts as handed over only once
//! the service confirms the outbox has its hold. A failed write is counted and tried again after
//! a backoff (`held.rs`); an alert the service cannot hold, or a channel that is full, leaves it
//! to the project's next call; and after a restart what the outbox lacks is offered again by the
//! next call over the threshold (the outbox is the truth, read at start).

pub mod claim;
pub mod config;
pub mod handover;
pub mod held;
pub mod ledger;
pub mod marks;
pub mod service;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;

use self::ledger::Ledger;
use crate::keys::KeyEntry;
use crate::quota::Usage;
use drg_telemetry::metrics::AlertStats;

/// Alerts noticed on the request path waiting for the service, at most.
pub const CHANNEL: usize = 1024;

/// The payload of one alert, as the receiver gets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Alert {
    pub project: String,
    pub plan: String,
    /// `YYYY-MM` (UTC).
    pub month: String,
    /// Percent of the monthly limit.
    pub threshold: u32,
    /// The month's count when the threshold was noticed.
    pub month_count: u64,
    pub monthly_limit: u64,
    /// When it was noticed, RFC 3339 UTC.
    #[serde(serialize_with = "rfc3339")]
    pub at: DateTime<Utc>,
}

fn rfc3339<S: serde::Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&drg_base::infra::units::rfc3339(*at))
}

/// How many of `thresholds` (ascending percentages) `used` of `limit` has reached.
pub fn reached(used: u64, limit: u64, thresholds: &[u32]) -> usize {
    if limit == 0 {
        return 0;
    }
    let used = u128::from(used) * 100;
    thresholds
        .iter()
        .take_while(|t| used >= u128::from(**t) * u128::from(limit))
        .count()
}

/// Counters of the alerts since start (the outbox's waiting count is read by the service).
#[derive(Debug, Default)]
pub struct Counters {
    pub sent: AtomicU64,
    pub failed: AtomicU64,
    pub attempt_errors: AtomicU64,
    /// Writes of a noticed alert to the webhook outbox that failed (each tried again).
    pub insert_errors: AtomicU64,
    /// Alerts given up because the guard refused every address of the receiver.
    pub refused: AtomicU64,
    pub dropped: AtomicU64,
    /// The webhook outbox's alert messages waiting for delivery or for their claim.
    pub pending: AtomicU64,
    /// Alerts the service holds for the outbox (a failed write): pending too.
    pub held: AtomicU64,
    /// The service's passes (take in, claim, deliver, count) since start: that a pass ran after
    /// an event is how a test (or an operator) knows the service looked since.
    pub passes: AtomicU64,
}

/// The request path's side: notices thresholds and hands them to the service.
pub struct Alerts {
    /// What the outbox has and what is on its way, per project (shared with the service).
    ledger: Arc<Ledger>,
    tx: tokio::sync::mpsc::Sender<Alert>,
    counters: Arc<Counters>,
}

impl Alerts {
    /// The request side and the channel the service reads, knowing nothing yet.
    pub fn new(
        thresholds: Vec<u32>,
        counters: Arc<Counters>,
    ) -> (Alerts, tokio::sync::mpsc::Receiver<Alert>) {
        Alerts::with_ledger(Arc::new(Ledger::new(thresholds)), counters)
    }

    /// [`Alerts::new`] on `ledger` (preloaded from the outbox, and kept by the service).
    pub fn with_ledger(
        ledger: Arc<Ledger>,
        counters: Arc<Counters>,
    ) -> (Alerts, tokio::sync::mpsc::Receiver<Alert>) {
        let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL);
        let alerts = Alerts {
            ledger,
            tx,
            counters,
        };
        (alerts, rx)
    }

    /// Tells the alerts of one call of `key`'s project, counted or refused by the month: its
    /// month after the call. Offers each threshold reached that the outbox does not have and
    /// that is not on its way already.
    pub fn observe(&self, key: &KeyEntry, usage: &Usage) {
        let thresholds = self.ledger.thresholds();
        let n = reached(usage.used, usage.limit, thresholds);
        if n == 0 {
            return;
        }
        let month = usage.month.index();
        let mut offer = self.ledger.claim(&key.project, month, marks::first(n));
        while offer != 0 {
            let bit = offer.trailing_zeros();
            let alert = Alert {
                project: key.project.to_string(),
                plan: key.plan.to_string(),
                month: usage.month.label(),
                threshold: thresholds[bit as usize],
                month_count: usage.used,
                monthly_limit: usage.limit,
                at: usage.now,
            };
            if self.tx.try_send(alert).is_err() {
                // Full (or the service gone): given back, a later call of the project offers
                // them again.
                let left = u64::from(offer.count_ones());
                self.counters.dropped.fetch_add(left, Ordering::Relaxed);
                self.ledger.released_bits(&key.project, month, offer);
                return;
            }
            offer &= offer - 1;
        }
    }

    /// The counters, for `/metrics`.
    pub fn stats(&self) -> AlertStats {
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        AlertStats {
            sent: n(&c.sent),
            failed: n(&c.failed),
            attempt_errors: n(&c.attempt_errors),
            insert_errors: n(&c.insert_errors),
            refused: n(&c.refused),
            dropped: n(&c.dropped),
            pending: n(&c.pending) + n(&c.held),
            passes: n(&c.passes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Month;

    #[test]
    fn thresholds_are_reached_by_exact_arithmetic() {
        let t = [80, 90, 100];
        assert_eq!(reached(79, 100, &t), 0);
        assert_eq!(reached(80, 100, &t), 1);
        assert_eq!(reached(8, 9, &t), 1, "8/9 = 88.9%");
        assert_eq!(reached(100, 100, &t), 3);
        assert_eq!(reached(u64::MAX, u64::MAX, &t), 3, "no overflow");
        assert_eq!(reached(5, 0, &t), 0);
    }

    #[test]
    fn each_threshold_is_handed_over_once_per_month() {
        let (alerts, mut rx) = Alerts::new(vec![50, 100], Arc::default());
        let key = KeyEntry::for_tests("k", "acme");
        let now: DateTime<Utc> = "2026-11-23T12:00:00Z".parse().unwrap();
        let usage = |used| Usage {
            used,
            limit: 10,
            month: Month::containing(now),
            now,
        };
        for used in [1, 5, 6, 7, 10, 10] {
            alerts.observe(&key, &usage(used));
        }
        let mut got = Vec::new();
        while let Ok(a) = rx.try_recv() {
            got.push((a.threshold, a.month_count));
        }
        assert_eq!(got, [(50, 5), (100, 10)]);
        // A new month starts over.
        let next = Usage {
            month: Month::containing(now).next(),
            ..usage(5)
        };
        alerts.observe(&key, &next);
        assert_eq!(rx.try_recv().map(|a| a.month).ok(), Some("2026-12".into()));
        let body = serde_json::to_string(&Alert {
            project: "p".into(),
            plan: "pro".into(),
            month: "2026-11".into(),
            threshold: 80,
            month_count: 8,
            monthly_limit: 10,
            at: now,
        })
        .unwrap();
        assert_eq!(
            body,
            r#"{"project":"p","plan":"pro","month":"2026-11","threshold":80,"month_count":8,"monthly_limit":10,"at":"2026-11-23T12:00:00Z"}"#
        );
    }

    fn november(used: u64) -> Usage {
        let now: DateTime<Utc> = "2026-11-23T12:00:00Z".parse().unwrap();
        Usage {
            used,
            limit: 10,
            month: Month::containing(now),
            now,
        }
    }

    fn drain(rx: &mut tokio::sync::mpsc::Receiver<Alert>) -> Vec<Alert> {
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    #[test]
    fn an_alert_is_offered_again_until_the_outbox_has_it() {
        let counters = Arc::new(Counters::default());
        let (alerts, mut rx) = Alerts::new(vec![50, 100], counters.clone());
        let key = KeyEntry::for_tests("k", "acme");
        alerts.observe(&key, &november(5));
        let first = drain(&mut rx);
        assert_eq!(first.len(), 1);
        // On its way: not offered twice.
        alerts.observe(&key, &november(6));
        assert!(drain(&mut rx).is_empty());
        // The outbox could not take it (the service gives it back): the next call offers it,
        // with that call's count.
        alerts.ledger.released("acme", &first[0].month, 50);
        alerts.observe(&key, &november(7));
        let again = drain(&mut rx);
        assert_eq!(
            again
                .iter()
                .map(|a| (a.threshold, a.month_count))
                .collect::<Vec<_>>(),
            [(50, 7)]
        );
        // The outbox has it: never again this month.
        alerts.ledger.recorded("acme", &again[0].month, 50);
        alerts.observe(&key, &november(8));
        assert!(drain(&mut rx).is_empty());
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_full_channel_drops_nothing_for_good() {
        let counters = Arc::new(Counters::default());
        let (alerts, mut rx) = Alerts::new(vec![50], counters.clone());
        for i in 0..CHANNEL {
            alerts.observe(&KeyEntry::for_tests("k", &format!("p{i}")), &november(5));
        }
        let late = KeyEntry::for_tests("k", "late");
        alerts.observe(&late, &november(5));
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 1);
        assert_eq!(drain(&mut rx).len(), CHANNEL);
        alerts.observe(&late, &november(6));
        let got = drain(&mut rx);
        assert_eq!((got.len(), got[0].project.as_str()), (1, "late"));
    }

    #[test]
    fn held_alerts_count_as_pending() {
        let counters = Arc::new(Counters::default());
        let (alerts, _rx) = Alerts::new(vec![50], counters.clone());
        counters.pending.store(2, Ordering::Relaxed);
        counters.held.store(1, Ordering::Relaxed);
        counters.insert_errors.store(3, Ordering::Relaxed);
        let stats = alerts.stats();
        assert_eq!((stats.pending, stats.insert_errors), (3, 3));
    }
}
