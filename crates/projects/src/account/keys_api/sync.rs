//! The poll of the shared key store ([`super::shared`]): every `keys_api.shared_poll_ms`, the
//! revocations kept during an outage are sent, then the rows are read again if their version or
//! epoch moved. A poll costs one `MGET` while nothing changes; pub/sub would tell sooner, but
//! needs a connection of its own per deployment kind (single, Cluster, Sentinel) and a poll
//! behind it anyway for the messages lost while Redis was away.
//!
//! A store that lost data gets this gateway's last known keys back, less every tombstone, before
//! anything is read, so no key in service dies with it and no revoked key comes back. Data is
//! lost when the data set this gateway read is gone (its epoch gone or changed: `FLUSHALL`,
//! eviction, another Redis), went back within its epoch (a lower version: a failover to a
//! replica that lagged, an older backup), or holds a key this gateway knows as revoked without
//! its tombstone. Only a cache kept in step with the store puts its keys back: one read in this
//! run, Redis answering within `IN_STEP_WITHIN` of the loss. A cache from before this run (or a
//! gateway cut off meanwhile) may lack revocations made while it was away: it puts back its
//! tombstones only and withholds its keys (`keys.withheld.json`) for the operator's
//! `restore-withheld`, run once every gateway has started again. The last two name the data set anew, so that every other gateway sees the loss
//! and publishes its tombstones too. A revoked key found in Redis with its tombstone (put back by
//! a gateway of an earlier release) is revoked again. The read itself leaves every revoked key
//! out of the cache: no gateway serves one, whatever Redis holds.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::shared::Shared;
use super::KeysApi;
use drg_access::managed::{self, ManagedFile, Tombstone};
use drg_access::shared_keys::pending::{self, Pending};
use drg_access::shared_keys::tombstones::{self, now_unix};
use drg_access::shared_keys::{SharedKeysError, Snapshot, Stamp};

/// Polls the shared key store (the gateway's keys API with the Redis quota store, and that store).
pub struct KeysSync(pub Arc<KeysApi>, pub Arc<Shared>);

#[async_trait::async_trait]
impl drg_base::service::Service for KeysSync {
    async fn run(&self, mut shutdown: drg_base::service::Shutdown) {
        // At once at the start: the cache may be older than Redis.
        self.0.sync_shared(&self.1).await;
        let mut ticks = drg_base::periodic::Ticks::new(self.0.config.shared_poll);
        while ticks.next(&mut shutdown).await.is_some() {
            self.0.sync_shared(&self.1).await;
        }
    }
}

/// How an unchanged poll records, about this often, that the cache still matches Redis.
const CONFIRM_EVERY_SECS: u64 = 86_400;

/// The file a cache not in step with a lost store keeps its keys in (beside `cache`).
pub fn withheld_path(cache: &std::path::Path) -> std::path::PathBuf {
    cache.with_file_name("keys.withheld.json")
}

/// How the data set this gateway read was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loss {
    /// Its epoch is gone or another: flushed, evicted, another Redis.
    Gone,
    /// Same epoch, lower version: the store went back to an older state.
    WentBack,
    /// Keys this gateway knows as revoked are in it without their tombstones.
    ForgotRevocations,
}

/// Whether (and how) the data set `old` this gateway read is lost, the store now at `now`.
fn loss(old: &Stamp, now: Option<&Stamp>) -> Option<Loss> {
    match now {
        None => Some(Loss::Gone),
        Some(s) if s.epoch != old.epoch => Some(Loss::Gone),
        Some(s) if s.version < old.version => Some(Loss::WentBack),
        Some(_) => None,
    }
}

/// The stamp the cache's keys were read at, if it says (a cache from before the epoch was kept
/// says nothing; one from before the version was, version 0).
fn cached_stamp(cache: &ManagedFile) -> Option<Stamp> {
    cache.redis_epoch.clone().map(|epoch| Stamp {
        epoch,
        version: cache.redis_version.unwrap_or(0),
    })
}

