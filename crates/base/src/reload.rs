//! Generic hot reload: watch files (poll and SIGHUP), build off-thread, swap with `ArcSwap`.
//!
//! A change is a change of content (SHA-256 of the bytes), not of metadata: a file rewritten with
//! the same length within one tick of the file system's clock has the same mtime, and a file only
//! touched has not changed. Hashing every file every poll would cost a read of every data file
//! each second, so a file's digest is reused while its metadata (inode, length, mtime, ctime) is
//! unchanged and old enough to be trusted; a file written recently is hashed again each poll.
//!
//! A build that fails keeps the current snapshot and logs why; a build whose files changed while
//! it ran is discarded and redone, so a half-written file is never what gets published; a build
//! that the source refuses next to the snapshot in service (e.g. a list that lost most of its
//! entries at once) keeps the current snapshot too, logged at WARN.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::service::{Service, Shutdown};
use arc_swap::ArcSwap;
use async_trait::async_trait;
use sha2::Digest;

use crate::periodic::{Tick, Ticks};

/// What a finished rebuild came to, as told to a [`ReloadHook`] by the reloader (a raced build is redone, not
/// reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadOutcome {
    Published,
    /// The build failed (or its thread could not run).
    Failed,
    /// Built, but the reloadable source's `accept` refused it.
    Refused,
}

/// Told the outcome of every finished rebuild (e.g. to count them in the metrics).
pub type ReloadHook = Box<dyn Fn(ReloadOutcome) + Send + Sync>;

/// Something that can be rebuilt from files.
pub trait Reloadable: Send + Sync + 'static {
    type Snapshot: Send + Sync + 'static;
    type Error: std::fmt::Display + Send + 'static;

    /// A name for logs, e.g. "domain table".
    fn name(&self) -> &str;
    /// Files whose change triggers a rebuild.
    fn watched_files(&self) -> Vec<PathBuf>;
    /// Builds a new snapshot (called on a blocking thread).
    fn build(&self) -> Result<Self::Snapshot, Self::Error>;
    /// Whether `next` may replace `current`: a well-formed file can still be one the operator
    /// did not mean (truncated, emptied). `Err` keeps `current`.
    fn accept(&self, _current: &Self::Snapshot, _next: &Self::Snapshot) -> Result<(), Self::Error> {
        Ok(())
    }
    /// Called on an accepted snapshot just before it replaces `current` (e.g. to number it).
    fn succeed(&self, _current: &Self::Snapshot, _next: &mut Self::Snapshot) {}
    /// Called after a snapshot was published (for logs).
    fn published(&self, _snapshot: &Self::Snapshot) {}
    /// Held from reading the files to swapping the snapshot in, when something else also
    /// publishes into the same target (the keys API): then neither can store a snapshot read
    /// before the other's store, which could bring back a key just revoked.
    fn publish_lock(&self) -> Option<&std::sync::Mutex<()>> {
        None
    }
}

/// A file's metadata, as far as telling a write goes: any write or rename changes one of these,
/// but only at the granularity of the file system's clock (a tick of several milliseconds, or a
/// second on some file systems).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Meta {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// How old (seconds) a file's ctime must be, relative to when its digest was taken, for its
/// unchanged metadata to prove an unchanged content: a write after the digest would have moved
/// the ctime (nobody can set it back) unless it landed in the same tick of the file system's
/// clock. Generous, for coarse clocks; a file this young is merely hashed again.
const TRUST_METADATA_AFTER_SECS: i64 = 2;

