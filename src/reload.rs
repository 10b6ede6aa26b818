//! Generic hot reload: watch files (mtime poll and SIGHUP), build off-thread, swap with `ArcSwap`.
//!
//! A build that fails keeps the current snapshot and logs why; a build whose files changed while
//! it ran is discarded and redone, so a half-written file is never what gets published; a build
//! that the source refuses next to the snapshot in service (e.g. a list that lost most of its
//! entries at once) keeps the current snapshot too, logged at WARN.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use crate::periodic::{Tick, Ticks};

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
}

/// Modification time and length of each watched file (`None` when missing).
type Fingerprint = Vec<Option<(SystemTime, u64)>>;

fn fingerprint(files: &[PathBuf]) -> Fingerprint {
    files
        .iter()
        .map(|f| {
            std::fs::metadata(f)
                .ok()
                .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()))
        })
        .collect()
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

/// What a finished rebuild came to, as told to a [`ReloadHook`] (a raced build is redone, not
/// reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReloadOutcome {
    Published,
    /// The build failed (or its thread could not run).
    Failed,
    /// Built, but [`Reloadable::accept`] refused it.
    Refused,
}

/// Told the outcome of every finished rebuild (e.g. to count them in the metrics).
pub type ReloadHook = Box<dyn Fn(ReloadOutcome) + Send + Sync>;

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
    let built = source.build();
    if fingerprint(files) != *before {
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
    true
}

/// Lowers the calling thread's scheduling priority, so a rebuild yields to request workers.
///
/// Only on Linux, where both calls act on the calling thread; elsewhere they would act on the
/// whole process, workers included, so nothing is done.
#[cfg(target_os = "linux")]
fn lower_priority(priority: BuildPriority) {
    let done = match priority {
        BuildPriority::Idle => {
            let param = libc::sched_param { sched_priority: 0 };
            // SAFETY: `param` is a valid sched_param for the call; pid 0 names this thread.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) == 0 }
        }
        // SAFETY: setpriority only reads its integer arguments; 0 names the calling thread.
        BuildPriority::Low => unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) == 0 },
    };
    if !done {
        log::debug!("could not lower the reload thread's priority ({priority:?})");
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority(_priority: BuildPriority) {}

#[async_trait]
impl<S: Reloadable> BackgroundService for Reloader<S> {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let files = self.source.watched_files();
        let mut seen = fingerprint(&files);
        let mut ticks = Ticks::new(self.interval).with_sighup(self.source.name());
        while let Some(tick) = ticks.next(&mut shutdown).await {
            let forced = tick == Tick::Hangup;
            let now = fingerprint(&files);
            if !forced && now == seen {
                continue;
            }
            if forced {
                log::info!("{}: SIGHUP, reloading", self.source.name());
            }
            // A failed build is not retried until the files change again (or SIGHUP), so a broken
            // file is reported once, not every second. A build raced by a write is retried.
            let published = self.rebuild(&files, &now).await;
            if published || fingerprint(&files) == now {
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
    fn a_snapshot_held_too_long_is_left_to_its_last_holder() {
        let old = Arc::new(7u32);
        let held = old.clone();
        assert!(!release_here(old, Duration::from_millis(5)));
        assert_eq!(Arc::strong_count(&held), 1);
    }
}
