//! The one circuit breaker, pure (callers pass the time in): after enough consecutive failures it
//! opens; the quota store skips Redis while it is open and lets exactly one call probe it after,
//! the MX resolver asks its canaries when it opens.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What a caller may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Closed: make the call.
    Call,
    /// The open period is over and this caller is the one probe: make the call and report.
    Probe,
    /// Open, or another caller is probing: skip the call.
    Skip,
}

/// Consecutive failures open the breaker; the first caller after the open period probes, and
/// every other caller keeps skipping until that probe reports. A success closes it, a failure
/// opens it again for the full period.
///
/// Lock-free: the request path reads one atomic word while closed.
#[derive(Debug)]
pub struct Breaker {
    threshold: u32,
    open_for: Duration,
    /// How long a probe may stay unanswered before another caller may probe (a probe whose
    /// caller went away never reports).
    probe_for: Duration,
    epoch: Instant,
    failures: AtomicU32,
    /// `0`: closed. Otherwise callers skip Redis until this tick (see [`Breaker::tick`]); once it
    /// has passed, the caller that moves it on by `probe_for` is the probe.
    until: AtomicU64,
}

impl Breaker {
    /// Opens after `threshold` consecutive failures, for `open_for`. A probe is given
    /// `probe_for` (the call budget) to report before it counts as lost.
    pub fn new(threshold: u32, open_for: Duration, probe_for: Duration, epoch: Instant) -> Self {
        Breaker {
            threshold: threshold.max(1),
            open_for,
            probe_for: probe_for.max(open_for),
            epoch,
            failures: AtomicU32::new(0),
            until: AtomicU64::new(0),
        }
    }