impl Meta {
    fn of(m: &std::fs::Metadata) -> Meta {
        Meta {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }

    /// Whether a write after `taken` could have left this metadata as it is.
    fn racy(&self, taken: SystemTime) -> bool {
        let taken = taken
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        self.ctime.0 >= taken.saturating_sub(TRUST_METADATA_AFTER_SECS)
    }
}

/// One watched file as last seen. Two states are the same file content when their digests are
/// equal: metadata alone neither proves a change nor its absence.
#[derive(Debug, Clone)]
struct FileState {
    meta: Meta,
    /// SHA-256 of the content (of the metadata, for anything that is not a regular file).
    digest: [u8; 32],
    /// When the digest was taken (before reading the file).
    taken: SystemTime,
}

impl PartialEq for FileState {
    fn eq(&self, other: &Self) -> bool {
        self.digest == other.digest
    }
}

/// Each watched file's state (`None` when missing or unreadable).
type Fingerprint = Vec<Option<FileState>>;

/// The watched files' states now; `previous` lends the digests of files whose metadata has not
/// changed since and is old enough to be trusted.
fn fingerprint(files: &[PathBuf], previous: &[Option<FileState>]) -> Fingerprint {
    files
        .iter()
        .enumerate()
        .map(|(i, f)| file_state(f, previous.get(i).and_then(Option::as_ref)))
        .collect()
}

/// Polls `files` against `seen`: `None` when their contents are as `seen` says, and then `seen`
/// takes the fresh states (their later `taken` lets metadata that has settled since be trusted:
/// kept, a file written just before the gateway started stayed "racy" and was hashed again on
/// every tick, for good); else the new fingerprint, `seen` as it was.
fn poll(files: &[PathBuf], seen: &mut Fingerprint) -> Option<Fingerprint> {
    let now = fingerprint(files, seen);
    if now == *seen {
        *seen = now;
        return None;
    }
    Some(now)
}

fn file_state(path: &Path, previous: Option<&FileState>) -> Option<FileState> {
    let taken = SystemTime::now();
    let metadata = std::fs::metadata(path).ok()?;
    let meta = Meta::of(&metadata);
    if let Some(p) = previous.filter(|p| p.meta == meta && !meta.racy(p.taken)) {
        return Some(p.clone());
    }
    let digest = if metadata.is_file() {
        content_digest(path).ok()?
    } else {
        sha2::Sha256::digest(format!("{meta:?}")).into()
    };
    Some(FileState {
        meta,
        digest,
        taken,
    })
}

fn content_digest(path: &Path) -> std::io::Result<[u8; 32]> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match file.read(&mut buf) {
            Ok(0) => return Ok(hasher.finalize().into()),
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// What became of one rebuild.
enum Outcome<E> {
    Published,
    /// The files changed while the build ran: redo it.
    Raced,
    /// The files could not be built into a snapshot.
    Failed(E),
    /// Built, but [`Reloadable::accept`] refused it.
    Refused(E),
}

/// How a rebuild thread shares the CPU with the request workers (`reload.build_priority`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BuildPriority {
    /// SCHED_IDLE: runs only when no other thread of the host wants the CPU, and a worker that
    /// wakes takes the core back at once. While the host's cores are all busy (requests, or any
    /// other process) a rebuild waits, however long; an unprivileged process cannot raise it
    /// back, so this is opt-in.
    Idle,
    /// nice 10: yields most of the CPU to workers but always progresses; a worker that wakes
    /// may wait for the rebuild's time slice.
    #[default]
    Low,
}

/// A background service that keeps `target` in step with the files of `source`.
pub struct Reloader<S: Reloadable> {
    source: Arc<S>,
    target: Arc<ArcSwap<S::Snapshot>>,
    interval: Duration,
    hook: Option<ReloadHook>,
    priority: BuildPriority,
}

impl<S: Reloadable> Reloader<S> {
    pub fn new(source: S, target: Arc<ArcSwap<S::Snapshot>>, interval: Duration) -> Self {
        Reloader {
            source: Arc::new(source),
            target,
            interval,
            hook: None,
            // Small files (keys, certificates) must not wait for a quiet moment: a revoked key
            // is revoked under full load too.
            priority: BuildPriority::Low,
        }
    }

    /// How the rebuild threads share the CPU with request workers.
    pub fn with_priority(mut self, priority: BuildPriority) -> Self {
        self.priority = priority;
        self
    }

    /// Reports the outcome of each rebuild to `hook`.
    pub fn with_hook(mut self, hook: ReloadHook) -> Self {
        self.hook = Some(hook);
        self
    }

    /// Rebuilds now and tells the hook what came of it.
    async fn rebuild(&self, files: &[PathBuf], before: &Fingerprint) -> bool {
        let outcome = self.rebuild_once(files, before).await;
        if let (Some(hook), Some(outcome)) = (&self.hook, outcome) {
            hook(outcome);
        }
        outcome == Some(ReloadOutcome::Published)
    }

