//! What a gateway holds of one kind of record, and the poll that keeps it: every `POLL` the
//! store's version is asked (a file's metadata, one `MGET` on Redis) and, when it moved, every
//! record is read and published, with this gateway's writes made since the read began merged
//! in. With Redis, when the store lost data (a `FLUSHALL`, a failover to a replica that lagged:
//! its data set gone, renamed or older), what this gateway holds that the store lacks or holds
//! older is put back first; otherwise what the store no longer holds was removed or compacted
//! on purpose and is gone here too. The state folder keeps a copy, served from the start while
//! Redis is away.
//!
//! Only a copy kept in step with the store is put back on its own: one this gateway read in
//! this run, its last read within [`IN_STEP_WITHIN`] of the loss. A copy from the state folder
//! (a gateway that was stopped, or cut off, while others changed the store) may lack removals
//! made meanwhile: it puts back its removal markers only, and keeps the rest aside in
//! `<kind>.withheld.json` for the operator's `restore-withheld` (docs/operations.md).

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use super::file::FileRecords;
use super::{Home, Merged, Put, Record, RecordStore, RecordsError, Token};

/// How often the store is asked: a change made on one gateway is held by the others within
/// this (and the time one read takes).
pub const POLL: Duration = Duration::from_millis(400);

/// A copy last read from the store longer ago than this before the store was found lost may
/// lack removals other gateways made meanwhile: it is withheld, as one from the state folder.
/// Long enough for a Redis restarted or failed over while the gateways ran.
pub const IN_STEP_WITHIN: Duration = Duration::from_secs(60);

/// The file a withheld copy of `kind` is kept in, in the state folder.
pub fn withheld_path(folder: &Path, kind: &str) -> std::path::PathBuf {
    folder.join(format!("{kind}.withheld.json"))
}

/// A failing store is logged at WARN at most this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// What the poll remembers between rounds.
#[derive(Default)]
struct SyncState {
    last: Option<Token>,
    warned: Option<Instant>,
    /// When the store last answered a poll in this run.
    answered: Option<Instant>,
}

impl SyncState {
    /// Whether what is held was in step with the store until now (read in this run, the
    /// store answering within [`IN_STEP_WITHIN`]); notes that it answers now.
    fn answered_now(&mut self) -> bool {
        let in_step =
            self.last.is_some() && (self.answered).is_some_and(|t| t.elapsed() <= IN_STEP_WITHIN);
        self.answered = Some(Instant::now());
        in_step
    }
}

/// This gateway's writes, numbered: those after a read began are merged into what it read.
struct LocalWrites<R> {
    generation: u64,
    writes: Vec<(u64, R)>,
}

impl<R> Default for LocalWrites<R> {
    fn default() -> Self {
        LocalWrites {
            generation: 0,
            writes: Vec::new(),
        }
    }
}

/// Called with every new set of records (at a write of this gateway, and when a poll read one).
pub type Publish<R> = Box<dyn Fn(&Merged<R>) + Send + Sync>;

/// One kind of record as this gateway holds it.
pub struct Replica<R: Record> {
    kind: &'static str,
    store: Box<dyn RecordStore<R>>,
    /// With Redis: the state folder's copy.
    cache: Option<FileRecords<R>>,
    /// With Redis: a copy not in step with the store when it was found lost (see the module).
    withheld: Option<FileRecords<R>>,
    held: ArcSwap<Merged<R>>,
    /// This gateway's writes a poll's read may predate (see [`Replica::take`]); held while the
    /// held set is replaced, never across an `.await`.
    local: std::sync::Mutex<LocalWrites<R>>,
    publish: Publish<R>,
    last_stamp: AtomicU64,
    sync: tokio::sync::Mutex<SyncState>,
}

impl<R: Record> Replica<R> {
    /// Records of `kind` where `home` keeps them: the control store, the state folder
    /// (`<kind>.records.sqlite`), or Redis with a copy in the folder
    /// (`<kind>.redis-cache.json`); `publish` is told each new set.
    pub fn open(kind: &'static str, home: Home<'_>, publish: Publish<R>) -> Replica<R> {
        let store = home.store(kind);
        let copies = home.keeps_copies();
        let cache =
            copies.then(|| FileRecords::new(home.folder.join(format!("{kind}.redis-cache.json"))));
        let withheld = copies.then(|| FileRecords::new(withheld_path(home.folder, kind)));
        Replica {
            kind,
            store,
            cache,
            withheld,
            held: ArcSwap::from_pointee(Merged::default()),
            local: std::sync::Mutex::new(LocalWrites::default()),
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
            let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
            local.generation += 1;
            let generation = local.generation;
            local.writes.push((generation, record.clone()));
            self.swap(&local, |m| {
                m.merge(record);
            });
        }
        Ok(put)
    }

