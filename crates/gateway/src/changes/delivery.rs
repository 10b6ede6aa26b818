//! Each project's messages, delivered by a task of its own off the service's loop (one at a
//! time a project, [`AT_ONCE`] at most in all): a receiver that never answers one project's
//! messages holds up that project alone, not the intake, the passes or another project's
//! messages. A message is made from the store once the project's sender lease is taken, never
//! kept across a backoff: what another gateway delivered meanwhile is not sent again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::store::ChangeStore;
use super::{ChangesError, Counters};
use crate::access::quota::alerts::deliver::{self, AttemptError};

/// Deliveries running at once at most: each holds a blocking thread while it posts (up to
/// `timeout_ms`); beyond, a project's delivery waits for a slot.
pub const AT_ONCE: usize = 16;

/// Where messages go: the receiver, its secret and the client.
pub struct Webhook {
    pub url: String,
    pub secret: Vec<u8>,
    pub agent: ureq::Agent,
    pub max_attempts: u32,
    pub timeout: Duration,
}

/// What every delivery needs, shared by the tasks.
pub struct Courier {
    pub store: Arc<dyn ChangeStore>,
    pub hook: Webhook,
    pub counters: Arc<Counters>,
    /// This gateway's name in the sender leases.
    pub holder: String,
    pub send_interval: Duration,
    pub max_per_message: u32,
    /// A flip and its flip back within this many seconds are left out of a message.
    pub quiet: i64,
}

/// A project's delivery between attempts: how many failed, when it may be tried again, and the
/// last id the failed message covered (a retry covers the same changes, so it carries the same
/// `X-Change-Id` and bytes unless another gateway sent some of them meanwhile).
#[derive(Debug, Default, Clone, Copy)]
pub struct Delivery {
    attempts: u32,
    next: Option<Instant>,
    upto: Option<u64>,
}

/// A delivery's end: its project, its state for the next attempt, what went wrong with the store.
type Finished = (String, Delivery, Result<(), ChangesError>);

/// The deliveries of every project: those running and those waiting for their next attempt.
pub struct Deliveries {
    courier: Arc<Courier>,
    slots: Arc<Semaphore>,
    waiting: HashMap<String, Delivery>,
    running: JoinSet<Finished>,
    /// The projects whose delivery runs, and its task.
    busy: HashMap<String, tokio::task::Id>,
}

impl Deliveries {
    pub fn new(courier: Courier) -> Deliveries {
        Deliveries {
            courier: Arc::new(courier),
            slots: Arc::new(Semaphore::new(AT_ONCE)),
            waiting: HashMap::new(),
            running: JoinSet::new(),
            busy: HashMap::new(),
        }
    }

    pub fn send_interval(&self) -> Duration {
        self.courier.send_interval
    }

    /// Starts a delivery for each of `projects` that has none running and is not waiting out a
    /// backoff.
    pub fn start(&mut self, projects: Vec<String>) {
        let now = Instant::now();
        for project in projects {
            if self.busy.contains_key(&project) {
                continue;
            }
            let d = self.waiting.get(&project).copied().unwrap_or_default();
            if d.next.is_some_and(|n| now < n) {
                continue;
            }
            self.waiting.remove(&project);
            let (courier, slots) = (self.courier.clone(), self.slots.clone());
            let name = project.clone();
            let task = self.running.spawn(async move {
                let mut d = d;
                // Closed at shutdown: what has not started by then is not started.
                let outcome = match slots.acquire_owned().await {
                    Ok(_slot) => courier.send_one(&name, &mut d).await,
                    Err(_) => Ok(()),
                };
                (name, d, outcome)
            });
            self.busy.insert(project, task.id());
        }
    }

    /// Takes in the deliveries that ended; returns the store failures among them.
    pub fn reap(&mut self) -> Vec<(String, ChangesError)> {
        let mut failed = Vec::new();
        while let Some(done) = self.running.try_join_next() {
            self.ended(done, &mut failed);
        }
        failed
    }

    /// At shutdown: no delivery starts any more; those posting get up to `within` to finish
    /// (and record their sent marks), then are dropped (another gateway, or the next start,
    /// sends their changes again: receivers deduplicate on the ids).
    pub async fn finish(&mut self, within: Duration) -> Vec<(String, ChangesError)> {
        self.slots.close();
        let mut failed = Vec::new();
        let deadline = tokio::time::Instant::now() + within;
        while let Ok(Some(done)) = tokio::time::timeout_at(deadline, self.running.join_next()).await
        {
            self.ended(done, &mut failed);
        }
        self.running.abort_all();
        failed
    }

    fn ended(
        &mut self,
        done: Result<Finished, tokio::task::JoinError>,
        failed: &mut Vec<(String, ChangesError)>,
    ) {
        let (project, d, outcome) = match done {
            Ok(done) => done,
            // A task that panicked or was stopped: its project is free again.
            Err(e) => {
                log::warn!("verdict changes: a delivery ended early: {e}");
                self.busy.retain(|_, task| *task != e.id());
                return;
            }
        };
        self.busy.remove(&project);
        if d.attempts > 0 {
            self.waiting.insert(project.clone(), d);
        }
        if let Err(e) = outcome {
            failed.push((project, e));
        }
    }
}

