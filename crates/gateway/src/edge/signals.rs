//! Pingora's Unix signal handling with a draining phase (`ops::lifecycle` says why): SIGTERM
//! drains for `drain_seconds` (`/readyz` answers 503) before the graceful terminate, SIGQUIT
//! hands the listening sockets to the new process at once, SIGINT stops fast.

use std::time::Duration;

use async_trait::async_trait;
use pingora::server::{ShutdownSignal, ShutdownSignalWatch};
use tokio::signal::unix::{signal, SignalKind};

use drg_telemetry::lifecycle::{Draining, Phase};

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
            _ = quit.recv() => {
                // No delay here: the new process gives up waiting for the sockets after ~6 s.
                self.draining.enter(Phase::HandingOff);
                log::info!("SIGQUIT: handing the listening sockets to the new process (/readyz answers 503)");
                return ShutdownSignal::GracefulUpgrade;
            }
            _ = int.recv() => return ShutdownSignal::FastShutdown,
            _ = term.recv() => {}
        }
        self.draining.enter(Phase::Draining);
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
