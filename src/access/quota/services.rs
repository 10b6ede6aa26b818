//! The background services that keep the quota stores: persistence of the embedded store's
//! counts, and reconciliation of counts made locally while Redis was away.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::local::LocalStore;
use super::redis::RedisStore;
use crate::periodic::Ticks;

/// Writes the embedded store's counts to its state file every interval and once more at
/// shutdown.
pub struct Persistence {
    pub store: Arc<LocalStore>,
    pub interval: Duration,
}

impl Persistence {
    async fn flush(&self) {
        let store = self.store.clone();
        // File locks and fsync block: never on a worker thread.
        match tokio::task::spawn_blocking(move || store.flush()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => log::error!("{e}"),
            Err(e) => log::error!("quota flush task failed: {e}"),
        }
    }
}

#[async_trait]
impl BackgroundService for Persistence {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticks = Ticks::new(self.interval);
        while ticks.next(&mut shutdown).await.is_some() {
            self.flush().await;
        }
        self.flush().await;
    }
}

/// Adds the counts made during a Redis outage back to Redis, every interval and at shutdown.
pub struct Reconciler {
    pub store: Arc<RedisStore>,
    pub interval: Duration,
}

#[async_trait]
impl BackgroundService for Reconciler {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut ticks = Ticks::new(self.interval);
        while ticks.next(&mut shutdown).await.is_some() {
            self.store.sync(false).await;
        }
        let left = self.store.sync(true).await;
        if left > 0 {
            log::error!(
                "quota store: {left} locally counted calls could not reach Redis before shutdown"
            );
        }
    }
}
