//! Quota alerts: a signed POST to the operator's URL when a project's month reaches a threshold
//! (80, 90, 100% by default), once per (project, month, threshold) across every gateway, never on
//! the request path.
//!
//! The request path only notices ([`Alerts::observe`]): below the lowest threshold a call costs
//! one multiplication; above it one map lookup, and a threshold not noticed before in this
//! process goes on a bounded channel. The service (`service.rs`) claims it (the outbox's unique
//! row on this host, and with the Redis quota store a `SET` only the first gateway wins,
//! `claim.rs`), keeps it in the outbox (`outbox.rs`, on disk, so a restart neither drops nor
//! repeats it) and delivers it signed, retrying with backoff (`deliver.rs`), only where the
//! destination guard allows (`destination/`, checked on the configured URL and again on every
//! address its host resolves to when sending, `resolve.rs`).

pub mod claim;
pub mod config;
pub mod deliver;
pub mod destination;
pub mod outbox;
pub mod resolve;
pub mod service;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::access::keys::KeyEntry;
use crate::access::quota::Usage;
use crate::ops::metrics::AlertStats;

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
    s.collect_str(&at.format("%Y-%m-%dT%H:%M:%SZ"))
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
    /// Alerts given up because the guard refused every address of the receiver.
    pub refused: AtomicU64,
    pub dropped: AtomicU64,
    pub pending: AtomicU64,
}

/// The request path's side: notices thresholds and hands them to the service.
pub struct Alerts {
    thresholds: Vec<u32>,
    /// Per project: the month (its index) and how many thresholds this process handed over.
    noticed: Mutex<HashMap<Arc<str>, (u32, usize)>>,
    tx: tokio::sync::mpsc::Sender<Alert>,
    counters: Arc<Counters>,
}

/// Projects remembered before the map is swept of past months.
const SWEEP_AT: usize = 65_536;

impl Alerts {
    /// The request side and the channel the service reads.
    pub fn new(
        thresholds: Vec<u32>,
        counters: Arc<Counters>,
    ) -> (Alerts, tokio::sync::mpsc::Receiver<Alert>) {
        let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL);
        let alerts = Alerts {
            thresholds,
            noticed: Mutex::new(HashMap::new()),
            tx,
            counters,
        };
        (alerts, rx)
    }

    /// Tells the alerts of one counted call of `key`'s project: its month after the call.
    pub fn observe(&self, key: &KeyEntry, usage: &Usage) {
        let n = reached(usage.used, usage.limit, &self.thresholds);
        if n == 0 {
            return;
        }
        let month = usage.month.index();
        // A poisoned lock only means another thread panicked mid-insert of one entry.
        let mut noticed = self.noticed.lock().unwrap_or_else(|e| e.into_inner());
        let done = match noticed.get(&key.project) {
            Some(&(m, done)) if m == month => done,
            _ => 0,
        };
        if n <= done {
            return;
        }
        let mut handed = done;
        for &threshold in &self.thresholds[done..n] {
            let alert = Alert {
                project: key.project.to_string(),
                plan: key.plan.to_string(),
                month: usage.month.label(),
                threshold,
                month_count: usage.used,
                monthly_limit: usage.limit,
                at: usage.now,
            };
            if self.tx.try_send(alert).is_err() {
                // Full (or the service gone): a later call of the project tries again.
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                break;
            }
            handed += 1;
        }
        if noticed.len() >= SWEEP_AT && !noticed.contains_key(&key.project) {
            noticed.retain(|_, (m, _)| *m == month);
        }
        noticed.insert(key.project.clone(), (month, handed));
    }

    /// The counters, for `/metrics`.
    pub fn stats(&self) -> AlertStats {
        let c = &self.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed);
        AlertStats {
            sent: n(&c.sent),
            failed: n(&c.failed),
            attempt_errors: n(&c.attempt_errors),
            refused: n(&c.refused),
            dropped: n(&c.dropped),
            pending: n(&c.pending),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::quota::Month;

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
}
