//! The background-service contract: every part's long-running work (reloaders, writers, polls,
//! deliverers) is a [`Service`] run until the shutdown signal turns true. The host adapts it to
//! its server (Pingora's background services); nothing else here knows that server.

use async_trait::async_trait;

/// Turns `true` (or closes) when the process shuts down.
pub type Shutdown = tokio::sync::watch::Receiver<bool>;

/// A part's background work.
#[async_trait]
pub trait Service: Send + Sync + 'static {
    /// Runs until `shutdown` says so, then does its last work (a final flush) and returns.
    async fn run(&self, shutdown: Shutdown);
}