    /// Changes the held set and publishes it, with the local writes' lock held: one change at
    /// a time, so a write answered `2xx` is held (a lookup, a list or a `DELETE` right after it
    /// sees it) whatever a poll that read the store before it does next.
    fn swap(&self, _local: &LocalWrites<R>, change: impl FnOnce(&mut Merged<R>)) {
        let mut m = Merged::clone(&self.held.load());
        change(&mut m);
        (self.publish)(&m);
        self.held.store(Arc::new(m));
    }

    /// The local writes' generation now: what a read that begins now includes.
    fn generation(&self) -> u64 {
        self.local
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .generation
    }

    /// Takes what a read of the store begun at local generation `since` found, with this
    /// gateway's writes after it merged in (last-writer-wins: a read from before a write never
    /// undoes it here). What the read does not hold and no later local write made is gone
    /// here too (another gateway's removal, a compacted removal marker).
    fn take(&self, read: Merged<R>, since: u64) {
        let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        local.writes.retain(|(g, _)| *g > since);
        let mut read = read;
        for (_, r) in &local.writes {
            read.merge(r.clone());
        }
        self.swap(&local, |m| *m = read);
    }

    /// Loads what the state folder's copy holds (with Redis), then what the store holds.
    pub async fn start(&self) {
        if let Some(cache) = &self.cache {
            match cache.read_now() {
                Ok(records) => {
                    let since = self.generation();
                    self.take(Merged::of(records), since);
                }
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
        let in_step = st.answered_now();
        if st.last.as_ref() == Some(&token) && token != Token::Lost {
            return;
        }
        let since = self.generation();
        let mut read = match self.store.read().await {
            Ok(r) => Merged::of(r),
            Err(e) => return self.failed(&mut st, &e),
        };
        // Put back only into a store that lost data (see `lost_data`): otherwise what it no
        // longer holds was removed or compacted on purpose.
        if let (Some(_), true) = (&self.cache, lost_data(st.last.as_ref(), &token)) {
            if let Err(e) = self.put_back(&mut read, in_step).await {
                return self.failed(&mut st, &e);
            }
        }
        if let Some(cache) = &self.cache {
            if let Err(e) = cache.replace_now(&read.sorted()) {
                log::warn!("{}: the local copy could not be written: {e}", self.kind);
            }
        }
        self.take(read, since);
        // Lost: the restore gave the store an epoch; the next round reads it again.
        st.last = Some(token);
    }

    /// Puts back into a store that lost data (holding `read`) what this gateway holds that it
    /// lacks or holds older: all of it from a copy `in_step` with the store, else its removal
    /// markers only, the rest withheld (see the module).
    async fn put_back(&self, read: &mut Merged<R>, in_step: bool) -> Result<(), RecordsError> {
        let held = self.held.load();
        let (missing, aside): (Vec<R>, Vec<R>) = held
            .all()
            .filter(|r| (read.get(r.project(), r.key())).is_none_or(|s| r.newer_than(s)))
            .cloned()
            .partition(|r| in_step || r.removed());
        if !aside.is_empty() {
            self.withhold(aside).await;
        }
        if missing.is_empty() {
            return Ok(());
        }
        log::info!(
            "{}: the shared store lacked {} records this gateway held; put back",
            self.kind,
            missing.len()
        );
        self.store.restore(&missing).await?;
        for r in missing {
            read.merge(r);
        }
        Ok(())
    }

    /// Keeps `records` (a copy not in step with a store found lost) in the withheld file, for
    /// the operator to put back once every gateway that could hold their removals has returned.
    async fn withhold(&self, records: Vec<R>) {
        let Some(file) = &self.withheld else { return };
        let n = records.len();
        match file.restore(&records).await {
            Ok(()) => log::warn!(
                "{}: the shared store lost its data while this gateway's copy was not in step \
                 with it (stopped or cut off): {n} records withheld in {} (removals put back); \
                 `restore-withheld` puts them back once every gateway has started again",
                self.kind,
                file.path().display()
            ),
            Err(e) => log::error!("{}: {n} withheld records not kept: {e}", self.kind),
        }
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

/// Whether a store whose version is now `now` lost data since this gateway read `last`: it
/// names no data set (flushed), another one (put back by a gateway after a loss), or the same
/// one at an older version (a failover to a replica that lagged). A gateway's first read
/// (`last` none) counts as a loss only for a store that names no data set: a store that moved
/// on while this gateway was away is the truth, and its copy from before is not put back.
fn lost_data(last: Option<&Token>, now: &Token) -> bool {
    let split = |t: &Token| match t {
        Token::At(v) => v
            .rsplit_once(':')
            .map(|(e, n)| (e.to_owned(), n.parse::<u64>().unwrap_or(0))),
        Token::Lost => None,
    };
    match (last.and_then(split), split(now)) {
        (_, None) => true,
        (None, Some(_)) => false,
        (Some((e0, v0)), Some((e1, v1))) => e0 != e1 || v1 < v0,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::records::tests::over;
    use drg_domain::overrides::Override;
    use std::sync::Mutex;

    /// A shared store that can lose its data (`None`: flushed), as Redis does.
    #[derive(Default)]
    struct Losable(Arc<Mutex<Option<Merged<Override>>>>);

    #[async_trait::async_trait]
    impl RecordStore<Override> for Losable {
        async fn put(&self, record: &Override, max: u32) -> Result<Put, RecordsError> {
            let mut held = self.0.lock().unwrap();
            Ok(held.get_or_insert_with(Merged::default).put(record, max))
        }
        async fn token(&self) -> Result<Token, RecordsError> {
            Ok(match &*self.0.lock().unwrap() {
                None => Token::Lost,
                Some(m) => Token::At(format!("e:{}", m.all().count())),
            })
        }
        async fn read(&self) -> Result<Vec<Override>, RecordsError> {
            Ok((self.0.lock().unwrap().iter())
                .flat_map(Merged::sorted)
                .collect())
        }
        async fn restore(&self, records: &[Override]) -> Result<(), RecordsError> {
            let mut held = self.0.lock().unwrap();
            let m = held.get_or_insert_with(Merged::default);
            for r in records {
                m.merge(r.clone());
            }
            Ok(())
        }
    }

    fn replica(folder: &Path, shared: &Losable) -> Replica<Override> {
        let mut r = Replica::open("overrides", Home::folder(folder), Box::new(|_| {}));
        r.store = Box::new(Losable(shared.0.clone()));
        r.cache = Some(FileRecords::new(folder.join("overrides.redis-cache.json")));
        r.withheld = Some(FileRecords::new(withheld_path(folder, "overrides")));
        r
    }

    #[tokio::test]
    async fn a_copy_from_the_state_folder_puts_back_its_removals_only_and_withholds_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let copy = [
            over("kept.example", 1, false),
            over("gone.example", 2, true),
        ];
        let cache = FileRecords::<Override>::new(dir.path().join("overrides.redis-cache.json"));
        cache.replace_now(&copy).unwrap();
        let shared = Losable::default();
        let r = replica(dir.path(), &shared);
        r.start().await;
        let store = Merged::of(shared.read().await.unwrap());
        assert!(store.get("p", "gone.example").is_some_and(|o| o.removed));
        assert!(store.get("p", "kept.example").is_none(), "not put back");
        assert_eq!(
            r.held().live("p").count(),
            0,
            "what the store holds is served"
        );
        let withheld = FileRecords::<Override>::new(withheld_path(dir.path(), "overrides"));
        assert_eq!(withheld.read_now().unwrap(), vec![copy[0].clone()]);
    }

    #[tokio::test]
    async fn a_copy_kept_in_step_puts_everything_back() {
        let dir = tempfile::tempdir().unwrap();
        let shared = Losable::default();
        shared
            .put(&over("kept.example", 1, false), 5)
            .await
            .unwrap();
        let r = replica(dir.path(), &shared);
        r.start().await;
        assert_eq!(r.held().live("p").count(), 1);
        *shared.0.lock().unwrap() = None;
        r.sync().await;
        let store = Merged::of(shared.read().await.unwrap());
        assert!(store.get("p", "kept.example").is_some_and(|o| !o.removed));
        assert!(!withheld_path(dir.path(), "overrides").exists());
    }
}
