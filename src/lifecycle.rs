//! Process lifecycle: the draining phase between SIGTERM and Pingora's graceful shutdown.
//!
//! Pingora stops accepting connections as soon as it is told to shut down, so a load balancer
//! would see refused connections rather than a failing readiness probe. We first drain: keep
//! serving for `drain_seconds` while `/readyz` answers 503, then hand over to Pingora.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch};
use tokio::signal::unix::{signal, SignalKind};

/// Shared flag: true once the process has started to drain.
#[derive(Debug, Clone, Default)]
pub struct Draining(Arc<AtomicBool>);

impl Draining {
    pub fn is_draining(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn start(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Pingora's Unix signal handling (SIGQUIT upgrade, SIGTERM graceful, SIGINT fast) with a
/// draining phase before the graceful terminate.
pub struct DrainingShutdown {
    pub draining: Draining,
    pub drain: Duration,
}

#[async_trait]
impl ShutdownSignalWatch for DrainingShutdown {
    async fn recv(&self) -> ShutdownSignal {
        let (Ok(mut quit), Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::quit()),
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            log::error!("cannot install signal handlers; shutting down");
            return ShutdownSignal::FastShutdown;
        };
        tokio::select! {
            _ = quit.recv() => return ShutdownSignal::GracefulUpgrade,
            _ = int.recv() => return ShutdownSignal::FastShutdown,
            _ = term.recv() => {}
        }
        self.draining.start();
        if !self.drain.is_zero() {
            log::info!(
                "SIGTERM: draining for {:?} (/readyz answers 503), then shutting down",
                self.drain
            );
            // A second SIGTERM or a SIGINT cuts the drain short.
            tokio::select! {
                _ = tokio::time::sleep(self.drain) => {}
                _ = term.recv() => {}
                _ = int.recv() => return ShutdownSignal::FastShutdown,
            }
        }
        ShutdownSignal::GracefulTerminate
    }
}
