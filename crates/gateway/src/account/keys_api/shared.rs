//! `/v1/keys` on the shared Redis store ([`crate::access::shared_keys`]), with the Redis quota
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
//! - Revoking is one script that removes the key and every key it made, recursively. With
//!   Redis away, a key this gateway knows is revoked here at once and kept in the pending file
//!   (`keys.redis-pending.json`, see [`crate::access::shared_keys::pending`]) until Redis has it:
//!   `202` says so. An id this gateway does not know is `503`: it cannot tell whose it is.
//! - Every change made here is written to the cache and published at once; other gateways see
//!   it within a poll ([`super::sync`]).
//! - A store that lost the data set this gateway read (its epoch gone or changed: `FLUSHALL`,
//!   eviction, another Redis) gets this gateway's last known keys back (less the revocations
//!   Redis lacks) before anything is read, so no key in service dies with it.
//!
//! No lock is held across a Redis call: one project's slow key call never queues another's.
//! A change made here (a key made or revoked) bumps `generation` as it reaches the cache, under
//! the publishing lock; a poll writes what it read only if no change reached the cache since it
//! began (else the next poll reads again). So a read of Redis from before a revocation is never
//! written after it (a revoked key never comes back, not even for a poll). Files are written
//! under the publishing lock, on blocking threads.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;
use serde::Serialize;

use super::{new_id, KeysApi, NewKey, Refused};
use crate::access::keys::{KeyEntry, KeyOrigin};
use crate::access::managed::{self, ManagedFile};
use crate::access::shared_keys::pending::{self, Pending};
use crate::access::shared_keys::{Made, SharedKeys, SharedKeysError, Stamp};
use crate::answer::{Answer, ApiError};

/// The keys API's part on the shared store.
pub struct Shared {
    store: SharedKeys,
    /// This gateway's revocations Redis does not have yet.
    pending: PathBuf,
    /// The stamp of the rows in the cache (`None` until the first read since the start).
    seen: std::sync::Mutex<Option<Stamp>>,
    /// Bumped by every change made here as it reaches the cache (see the module).
    generation: std::sync::atomic::AtomicU64,
    /// Whether the last call reached Redis (the log says each change once).
    reachable: AtomicBool,
    /// `drg_keys_shared_store_up`, following `reachable`.
    up_gauge: Option<prometheus::Gauge>,
    /// `drg_keys_shared_store_restores_total`: data sets found lost and keys put back.
    restores: Option<prometheus::IntCounter>,
    /// Last uses sent to Redis, so that unchanged ones are not sent again.
    saved: std::sync::Mutex<HashMap<Arc<str>, u64>>,
    /// Keys this gateway revoked in Redis lately, (project, id) -> when: one that comes back
    /// (put back by a gateway that had not seen the revocation when Redis lost its data) is
    /// revoked again at the next poll.
    revoked_lately: std::sync::Mutex<HashMap<(String, String), std::time::Instant>>,
}