impl Courier {
    /// One attempt for `project`: under its lease, a message made from the store now.
    async fn send_one(&self, project: &str, d: &mut Delivery) -> Result<(), ChangesError> {
        let ttl = self.hook.timeout * 2 + self.send_interval;
        // Nothing unsent: no lease taken (a write per project and interval otherwise).
        let sent = self.store.sent_upto(project).await?;
        if self
            .store
            .list(project, sent, i64::MIN, 1)
            .await?
            .is_empty()
        {
            *d = Delivery::default();
            return Ok(());
        }
        if !self.store.lease(project, &self.holder, ttl).await? {
            return Ok(());
        }
        // Made after the lease was taken: the sent mark another gateway left is seen.
        let Some(message) = self.message(project, d.upto).await? else {
            *d = Delivery::default();
            return Ok(());
        };
        if d.attempts == 0 {
            Counters::add(&self.counters.withdrawn, message.cancelled);
        }
        let outcome = self.post(&message).await;
        self.settle(project, d, &message, outcome, ttl).await
    }

    /// Records what an attempt did: delivered or given up (the sent mark moves), or failed (the
    /// next attempt after the backoff, the lease kept through it).
    async fn settle(
        &self,
        project: &str,
        d: &mut Delivery,
        message: &Outgoing,
        outcome: Result<(), AttemptError>,
        ttl: Duration,
    ) -> Result<(), ChangesError> {
        let id = &message.id;
        match outcome {
            Ok(()) => {
                self.store.mark_sent(project, message.last_id).await?;
                Counters::add(&self.counters.messages_sent, 1);
                *d = Delivery::default();
                let total = message.total;
                log::info!("verdict changes: project {project} told of {total} change(s) ({id})");
            }
            Err(e) => {
                Counters::add(&self.counters.attempt_errors, 1);
                d.attempts += 1;
                let refused = matches!(e, AttemptError::Refused(_));
                if refused || d.attempts >= self.hook.max_attempts {
                    // Given up: the changes stay readable through `GET /v1/changes`.
                    self.store.mark_sent(project, message.last_id).await?;
                    Counters::add(&self.counters.messages_failed, 1);
                    log::warn!(
                        "verdict changes: message {id} of project {project} given up after {} attempt(s): {e}",
                        d.attempts
                    );
                    *d = Delivery::default();
                } else {
                    let wait = deliver::backoff(d.attempts - 1);
                    d.next = Some(Instant::now() + wait);
                    d.upto = Some(message.last_id);
                    // The lease is kept through the wait: another gateway does not retry at
                    // once with its own count (the backoff holds across gateways).
                    self.store.lease(project, &self.holder, wait + ttl).await?;
                    log::warn!(
                        "verdict changes: message {id} of project {project}: attempt {} failed: {e}",
                        d.attempts
                    );
                }
            }
        }
        Ok(())
    }

    /// The POST, on a blocking thread (ureq).
    async fn post(&self, message: &Outgoing) -> Result<(), AttemptError> {
        let hook = &self.hook;
        let (agent, url, secret) = (hook.agent.clone(), hook.url.clone(), hook.secret.clone());
        let (id, body) = (message.id.clone(), message.body.clone());
        tokio::task::spawn_blocking(move || {
            deliver::post(&agent, &url, ("X-Change-Id", &id), &body, &secret)
        })
        .await
        .unwrap_or_else(|e| Err(AttemptError::Failed(e.to_string())))
    }

    /// The message of `project`'s unsent changes up to `upto` (all of them: `None`), if any.
    async fn message(
        &self,
        project: &str,
        upto: Option<u64>,
    ) -> Result<Option<Outgoing>, ChangesError> {
        let sent = self.store.sent_upto(project).await?;
        let pending = self
            .store
            .pending(project, sent, upto.unwrap_or(u64::MAX))
            .await?;
        if pending.total == 0 {
            return Ok(None);
        }
        let n = self.max_per_message as usize;
        let mut first = self.store.list(project, sent, i64::MIN, n).await?;
        // Only what `pending` counted: a change recorded in between waits for the next one.
        first.retain(|c| c.id <= pending.last_id);
        let message = super::message::build(project, &first, &pending, self.quiet);
        Ok(Some(Outgoing {
            id: message.id(),
            body: serde_json::to_string(&message).unwrap_or_default(),
            last_id: pending.last_id,
            total: pending.total,
            cancelled: message.cancelled,
        }))
    }
}

/// A message as it is posted.
struct Outgoing {
    id: String,
    body: String,
    /// The last change id it covers: the sent mark once it is delivered or given up.
    last_id: u64,
    total: u64,
    /// Changes left out because they cancel out (counted at a message's first attempt).
    cancelled: u64,
}
