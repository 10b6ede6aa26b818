//! The deliverer: takes the due head of each lane from the outbox, a lane at a time, posts it on
//! a blocking thread and settles it (sent; retried after the backoff; given up after the
//! destination's `max_attempts` or at once when the guard refused the receiver; dropped when the
//! destination is gone). What producers hand over wakes it at once; retries are looked for
//! every [`TICK`].
//!
//! **Slots are fair, whatever the count of accounts.** The operator's receivers (quota alerts,
//! the changes webhook) have [`OPERATOR_SLOTS`] of their own; the projects' webhooks share
//! [`PROJECT_SLOTS`], each project holding [`PER_PROJECT`] at most. Accounts are free to make, so
//! shares alone would let 14 projects whose receivers hang hold every project slot. Hence: a
//! project's webhook whose last attempt failed (a timeout, a connection error, an answer but
//! `2xx`, the guard's refusal) is *suspect* until an attempt of it succeeds, and attempts to
//! suspect webhooks, all projects together, hold [`SUSPECT_SLOTS`] at most. And webhooks with
//! no success on record (never tried yet, or suspect) hold [`OPEN_SLOTS`] at most together: the
//! rest are kept for webhooks whose last attempt succeeded. So 14, or 1,000, new accounts whose
//! receivers hang hold at most half the project slots while their first attempts run
//! (`timeout_ms`, at most [`MAX_TIMEOUT`]), and 4 once those failed; a proven webhook's message
//! (and the operator's alert) goes out beside them at once. A new project's first message
//! competes with new accounts for the open half until it succeeds once. Health is a webhook's,
//! not its project's: a project's one dead webhook neither confines its others nor is cleared by
//! their successes. Limits, by design: one that answers every other attempt at once is back
//! among the proven after each success (a message per attempt it hangs on); and at most
//! [`HEALTH_KEPT`] webhooks of each kind are remembered (8 bytes each): beyond, each new one
//! forgets another (a suspect forgotten gets one attempt in the open slots, a proven one
//! competes there until it succeeds again).
//!
//! **At least once, one id.** Every message carries its id as `Webhook-Id` on every attempt
//! and after a restart; a lease names its holder (`holder.rs`), so a message in flight at a
//! crash is taken again as soon as the restarted process (or another on the file) sees its
//! holder gone, and only the holder settles it.
//!
//! **Held until released.** A producer may hand messages over under a hold of its own
//! (`outbox/holds.rs`): durable at once, delivered only once it releases the hold (a producer
//! that must win a claim elsewhere first); the deliverer never takes a held message.

use std::collections::hash_map::RandomState;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
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
/// Attempts to suspect webhooks (last attempt failed) running at once at most, all projects
/// together: out of [`PROJECT_SLOTS`], so the healthy always have the rest.
pub const SUSPECT_SLOTS: usize = 4;
/// Attempts to webhooks with no success on record (never tried, or suspect) running at once at
/// most, all projects together: out of [`PROJECT_SLOTS`], so the proven always have the rest.
pub const OPEN_SLOTS: usize = PROJECT_SLOTS / 2;
/// Suspect webhooks, and proven ones, remembered at most each.
const HEALTH_KEPT: usize = 100_000;
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

/// What runs: the lanes being tried and the slots each owner holds; and which webhooks are
/// suspect.
#[derive(Default, Clone)]
struct Slots {
    lanes: HashSet<String>,
    /// Attempts per owner: `None` the operator's receivers, else the project.
    held: HashMap<Option<String>, usize>,
    /// The lanes running that were admitted as suspect: [`SUSPECT_SLOTS`] at most.
    confined: HashSet<String>,
    /// The lanes running that were admitted with no success on record: [`OPEN_SLOTS`] at most.
    open: HashSet<String>,
    /// Shared with the copy a round of [`Engine::start_due`] keeps, which it drops before any
    /// change: cloned cheaply, changed in place.
    suspects: Arc<Health>,
}

/// The projects' destinations whose last attempt failed (suspect) or succeeded (proven), as a
/// keyed hash of the name; one never tried is in neither.
#[derive(Default, Clone)]
struct Health {
    failed: HashSet<u64>,
    proven: HashSet<u64>,
    seed: RandomState,
}

/// Adds `key` to `set`, making room past [`HEALTH_KEPT`] by forgetting another.
fn remember(set: &mut HashSet<u64>, key: u64) {
    if set.len() >= HEALTH_KEPT && !set.contains(&key) {
        if let Some(&other) = set.iter().next() {
            set.remove(&other);
        }
    }
    set.insert(key);
}

/// How an attempt of a message ended, for its webhook's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tried {
    Sent,
    Failed,
    /// Not tried: the destination is gone.
    Gone,
}

impl Slots {
    fn owner(m: &Message) -> Option<String> {
        crate::project_of(&m.destination).map(|(p, _)| p.to_owned())
    }

    fn suspect(&self, m: &Message) -> bool {
        let s = &self.suspects;
        s.failed.contains(&s.seed.hash_one(&m.destination))
    }

