//! The background services that keep the quota stores: persistence of the embedded store's
//! counts, and reconciliation of counts made locally while Redis was away (with the Redis probe
//! that keeps readiness true).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use drg_base::service::{Service, Shutdown};
use tokio::time::MissedTickBehavior;

use super::local::LocalStore;
use super::redis::RedisStore;
use drg_base::periodic::Ticks;
use drg_telemetry::lifecycle::InFlight;

/// Syncs the embedded store's counters to disk every interval and once more at shutdown. The
/// counts are in the shared mapping as soon as they are made (a crash loses none): this bounds
/// what a power loss can take.
pub struct Persistence {
    pub store: Arc<LocalStore>,
    pub interval: Duration,
}

impl Persistence {
    async fn flush(&self) {
        let store = self.store.clone();
        // msync blocks until the disk has the pages: never on a worker thread.
        match tokio::task::spawn_blocking(move || store.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => log::error!("{e}"),
            Err(e) => log::error!("quota flush task failed: {e}"),
        }
    }
}

#[async_trait]
impl Service for Persistence {
    async fn run(&self, mut shutdown: Shutdown) {
        let mut ticks = Ticks::new(self.interval);
        while ticks.next(&mut shutdown).await.is_some() {
            self.flush().await;
        }
        self.flush().await;
    }
}

/// Adds the counts made during a Redis outage back to Redis, every interval and at shutdown, and
/// pings Redis every `probe_interval` so that readiness follows Redis without traffic.
pub struct Reconciler {
    pub store: Arc<RedisStore>,
    pub interval: Duration,
    pub probe_interval: Duration,
    /// The final sync waits for the requests in flight at shutdown (they may still count
    /// locally), for at most `settle_within`.
    pub in_flight: InFlight,
    pub settle_within: Duration,
}

#[async_trait]
impl Service for Reconciler {
    async fn run(&self, mut shutdown: Shutdown) {
        let mut ticks = Ticks::new(self.interval);
        let mut probes = tokio::time::interval(self.probe_interval);
        probes.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                tick = ticks.next(&mut shutdown) => match tick {
                    Some(_) => {
                        self.store.sync(false).await;
                    }
                    None => break,
                },
                _ = probes.tick() => self.store.probe().await,
            }
        }
        let open = self.in_flight.settle(self.settle_within).await;
        if open > 0 {
            log::warn!(
                "quota store: final sync with {open} connections still open after {:?}",
                self.settle_within
            );
        }
        let left = self.store.sync(true).await;
        if left > 0 {
            log::error!(
                "quota store: {left} locally counted calls could not reach Redis before shutdown"
            );
        }
    }
}
