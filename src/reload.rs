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

/// A background service that keeps `target` in step with the files of `source`.
pub struct Reloader<S: Reloadable> {
    source: Arc<S>,
    target: Arc<ArcSwap<S::Snapshot>>,
    interval: Duration,
    hook: Option<ReloadHook>,
}

impl<S: Reloadable> Reloader<S> {
    pub fn new(source: S, target: Arc<ArcSwap<S::Snapshot>>, interval: Duration) -> Self {
        Reloader {
            source: Arc::new(source),
            target,
            interval,
            hook: None,
        }
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
        let spawned = std::thread::Builder::new()
            .name(format!("reload {}", self.source.name()))
            .spawn(move || {
                // A low priority: on a small machine the build competes with request threads.
                lower_priority();
                let _ = tx.send(build_and_swap(&*source, &target, &files_owned, &before));
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

/// Builds a snapshot and publishes it unless the files changed meanwhile or the source refuses
/// it next to the one in service.
fn build_and_swap<S: Reloadable>(
    source: &S,
    target: &ArcSwap<S::Snapshot>,
    files: &[PathBuf],
    before: &Fingerprint,
) -> Outcome<S::Error> {
    let built = source.build();
    if fingerprint(files) != *before {
        return Outcome::Raced;
    }
    let mut snapshot = match built {
        Ok(s) => s,
        Err(e) => return Outcome::Failed(e),
    };
    // Rebuilds run one at a time and only they swap `target`: the snapshot checked against is
    // the one replaced.
    if let Err(e) = source.accept(&target.load(), &snapshot) {
        return Outcome::Refused(e);
    }
    source.succeed(&target.load(), &mut snapshot);
    source.published(&snapshot);
    // The old snapshot is dropped here, on this thread, not on a request thread (unless a
    // request still holds it, in which case it goes when that request ends).
    drop(target.swap(Arc::new(snapshot)));
    Outcome::Published
}

/// Lowers the calling thread's scheduling priority, so a rebuild yields to request workers.
///
/// Only on Linux, where nice is per thread; elsewhere `setpriority(PRIO_PROCESS, 0)` would lower
/// the whole process, workers included, so nothing is done.
#[cfg(target_os = "linux")]
fn lower_priority() {
    // SAFETY: setpriority only reads its integer arguments; 0 names the calling thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
    if rc != 0 {
        log::debug!("could not lower the reload thread's priority");
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

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