impl KeysApi {
    /// One poll: revocations kept during an outage sent to Redis, then the rows read again if
    /// they changed (after putting back what a store that lost data lacks), written to the cache
    /// and published. Quiet while Redis is away (the last known keys stay).
    pub async fn sync_shared(self: &Arc<Self>, shared: &Arc<Shared>) {
        let at = shared.generation.load(Ordering::SeqCst);
        let seen = shared.seen();
        if let Err(e) = self.flush_pending(shared).await {
            return shared.down(&e);
        }
        let stamp = match shared.store.stamp().await {
            Ok(s) => s,
            Err(e) => return shared.down(&e),
        };
        shared.up();
        let in_step = shared.answered_now(self.config.shared_poll);
        if stamp.is_some() && stamp == seen {
            return self.confirm(shared, at).await;
        }
        // Without the cache, nothing could be put back or kept out: it stays as it is (an
        // unreadable one is set aside by the keys reloader if corrupt).
        let cache = match self.read_cache().await {
            Ok(c) => c,
            Err(e) => return log::error!("keys: the shared keys not read: {e}"),
        };
        // Just after a start, what this gateway read is what its cache says.
        let known = seen.or_else(|| cached_stamp(&cache));
        if let Some(old) = known.as_ref() {
            if let Some(lost) = loss(old, stamp.as_ref()) {
                let restored =
                    self.restore_lost(shared, &cache, (old, stamp.as_ref()), lost, in_step);
                if let Err(e) = restored.await {
                    return shared.down(&e);
                }
            }
        }
        let ids: Vec<&str> = cache.keys.iter().map(|k| k.id.as_str()).collect();
        let snapshot = match shared.store.read(&ids).await {
            Ok(s) => s,
            Err(e) => return shared.down(&e),
        };
        for id in &snapshot.unreadable {
            log::warn!("keys: shared key '{id}' is not a key's row; left out");
        }
        self.take_read(shared, (at, in_step), &cache, snapshot)
            .await;
    }

    /// Writes what a poll read to the cache (if no change reached it since the poll began, at
    /// generation `at`): the rows less every revoked one (its tombstone in Redis or in the
    /// cache) and less the pending revocations, the tombstones learned. A revoked key found in
    /// Redis is revoked there again first (a loss, put back as the poll's `in_step` allows).
    async fn take_read(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        (at, in_step): (u64, bool),
        cache: &ManagedFile,
        snapshot: Snapshot,
    ) {
        let t = now_unix();
        let Snapshot {
            stamp,
            rows,
            revoked: in_redis,
            ..
        } = snapshot;
        let mut revoked = cache.revoked.clone();
        for x in &in_redis {
            tombstones::add(&mut revoked, x.clone());
        }
        tombstones::prune(&mut revoked, t);
        let mut next = ManagedFile {
            keys: rows,
            ..ManagedFile::default()
        };
        let dead = tombstones::strip(&mut next, &revoked);
        if !dead.is_empty() {
            let forgotten = dead.iter().any(|id| !in_redis.iter().any(|x| x.id == *id));
            let again = self.revoke_again(shared, cache, &revoked, (forgotten, in_step), &stamp);
            match again.await {
                // What was read is from before the loss: the next poll reads the data set anew.
                Ok(true) => return,
                Ok(false) => {}
                Err(e) => return shared.down(&e),
            }
        }
        let path = shared.pending.clone();
        let read = stamp.clone();
        let written = self
            .locally(shared, Some(at), move |file| {
                // Without the list of revocations Redis lacks, the rows read could bring one
                // back: an unreadable list leaves the cache as it is.
                pending::read(&path)?.strip(&mut next);
                for x in &file.revoked {
                    tombstones::add(&mut revoked, x.clone());
                }
                tombstones::prune(&mut revoked, t);
                let (epoch, version) = (Some(read.epoch), Some(read.version));
                let stale = file
                    .redis_read_at
                    .is_none_or(|r| r.saturating_add(CONFIRM_EVERY_SECS) <= t);
                let changed = file.keys != next.keys
                    || file.redis_epoch != epoch
                    || file.redis_version != version
                    || file.revoked != revoked
                    || stale;
                file.keys = next.keys;
                file.redis_epoch = epoch;
                file.redis_version = version;
                file.revoked = revoked;
                file.redis_read_at = Some(t);
                Ok(changed)
            })
            .await;
        match written {
            Ok(true) => {
                // The cache's time is now, or within a day of it.
                shared.confirmed.store(t, Ordering::Relaxed);
                shared.set_seen(stamp);
            }
            // A change made here meanwhile: the next poll reads again.
            Ok(false) => {}
            Err(e) => log::error!("keys: the shared keys not written to the cache: {e}"),
        }
    }

