//! The one background-service loop: wake every interval (or on SIGHUP, when asked) until
//! shutdown. Each service keeps its own state and its final action after the loop.

use std::time::Duration;

use crate::service::Shutdown;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::{interval, Interval, MissedTickBehavior};

/// Why a service woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    /// The interval passed.
    Timer,
    /// The process got SIGHUP (only with [`Ticks::with_sighup`]).
    Hangup,
}

/// The wake-ups of one background service.
pub struct Ticks {
    timer: Interval,
    hangup: Option<Signal>,
}

impl Ticks {
    /// Every `every`; a tick missed while the service was busy is delayed, not bunched.
    pub fn new(every: Duration) -> Self {
        let mut timer = interval(every);
        timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Ticks {
            timer,
            hangup: None,
        }
    }

    /// Also wake on SIGHUP; `name` is for the log line if the handler cannot be installed.
    pub fn with_sighup(mut self, name: &str) -> Self {
        match signal(SignalKind::hangup()) {
            Ok(s) => self.hangup = Some(s),
            Err(e) => log::warn!("{name}: SIGHUP unavailable: {e}"),
        }
        self
    }

    /// The next wake-up, or `None` once the server shuts down.
    pub async fn next(&mut self, shutdown: &mut Shutdown) -> Option<Tick> {
        if *shutdown.borrow() {
            return None;
        }
        let hangup = async {
            match self.hangup.as_mut() {
                Some(h) => h.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.timer.tick() => Some(Tick::Timer),
            Some(()) = hangup => Some(Tick::Hangup),
            _ = shutdown.changed() => None,
        }
    }
}