    fn proven(&self, m: &Message) -> bool {
        let s = &self.suspects;
        s.proven.contains(&s.seed.hash_one(&m.destination))
    }

    /// Records how an attempt of `m` ended (the operator's receivers are not judged).
    fn judge(&mut self, m: &Message, tried: Tried) {
        if Slots::owner(m).is_none() {
            return;
        }
        let s = Arc::make_mut(&mut self.suspects);
        let key = s.seed.hash_one(&m.destination);
        match tried {
            Tried::Sent => {
                s.failed.remove(&key);
                remember(&mut s.proven, key);
            }
            Tried::Failed => {
                s.proven.remove(&key);
                remember(&mut s.failed, key);
            }
            Tried::Gone => {
                s.failed.remove(&key);
                s.proven.remove(&key);
            }
        }
    }

    /// Takes a slot for `m` if its lane is free and its owner has room (and, for a suspect
    /// webhook, the suspects).
    fn admit(&mut self, m: &Message) -> bool {
        let owner = Slots::owner(m);
        let suspect = owner.is_some() && self.suspect(m);
        let open = owner.is_some() && !self.proven(m);
        let held = self.held.get(&owner).copied().unwrap_or(0);
        let projects: usize = (self.held.iter())
            .filter(|(o, _)| o.is_some())
            .map(|(_, n)| n)
            .sum();
        let room = match owner {
            None => held < OPERATOR_SLOTS,
            Some(_) => {
                held < PER_PROJECT
                    && projects < PROJECT_SLOTS
                    && (!suspect || self.confined.len() < SUSPECT_SLOTS)
                    && (!open || self.open.len() < OPEN_SLOTS)
            }
        };
        if !room || self.lanes.contains(&m.lane) {
            return false;
        }
        self.lanes.insert(m.lane.clone());
        if suspect {
            self.confined.insert(m.lane.clone());
        }
        if open {
            self.open.insert(m.lane.clone());
        }
        *self.held.entry(owner).or_default() += 1;
        true
    }