    /// Revoked keys found in Redis: with their tombstones there (put back by a gateway of an
    /// earlier release), they are revoked again; without (`forgotten`: Redis lost the
    /// revocations, and so maybe more), that is a loss. Whether it was one.
    async fn revoke_again(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        cache: &ManagedFile,
        revoked: &[Tombstone],
        (forgotten, in_step): (bool, bool),
        stamp: &Stamp,
    ) -> Result<bool, SharedKeysError> {
        if forgotten {
            let lost = Loss::ForgotRevocations;
            self.restore_lost(shared, cache, (stamp, Some(stamp)), lost, in_step)
                .await?;
            return Ok(true);
        }
        let done = shared.store.restore(&[], revoked, false).await?;
        log::warn!(
            "keys: {} revoked keys came back in Redis (put back by a gateway that had not seen \
             their revocation): revoked again",
            done.removed
        );
        Ok(false)
    }

    /// An unchanged poll: about once a day the cache records that its keys still match
    /// Redis's (see [`tombstones::fresh_enough`]).
    async fn confirm(self: &Arc<Self>, shared: &Arc<Shared>, at: u64) {
        let t = now_unix();
        let last = shared.confirmed.load(Ordering::Relaxed);
        if last.saturating_add(CONFIRM_EVERY_SECS) > t {
            return;
        }
        let done = self
            .locally(shared, Some(at), move |file| {
                file.redis_read_at = Some(t);
                Ok(true)
            })
            .await;
        match done {
            Ok(true) => shared.confirmed.store(t, Ordering::Relaxed),
            Ok(false) => {}
            Err(e) => log::warn!("keys: the cache's time of the last read not written: {e}"),
        }
    }

    /// The cache as it is now.
    async fn read_cache(self: &Arc<Self>) -> Result<ManagedFile, String> {
        let cache = self.file.clone();
        match tokio::task::spawn_blocking(move || managed::read(&cache)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Puts this gateway's last known keys (its cache, less the pending revocations and every
    /// tombstone) back into a store that lost data set `old` (now `now`, or none), with its
    /// tombstones, and says so. A cache not `in_step` (read before this run, or longer ago than
    /// the store has been away) may lack revocations made meanwhile: it puts back its
    /// tombstones only and keeps its keys in the withheld file for the operator (see the
    /// module); one not in step within a tombstone's lifetime puts back its tombstones only.
    async fn restore_lost(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        cache: &ManagedFile,
        (old, now): (&Stamp, Option<&Stamp>),
        lost: Loss,
        in_step: bool,
    ) -> Result<(), SharedKeysError> {
        let t = now_unix();
        let path = shared.pending.clone();
        let pending = match tokio::task::spawn_blocking(move || pending::read(&path)).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                log::error!("keys: the shared key store lost data and {e}: nothing restored");
                return Ok(());
            }
            Err(_) => return Ok(()),
        };
        let mut known = ManagedFile {
            keys: cache.keys.clone(),
            ..ManagedFile::default()
        };
        pending.strip(&mut known);
        tombstones::strip(&mut known, &cache.revoked);
        if !tombstones::fresh_enough(cache.redis_read_at, t) {
            log::warn!(
                "keys: this gateway's cache was last in step with Redis longer ago than a \
                 revocation is kept: its keys are not put back"
            );
            known.keys.clear();
        }
        let mut revoked = cache.revoked.clone();
        tombstones::prune(&mut revoked, t);
        if !in_step && !known.keys.is_empty() {
            self.withhold(std::mem::take(&mut known.keys), &revoked)
                .await;
        }
        let done = shared
            .store
            .restore(&known.keys, &revoked, lost != Loss::Gone)
            .await?;
        if let Some(c) = &shared.restores {
            c.inc();
        }
        // Named anew by this gateway: no loss to find again at its next poll.
        if let Some(epoch) = &done.epoch {
            shared.set_seen(Stamp {
                epoch: epoch.clone(),
                version: 0,
            });
        }
        log::warn!(
            "keys: the shared key store lost its data set ({}); {} of the {} API-made keys this \
             gateway knew put back, {} revoked keys found in it removed again, {} revocations \
             this gateway knows kept",
            why(lost, old, now),
            done.restored,
            known.keys.len(),
            done.removed,
            revoked.len()
        );
        Ok(())
    }

