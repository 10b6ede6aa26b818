//! What a gateway holds of one kind of record, and the poll that keeps it: every `POLL` the
//! store's version is asked (a file's metadata, one `MGET` on Redis) and, when it moved, every
//! record is read and published. With Redis, what this gateway holds that the store lacks or
//! holds older (a `FLUSHALL`, an eviction, a failover to a replica that lagged) is put back
//! first, and the state folder keeps a copy, served from the start while Redis is away.

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use super::file::FileRecords;
use super::redis::RedisRecords;
use super::{Merged, Put, Record, RecordStore, RecordsError, Token};
use crate::infra::redis::config::RedisConfig;

/// How often the store is asked: a change made on one gateway is held by the others within
/// this (and the time one read takes).
pub const POLL: Duration = Duration::from_millis(400);

/// A failing store is logged at WARN at most this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// What the poll remembers between rounds.
#[derive(Default)]
struct SyncState {
    last: Option<Token>,
    warned: Option<Instant>,
}

/// Called with every new set of records (at a write of this gateway, and when a poll read one).
pub type Publish<R> = Box<dyn Fn(&Merged<R>) + Send + Sync>;

/// One kind of record as this gateway holds it.
pub struct Replica<R: Record> {
    kind: &'static str,
    store: Box<dyn RecordStore<R>>,
    /// With Redis: the state folder's copy.
    cache: Option<FileRecords<R>>,
    held: ArcSwap<Merged<R>>,
    /// Held while the held set is replaced: a write's merge and a poll's swap never lose each
    /// other's record (see [`Replica::update`]). Never held across an `.await`.
    updating: std::sync::Mutex<()>,
    publish: Publish<R>,
    last_stamp: AtomicU64,
    sync: tokio::sync::Mutex<SyncState>,
}

impl<R: Record> Replica<R> {
    /// Records of `kind` in `folder` (`<kind>.json`), or on `redis` with a copy there
    /// (`<kind>.redis-cache.json`); `publish` is told each new set.
    pub fn open(
        kind: &'static str,
        folder: &Path,
        redis: Option<&RedisConfig>,
        publish: Publish<R>,
    ) -> Replica<R> {
        let (store, cache): (Box<dyn RecordStore<R>>, _) = match redis {
            None => (
                Box::new(FileRecords::new(folder.join(format!("{kind}.json")))),
                None,
            ),
            Some(config) => (
                Box::new(RedisRecords::new(config, kind)),
                Some(FileRecords::new(
                    folder.join(format!("{kind}.redis-cache.json")),
                )),
            ),
        };
        Replica {
            kind,
            store,
            cache,
            held: ArcSwap::from_pointee(Merged::default()),
            updating: std::sync::Mutex::new(()),
            publish,
            last_stamp: AtomicU64::new(0),
            sync: tokio::sync::Mutex::new(SyncState::default()),
        }
    }

    /// What this gateway holds now.
    pub fn held(&self) -> Arc<Merged<R>> {
        self.held.load_full()
    }

    /// A stamp for a write replacing one stamped `held`.
    pub fn stamp(&self, held: u64) -> u64 {
        super::next_stamp(&self.last_stamp, held)
    }

    /// Writes `record` to the store (a new one in force only within `max_live` for its
    /// project), held and published here at once when it was.
    pub async fn put(&self, record: R, max_live: u32) -> Result<Put, RecordsError> {
        let put = self.store.put(&record, max_live).await?;
        if let Put::Done { .. } = put {
            self.update(|m| {
                m.merge(record);
            });
        }
        Ok(put)
    }

    /// Changes the held set and publishes it, one change at a time: a write answered `2xx` is
    /// held (a lookup, a list or a `DELETE` right after it sees it) whatever a poll that read
    /// the store before it does next.
    fn update(&self, change: impl FnOnce(&mut Merged<R>)) {
        let _one = self.updating.lock().unwrap_or_else(|e| e.into_inner());
        let mut m = Merged::clone(&self.held.load());
        change(&mut m);
        (self.publish)(&m);
        self.held.store(Arc::new(m));
    }

    /// Takes what a read of the store found, keeping what is held and newer (a write of this
    /// gateway that landed after the read began): records merge last-writer-wins, so a read
    /// from before a write never undoes it here.
    fn take(&self, read: Merged<R>) {
        self.update(|m| {
            let mut read = read;
            for r in m.all() {
                read.merge(r.clone());
            }
            *m = read;
        });
    }

    /// Loads what the state folder's copy holds (with Redis), then what the store holds.
    pub async fn start(&self) {
        if let Some(cache) = &self.cache {
            match cache.read_now() {
                Ok(records) => self.take(Merged::of(records)),
                Err(e) => log::warn!("{}: the local copy could not be read: {e}", self.kind),
            }
        }
        self.sync().await;
    }

    /// One round of the poll.
    pub async fn sync(&self) {
        let mut st = self.sync.lock().await;
        let token = match self.store.token().await {
            Ok(t) => t,
            Err(e) => return self.failed(&mut st, &e),
        };
        if st.last.as_ref() == Some(&token) && token != Token::Lost {
            return;
        }
        let mut read = match self.store.read().await {
            Ok(r) => Merged::of(r),
            Err(e) => return self.failed(&mut st, &e),
        };
        if let Some(cache) = &self.cache {
            let held = self.held.load();
            let missing: Vec<R> = held
                .all()
                .filter(|r| (read.get(r.project(), r.key())).is_none_or(|s| r.newer_than(s)))
                .cloned()
                .collect();
            if !missing.is_empty() {
                log::info!(
                    "{}: the shared store lacked {} records this gateway held; put back",
                    self.kind,
                    missing.len()
                );
                if let Err(e) = self.store.restore(&missing).await {
                    return self.failed(&mut st, &e);
                }
                for r in missing {
                    read.merge(r);
                }
            }
            if let Err(e) = cache.replace_now(&read.sorted()) {
                log::warn!("{}: the local copy could not be written: {e}", self.kind);
            }
        }
        self.take(read);
        // Lost: the restore gave the store an epoch; the next round reads it again.
        st.last = Some(token);
    }

    fn failed(&self, st: &mut SyncState, e: &RecordsError) {
        if st.warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            st.warned = Some(Instant::now());
            log::warn!(
                "{}: the store did not answer ({e}); serving what is held",
                self.kind
            );
        } else {
            log::debug!("{}: {e}", self.kind);
        }
    }
}

/// The poll of a replica, a background service.
pub struct ReplicaSync<R: Record>(pub Arc<Replica<R>>);

#[async_trait::async_trait]
impl<R: Record> crate::service::Service for ReplicaSync<R> {
    async fn run(&self, mut shutdown: crate::service::Shutdown) {
        self.0.start().await;
        let mut ticks = crate::periodic::Ticks::new(POLL);
        while ticks.next(&mut shutdown).await.is_some() {
            self.0.sync().await;
        }
    }
}
