//! Process lifecycle: draining on SIGTERM, the hand-off of the listening sockets on SIGQUIT
//! (graceful upgrade), and waiting for in-flight requests before the final quota sync.
//!
//! Pingora stops accepting connections as soon as it is told to shut down, so a load balancer
//! would see refused connections rather than a failing readiness probe. On SIGTERM we first drain:
//! keep serving for `drain_seconds` while `/readyz` answers 503, then hand over to Pingora. On
//! SIGQUIT Pingora sends the listening sockets to the new process at once (it waits only a few
//! seconds for them); this process keeps serving beside it for Pingora's close timeout with
//! `/readyz` answering 503, then stops like a graceful terminate.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

/// Where the process is in its life, as readiness reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Serving,
    /// SIGTERM: serving out `drain_seconds`, then stopping.
    Draining,
    /// SIGQUIT: the listening sockets went (or are going) to a new process; this one stops next.
    HandingOff,
}

impl Phase {
    /// The `status` word of `/readyz` for a phase other than [`Phase::Serving`].
    pub fn status(self) -> &'static str {
        match self {
            Phase::Serving => "ready",
            Phase::Draining => "draining",
            Phase::HandingOff => "upgrading",
        }
    }
}

/// Shared state: whether the process has started to stop, and why.
#[derive(Debug, Clone, Default)]
pub struct Draining(Arc<AtomicU8>);

impl Draining {
    /// Whether the process is on its way out (draining or handing off): not ready, and each
    /// answer closes its connection.
    pub fn is_draining(&self) -> bool {
        self.phase() != Phase::Serving
    }

    pub fn phase(&self) -> Phase {
        match self.0.load(Ordering::Relaxed) {
            0 => Phase::Serving,
            1 => Phase::Draining,
            _ => Phase::HandingOff,
        }
    }

    /// Moves to `phase` (never back).
    pub fn enter(&self, phase: Phase) {
        let n = match phase {
            Phase::Serving => 0,
            Phase::Draining => 1,
            Phase::HandingOff => 2,
        };
        self.0.fetch_max(n, Ordering::Relaxed);
    }
}

type Counter = Box<dyn Fn() -> usize + Send + Sync>;

/// The public listener's open connections, for background services that must act only once
/// the requests still in flight at shutdown are done (the final quota sync). Bound late: the
/// quota store and its service are built before the listener.
#[derive(Clone, Default)]
pub struct InFlight(Arc<OnceLock<Counter>>);

impl InFlight {
    /// Reads the open connections from `count` from now on (the first binding wins).
    pub fn track(&self, count: impl Fn() -> usize + Send + Sync + 'static) {
        if self.0.set(Box::new(count)).is_err() {
            log::warn!("in-flight counter bound twice; keeping the first");
        }
    }

    /// Open connections now (0 when nothing is tracked).
    pub fn open(&self) -> usize {
        self.0.get().map_or(0, |count| count())
    }

    /// After the shutdown signal: waits until no public connection is open (the listener has
    /// stopped accepting, idle keep-alive connections are closed and in-flight requests are
    /// answered), or until `within` has passed. Returns the connections still open.
    pub async fn settle(&self, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let open = self.open();
            if open == 0 || Instant::now() >= deadline {
                return open;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// How long a final action may wait for in-flight requests: half of Pingora's grace period
/// (`grace_period_seconds`, 300 s when unset), which bounds the whole shutdown; the other half is
/// left for the action itself, since Pingora drops every task when the grace period ends.
pub fn settle_budget(grace_period_seconds: Option<u64>) -> Duration {
    Duration::from_secs(grace_period_seconds.unwrap_or(300)) / 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_hand_off_outranks_a_drain_and_neither_is_undone() {
        let d = Draining::default();
        assert_eq!(d.phase(), Phase::Serving);
        assert!(!d.is_draining());
        d.enter(Phase::Draining);
        assert_eq!(d.phase().status(), "draining");
        d.enter(Phase::HandingOff);
        d.enter(Phase::Draining);
        assert_eq!(d.phase(), Phase::HandingOff);
        assert!(d.is_draining());
    }

    #[tokio::test]
    async fn settle_returns_once_the_connections_are_gone_or_at_the_deadline() {
        let open = Arc::new(AtomicUsize::new(2));
        let tracked = InFlight::default();
        assert_eq!(tracked.settle(Duration::from_secs(1)).await, 0, "unbound");
        let o = open.clone();
        tracked.track(move || o.load(Ordering::Relaxed));
        let started = Instant::now();
        assert_eq!(tracked.settle(Duration::from_millis(100)).await, 2);
        assert!(started.elapsed() >= Duration::from_millis(100));
        let o = open.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            o.store(0, Ordering::Relaxed);
        });
        let started = Instant::now();
        assert_eq!(tracked.settle(Duration::from_secs(10)).await, 0);
        // Not a speed bound: only that it did not wait for the deadline.
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