    /// Gives `m`'s slot back.
    fn release(&mut self, m: &Message) {
        self.lanes.remove(&m.lane);
        self.confined.remove(&m.lane);
        self.open.remove(&m.lane);
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
                let target = match target {
                    crate::Found::Target(t) => t,
                    crate::Found::Gone => return (row, None),
                    crate::Found::NotHere => {
                        let tries = crate::config::default_attempts();
                        return (row, Some((tries, Err(AttemptError::NotHere))));
                    }
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
        let tried = match &attempt {
            None => Some(Tried::Gone),
            // Not tried: nothing is known of the receiver.
            Some((_, Err(AttemptError::NotHere))) => None,
            Some((_, Ok(()))) => Some(Tried::Sent),
            Some((_, Err(_))) => Some(Tried::Failed),
        };
        if let Some(tried) = tried {
            busy.judge(&row.message, tried);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A message to webhook `hook` of `project` (`None`: the operator's receiver `hook`), on the
    /// webhook's own lane.
    fn message(project: Option<&str>, hook: &str) -> Message {
        let destination = match project {
            Some(p) => crate::project_destination(p, hook),
            None => hook.to_owned(),
        };
        Message {
            key: format!("k-{destination}"),
            topic: "t".into(),
            label: "test message".into(),
            lane: destination.clone(),
            destination,
            id_header: "X-Id".into(),
            id: "1".into(),
            body: "{}".into(),
        }
    }

    /// Admits each of `messages`: how many got a slot.
    fn admitted(slots: &mut Slots, messages: &[Message]) -> usize {
        messages.iter().filter(|m| slots.admit(m)).count()
    }

    /// `count` projects, each with two webhooks whose last attempt failed.
    fn hung(slots: &mut Slots, count: usize) -> Vec<Message> {
        let hung: Vec<Message> = (0..count)
            .flat_map(|i| ["a", "b"].map(|h| message(Some(&format!("hung{i}")), h)))
            .collect();
        for m in &hung {
            slots.judge(m, Tried::Failed);
        }
        hung
    }

    #[test]
    fn hung_receivers_hold_the_suspect_slots_only() {
        for count in [14, 100] {
            let mut slots = Slots::default();
            let hung = hung(&mut slots, count);
            // Every due head is offered, round after round: still the suspects' slots only.
            assert_eq!(admitted(&mut slots, &hung), SUSPECT_SLOTS);
            for _ in 0..3 {
                assert_eq!(admitted(&mut slots, &hung), 0);
            }
            assert_eq!(slots.running(), SUSPECT_SLOTS);
            // A healthy (never tried) project's message goes out beside them at once.
            assert!(slots.admit(&message(Some("healthy"), "a")));
            // The proven have every other project slot.
            let others: Vec<Message> = (0..PROJECT_SLOTS)
                .flat_map(|i| ["a", "b"].map(|h| message(Some(&format!("p{i}")), h)))
                .collect();
            for m in &others {
                slots.judge(m, Tried::Sent);
            }
            let rest = PROJECT_SLOTS - SUSPECT_SLOTS - 1;
            assert_eq!(admitted(&mut slots, &others), rest);
            assert_eq!(slots.running(), PROJECT_SLOTS);
        }
    }

    #[test]
    fn new_webhooks_that_hang_hold_the_open_slots_only_before_their_first_attempt_ends() {
        for count in [14, 1_000] {
            let mut slots = Slots::default();
            // New accounts, two webhooks each, never tried: their first attempts all hang.
            let new: Vec<Message> = (0..count)
                .flat_map(|i| ["a", "b"].map(|h| message(Some(&format!("new{i}")), h)))
                .collect();
            assert_eq!(admitted(&mut slots, &new), OPEN_SLOTS);
            assert_eq!(admitted(&mut slots, &new), 0);
            // A webhook whose last attempt succeeded goes out beside them, as do the rest.
            let proven: Vec<Message> = (0..PROJECT_SLOTS)
                .map(|i| message(Some(&format!("p{i}")), "a"))
                .collect();
            for m in &proven {
                slots.judge(m, Tried::Sent);
            }
            assert_eq!(admitted(&mut slots, &proven), PROJECT_SLOTS - OPEN_SLOTS);
            // Their first attempts fail: from then on they hold the suspects' slots only.
            for m in &new[..OPEN_SLOTS] {
                slots.release(m);
                slots.judge(m, Tried::Failed);
            }
            assert_eq!(admitted(&mut slots, &new[..OPEN_SLOTS]), SUSPECT_SLOTS);
        }
    }

    #[test]
    fn a_suspect_holds_its_project_share_at_most() {
        let mut slots = Slots::default();
        let hooks = ["a", "b", "c"].map(|h| message(Some("one"), h));
        for m in &hooks {
            slots.judge(m, Tried::Failed);
        }
        assert_eq!(admitted(&mut slots, &hooks), PER_PROJECT);
    }

    #[test]
    fn a_success_clears_a_suspect_and_health_is_the_webhooks() {
        let mut slots = Slots::default();
        let hung = hung(&mut slots, 14);
        let dead = message(Some("acme"), "dead");
        let live = message(Some("acme"), "live");
        slots.judge(&dead, Tried::Failed);
        assert_eq!(admitted(&mut slots, &hung), SUSPECT_SLOTS);
        // The suspects' slots are full: the dead webhook waits, the project's other one not.
        assert!(!slots.admit(&dead));
        assert!(slots.admit(&live));
        // Its success does not clear the dead one.
        slots.release(&live);
        slots.judge(&live, Tried::Sent);
        assert!(!slots.admit(&dead));
        // A suspect's slot given back goes to another suspect.
        slots.release(&hung[0]);
        assert!(slots.admit(&dead));
        slots.release(&dead);
        // An attempt of it succeeds: healthy again, admitted beside the full suspects.
        assert!(slots.admit(&hung[0]));
        slots.judge(&dead, Tried::Sent);
        assert!(slots.admit(&dead));
        assert_eq!(slots.confined.len(), SUSPECT_SLOTS);
        // A destination gone (not tried) leaves no suspect either.
        slots.judge(&hung[1], Tried::Gone);
        assert!(!slots.suspect(&hung[1]));
    }

    #[test]
    fn the_operators_slots_are_untouched() {
        let mut slots = Slots::default();
        let hung = hung(&mut slots, 100);
        let healthy: Vec<Message> = (0..PROJECT_SLOTS)
            .flat_map(|i| ["a", "b"].map(|h| message(Some(&format!("p{i}")), h)))
            .collect();
        for m in &healthy {
            slots.judge(m, Tried::Sent);
        }
        admitted(&mut slots, &hung);
        admitted(&mut slots, &healthy);
        assert_eq!(slots.running(), PROJECT_SLOTS);
        // The operator's receivers fail too: they are never suspect, and keep their own slots.
        let operator: Vec<Message> = (0..=OPERATOR_SLOTS)
            .map(|i| message(None, &format!("alerts{i}")))
            .collect();
        for m in &operator {
            slots.judge(m, Tried::Failed);
            assert!(!slots.suspect(m));
        }
        assert_eq!(slots.suspects.failed.len(), hung.len());
        assert_eq!(admitted(&mut slots, &operator), OPERATOR_SLOTS);
        assert_eq!(slots.running(), AT_ONCE);
    }

    #[test]
    fn the_suspects_kept_are_bounded() {
        let mut slots = Slots::default();
        let over = HEALTH_KEPT + 1_000;
        for i in 0..over {
            slots.judge(&message(Some(&format!("p{i}")), "a"), Tried::Failed);
        }
        assert_eq!(slots.suspects.failed.len(), HEALTH_KEPT);
        // The newest failure is kept.
        assert!(slots.suspect(&message(Some(&format!("p{}", over - 1)), "a")));
        // Failing again takes no room; a success frees it.
        slots.judge(
            &message(Some(&format!("p{}", over - 1)), "a"),
            Tried::Failed,
        );
        assert_eq!(slots.suspects.failed.len(), HEALTH_KEPT);
        for i in 0..over {
            slots.judge(&message(Some(&format!("p{i}")), "a"), Tried::Sent);
        }
        assert!(slots.suspects.failed.is_empty());
    }
}
