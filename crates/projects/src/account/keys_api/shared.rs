//! `/v1/keys` on the shared Redis store ([`drg_access::shared_keys`]), with the Redis quota
//! store: what gateways sharing only Redis need to share API-made keys.
//!
//! Redis is the truth; each gateway keeps the rows it last read in a cache file of its state
//! folder (`keys.redis-cache.json`, the managed file's format, in the managed file's place: the
//! keys reloader merges it with the operator's keys as it would the managed file). So a gateway
//! whose Redis is away keeps serving the last known keys, after a restart too.
//!
//! - Making a key is one script that counts the project's API-made keys in Redis (plus the
//!   operator's keys, counted here) and adds the row only below `max_keys`: exact across
//!   gateways. With Redis away: `503 service_unavailable`, nothing made. A script whose reply
//!   did not come (a paused or slow Redis) may still run later: its id is kept in the pending
//!   file as a revocation, so the key (whose secret nobody was shown) is removed as soon as
//!   Redis answers, and the 503 stays true.
//! - Revoking is one script that removes the key and every key it made, recursively, and keeps
//!   each as a tombstone in Redis ([`drg_access::shared_keys::tombstones`]); this gateway
//!   keeps them in its cache too (`revoked`). The key's lineage as this gateway's cache knows it
//!   is tombstoned with it also when Redis has no row of it (a Redis flushed a moment ago):
//!   `204`, not a `404` that would leave the key to the next restore. With Redis away, a key
//!   this gateway knows is revoked here at once (tombstoned in the cache) and kept in the
//!   pending file (`keys.redis-pending.json`, see [`drg_access::shared_keys::pending`]) until
//!   Redis has it: `202` says so. An id this gateway does not know is `503`: it cannot tell
//!   whose it is.
//! - Every change made here is written to the cache and published at once; other gateways see
//!   it within a poll ([`super::sync`], which also puts keys back into a store that lost them,
//!   less every tombstone any gateway holds).
//!
//! No lock is held across a Redis call: one project's slow key call never queues another's.
//! A change made here (a key made or revoked) bumps `generation` as it reaches the cache, under
//! the publishing lock; a poll writes what it read only if no change reached the cache since it
//! began (else the next poll reads again). So a read of Redis from before a revocation is never
//! written after it (a revoked key never comes back, not even for a poll). Files are written
//! under the publishing lock, on blocking threads.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;
use serde::Serialize;

use super::{new_id, KeysApi, NewKey, Refused};
use drg_access::keys::{KeyEntry, KeyOrigin};
use drg_access::managed::{self, ManagedFile, Tombstone};
use drg_access::shared_keys::pending;
use drg_access::shared_keys::tombstones::{self, now_unix};
use drg_access::shared_keys::{Made, SharedKeys, SharedKeysError, Stamp};
use drg_base::answer::{Action, Answer, ApiError, Changed};

/// A copy last read from the store longer ago than this before the store was found lost may
/// lack revocations other gateways made meanwhile: it is withheld, as one from the state folder.
/// Long enough for a Redis restarted or failed over while the gateways ran.
pub const IN_STEP_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// The keys API's part on the shared store.
pub struct Shared {
    pub(super) store: SharedKeys,
    /// This gateway's revocations Redis does not have yet.
    pub(super) pending: PathBuf,
    /// The stamp of the rows in the cache (`None` until the first read since the start).
    seen: std::sync::Mutex<Option<Stamp>>,
    /// Bumped by every change made here as it reaches the cache (see the module).
    pub(super) generation: AtomicU64,
    /// Whether the last call reached Redis (the log says each change once).
    reachable: AtomicBool,
    /// `drg_keys_shared_store_up`, following `reachable`.
    up_gauge: Option<prometheus::Gauge>,
    /// `drg_keys_shared_store_restores_total`: data sets found lost and keys put back.
    pub(super) restores: Option<prometheus::IntCounter>,
    /// Last uses sent to Redis, so that unchanged ones are not sent again.
    saved: std::sync::Mutex<HashMap<Arc<str>, u64>>,
    /// When this process last recorded in the cache that its keys match Redis's (unix
    /// seconds; see [`tombstones::fresh_enough`]).
    pub(super) confirmed: AtomicU64,
    /// When Redis last answered a poll in this run.
    answered: std::sync::Mutex<Option<std::time::Instant>>,
}