    /// `t` as a non-zero tick (nanoseconds since the epoch, plus one): `0` means closed.
    fn tick(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1)
    }

    pub fn admit(&self, now: Instant) -> Admit {
        let t = self.tick(now);
        let mut until = self.until.load(Ordering::Acquire);
        loop {
            if until == 0 {
                return Admit::Call;
            }
            if t < until {
                return Admit::Skip;
            }
            // Due: of the callers racing here, only the one whose swap lands probes.
            let claim = self.tick(now + self.probe_for);
            match self.until.compare_exchange_weak(
                until,
                claim,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Admit::Probe,
                Err(seen) => until = seen,
            }
        }
    }

    /// The call succeeded. Returns whether this closed the breaker.
    pub fn succeeded(&self) -> bool {
        self.failures.store(0, Ordering::Relaxed);
        self.until.swap(0, Ordering::AcqRel) != 0
    }

    /// A call failed. Returns whether this opened the breaker (it was closed).
    pub fn failed(&self, now: Instant) -> bool {
        let n = self
            .failures
            .fetch_add(1, Ordering::Relaxed)
            .saturating_add(1);
        if n < self.threshold && self.until.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.until
            .swap(self.tick(now + self.open_for), Ordering::AcqRel)
            == 0
    }

    /// Whether callers skip the call now (open, or a probe under way).
    pub fn is_open(&self, now: Instant) -> bool {
        let until = self.until.load(Ordering::Acquire);
        until != 0 && self.tick(now) < until
    }

    /// Whether the breaker is closed (no failure streak has opened it).
    pub fn is_closed(&self) -> bool {
        self.until.load(Ordering::Acquire) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    const OPEN: Duration = Duration::from_millis(1_000);
    const PROBE: Duration = Duration::from_millis(50);

    fn breaker(t0: Instant) -> Breaker {
        Breaker::new(3, OPEN, PROBE, t0)
    }

    /// A breaker opened at `t0` by three failures in a row.
    fn tripped(t0: Instant) -> Breaker {
        let b = breaker(t0);
        for _ in 0..3 {
            b.failed(t0);
        }
        b
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn opens_after_consecutive_failures_only() {
        let t0 = Instant::now();
        let b = breaker(t0);
        assert_eq!(b.admit(t0), Admit::Call);
        assert!(!b.failed(t0));
        assert!(!b.failed(t0));
        // A success in between restarts the streak.
        assert!(!b.succeeded());
        assert!(!b.failed(t0));
        assert!(!b.failed(t0));
        assert_eq!(b.admit(t0), Admit::Call);
        assert!(b.failed(t0 + ms(10)), "the third failure in a row opens it");
        assert!(b.is_open(t0 + ms(10)));
        assert_eq!(b.admit(t0 + ms(10)), Admit::Skip);
        assert_eq!(b.admit(t0 + ms(1_009)), Admit::Skip);
    }

    #[test]
    fn exactly_one_caller_probes_when_the_period_is_over() {
        let t0 = Instant::now();
        let b = tripped(t0);
        let due = t0 + OPEN;
        assert_eq!(b.admit(due), Admit::Probe);
        // While the probe is out, everyone else keeps skipping Redis.
        assert_eq!(b.admit(due), Admit::Skip);
        assert_eq!(b.admit(due + ms(500)), Admit::Skip);
        assert!(b.is_open(due + ms(500)));
        assert!(b.succeeded(), "the probe's success closes it");
        assert_eq!(b.admit(due + ms(500)), Admit::Call);
        assert!(!b.is_open(due + ms(500)));
    }

    #[test]
    fn a_failed_probe_opens_it_for_a_full_period() {
        let t0 = Instant::now();
        let b = tripped(t0);
        let due = t0 + OPEN;
        assert_eq!(b.admit(due), Admit::Probe);
        assert!(!b.failed(due + ms(20)), "it was not closed");
        assert_eq!(b.admit(due + ms(20) + OPEN - ms(1)), Admit::Skip);
        assert_eq!(b.admit(due + ms(20) + OPEN), Admit::Probe);
    }

    #[test]
    fn a_probe_that_never_reports_is_replaced() {
        let t0 = Instant::now();
        let b = tripped(t0);
        let due = t0 + OPEN;
        assert_eq!(b.admit(due), Admit::Probe);
        // Its caller went away: after the probe's own budget (never shorter than the open
        // period) someone else probes.
        assert_eq!(b.admit(due + OPEN - ms(1)), Admit::Skip);
        assert_eq!(b.admit(due + OPEN), Admit::Probe);
    }

    #[test]
    fn the_probe_budget_is_at_least_the_call_budget() {
        let t0 = Instant::now();
        let b = Breaker::new(1, ms(10), ms(200), t0);
        b.failed(t0);
        assert_eq!(b.admit(t0 + ms(10)), Admit::Probe);
        assert_eq!(
            b.admit(t0 + ms(150)),
            Admit::Skip,
            "the probe is still within 200 ms"
        );
        assert_eq!(b.admit(t0 + ms(210)), Admit::Probe);
    }

    #[test]
    fn concurrent_callers_while_half_open_make_one_probe() {
        let t0 = Instant::now();
        let b = Arc::new(breaker(t0));
        for _ in 0..3 {
            b.failed(t0);
        }
        let due = t0 + OPEN + ms(1);
        let threads = 8;
        let barrier = Arc::new(Barrier::new(threads));
        let admitted: Vec<Vec<Admit>> = (0..threads)
            .map(|_| {
                let (b, barrier) = (b.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    (0..1_000).map(|_| b.admit(due)).collect()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let all: Vec<Admit> = admitted.into_iter().flatten().collect();
        assert_eq!(all.iter().filter(|a| **a == Admit::Probe).count(), 1);
        assert_eq!(all.iter().filter(|a| **a == Admit::Call).count(), 0);
    }

    #[test]
    fn a_late_success_closes_it_and_a_late_failure_keeps_it_open() {
        let t0 = Instant::now();
        let b = tripped(t0);
        // A call let through before it opened fails late: the period restarts from then.
        b.failed(t0 + ms(400));
        assert_eq!(b.admit(t0 + OPEN), Admit::Skip);
        assert_eq!(b.admit(t0 + ms(400) + OPEN), Admit::Probe);
        // One answered late: Redis is reachable.
        assert!(b.succeeded());
        assert!(b.is_closed());
    }
}
