//! The deliverer: takes the due head of each lane from the outbox, a lane at a time, posts it on
//! a blocking thread and settles it (sent; retried after the backoff; given up after the
//! destination's `max_attempts` or at once when the guard refused the receiver; dropped when the
//! destination is gone). What producers hand over wakes it at once; retries are looked for
//! every [`TICK`].
//!
//! **Slots are fair.** The operator's receivers (quota alerts, the changes webhook) have
//! [`OPERATOR_SLOTS`] of their own; the projects' webhooks share [`PROJECT_SLOTS`], each project
//! holding [`PER_PROJECT`] at most. So receivers that never answer hold their own lanes and at
//! most their project's share: another project's message, and the operator's alert, go out
//! beside them.
//!
//! **At least once, one id.** Every message carries its id as `Webhook-Id` on every attempt
//! and after a restart; a lease names its holder (`holder.rs`), so a message in flight at a
//! crash is taken again as soon as the restarted process (or another on the file) sees its
//! holder gone, and only the holder settles it.
//!
//! **Held until released.** A producer may hand messages over under a hold of its own
//! (`outbox/holds.rs`): durable at once, delivered only once it releases the hold (a producer
//! that must win a claim elsewhere first); the deliverer never takes a held message.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drg_base::service::{Service, Shutdown};
use tokio::sync::Notify;
use tokio::task::JoinSet;

use crate::client::{self, AttemptError};
use crate::outbox::{Enqueued, HeldRow, Hold, Outbox, OutboxError, Row, State};
use crate::{Directory, Message, Observer, Outcome, MAX_TIMEOUT};

/// Attempts for the operator's receivers running at once at most (each holds a blocking thread
/// while it posts).
pub const OPERATOR_SLOTS: usize = 4;
/// Attempts for the projects' webhooks running at once at most, all projects together.
pub const PROJECT_SLOTS: usize = 28;
/// Attempts for one project's webhooks running at once at most: its share.
pub const PER_PROJECT: usize = 2;
/// Attempts running at once at most.
pub const AT_ONCE: usize = OPERATOR_SLOTS + PROJECT_SLOTS;
/// How often due retries are looked for.
pub const TICK: Duration = Duration::from_millis(250);
/// At shutdown, attempts posting get this long to finish and be settled.
pub const DRAIN: Duration = Duration::from_secs(2);
/// Settled messages are kept this long (for an operator reading the file), then forgotten.
const KEEP: Duration = Duration::from_secs(7 * 86_400);
const PRUNE_EVERY: Duration = Duration::from_secs(3_600);

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error("webhook outbox: task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// The outbox, shared by the deliverer and the producers; SQLite waits for the disk, so every
/// use runs on a blocking thread.
#[derive(Clone)]
struct Shared(Arc<Mutex<Outbox>>);

impl Shared {
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Outbox) -> Result<T, OutboxError> + Send + 'static,
    ) -> Result<T, EngineError> {
        let outbox = self.0.clone();
        let done = tokio::task::spawn_blocking(move || {
            let mut guard = outbox.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut guard)
        })
        .await;
        Ok(done??)
    }
}

/// The producers' handle: hands messages to the outbox and wakes the deliverer. Its connection
/// is its own (see [`Outbox::sibling`]).
#[derive(Clone)]
pub struct Sender {
    outbox: Shared,
    wake: Arc<Notify>,
}

impl Sender {
    /// Hands `messages` over (one transaction); returns how many were new. Once this returns
    /// `Ok`, they are on disk.
    pub async fn send(&self, messages: Vec<Message>) -> Result<usize, EngineError> {
        if messages.is_empty() {
            return Ok(0);
        }
        let new = self
            .outbox
            .run(move |o| o.enqueue(&messages, now_ms()))
            .await?;
        self.wake.notify_one();
        Ok(new)
    }

    /// Hands over each hold with its messages, one transaction for all (see
    /// [`Outbox::enqueue_holds`]). Once this returns `Ok`, they are on disk.
    pub async fn send_held(
        &self,
        holds: Vec<(Hold, Vec<Message>)>,
        max_waiting: u64,
    ) -> Result<Vec<Enqueued>, EngineError> {
        let got = self
            .outbox
            .run(move |o| o.enqueue_holds(&holds, max_waiting, now_ms()))
            .await?;
        self.wake.notify_one();
        Ok(got)
    }

    /// Releases a held hold (see [`Outbox::release`]).
    pub async fn release(&self, key: String) -> Result<bool, EngineError> {
        let released = self.outbox.run(move |o| o.release(&key)).await?;
        self.wake.notify_one();
        Ok(released)
    }

    /// Drops a held hold (see [`Outbox::drop_held`]).
    pub async fn drop_held(&self, key: String) -> Result<bool, EngineError> {
        self.outbox.run(move |o| o.drop_held(&key)).await
    }

    /// Up to `limit` holds of `scope` still held.
    pub async fn held_rows(&self, scope: &str, limit: usize) -> Result<Vec<HeldRow>, EngineError> {
        let scope = scope.to_owned();
        self.outbox.run(move |o| o.held_rows(&scope, limit)).await
    }