/// The cache file (in the managed file's place) and the pending file, beside `managed`.
pub fn paths(managed: &std::path::Path) -> (PathBuf, PathBuf) {
    (
        managed.with_file_name("keys.redis-cache.json"),
        managed.with_file_name("keys.redis-pending.json"),
    )
}

impl Shared {
    pub fn new(store: SharedKeys, pending: PathBuf) -> Self {
        Shared {
            store,
            pending,
            seen: std::sync::Mutex::new(None),
            generation: std::sync::atomic::AtomicU64::new(0),
            reachable: AtomicBool::new(true),
            up_gauge: None,
            restores: None,
            saved: std::sync::Mutex::default(),
            confirmed: AtomicU64::new(0),
            answered: std::sync::Mutex::new(None),
        }
    }

    /// Shows the store's reachability in `gauge` (1 until a call fails).
    pub fn with_gauge(mut self, gauge: prometheus::Gauge) -> Self {
        gauge.set(1.0);
        self.up_gauge = Some(gauge);
        self
    }

    /// For the admin `/readyz`: `{"store":"redis","up":..,"restores":..}`.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "store": "redis",
            "up": self.reachable.load(Ordering::Relaxed),
            "restores": self.restores.as_ref().map_or(0, prometheus::IntCounter::get),
        })
    }

    /// Counts each lost data set this gateway put its keys back into.
    pub fn with_restores(mut self, counter: prometheus::IntCounter) -> Self {
        self.restores = Some(counter);
        self
    }

    /// The stamp of the rows in the cache, if read since the start.
    pub(super) fn seen(&self) -> Option<Stamp> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(super) fn set_seen(&self, stamp: Stamp) {
        *self.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(stamp);
    }

    /// Whether the cache was in step with Redis until now (read in this run, Redis answering
    /// within [`IN_STEP_WITHIN`] past the `poll`'s period): only such a cache puts its keys back
    /// after a loss (see `sync.rs`). Notes that Redis answers now.
    pub(super) fn answered_now(&self, poll: std::time::Duration) -> bool {
        let mut answered = self.answered.lock().unwrap_or_else(|p| p.into_inner());
        let within = IN_STEP_WITHIN + poll;
        let in_step = self.seen().is_some()
            && answered.is_some_and(|t: std::time::Instant| t.elapsed() <= within);
        *answered = Some(std::time::Instant::now());
        in_step
    }

    pub(super) fn up(&self) {
        if let Some(g) = &self.up_gauge {
            g.set(1.0);
        }
        if !self.reachable.swap(true, Ordering::Relaxed) {
            log::info!("keys: the shared key store (Redis) answers again");
        }
    }

    pub(super) fn down(&self, e: &SharedKeysError) {
        if let Some(g) = &self.up_gauge {
            g.set(0.0);
        }
        if self.reachable.swap(false, Ordering::Relaxed) {
            log::warn!(
                "keys: the shared key store is unreachable ({e}): the last known keys stay in \
                 service, revocations wait in {}",
                self.pending.display()
            );
        }
    }

    /// Called while publishing (publishing lock held): keys whose maker is gone (an operator key
    /// removed from the keys file) are revoked in Redis too, through the pending file.
    pub(super) fn queue_orphans(&self, file: &ManagedFile, revoked: &[String]) {
        if let Err(e) = pending::queue_revoked(&self.pending, file, revoked, &now()) {
            log::error!("keys: revocations of keys whose maker is gone not queued: {e}");
        }
    }
}

fn now() -> String {
    drg_base::infra::units::now_rfc3339()
}

impl KeysApi {
    /// `POST /v1/keys` on the shared store.
    pub(super) async fn create_shared(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        caller: &KeyEntry,
        new: NewKey,
        secret: &str,
    ) -> Answer {
        let mut row = self.new_row(caller, new, secret);
        let operator = self.operator_count(&caller.project);
        // A clash of 48 random bits is rare; a few draws make a refusal for it unheard of.
        for _ in 0..8 {
            row.id = match new_id() {
                Ok(id) => id,
                Err(e) => return ApiError::Internal(e.to_string()).into(),
            };
            if self.keys.load().by_id(&row.id).is_some() {
                continue;
            }
            match shared.store.create(&row, operator, caller.max_keys).await {
                Ok(Made::Made) => {
                    shared.up();
                    let made = row.clone();
                    let local = self
                        .change_locally(shared, move |file| {
                            file.keys.retain(|k| k.id != made.id);
                            file.keys.push(made);
                            Ok(true)
                        })
                        .await;
                    if let Err(e) = local {
                        // Redis has it: this gateway serves it from its next poll.
                        log::warn!("keys API: a key made is not in the cache yet: {e}");
                    }
                    return self.created(&row, secret);
                }
                Ok(Made::Full) => {
                    shared.up();
                    return Refused::Full {
                        max: caller.max_keys,
                    }
                    .answer();
                }
                Ok(Made::IdTaken) => continue,
                Err(e) => {
                    shared.down(&e);
                    self.undo_create(shared, &row.project, &row.id).await;
                    return Refused::Unavailable.answer();
                }
            }
        }
        ApiError::Internal("no free key id in 8 draws".into()).into()
    }

