//! Noticed alerts into the webhook engine's outbox, each as a hold with its messages
//! (`handover.rs`). Only a hold the outbox has counts: then the request path is told
//! ([`Ledger::recorded`](crate::quota::alerts::ledger::Ledger::recorded)) and offers it no
//! more. A failed write (counted) or a full outbox holds the alert for another write after a
//! backoff (`held.rs`); one that cannot be held is given back to the request path, whose next
//! call of the project offers it again. Nothing is forgotten on the way.

use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::mpsc::Receiver;

use drg_webhook::outbox::Enqueued;

use super::{now_ms, AlertService, RunError, TOPIC};
use crate::quota::alerts::handover::Outgoing;
use crate::quota::alerts::held::{Held, Waiting};
use crate::quota::alerts::Alert;

/// What the outbox made of an alert.
enum Taken {
    /// It has the hold (written now, or by another process on the file before).
    Recorded,
    /// `max_pending` alerts wait for delivery already.
    Full,
}

fn what(alert: &Alert) -> String {
    format!(
        "project {} month {} threshold {}%",
        alert.project, alert.month, alert.threshold
    )
}

impl AlertService {
    /// Writes `waiting` to the outbox, unless a recent failure says to hold it at once.
    pub(super) async fn take_in(&self, mut waiting: Waiting, held: &mut Held) {
        if held.backing_off(Instant::now()) {
            return self.hold(waiting, held);
        }
        match self.record(&waiting.alert).await {
            Ok(Taken::Recorded) => {
                held.succeeded();
                let a = &waiting.alert;
                self.ledger.recorded(&a.project, &a.month, a.threshold);
            }
            Ok(Taken::Full) => {
                if !waiting.counted_full {
                    waiting.counted_full = true;
                    self.counters.dropped.fetch_add(1, Ordering::Relaxed);
                    log::error!(
                        "quota alerts: {} alerts wait for delivery already (max_pending): {} held until there is room",
                        self.config.max_pending,
                        what(&waiting.alert)
                    );
                }
                held.failed(Instant::now());
                self.hold(waiting, held);
            }
            Err(e) => {
                self.counters.insert_errors.fetch_add(1, Ordering::Relaxed);
                let wait = held.failed(Instant::now());
                log::error!(
                    "quota alerts: {} not recorded ({e}): written again in {} s",
                    what(&waiting.alert),
                    wait.as_secs()
                );
                self.hold(waiting, held);
            }
        }
    }

    /// The outbox's hold for `alert`: found, or written with its messages unless `max_pending`
    /// alerts wait already. Held when a Redis claim is to be won first (the pass confirms it).
    async fn record(&self, alert: &Alert) -> Result<Taken, RunError> {
        let outgoing = Outgoing::new(alert);
        let destinations = self.subscribers.destinations(&alert.project, TOPIC);
        let hold = outgoing.hold(self.claims.is_some(), now_ms());
        let messages = outgoing.messages(destinations);
        let max = u64::from(self.config.max_pending);
        let got = self.sender.send_held(vec![(hold, messages)], max).await?;
        Ok(match got.first() {
            Some(Enqueued::Full) => Taken::Full,
            // New, or known: another process on the file (or an earlier start) has it.
            _ => Taken::Recorded,
        })
    }

    fn hold(&self, waiting: Waiting, held: &mut Held) {
        if let Err(waiting) = held.hold(waiting) {
            // Too many held: the project's next call offers it again.
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            let a = &waiting.alert;
            self.ledger.released(&a.project, &a.month, a.threshold);
        }
    }

    /// Writes the held alerts again once the backoff is over; stops at the first that fails.
    pub(super) async fn retry_held(&self, held: &mut Held) {
        while let Some(waiting) = held.next_due(Instant::now()) {
            self.take_in(waiting, held).await;
        }
    }

    /// At shutdown: what is on the channel or held goes into the outbox if it can, one last try
    /// whatever the backoff. What cannot is offered again after the start, by the project's next
    /// call over the threshold (the outbox lacks it).
    pub(super) async fn flush(&self, rx: &mut Receiver<Alert>, held: &mut Held) {
        while let Ok(alert) = rx.try_recv() {
            self.take_in(alert.into(), held).await;
        }
        held.forgive();
        self.retry_held(held).await;
        if !held.is_empty() {
            log::warn!(
                "quota alerts: {} noticed alerts not recorded at the stop; each is offered again after the start by its project's next call",
                held.len()
            );
        }
    }
}