    /// Rebuilds now; publishes on success. `None` when the build raced a write.
    async fn rebuild_once(&self, files: &[PathBuf], before: &Fingerprint) -> Option<ReloadOutcome> {
        let source = self.source.clone();
        let target = self.target.clone();
        let files_owned = files.to_vec();
        let before = before.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let priority = self.priority;
        let spawned = std::thread::Builder::new()
            .name(format!("reload {}", self.source.name()))
            .spawn(move || {
                // On a small machine the build competes with request threads.
                lower_priority(priority);
                let (outcome, replaced) = build_and_swap(&*source, &target, &files_owned, &before);
                let _ = tx.send(outcome);
                if let Some(old) = replaced {
                    release_here(old, RELEASE_WAIT);
                }
            });
        if let Err(e) = spawned {
            log::error!(
                "{}: cannot start the reload thread: {e}",
                self.source.name()
            );
            return Some(ReloadOutcome::Failed);
        }
        let outcome = rx.await;
        match outcome {
            Ok(Outcome::Published) => Some(ReloadOutcome::Published),
            Ok(Outcome::Raced) => {
                log::info!(
                    "{}: files changed during the rebuild; trying again",
                    self.source.name()
                );
                None
            }
            Ok(Outcome::Failed(e)) => {
                log::error!(
                    "{}: reload failed, keeping the current data: {e}",
                    self.source.name()
                );
                Some(ReloadOutcome::Failed)
            }
            Ok(Outcome::Refused(e)) => {
                log::warn!(
                    "{}: reload refused, keeping the current data: {e}",
                    self.source.name()
                );
                Some(ReloadOutcome::Refused)
            }
            Err(_) => {
                log::error!(
                    "{}: the reload thread died, keeping the current data",
                    self.source.name()
                );
                Some(ReloadOutcome::Failed)
            }
        }
    }
}

/// How long a reload thread waits for requests to let go of the snapshot it replaced.
const RELEASE_WAIT: Duration = Duration::from_secs(5);

/// Builds a snapshot and publishes it unless the files changed meanwhile or the source refuses
/// it next to the one in service. Returns the replaced snapshot, for [`release_here`].
fn build_and_swap<S: Reloadable>(
    source: &S,
    target: &ArcSwap<S::Snapshot>,
    files: &[PathBuf],
    before: &Fingerprint,
) -> (Outcome<S::Error>, Option<Arc<S::Snapshot>>) {
    // A poisoned lock guards no data of its own: carry on.
    let _publishing = source
        .publish_lock()
        .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()));
    let built = source.build();
    if fingerprint(files, before) != *before {
        return (Outcome::Raced, None);
    }
    let mut snapshot = match built {
        Ok(s) => s,
        Err(e) => return (Outcome::Failed(e), None),
    };
    // Rebuilds run one at a time and only they swap `target`: the snapshot checked against is
    // the one replaced.
    if let Err(e) = source.accept(&target.load(), &snapshot) {
        return (Outcome::Refused(e), None);
    }
    source.succeed(&target.load(), &mut snapshot);
    source.published(&snapshot);
    let replaced = target.swap(Arc::new(snapshot));
    (Outcome::Published, Some(replaced))
}