/// How long a revocation is remembered against a key coming back.
const REVOKED_MEMORY: std::time::Duration = std::time::Duration::from_secs(3_600);

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
            revoked_lately: std::sync::Mutex::default(),
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

    fn up(&self) {
        if let Some(g) = &self.up_gauge {
            g.set(1.0);
        }
        if !self.reachable.swap(true, Ordering::Relaxed) {
            log::info!("keys: the shared key store (Redis) answers again");
        }
    }

    fn down(&self, e: &SharedKeysError) {
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

    /// Remembers that Redis has the revocation of `id` of `project`.
    fn remember_revoked(&self, project: &str, id: &str) {
        let mut lately = self
            .revoked_lately
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        lately.retain(|_, at| at.elapsed() < REVOKED_MEMORY);
        lately.insert(
            (project.to_owned(), id.to_owned()),
            std::time::Instant::now(),
        );
    }

    /// The rows of `rows` this gateway revoked lately, as (project, id).
    fn came_back(&self, rows: &[crate::access::managed::ManagedKey]) -> Vec<(String, String)> {
        let lately = self
            .revoked_lately
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        rows.iter()
            .map(|r| (r.project.clone(), r.id.clone()))
            .filter(|pair| lately.contains_key(pair))
            .collect()
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
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
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
        let mut row = Self::new_row(caller, new, secret);
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
    async fn undo_create(self: &Arc<Self>, shared: &Arc<Shared>, project: &str, id: &str) {
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
        let revoked = shared.store.revoke(&project, id).await;
        let strip = {
            let (project, id) = (project.clone(), id.to_owned());
            move |file: &mut ManagedFile| {
                let ours = file.keys.iter().any(|k| k.id == id && k.project == project);
                ours && managed::without_descendants(file, &[id]) > 0
            }
        };
        match revoked {
            Ok(n) => {
                shared.up();
                if n > 0 {
                    shared.remember_revoked(&project, id);
                }
                // Also when Redis had it no more (revoked elsewhere): the cache follows.
                if let Err(e) = self.change_locally(shared, move |f| Ok(strip(f))).await {
                    log::warn!("keys API: a revocation is not in the cache yet: {e}");
                }
                if n == 0 {
                    return self.not_revocable(caller, id).answer();
                }
                self.revoked.inc();
                Answer::raw(StatusCode::NO_CONTENT, Bytes::new())
            }
            Err(e) => {
                shared.down(&e);
                let known = self
                    .keys
                    .load()
                    .by_id(id)
                    .is_some_and(|k| k.project == caller.project && k.source == KeyOrigin::Api);
                if !known {
                    return Refused::Unavailable.answer();
                }
                let path = shared.pending.clone();
                let id_owned = id.to_owned();
                // Kept first: the revocation is in the file before the key leaves the cache.
                let queued = self
                    .change_locally(shared, move |file| {
                        let mut p = pending::read(&path)?;
                        p.add(&project, &id_owned, &now());
                        pending::write(&path, &p)?;
                        Ok(strip(file))
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
        }
    }

    /// `change` to the cache (it says whether it changed anything; its error leaves the cache
    /// as it was), under the publishing lock on a blocking thread; then publishes.
    async fn change_locally(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        change: impl FnOnce(&mut ManagedFile) -> Result<bool, LocalError> + Send + 'static,
    ) -> Result<(), LocalError> {
        self.locally(shared, None, change).await.map(|_| ())
    }

    /// `change` to the cache under the publishing lock. `if_at`: a poll's write, made only if
    /// no change reached the cache since the poll began (at that generation); otherwise the
    /// change is this gateway's own and bumps the generation. Whether it was made.
    async fn locally(
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

    /// One poll: revocations kept during an outage sent to Redis, then the rows read again if
    /// they changed, written to the cache and published. Quiet while Redis is away (the last
    /// known keys stay).
    pub async fn sync_shared(self: &Arc<Self>, shared: &Arc<Shared>) {
        let at = shared.generation.load(Ordering::SeqCst);
        let seen = shared
            .seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Err(e) = self.flush_pending(shared).await {
            return shared.down(&e);
        }
        let stamp = match shared.store.stamp().await {
            Ok(s) => s,
            Err(e) => return shared.down(&e),
        };
        shared.up();
        if stamp.is_some() && stamp == seen {
            return;
        }
        // The data set this gateway read is gone (FLUSHALL, eviction, another Redis): what it
        // knew goes back before anything is read, so the keys in service do not die with it.
        // Just after a start, what it read is the cache's (written with its epoch).
        let known = match seen.as_ref() {
            Some(s) => Some(s.clone()),
            None => self
                .cached_epoch()
                .await
                .map(|epoch| Stamp { epoch, version: 0 }),
        };
        if let Some(old) = known.as_ref() {
            if stamp.as_ref().is_none_or(|s| s.epoch != old.epoch) {
                if let Err(e) = self.restore_lost(shared, old, stamp.as_ref()).await {
                    return shared.down(&e);
                }
            }
        }
        let snapshot = match shared.store.read().await {
            Ok(s) => s,
            Err(e) => return shared.down(&e),
        };
        for id in &snapshot.unreadable {
            log::warn!("keys: shared key '{id}' is not a key's row; left out");
        }
        let (rows, stamp) = (snapshot.rows, snapshot.stamp);
        let back = match self.revoke_came_back(shared, &rows).await {
            Ok(back) => back,
            Err(e) => return shared.down(&e),
        };
        let path = shared.pending.clone();
        let stamp_epoch = stamp.epoch.clone();
        let written = self
            .locally(shared, Some(at), move |file| {
                let mut next = ManagedFile {
                    keys: rows,
                    ..ManagedFile::default()
                };
                // Without the list of revocations Redis lacks, the rows read could bring one
                // back: an unreadable list leaves the cache as it is.
                pending::read(&path)?.strip(&mut next);
                managed::without_descendants(&mut next, &back);
                let epoch = Some(stamp_epoch);
                let changed = file.keys != next.keys || file.redis_epoch != epoch;
                file.keys = next.keys;
                file.redis_epoch = epoch;
                Ok(changed)
            })
            .await;
        match written {
            Ok(true) => *shared.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some(stamp),
            // A change made here meanwhile: the next poll reads again.
            Ok(false) => {}
            Err(e) => log::error!("keys: the shared keys not written to the cache: {e}"),
        }
    }

    /// Revokes again the keys of `rows` this gateway revoked lately (put back by a gateway that
    /// had not seen the revocation when Redis lost its data); their ids.
    async fn revoke_came_back(
        &self,
        shared: &Shared,
        rows: &[crate::access::managed::ManagedKey],
    ) -> Result<Vec<String>, SharedKeysError> {
        let back = shared.came_back(rows);
        for (project, id) in &back {
            log::warn!(
                "keys: a key this gateway revoked came back in Redis (put back by a gateway that \
                 had not seen the revocation when Redis lost its data): revoked again"
            );
            shared.store.revoke(project, id).await?;
        }
        Ok(back.into_iter().map(|(_, id)| id).collect())
    }

    /// The epoch the cache's keys were read from, if it says (a cache from before the epoch
    /// was kept says nothing).
    async fn cached_epoch(self: &Arc<Self>) -> Option<String> {
        let cache = self.file.clone();
        tokio::task::spawn_blocking(move || managed::read(&cache).ok()?.redis_epoch)
            .await
            .ok()
            .flatten()
    }

    /// Puts this gateway's last known keys (its cache, less the revocations Redis lacks) back
    /// into a store that lost the data set `old` (now `now`, or none), and says so.
    async fn restore_lost(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        old: &Stamp,
        now: Option<&Stamp>,
    ) -> Result<(), SharedKeysError> {
        let (cache, pending_path) = (self.file.clone(), shared.pending.clone());
        let known = tokio::task::spawn_blocking(move || {
            let mut file = managed::read(&cache).map_err(|e| e.to_string())?;
            pending::read(&pending_path)
                .map_err(|e| e.to_string())?
                .strip(&mut file);
            Ok::<_, String>(file.keys)
        })
        .await;
        let rows = match known {
            Ok(Ok(rows)) => rows,
            Ok(Err(e)) => {
                log::error!("keys: the shared key store lost its keys and this gateway's cache is unreadable ({e}): nothing restored");
                return Ok(());
            }
            Err(_) => return Ok(()),
        };
        let back = shared.store.restore(&rows).await?;
        if let Some(c) = &shared.restores {
            c.inc();
        }
        log::warn!(
            "keys: the shared key store lost its data set (epoch {} -> {}: flushed, evicted or \
             another Redis); {back} of the {} API-made keys this gateway knew put back",
            old.epoch,
            now.map_or("none", |s| s.epoch.as_str()),
            rows.len()
        );
        Ok(())
    }

    /// Sends the pending revocations to Redis, each dropped from the file once Redis has it.
    async fn flush_pending(self: &Arc<Self>, shared: &Arc<Shared>) -> Result<(), SharedKeysError> {
        let path = shared.pending.clone();
        let read = tokio::task::spawn_blocking(move || pending::read(&path)).await;
        let list = match read {
            Ok(Ok(p)) => p.revocations,
            Ok(Err(e)) => {
                log::error!("keys: {e}; its revocations wait until it is readable");
                return Ok(());
            }
            Err(_) => return Ok(()),
        };
        for r in list {
            let n = shared.store.revoke(&r.project, &r.id).await?;
            shared.remember_revoked(&r.project, &r.id);
            log::info!(
                "keys: a revocation kept during the outage reached Redis ({n} keys of project \
                 '{}')",
                r.project
            );
            let path = shared.pending.clone();
            let api = self.clone();
            let _ = tokio::task::spawn_blocking(move || {
                let _publishing = api.publishing();
                let done = pending::read(&path).and_then(|mut p: Pending| {
                    p.remove(&r.project, &r.id);
                    pending::write(&path, &p)
                });
                if let Err(e) = done {
                    log::error!("keys: {e}");
                }
            })
            .await;
        }
        Ok(())
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

/// The `202` of a revocation kept for Redis: in force on this gateway, on the others once
/// Redis is back.
fn pending_answer(id: &str) -> Answer {
    #[derive(Serialize)]
    struct Body<'a> {
        id: &'a str,
        status: &'a str,
        message: &'a str,
    }
    Answer::json(
        StatusCode::ACCEPTED,
        &Body {
            id,
            status: "pending",
            message: "Revoked on this gateway; the shared key store is unreachable, so the other \
                      gateways stop accepting the key once it is back.",
        },
    )
}
