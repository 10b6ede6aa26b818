//! Each project's messages, made by a task of its own off the service's loop (one at a time a
//! project, [`AT_ONCE`] at most in all) and handed to the webhook engine, one per destination
//! (the operator's `gateway.changes.webhook`, the project's own webhooks for
//! `verdict.changed`), which delivers them, retried across restarts. A message is made from the
//! store once the project's sender lease is taken: what another gateway handed over meanwhile is
//! not made again, and a message made twice (a crash between the hand-over and the sent mark)
//! has the same key and is delivered once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use drg_webhook::{Message, Sender};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::store::ChangeStore;
use super::{ChangesError, Counters};
use drg_webhook::Subscribers;

/// Hand-overs running at once at most (each a few store calls and one outbox write).
pub const AT_ONCE: usize = 16;
/// The topic of the changes' messages.
pub const TOPIC: &str = "verdict.changed";

/// What every hand-over needs, shared by the tasks.
pub struct Courier {
    pub store: Arc<dyn ChangeStore>,
    /// The webhook engine, and who receives a project's messages.
    pub sender: Sender,
    pub subscribers: Arc<dyn Subscribers>,
    pub counters: Arc<Counters>,
    /// This gateway's name in the sender leases.
    pub holder: String,
    pub send_interval: Duration,
    pub max_per_message: u32,
    /// A flip and its flip back within this many seconds are left out of a message.
    pub quiet: i64,
}

/// A hand-over's end: its project and what went wrong with the store.
type Finished = (String, Result<(), ChangesError>);

/// The hand-overs of every project that run.
pub struct Deliveries {
    courier: Arc<Courier>,
    slots: Arc<Semaphore>,
    running: JoinSet<Finished>,
    /// The projects whose hand-over runs, and its task.
    busy: HashMap<String, tokio::task::Id>,
    /// Projects asked for at once while theirs ran ([`Deliveries::start_now`]): started again
    /// as soon as it ends, so a change recorded meanwhile does not wait for the interval.
    again: std::collections::HashSet<String>,
}

impl Deliveries {
    pub fn new(courier: Courier) -> Deliveries {
        Deliveries {
            courier: Arc::new(courier),
            slots: Arc::new(Semaphore::new(AT_ONCE)),
            running: JoinSet::new(),
            busy: HashMap::new(),
            again: Default::default(),
        }
    }

    pub fn send_interval(&self) -> Duration {
        self.courier.send_interval
    }

    /// Starts a hand-over for each of `projects` that has none running.
    pub fn start(&mut self, projects: Vec<String>) {
        for project in projects {
            if self.busy.contains_key(&project) {
                continue;
            }
            let (courier, slots) = (self.courier.clone(), self.slots.clone());
            let name = project.clone();
            let task = self.running.spawn(async move {
                // Closed at shutdown: what has not started by then is not started.
                let outcome = match slots.acquire_owned().await {
                    Ok(_slot) => courier.send_one(&name).await,
                    Err(_) => Ok(()),
                };
                (name, outcome)
            });
            self.busy.insert(project, task.id());
        }
    }

    /// Starts a hand-over for each of `projects` now, and once more right after one that
    /// runs already ends (what it made may predate the change that asks).
    pub fn start_now(&mut self, projects: Vec<String>) {
        for p in &projects {
            if self.busy.contains_key(p) {
                self.again.insert(p.clone());
            }
        }
        self.start(projects);
    }

    /// Takes in the hand-overs that ended (starting those asked for again meanwhile); returns
    /// the store failures among them.
    pub fn reap(&mut self) -> Vec<(String, ChangesError)> {
        let mut failed = Vec::new();
        while let Some(done) = self.running.try_join_next() {
            self.ended(done, &mut failed);
        }
        let again: Vec<String> = (self.again.iter())
            .filter(|p| !self.busy.contains_key(*p))
            .cloned()
            .collect();
        for p in &again {
            self.again.remove(p);
        }
        self.start(again);
        failed
    }

    /// At shutdown: no hand-over starts any more; those running get up to `within` to finish,
    /// then are dropped (the next start, or another gateway, makes their message again).
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
        let (project, outcome) = match done {
            Ok(done) => done,
            // A task that panicked or was stopped: its project is free again.
            Err(e) => {
                log::warn!("verdict changes: a hand-over ended early: {e}");
                self.busy.retain(|_, task| *task != e.id());
                return;
            }
        };
        self.busy.remove(&project);
        if let Err(e) = outcome {
            failed.push((project, e));
        }
    }
}

impl Courier {
    /// One hand-over for `project`: under its lease, a message made from the store now, handed
    /// to the engine for each destination, then the sent mark moved past it.
    async fn send_one(&self, project: &str) -> Result<(), ChangesError> {
        let ttl = self.send_interval * 2 + Duration::from_secs(10);
        // Nothing unsent: no lease taken (a write per project and interval otherwise).
        let sent = self.store.sent_upto(project).await?;
        if self
            .store
            .list(project, sent, i64::MIN, 1)
            .await?
            .is_empty()
        {
            return Ok(());
        }
        if !self.store.lease(project, &self.holder, ttl).await? {
            return Ok(());
        }
        // Made after the lease was taken: the sent mark another gateway left is seen.
        let Some(message) = self.message(project).await? else {
            return Ok(());
        };
        Counters::add(&self.counters.withdrawn, message.cancelled);
        let messages: Vec<Message> = self
            .subscribers
            .destinations(project, TOPIC)
            .into_iter()
            .map(|destination| Message {
                key: format!("{TOPIC}:{project}:{}:{destination}", message.id),
                topic: TOPIC.to_owned(),
                label: "verdict changes message".to_owned(),
                // One project's messages in order; another project's beside them.
                lane: format!("{destination}|{project}"),
                destination,
                id_header: "X-Change-Id".to_owned(),
                id: message.id.clone(),
                body: message.body.clone(),
            })
            .collect();
        self.sender
            .send(messages)
            .await
            .map_err(|e| ChangesError::Other(e.to_string()))?;
        self.store.mark_sent(project, message.last_id).await?;
        let (id, total) = (&message.id, message.total);
        log::info!("verdict changes: project {project}: {total} change(s) handed over ({id})");
        Ok(())
    }

    /// The message of `project`'s unsent changes, if any.
    async fn message(&self, project: &str) -> Result<Option<Outgoing>, ChangesError> {
        let sent = self.store.sent_upto(project).await?;
        let pending = self.store.pending(project, sent, u64::MAX).await?;
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
    /// The last change id it covers: the sent mark once it is handed over.
    last_id: u64,
    total: u64,
    /// Changes left out because they cancel out (counted at a message's first attempt).
    cancelled: u64,
}