    /// A make whose reply did not come may run once Redis reads it: its id is queued as a
    /// revocation (the pending file, sent at the next poll that reaches Redis), so the key is
    /// removed if it was made, before it is ever used (nobody was shown its secret).
    pub(super) async fn undo_create(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        project: &str,
        id: &str,
    ) {
        let path = shared.pending.clone();
        let (project, id) = (project.to_owned(), id.to_owned());
        // Under the publishing lock, as every other writer of the pending file.
        let queued = self
            .change_locally(shared, move |_| {
                let mut p = pending::read(&path)?;
                p.add(&project, &id, &now());
                pending::write(&path, &p)?;
                Ok(false)
            })
            .await;
        if let Err(e) = queued {
            log::error!("keys API: a key Redis may still make was not queued for removal: {e}");
        }
    }

    /// `DELETE /v1/keys/{id}` on the shared store.
    pub(super) async fn revoke_shared(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        caller: &KeyEntry,
        id: &str,
    ) -> Answer {
        let project = caller.project.to_string();
        // The key's lineage as this gateway knows it: tombstoned also when Redis has no row of
        // it (flushed a moment ago), so that no restore brings it back.
        let known = self.known_lineage(&project, id).await;
        match shared.store.revoke(&project, id, &known).await {
            Ok(removed) => {
                shared.up();
                let mut gone = known;
                for r in removed {
                    if !gone.contains(&r) {
                        gone.push(r);
                    }
                }
                if gone.is_empty() {
                    return self.not_revocable(caller, id).answer();
                }
                // Also when Redis had it no more (revoked elsewhere, or lost): the cache follows.
                let change = forget(project, id.to_owned(), gone);
                if let Err(e) = self.change_locally(shared, move |f| Ok(change(f))).await {
                    log::warn!("keys API: a revocation is not in the cache yet: {e}");
                }
                self.revoked.inc();
                Answer::raw(StatusCode::NO_CONTENT, Bytes::new()).changed(Changed::new(
                    Action::KeyRevoked,
                    id,
                    "",
                ))
            }
            Err(e) => {
                shared.down(&e);
                self.revoke_while_away(shared, project, id, known).await
            }
        }
    }

    /// A revocation while Redis is away: in force here at once, kept in the pending file until
    /// Redis has it (`202`); an id this gateway does not know (`known` empty) is `503`.
    async fn revoke_while_away(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        project: String,
        id: &str,
        known: Vec<String>,
    ) -> Answer {
        if known.is_empty() {
            return Refused::Unavailable.answer();
        }
        let path = shared.pending.clone();
        let id_owned = id.to_owned();
        let change = forget(project.clone(), id.to_owned(), known);
        // Kept first: the revocation is in the file before the key leaves the cache.
        let queued = self
            .change_locally(shared, move |file| {
                let mut p = pending::read(&path)?;
                p.add(&project, &id_owned, &now());
                pending::write(&path, &p)?;
                Ok(change(file))
            })
            .await;
        match queued {
            Ok(()) => {
                self.revoked.inc();
                pending_answer(id)
            }
            Err(e) => {
                log::error!("keys API: a revocation could not be kept for Redis: {e}");
                Refused::Unavailable.answer()
            }
        }
    }

    /// `id` of `project` and what it made, as this gateway's cache knows them (empty: it does
    /// not know the key, or cannot read its cache).
    async fn known_lineage(self: &Arc<Self>, project: &str, id: &str) -> Vec<String> {
        let (cache, project, id) = (self.file.clone(), project.to_owned(), id.to_owned());
        match tokio::task::spawn_blocking(move || managed::read(&cache)).await {
            Ok(Ok(file)) => tombstones::lineage(&file.keys, &project, &id),
            Ok(Err(e)) => {
                log::warn!("keys API: {e}");
                Vec::new()
            }
            Err(_) => Vec::new(),
        }
    }

