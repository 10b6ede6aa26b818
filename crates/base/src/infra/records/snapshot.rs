//! What a gateway holds of one kind of record, and what keeps it: when the kind is told moved
//! (PostgreSQL's `NOTIFY`, `control/listen.rs`; the poll of every kind's revision behind it,
//! `control/watch.rs`), its revision is asked (one indexed row) and, when it moved, the
//! projects the revision log names since the revision held are read and published, with this
//! gateway's writes made since the read began merged in: a write costs its project's records,
//! whatever the others hold. The first read, and one the log cannot answer (a restore, a
//! gateway far behind, an import), reads the kind whole. A revision lower than the last one read (the database restored from an older
//! backup, a failover to a replica that lagged) is logged and reported on `/readyz`, and what
//! the store holds now is served: a gateway never writes its copy back.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use serde::Serialize;

use super::once::{Once, Outcome};
use super::sql::{Since, SqlRecords, Step};
use super::{Audited, Merged, Moved, Put, Record, RecordsError};
use crate::infra::control::{Control, Revision};

/// A failing store is logged at WARN at most this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// A revision that went back, as `/readyz` reports it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct WentBack {
    pub kind: &'static str,
    pub from: i64,
    pub to: i64,
    /// Unix seconds when this gateway saw it.
    pub seen_at: i64,
    /// For keys: the commands that revoke again, in the store, the keys this gateway saw
    /// revoked that the restore brought back (refused here meanwhile).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub revoke_again: Vec<String>,
}

/// Whether the store's history of `kind`, read at `now`, went another way than the one this
/// gateway held at `from` (a restore, a failover; see [`crate::infra::control::diverged`]):
/// logged at WARN and given for `/readyz`. A store that does not answer the question is
/// taken as one that moved on (the kind is read whole either way).
pub async fn went_back(
    control: &Control,
    kind: &'static str,
    from: &Revision,
    now: &Revision,
) -> Option<WentBack> {
    let ask = async {
        let pool = control.pool().await?;
        (crate::infra::control::diverged(pool, kind, from, now).await).map_err(control.sql())
    };
    if !control.within(ask).await.unwrap_or(false) {
        return None;
    }
    let (f, t) = (from.n, now.n);
    log::warn!(
        "{kind}: the control store's revision went back from {f} to {t}{} (restored from an \
         older backup, or a replica that lagged): what it holds now is served",
        if t >= f {
            ", through another history"
        } else {
            ""
        }
    );
    Some(WentBack {
        kind,
        from: f,
        to: t,
        seen_at: chrono::Utc::now().timestamp(),
        revoke_again: Vec::new(),
    })
}

/// What the poll remembers between rounds.
#[derive(Default)]
struct SyncState {
    /// The revision last read.
    last: Option<Revision>,
    warned: Option<Instant>,
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

/// Called with every new set of records (at a write of this gateway, and when a poll read one)
/// and what moved in it since the set before.
pub type Publish<R> = Box<dyn Fn(&Merged<R>, &Moved) + Send + Sync>;

/// One kind of record as this gateway holds it.
pub struct Snapshot<R: Record> {
    kind: &'static str,
    store: SqlRecords<R>,
    control: Arc<Control>,
    held: ArcSwap<Merged<R>>,
    /// This gateway's writes a poll's read may predate (see [`Snapshot::take`]); held while the
    /// held set is replaced, never across an `.await`.
    local: std::sync::Mutex<LocalWrites<R>>,
    publish: Publish<R>,
    last_stamp: AtomicU64,
    sync: tokio::sync::Mutex<SyncState>,
    went_back: arc_swap::ArcSwapOption<WentBack>,
    /// The revision last read (none yet), for the poll's word (see `control/watch.rs`).
    revision_held: arc_swap::ArcSwapOption<Revision>,
    /// Whether the store was read once: until then what is held is only this gateway's writes.
    read: AtomicBool,
}

impl<R: Record> Snapshot<R> {
    /// Records of `kind` in the control store; `publish` is told each new set.
    pub fn open(kind: &'static str, control: &Arc<Control>, publish: Publish<R>) -> Snapshot<R> {
        control.snapshot_opened();
        Snapshot {
            kind,
            store: SqlRecords::new(control.clone(), kind),
            control: control.clone(),
            held: ArcSwap::from_pointee(Merged::default()),
            local: std::sync::Mutex::new(LocalWrites::default()),
            publish,
            last_stamp: AtomicU64::new(0),
            sync: tokio::sync::Mutex::new(SyncState::default()),
            went_back: arc_swap::ArcSwapOption::empty(),
            revision_held: arc_swap::ArcSwapOption::empty(),
            read: AtomicBool::new(false),
        }
    }

    /// What this gateway holds now.
    pub fn held(&self) -> Arc<Merged<R>> {
        self.held.load_full()
    }

    /// Whether the store was read since this gateway started: before, a list read from what is
    /// held would say a project has nothing (its reads answer `503` instead).
    pub fn read_once(&self) -> bool {
        self.read.load(Ordering::Acquire)
    }

