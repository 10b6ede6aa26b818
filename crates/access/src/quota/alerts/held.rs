//! Alerts the outbox could not take yet (its write failed: a locked or full disk; or it holds
//! `max_pending` already), held by the service and written again after a backoff. The backoff is
//! the outbox's, not each alert's: one failure says the next write would fail too, so while it
//! runs new alerts join the queue without a try (a locked SQLite file costs its busy timeout per
//! write), and a pass stops at its first failure.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::Alert;

/// The first wait after a failed write; it doubles with each failure in a row, up to [`MAX_WAIT`].
const FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest wait between two writes of a failing outbox: a recovered disk is used within it.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// An alert waiting for the outbox.
#[derive(Debug)]
pub struct Waiting {
    pub alert: Alert,
    /// Already counted as dropped for a full outbox (counted once per alert).
    pub counted_full: bool,
}

impl From<Alert> for Waiting {
    fn from(alert: Alert) -> Waiting {
        Waiting {
            alert,
            counted_full: false,
        }
    }
}

/// The held alerts and the outbox's backoff.
#[derive(Debug)]
pub struct Held {
    queue: VecDeque<Waiting>,
    cap: usize,
    /// Failed writes in a row.
    failures: u32,
    not_before: Option<Instant>,
}

impl Held {
    /// Holds `cap` alerts at most.
    pub fn new(cap: usize) -> Held {
        Held {
            queue: VecDeque::new(),
            cap,
            failures: 0,
            not_before: None,
        }
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether the outbox is not to be written yet (a recent failure).
    pub fn backing_off(&self, now: Instant) -> bool {
        self.not_before.is_some_and(|t| now < t)
    }

    /// A write failed at `now`: returns how long the outbox is left alone.
    pub fn failed(&mut self, now: Instant) -> Duration {
        let wait = FIRST_WAIT
            .saturating_mul(1 << self.failures.min(16))
            .min(MAX_WAIT);
        self.failures = self.failures.saturating_add(1);
        self.not_before = Some(now + wait);
        wait
    }

    /// A write went through: the outbox is written at once again.
    pub fn succeeded(&mut self) {
        self.failures = 0;
        self.not_before = None;
    }

    /// One last try whatever the backoff (at shutdown).
    pub fn forgive(&mut self) {
        self.not_before = None;
    }

    /// Holds `waiting`; gives it back when `cap` are held already.
    pub fn hold(&mut self, waiting: Waiting) -> Result<(), Waiting> {
        if self.queue.len() >= self.cap {
            return Err(waiting);
        }
        self.queue.push_back(waiting);
        Ok(())
    }

    /// The next held alert to write, unless the outbox is backed off.
    pub fn next_due(&mut self, now: Instant) -> Option<Waiting> {
        if self.backing_off(now) {
            return None;
        }
        self.queue.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(threshold: u32) -> Waiting {
        Waiting::from(Alert {
            project: "acme".into(),
            plan: "pro".into(),
            month: "2026-11".into(),
            threshold,
            month_count: 8,
            monthly_limit: 10,
            at: "2026-11-23T12:00:00Z".parse().unwrap(),
        })
    }

    #[test]
    fn the_backoff_doubles_up_to_a_minute_and_a_success_resets_it() {
        let mut held = Held::new(10);
        let t0 = Instant::now();
        let waits: Vec<u64> = (0..9).map(|_| held.failed(t0).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert!(held.backing_off(t0 + Duration::from_secs(59)));
        assert!(!held.backing_off(t0 + MAX_WAIT));
        held.succeeded();
        assert!(!held.backing_off(t0));
        assert_eq!(held.failed(t0), FIRST_WAIT);
    }

    #[test]
    fn held_alerts_come_back_in_order_when_the_backoff_is_over() {
        let mut held = Held::new(2);
        let t0 = Instant::now();
        held.hold(waiting(80)).unwrap();
        held.hold(waiting(90)).unwrap();
        let refused = held.hold(waiting(100)).unwrap_err();
        assert_eq!(refused.alert.threshold, 100, "given back: full");
        held.failed(t0);
        assert!(held.next_due(t0).is_none(), "backing off");
        let later = t0 + FIRST_WAIT;
        assert_eq!(held.next_due(later).map(|w| w.alert.threshold), Some(80));
        held.failed(later);
        held.forgive();
        assert_eq!(held.next_due(later).map(|w| w.alert.threshold), Some(90));
        assert!(held.is_empty() && held.next_due(later).is_none());
    }
}
