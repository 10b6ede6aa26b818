//! The poll of the shared key store ([`super::shared`]): every `keys_api.shared_poll_ms`, the
//! revocations kept during an outage are sent, then the rows are read again if their version or
//! epoch moved. A poll costs one `MGET` while nothing changes; pub/sub would tell sooner, but
//! needs a connection of its own per deployment kind (single, Cluster, Sentinel) and a poll
//! behind it anyway for the messages lost while Redis was away.

use std::sync::Arc;

use super::shared::Shared;
use super::KeysApi;

/// Polls the shared key store (the gateway's keys API with the Redis quota store, and that store).
pub struct KeysSync(pub Arc<KeysApi>, pub Arc<Shared>);

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for KeysSync {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        // At once at the start: the cache may be older than Redis.
        self.0.sync_shared(&self.1).await;
        let mut ticks = crate::ops::periodic::Ticks::new(self.0.config.shared_poll);
        while ticks.next(&mut shutdown).await.is_some() {
            self.0.sync_shared(&self.1).await;
        }
    }
}