    /// A stamp for a write replacing one stamped `held`.
    pub fn stamp(&self, held: u64) -> u64 {
        super::next_stamp(&self.last_stamp, held)
    }

    /// Writes `record` to the store (a new one in force only within `max_live` for its
    /// project), held and published here at once when it was.
    pub async fn put(&self, record: R, max_live: u32) -> Result<Put, RecordsError> {
        let put = self.store.put(&record, max_live).await?;
        self.held_now(&put, record);
        Ok(put)
    }

    /// Writes `record` as [`Snapshot::put`] does, `once` its `Idempotency-Key` (see
    /// [`super::once`]: a retry of a write that committed gets its first answer) and `audited`
    /// the audit entry written with it.
    pub async fn put_with(
        &self,
        record: R,
        max_live: u32,
        once: Option<&Once<'_>>,
        audited: Option<&Audited<'_>>,
    ) -> Result<Outcome, RecordsError> {
        // Boxed: the store's transaction is a large future, and a request's future holds the
        // largest of its branches whatever route it takes (every request would copy it).
        let outcome = Box::pin(self.store.put_once(&record, max_live, once, audited)).await?;
        if let Outcome::Put(put) = &outcome {
            self.held_now(put, record);
        }
        Ok(outcome)
    }

    /// What a write with `once`'s key in `project` came to before (see [`SqlRecords::seen`]).
    pub async fn seen(
        &self,
        project: &str,
        once: &Once<'_>,
    ) -> Result<Option<Outcome>, RecordsError> {
        Box::pin(self.store.seen(project, once)).await
    }

    /// Holds and publishes `record` at once when `put` wrote it.
    fn held_now(&self, put: &Put, record: R) {
        if let Put::Done { .. } = put {
            let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
            local.generation += 1;
            let generation = local.generation;
            local.writes.push((generation, record.clone()));
            let changed = Moved::Projects([record.project().to_owned()].into());
            self.swap(&local, &changed, |m| {
                m.merge(record);
            });
        }
    }

    /// Changes the held set and publishes it, with the local writes' lock held: one change at
    /// a time, so a write answered `2xx` is held (a lookup, a list or a `DELETE` right after it
    /// sees it) whatever a poll that read the store before it does next.
    fn swap(&self, _local: &LocalWrites<R>, changed: &Moved, change: impl FnOnce(&mut Merged<R>)) {
        let mut m = Merged::clone(&self.held.load());
        change(&mut m);
        (self.publish)(&m, changed);
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
        self.swap(&local, &Moved::All, |m| *m = read);
    }

    /// Takes what a read of what changed, begun at local generation `since`, found: each
    /// project read whole replaces what is held of it, each record read alone its key (gone
    /// when the store holds none), with this gateway's writes after it merged in (as
    /// [`Snapshot::take`] does for the whole kind). Nothing changed but this gateway's own
    /// writes: what is held stays.
    fn take_changes(&self, read: Since<R>, since: u64) {
        let mut local = self.local.lock().unwrap_or_else(|e| e.into_inner());
        local.writes.retain(|(g, _)| *g > since);
        if read.projects.is_empty() && read.records.is_empty() {
            return;
        }
        let mut projects: BTreeSet<String> = read.projects.keys().cloned().collect();
        projects.extend(read.records.keys().map(|(p, _)| p.clone()));
        projects.extend(local.writes.iter().map(|(_, r)| r.project().to_owned()));
        let writes: Vec<R> = local.writes.iter().map(|(_, r)| r.clone()).collect();
        self.swap(&local, &Moved::Projects(projects), move |m| {
            for (project, records) in read.projects {
                m.replace(&project, records);
            }
            for ((project, key), record) in read.records {
                m.set(&project, &key, record);
            }
            for r in writes {
                m.merge(r);
            }
        });
    }

    /// One round: whether the store answered (`false`: what is held stays, and the round is
    /// tried again at the next poll).
    pub async fn sync(&self) -> bool {
        let mut st = self.sync.lock().await;
        // Taken before the store is read: a local write after it is merged into what is read.
        let since = self.generation();
        match self.store.step(st.last.as_ref()).await {
            Ok(Step::Unmoved) => return true,
            Ok(Step::Since(changed)) => {
                // The log held the history this gateway read: nothing went back.
                let at = changed.at.clone();
                self.take_changes(changed, since);
                self.revision_held.store(Some(Arc::new(at.clone())));
                st.last = Some(at);
                return true;
            }
            Ok(Step::Whole) => {}
            Err(e) => {
                self.failed(&mut st, &e);
                return false;
            }
        }
        let (revision, read) = match self.store.read().await {
            Ok((n, r)) => (n, Merged::of(r)),
            Err(e) => {
                self.failed(&mut st, &e);
                return false;
            }
        };
        if let Some(from) = &st.last {
            let back = Box::pin(went_back(&self.control, self.kind, from, &revision)).await;
            if let Some(back) = back {
                self.went_back.store(Some(Arc::new(back)));
            }
        }
        self.take(read, since);
        self.read.store(true, Ordering::Release);
        self.revision_held.store(Some(Arc::new(revision.clone())));
        st.last = Some(revision);
        true
    }