    /// `change` to the cache (it says whether it changed anything; its error leaves the cache
    /// as it was), under the publishing lock on a blocking thread; then publishes.
    pub(super) async fn change_locally(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        change: impl FnOnce(&mut ManagedFile) -> Result<bool, LocalError> + Send + 'static,
    ) -> Result<(), LocalError> {
        self.locally(shared, None, change).await.map(|_| ())
    }

    /// `change` to the cache under the publishing lock. `if_at`: a poll's write, made only if
    /// no change reached the cache since the poll began (at that generation); otherwise the
    /// change is this gateway's own and bumps the generation. Whether it was made.
    pub(super) async fn locally(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        if_at: Option<u64>,
        change: impl FnOnce(&mut ManagedFile) -> Result<bool, LocalError> + Send + 'static,
    ) -> Result<bool, LocalError> {
        let (api, shared) = (self.clone(), shared.clone());
        tokio::task::spawn_blocking(move || {
            let _publishing = api.publishing();
            let generation = &shared.generation;
            match if_at {
                Some(at) if generation.load(Ordering::SeqCst) != at => return Ok(false),
                Some(_) => {}
                None => {
                    generation.fetch_add(1, Ordering::SeqCst);
                }
            }
            let written = managed::update(&api.file, |file: &mut ManagedFile| {
                change(file).map(|changed| (changed, ()))
            });
            api.publish();
            written.map(|()| true)
        })
        .await
        .map_err(|e| LocalError::Task(e.to_string()))?
    }

    /// Saves the last use of API-made keys to Redis (those that moved since the last save).
    pub(super) async fn save_last_used_shared(&self, shared: &Shared) {
        let moved: Vec<(Arc<str>, u64)> = {
            let saved = shared.saved.lock().unwrap_or_else(|p| p.into_inner());
            self.keys
                .load()
                .entries()
                .filter(|k| k.source == KeyOrigin::Api)
                .filter_map(|k| Some((k.id.clone(), k.last_used_at()?)))
                .filter(|(id, t)| saved.get(id).is_none_or(|s| s < t))
                .collect()
        };
        let send: Vec<(String, u64)> = moved.iter().map(|(id, t)| (id.to_string(), *t)).collect();
        match shared.store.save_used(&send).await {
            Ok(()) => {
                let mut saved = shared.saved.lock().unwrap_or_else(|p| p.into_inner());
                saved.extend(moved);
            }
            Err(e) => log::debug!("keys API: last uses not saved to Redis: {e}"),
        }
    }
}

/// Why a change of the cache (or the pending file before it) was not made.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(transparent)]
    Cache(#[from] managed::ManagedError),
    #[error(transparent)]
    Pending(#[from] pending::PendingError),
    #[error("blocking task: {0}")]
    Task(String),
}

/// A revocation in the cache: `id`'s tree leaves the rows, and `ids` (what went) are kept as
/// tombstones of `project`. Whether anything changed.
fn forget(
    project: String,
    id: String,
    ids: Vec<String>,
) -> impl FnOnce(&mut ManagedFile) -> bool + Send + 'static {
    move |file| {
        let at = now_unix();
        let ours = file.keys.iter().any(|k| k.id == id && k.project == project);
        let mut changed = ours && managed::without_descendants(file, &[id]) > 0;
        for id in ids {
            let t = Tombstone {
                id,
                project: project.clone(),
                at,
            };
            changed |= tombstones::add(&mut file.revoked, t);
        }
        tombstones::prune(&mut file.revoked, at);
        changed
    }
}

/// The `202` of a revocation kept for Redis: in force on this gateway, on the others once
/// Redis is back.
fn pending_answer(id: &str) -> Answer {
    #[derive(Serialize)]
    struct Body<'a> {
        id: &'a str,
        status: &'a str,
        message: &'a str,
    }
    // In force here at once: recorded as the revocation it is.
    Answer::json(
        StatusCode::ACCEPTED,
        &Body {
            id,
            status: "pending",
            message: "Revoked on this gateway; the shared key store is unreachable, so the other \
                      gateways stop accepting the key once it is back.",
        },
    )
    .changed(Changed::new(Action::KeyRevoked, id, ""))
}