    /// Keeps `keys` (a cache not in step with a store found lost) in `keys.withheld.json`
    /// beside the cache, with the tombstones known, for the operator's `restore-withheld`.
    async fn withhold(self: &Arc<Self>, keys: Vec<managed::ManagedKey>, revoked: &[Tombstone]) {
        let path = withheld_path(&self.file);
        let (n, revoked, at) = (keys.len(), revoked.to_vec(), path.clone());
        let kept = tokio::task::spawn_blocking(move || {
            managed::update(&at, |file| -> Result<_, managed::ManagedError> {
                for k in keys {
                    if !file.keys.iter().any(|h| h.id == k.id) {
                        file.keys.push(k);
                    }
                }
                for x in revoked {
                    tombstones::add(&mut file.revoked, x);
                }
                Ok((true, ()))
            })
        })
        .await;
        match kept {
            Ok(Ok(())) => log::warn!(
                "keys: the shared key store lost its data while this gateway's cache was not in \
                 step with it (stopped or cut off): its {n} API-made keys are withheld in {} \
                 (its revocations put back); `restore-withheld` puts them back once every \
                 gateway has started again",
                path.display()
            ),
            Ok(Err(e)) => log::error!("keys: {n} withheld keys not kept: {e}"),
            Err(e) => log::error!("keys: {n} withheld keys not kept: {e}"),
        }
    }

    /// Sends the pending revocations to Redis, each dropped from the file once Redis has it
    /// (tombstoned there also if Redis has no row of it).
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
            let gone = shared
                .store
                .revoke(&r.project, &r.id, std::slice::from_ref(&r.id))
                .await?;
            log::info!(
                "keys: a revocation kept during the outage reached Redis ({} keys of project \
                 '{}')",
                gone.len(),
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
}

/// What the log says of a loss.
fn why(lost: Loss, old: &Stamp, now: Option<&Stamp>) -> String {
    let now_epoch = now.map_or("none", |s| s.epoch.as_str());
    match lost {
        Loss::Gone => format!(
            "epoch {} -> {now_epoch}: flushed, evicted or another Redis",
            old.epoch
        ),
        Loss::WentBack => format!(
            "its version went back in epoch {}: a failover to a replica that lagged, or an \
             older backup; named anew",
            old.epoch
        ),
        Loss::ForgotRevocations => format!(
            "keys this gateway knows as revoked are in epoch {now_epoch} without their \
             revocation; named anew"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_set_is_lost_when_its_epoch_changes_or_its_version_goes_back() {
        let at = |epoch: &str, version| Stamp {
            epoch: epoch.into(),
            version,
        };
        let old = at("e", 10);
        assert_eq!(loss(&old, None), Some(Loss::Gone));
        assert_eq!(loss(&old, Some(&at("f", 99))), Some(Loss::Gone));
        assert_eq!(loss(&old, Some(&at("e", 9))), Some(Loss::WentBack));
        assert_eq!(loss(&old, Some(&at("e", 10))), None);
        assert_eq!(loss(&old, Some(&at("e", 11))), None);
        let cache = ManagedFile {
            redis_epoch: Some("e".into()),
            ..ManagedFile::default()
        };
        assert_eq!(cached_stamp(&cache), Some(at("e", 0)));
        assert_eq!(cached_stamp(&ManagedFile::default()), None);
    }
}