    /// The last time the store's revision went back, if it did in this run.
    pub fn went_back(&self) -> Option<WentBack> {
        self.went_back.load().as_deref().cloned()
    }

    fn failed(&self, st: &mut SyncState, e: &RecordsError) {
        if st.warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            st.warned = Some(Instant::now());
            log::warn!(
                "{}: the control store did not answer ({e}); serving what is held",
                self.kind
            );
        } else {
            log::debug!("{}: {e}", self.kind);
        }
    }
}

#[async_trait::async_trait]
impl<R: Record> crate::infra::control::follow::Follower for Snapshot<R> {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn control(&self) -> &Control {
        &self.control
    }

    fn held(&self) -> Option<Arc<Revision>> {
        self.revision_held.load_full()
    }

    async fn sync(&self) -> bool {
        Snapshot::sync(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::records::tests::over;
    use drg_domain::overrides::Override;

    /// What each publish was told moved, and the records in force it held for project `p`.
    type Told = Arc<std::sync::Mutex<Vec<(Moved, Vec<String>)>>>;

    /// A publish that tells `told`.
    fn telling(told: &Told) -> Publish<Override> {
        let t = told.clone();
        Box::new(move |m, moved| {
            let mut names: Vec<String> = m.live("p").map(|o| o.domain.clone()).collect();
            names.sort();
            t.lock().unwrap().push((moved.clone(), names));
        })
    }

    #[tokio::test]
    async fn a_follower_reads_the_projects_that_moved_and_the_whole_kind_when_the_log_cannot_tell()
    {
        let dir = tempfile::tempdir().unwrap();
        let control = Control::sqlite(&dir.path().join("control.sqlite")).unwrap();
        let told: Told = Arc::default();
        let publish = telling(&told);
        let follower = Snapshot::open("overrides", &control, publish);
        // Another gateway's writes: the store itself, not the follower's copy.
        let other = SqlRecords::<Override>::new(control.clone(), "overrides");
        let mut elsewhere = over("b.example", 2, false);
        elsewhere.project = "q".into();
        other.put(&over("a.example", 1, false), 10).await.unwrap();
        other.put(&elsewhere, 10).await.unwrap();
        assert!(follower.sync().await);
        other.put(&over("c.example", 3, false), 10).await.unwrap();
        other.put(&over("a.example", 4, true), 10).await.unwrap();
        assert!(follower.sync().await);
        assert!(follower.sync().await, "nothing moved: nothing read");
        other
            .import("file:x", &[over("d.example", 5, false)])
            .await
            .unwrap();
        assert!(follower.sync().await);
        let told = told.lock().unwrap();
        let p = || Moved::Projects(["p".to_owned()].into());
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(told.len(), 3, "{told:?}");
        assert_eq!(told[0], (Moved::All, names(&["a.example"])));
        // Two writes of `p` since: its records read again, a removal's row gone with them.
        assert_eq!(told[1], (p(), names(&["c.example"])));
        // An import names no project: the kind is read whole.
        assert_eq!(told[2], (Moved::All, names(&["c.example", "d.example"])));
        assert_eq!(follower.held().live("q").count(), 1);
    }

    #[tokio::test]
    async fn a_gateway_does_not_read_back_its_own_writes_and_reads_anothers_by_record() {
        let dir = tempfile::tempdir().unwrap();
        let control = Control::sqlite(&dir.path().join("control.sqlite")).unwrap();
        let told: Told = Arc::default();
        let publish = telling(&told);
        let gateway = Snapshot::open("overrides", &control, publish);
        let other = SqlRecords::<Override>::new(control.clone(), "overrides");
        other.put(&over("a.example", 1, false), 10).await.unwrap();
        assert!(gateway.sync().await);
        gateway.put(over("b.example", 2, false), 10).await.unwrap();
        gateway.put(over("c.example", 3, false), 10).await.unwrap();
        let published = told.lock().unwrap().len();
        assert_eq!(published, 3, "the read, then each write as it is answered");
        assert!(gateway.sync().await);
        assert_eq!(
            told.lock().unwrap().len(),
            published,
            "its own writes: nothing read"
        );
        // Another gateway's write between two of its own: that record alone is read.
        gateway.put(over("d.example", 4, false), 10).await.unwrap();
        other.put(&over("a.example", 5, true), 10).await.unwrap();
        gateway.put(over("e.example", 6, false), 10).await.unwrap();
        assert!(gateway.sync().await);
        let (count, last) = {
            let told = told.lock().unwrap();
            (told.len(), told.last().unwrap().clone())
        };
        let held = ["b.example", "c.example", "d.example", "e.example"];
        assert_eq!(last.1, held.map(str::to_owned));
        assert_eq!(last.0, Moved::Projects(["p".to_owned()].into()));
        assert_eq!(count, published + 3);
        // The store says the same.
        let (_, stored) = other.read().await.unwrap();
        assert_eq!(stored.iter().filter(|o| !o.removed).count(), 4);
    }
}