    /// Messages of `topic` not yet settled (held ones too).
    pub async fn waiting(&self, topic: &str) -> Result<u64, EngineError> {
        let topic = topic.to_owned();
        self.outbox.run(move |o| o.waiting(&topic)).await
    }

    /// Runs `f` on the producers' outbox on this thread, then closes its connection: for a
    /// producer's start, before the process that serves exists (a host may fork into a daemon
    /// after it, and a connection carried across a fork holds none of its locks).
    pub fn at_start<T>(
        &self,
        f: impl FnOnce(&mut Outbox) -> Result<T, OutboxError>,
    ) -> Result<T, OutboxError> {
        let mut outbox = self.outbox.0.lock().unwrap_or_else(|e| e.into_inner());
        let out = f(&mut outbox);
        outbox.close();
        out
    }
}

/// The deliverer (see the module documentation).
pub struct Engine {
    outbox: Shared,
    directory: Arc<dyn Directory>,
    observer: Arc<dyn Observer>,
    wake: Arc<Notify>,
    /// Tests only: a wait between a receiver's answer and its record in the outbox, where a
    /// test's `kill -9` lands (the at-least-once case).
    settle_pause: Option<Duration>,
}

/// Opens the outbox at `path` (a bad one stops the start) and makes the deliverer and the
/// producers' handle.
pub fn open(
    path: &Path,
    directory: Arc<dyn Directory>,
    observer: Arc<dyn Observer>,
) -> Result<(Engine, Sender), OutboxError> {
    let deliverer = Outbox::open(path)?;
    let producers = deliverer.sibling();
    let outbox = Shared(Arc::new(Mutex::new(deliverer)));
    let wake = Arc::new(Notify::new());
    let sender = Sender {
        outbox: Shared(Arc::new(Mutex::new(producers))),
        wake: wake.clone(),
    };
    let engine = Engine {
        outbox,
        directory,
        observer,
        wake,
        settle_pause: None,
    };
    Ok((engine, sender))
}

impl Engine {
    /// Tests only: waits `pause` between each receiver's answer and its record in the outbox.
    pub fn with_settle_pause(mut self, pause: Option<Duration>) -> Engine {
        self.settle_pause = pause;
        self
    }
}

/// What an attempt's end writes to the outbox.
enum Write {
    Settle(State, Option<String>),
    /// Due again at (ms), with the error.
    Retry(i64, String),
}

/// An attempt's end: the message as taken, and what the post did (`None`: not tried, the
/// destination is gone).
type Attempted = (Row, Option<(u32, Result<(), AttemptError>)>);

/// What runs: the lanes being tried and the slots each owner holds.
#[derive(Default, Clone)]
struct Slots {
    lanes: HashSet<String>,
    /// Attempts per owner: `None` the operator's receivers, else the project.
    held: HashMap<Option<String>, usize>,
}

impl Slots {
    fn owner(m: &Message) -> Option<String> {
        crate::project_of(&m.destination).map(|(p, _)| p.to_owned())
    }

    /// Takes a slot for `m` if its lane is free and its owner has room.
    fn admit(&mut self, m: &Message) -> bool {
        let owner = Slots::owner(m);
        let held = self.held.get(&owner).copied().unwrap_or(0);
        let projects: usize = (self.held.iter())
            .filter(|(o, _)| o.is_some())
            .map(|(_, n)| n)
            .sum();
        let room = match owner {
            None => held < OPERATOR_SLOTS,
            Some(_) => held < PER_PROJECT && projects < PROJECT_SLOTS,
        };
        if !room || self.lanes.contains(&m.lane) {
            return false;
        }
        self.lanes.insert(m.lane.clone());
        *self.held.entry(owner).or_default() += 1;
        true
    }

    /// Gives `m`'s slot back.
    fn release(&mut self, m: &Message) {
        self.lanes.remove(&m.lane);
        let owner = Slots::owner(m);
        if let Some(n) = self.held.get_mut(&owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.held.remove(&owner);
            }
        }
    }

    fn running(&self) -> usize {
        self.held.values().sum()
    }
}