/// Drops a replaced snapshot on the calling (reload) thread once no request holds it any more.
///
/// Requests in flight during a swap still hold the old snapshot, and whoever lets go last frees
/// it: freeing a table of 100k names takes milliseconds, which would land on one request's
/// latency. So the reload thread, at its low priority, waits for the others to let go (polling:
/// swaps are rare) and frees it itself; after `wait` it gives up and lets the last holder free it.
fn release_here<T>(old: Arc<T>, wait: Duration) -> bool {
    let deadline = std::time::Instant::now() + wait;
    while Arc::strong_count(&old) > 1 {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(old);
    // What the old snapshot held (a table: hundreds of MB) goes back to the system now.
    crate::infra::alloc::release_free_memory();
    true
}

/// Lowers the calling thread's scheduling priority, so a rebuild yields to request workers.
fn lower_priority(priority: BuildPriority) {
    use crate::infra::priority::{lower_this_thread, Priority};
    let lowered = lower_this_thread(match priority {
        BuildPriority::Idle => Priority::Idle,
        BuildPriority::Low => Priority::Low,
    });
    if !lowered {
        log::debug!("could not lower the reload thread's priority ({priority:?})");
    }
}

#[async_trait]
impl<S: Reloadable> Service for Reloader<S> {
    async fn run(&self, mut shutdown: Shutdown) {
        let files = self.source.watched_files();
        let mut seen = fingerprint(&files, &[]);
        // Another publisher (the keys API: the API-made keys as the control store gives them)
        // builds its snapshots from the one in service, under the source's publish lock, so
        // they carry the files this loop last built; none needs a rebuild from the files (one
        // after each key change cost a whole rebuild of the keys).
        let mut ticks = Ticks::new(self.interval).with_sighup(self.source.name());
        while let Some(tick) = ticks.next(&mut shutdown).await {
            let hangup = tick == Tick::Hangup;
            let now = match poll(&files, &mut seen) {
                None if !hangup => continue,
                None => seen.clone(),
                Some(now) => now,
            };
            if hangup {
                log::info!("{}: SIGHUP, reloading", self.source.name());
            }
            // A failed build is not retried until the files change again (or SIGHUP), so a broken
            // file is reported once, not every second. A build raced by a write is retried.
            let published = self.rebuild(&files, &now).await;
            if published || fingerprint(&files, &now) == now {
                seen = now;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_snapshot_is_freed_by_the_reload_thread_once_requests_let_go() {
        let target = Arc::new(ArcSwap::from_pointee(vec![1u8; 1024]));
        let held = target.load_full();
        let replaced = target.swap(Arc::new(vec![2u8; 1024]));
        let weak = Arc::downgrade(&replaced);
        let releaser = std::thread::spawn(move || release_here(replaced, Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(20));
        // A request still holds it: it is not freed yet.
        assert!(weak.upgrade().is_some());
        drop(held);
        assert!(releaser.join().unwrap(), "the reload thread freed it");
        assert!(weak.upgrade().is_none());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn rebuild_threads_take_the_configured_scheduling_policy() {
        let policy_after = |priority| {
            std::thread::spawn(move || {
                lower_priority(priority);
                // SAFETY: no arguments besides pid 0, the calling thread.
                let policy = unsafe { libc::sched_getscheduler(0) };
                // SAFETY: as above.
                let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
                (policy, nice)
            })
            .join()
            .unwrap()
        };
        assert_eq!(policy_after(BuildPriority::Idle).0, libc::SCHED_IDLE);
        assert_eq!(policy_after(BuildPriority::Low), (libc::SCHED_OTHER, 10));
    }

    #[test]
    fn a_same_size_rewrite_with_the_same_mtime_is_a_change_and_a_touch_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.yaml");
        std::fs::write(&path, "aaaa\n").unwrap();
        let files = [path.clone(), dir.path().join("missing")];
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        let first = fingerprint(&files, &[]);
        assert!(first[0].is_some() && first[1].is_none());
        // Same length, mtime set back: only the content tells.
        std::fs::write(&path, "bbbb\n").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let second = fingerprint(&files, &first);
        assert_eq!(
            second[0].as_ref().unwrap().meta.mtime,
            first[0].as_ref().unwrap().meta.mtime
        );
        assert_ne!(second, first, "the rewrite is seen");
        // Touched, content unchanged: no change.
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(SystemTime::now())
            .unwrap();
        assert_eq!(fingerprint(&files, &second), second);
        // A digest is reused only for metadata old enough to be trusted.
        let old = FileState {
            taken: SystemTime::now() + Duration::from_secs(60),
            ..second[0].clone().unwrap()
        };
        assert!(!old.meta.racy(old.taken));
        assert!(old.meta.racy(SystemTime::now()));
    }

    #[test]
    fn a_file_that_settles_is_trusted_by_its_metadata_and_not_hashed_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disposable.txt");
        std::fs::write(&path, "a.com\n").unwrap();
        let files = [path];
        // Written just now: its metadata cannot vouch for its content yet.
        let mut seen = fingerprint(&files, &[]);
        let first = seen[0].clone().unwrap();
        assert!(first.meta.racy(first.taken));
        std::thread::sleep(Duration::from_millis(3_100));
        assert!(poll(&files, &mut seen).is_none(), "unchanged");
        assert!(poll(&files, &mut seen).is_none(), "unchanged");
        // The polls' later states are kept: the settled file is trusted from now on.
        let settled = seen[0].clone().unwrap();
        assert!(settled.taken > first.taken);
        assert!(!settled.meta.racy(settled.taken));
        std::fs::write(&files[0], "b.com\n").unwrap();
        let changed = poll(&files, &mut seen).expect("a write is seen");
        assert_ne!(changed, seen);
    }

    #[test]
    fn a_snapshot_held_too_long_is_left_to_its_last_holder() {
        let old = Arc::new(7u32);
        let held = old.clone();
        assert!(!release_here(old, Duration::from_millis(5)));
        assert_eq!(Arc::strong_count(&held), 1);
    }
}