impl Engine {
    /// Delivers until `shutdown` turns true (or its sender is dropped), then gives the attempts
    /// posting two seconds to finish; one cut short is tried again after its lease.
    pub async fn deliver(&self, mut shutdown: Shutdown) {
        let mut running: JoinSet<Attempted> = JoinSet::new();
        let mut busy = Slots::default();
        let mut last_prune: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = self.wake.notified() => {}
                Some(done) = running.join_next(), if !running.is_empty() => {
                    self.settle(done, &mut busy).await;
                }
                _ = shutdown.changed() => break,
            }
            if *shutdown.borrow() {
                break;
            }
            while let Some(done) = running.try_join_next() {
                self.settle(done, &mut busy).await;
            }
            self.start_due(&mut running, &mut busy).await;
            if last_prune.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
                last_prune = Some(tokio::time::Instant::now());
                self.prune().await;
            }
        }
        let deadline = tokio::time::Instant::now() + DRAIN;
        while let Ok(Some(done)) = tokio::time::timeout_at(deadline, running.join_next()).await {
            self.settle(done, &mut busy).await;
        }
        running.abort_all();
    }

    /// Starts an attempt for each due lane head, as slots allow.
    async fn start_due(&self, running: &mut JoinSet<Attempted>, busy: &mut Slots) {
        let free = AT_ONCE.saturating_sub(busy.running());
        if free == 0 {
            return;
        }
        let lease = MAX_TIMEOUT + Duration::from_secs(10);
        // The slots go to the blocking thread and back: admitted there, row by row (a round
        // that failed leased nothing: the slots are as before it).
        let before = busy.clone();
        let mut slots = std::mem::take(busy);
        let taken = self
            .outbox
            .run(move |o| {
                let rows = o.take_due(now_ms(), lease, free, &mut |m| slots.admit(m));
                Ok((rows, slots))
            })
            .await;
        let rows = match taken {
            Ok((Ok(rows), slots)) => {
                *busy = slots;
                rows
            }
            Ok((Err(e), _)) => {
                *busy = before;
                log::error!("{e}");
                return;
            }
            Err(e) => {
                *busy = before;
                log::error!("{e}");
                return;
            }
        };
        for row in rows {
            let target = self.directory.target(&row.message.destination);
            running.spawn(async move {
                let Some(target) = target else {
                    return (row, None);
                };
                let m = row.message.clone();
                let max_attempts = target.max_attempts;
                let result = tokio::task::spawn_blocking(move || {
                    client::post(&target, (&m.id_header, &m.id), &m.body)
                })
                .await
                .unwrap_or_else(|e| Err(AttemptError::Failed(e.to_string())));
                (row, Some((max_attempts, result)))
            });
        }
    }

    /// Records what an attempt did and tells the observer.
    async fn settle(&self, done: Result<Attempted, tokio::task::JoinError>, busy: &mut Slots) {
        let (row, attempt) = match done {
            Ok(done) => done,
            Err(e) => {
                // Its lane stays taken until its lease ends; the next start tries it again.
                log::warn!("webhooks: an attempt ended early: {e}");
                return;
            }
        };
        busy.release(&row.message);
        let m = &row.message;
        // The lane names the destination and the project; never the URL (it may hold a token).
        let (label, what) = (&m.label, format!("{} for {}", m.id, m.lane));
        let n = row.attempts + 1;
        let (outcome, write) = match attempt {
            None => {
                log::info!("{label} dropped: {what}: the destination is gone");
                (Outcome::Dropped, Write::Settle(State::Dropped, None))
            }
            Some((_, Ok(()))) => {
                log::info!("{label} sent: {what}");
                (Outcome::Sent, Write::Settle(State::Sent, None))
            }
            Some((_, Err(e @ AttemptError::Refused(_)))) => {
                log::error!("{label} refused, given up: {what}: {e}");
                let failed = Write::Settle(State::Failed, Some(e.to_string()));
                (Outcome::Refused, failed)
            }
            Some((max_attempts, Err(e))) if n >= max_attempts => {
                log::error!("{label} given up after {n} attempts: {what}: {e}");
                let failed = Write::Settle(State::Failed, Some(e.to_string()));
                (Outcome::GivenUp, failed)
            }
            Some((_, Err(e))) => {
                log::warn!("{label} attempt {n} failed: {what}: {e}");
                let wait = client::backoff(row.attempts);
                let next = now_ms() + i64::try_from(wait.as_millis()).unwrap_or(i64::MAX / 2);
                (Outcome::Retrying, Write::Retry(next, e.to_string()))
            }
        };
        self.observer.observe(m, outcome);
        if let Some(pause) = self.settle_pause {
            tokio::time::sleep(pause).await;
        }
        let key = m.key.clone();
        let written = self
            .outbox
            .run(move |o| match write {
                Write::Settle(state, error) => o.settle(&key, state, now_ms(), error.as_deref()),
                Write::Retry(next, error) => o.retry_at(&key, next, &error),
            })
            .await;
        match written {
            Ok(true) => {}
            // Its lease ran out and another deliverer took it: that one settles it.
            Ok(false) => log::debug!("{label}: {what} was taken over; its holder settles it"),
            // The lease ends and the message is tried again: a repeat, which receivers drop
            // by its `Webhook-Id`.
            Err(e) => log::error!("{e} (settling {what})"),
        }
    }

    /// Forgets messages settled [`KEEP`] ago, and producers' holds past their time.
    async fn prune(&self) {
        let now = now_ms();
        let before = now - i64::try_from(KEEP.as_millis()).unwrap_or(0);
        let pruned = self
            .outbox
            .run(move |o| Ok((o.prune(before)?, o.prune_holds(now)?)))
            .await;
        match pruned {
            Ok((0, 0)) => {}
            Ok((n, h)) => log::info!("webhooks: forgot {n} settled messages and {h} holds"),
            Err(e) => log::error!("{e}"),
        }
    }
}

#[async_trait::async_trait]
impl Service for Engine {
    async fn run(&self, shutdown: Shutdown) {
        self.deliver(shutdown).await;
    }
}
