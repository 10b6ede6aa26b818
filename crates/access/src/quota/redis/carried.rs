//! The calls this gateway counted while Redis was unreachable or slow, and has not got into
//! Redis yet, the calls Redis counts for it that it will not serve (a lease's kept part,
//! give-backs not sent yet), and the month counts it last read, kept in a state file beside the
//! quota's (`quota.carried.<tag>.json`, one per process, `<tag>` random): a restart sends the
//! first, gives back the second and restores a count Redis lost to the highest of the third,
//! instead of forgetting them; the embedded store's crash-safety for the Redis store's local
//! part. Written by the background sync whenever what Redis lacks changed (every
//! `reconcile_interval_ms`, so a `kill -9` misses at most the calls counted in that interval),
//! before each round of its calls to Redis, and the counts read at most every [`SEEN_EVERY`]
//! and at shutdown; removed once there is nothing. Each version is written whole, synced and
//! renamed into place.
//!
//! **Named before they leave.** Only the background sync sends what Redis lacks (a call on the
//! request path carries none of it, and counts it against its limit instead). It takes each
//! slot's calls and give-backs into a call with a new id, writes the file naming that call as
//! `[id, calls, returned]` among `unsure` (as a call whose reply never came), and only then
//! sends it. Redis applies an id at most once (a batch sent again under its id only settles it,
//! `script.rs`), so whatever instant the process dies at, the next gateway counts each call
//! once: before the write the file still holds them as calls never sent, and none was; after
//! it, it sends the id again. Redis forgets an answered call's id only once a later file no
//! longer names it. A file that cannot be written holds the round back (logged): the calls wait
//! here, counted, until it can.
//!
//! **A lease's unused part, never a served call.** A lease serves calls without writing
//! anything, so its unused part at the last save says nothing of its unused part at a kill.
//! The file names only a part no call may take any longer: at each sync's own save
//! (`Save::Sync`), a lease that served no call since the previous one keeps its whole unused
//! part for the file (named, served no more: a call that finds only that part asks for a new
//! lease), one that served keeps nothing, and what it kept serves again once the file that no
//! longer names it is written. A kill then gives back calls never served only: an idle lease's
//! whole unused part, none of a lease that served or was granted since the last sync (still
//! counted in Redis: the month reads up to a lease high per such key, never low).
//!
//! **Owned by a lock, not a pid.** A process holds its file under an exclusive `flock` for its
//! whole life (each new version is locked before the rename that puts it in place). A file is
//! adoptable only when its lock can be taken: its process is gone, whatever pid it had and in
//! whichever pid namespace (two containers' gateways are both pid 1). The adopter keeps the
//! adopted files locked until they are removed, at its start and at each sync, so the new
//! process of a graceful upgrade takes what the old one left at its end, and two gateways on one
//! folder never both take one.
//!
//! **Adopted once, whatever the crash.** The adopter's own file, written before it removes the
//! adopted ones, names them (`absorbed`); that write is the commit. A later adopter that finds
//! both skips every file another file names (and names them too). Batches whose reply never
//! came keep their ids, so Redis still applies each once.
//!
//! **Earlier releases' files are handed over, never taken.** Releases before the lock wrote
//! `quota.redis-carried.<pid>[-<tag>].json` (and claimed them by renaming to
//! `...json.claimed.<pid>`). Nothing tells whether their writer still runs: a pid is one
//! namespace's (a live old gateway in another container may be pid 1 too, or a pid this one
//! does not see), and such a release rewrites its file only when its content changes, so no age
//! tells either. They are left alone and named in a warning, once per process and file; the
//! operator hands one over, once no gateway of such a release runs on the folder, by renaming
//! it to `quota.carried.<hex digits>.json`: a file of this release's name nobody holds, which
//! the next sync adopts (docs/operations.md).

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::slots::{Batch, Carried, Carry, Slot};
use super::RedisStore;
use crate::quota::Month;

/// How often the counts read alone (nothing owed) are written again: they are a floor, and a
/// few seconds' lag costs nothing a restore needs.
pub const SEEN_EVERY: Duration = Duration::from_secs(5);

/// One key and month's calls Redis may lack, and the count last read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    key: String,
    /// `YYYY-MM`.
    month: String,
    /// Counted here, never sent.
    #[serde(default, skip_serializing_if = "is_zero")]
    calls: u64,
    /// Counted in Redis for this process and never served (a lease's unused part): given back.
    #[serde(default, skip_serializing_if = "is_zero")]
    returned: u64,
    /// Sent under an id whose reply never came: `[id, calls, returned]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    unsure: Vec<[u64; 3]>,
    /// The shared count this process last read, and the epoch it was read in.
    #[serde(default, skip_serializing_if = "is_zero")]
    seen: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    epoch: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A file's content: a list of entries (releases before the lock), or entries with the names
/// of the files whose content they took in.
#[derive(Debug, Deserialize, Serialize)]
#[serde(untagged)]
enum Body {
    Legacy(Vec<Entry>),
    Current {
        entries: Vec<Entry>,
        #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
        absorbed: BTreeSet<String>,
    },
    /// Unreadable, or set aside.
    #[serde(skip)]
    Empty,
}

impl Body {
    fn into_parts(self) -> (Vec<Entry>, BTreeSet<String>) {
        match self {
            Body::Current { entries, absorbed } => (entries, absorbed),
            Body::Legacy(entries) => (entries, BTreeSet::new()),
            Body::Empty => (Vec::new(), BTreeSet::new()),
        }
    }
}

const PREFIX: &str = "quota.carried.";
const LEGACY_PREFIX: &str = "quota.redis-carried.";
const CLAIMED: &str = ".json.claimed.";

/// The folder the files live in: the quota's `state_file`'s.
pub fn folder_of(state_file: &Path) -> PathBuf {
    state_file
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Which kind of carried-calls file a name is.
#[derive(Debug, PartialEq, Eq)]
enum Kind {
    /// This release's: adoptable when its lock can be taken.
    Locked,
    /// An earlier release's (its writer's, or claimed by another process): never adopted.
    Legacy,
}

fn kind_of(name: &str) -> Option<Kind> {
    if let Some(tag) = name
        .strip_prefix(PREFIX)
        .and_then(|r| r.strip_suffix(".json"))
    {
        return (!tag.is_empty() && tag.bytes().all(|b| b.is_ascii_hexdigit()))
            .then_some(Kind::Locked);
    }
    let rest = name.strip_prefix(LEGACY_PREFIX)?;
    let pid = match rest.split_once(CLAIMED) {
        Some((_, claimer)) => claimer,
        None => {
            let stem = rest.strip_suffix(".json")?;
            stem.split_once('-').map_or(stem, |(pid, _)| pid)
        }
    };
    pid.parse::<u32>().ok().map(|_| Kind::Legacy)
}

/// Opens `path` and takes its lock without waiting; `None` when another process holds it,
/// or when the file was replaced or removed between the open and the lock (its owner is
/// alive: it just wrote a new version).
fn lock_if_free(path: &Path) -> Option<File> {
    let file = File::open(path).ok()?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => return None,
        Err(std::fs::TryLockError::Error(e)) => {
            log::warn!("quota store: cannot lock {}: {e}", path.display());
            return None;
        }
    }
    let (held, now) = (file.metadata().ok()?, std::fs::metadata(path).ok()?);
    (held.ino() == now.ino() && held.dev() == now.dev()).then_some(file)
}

/// A file of a gone process, locked by this one until it is removed.
struct Taken {
    name: String,
    path: PathBuf,
    _lock: File,
}

/// This process's file and what it holds.
pub struct OwnFile {
    path: PathBuf,
    state: Mutex<OwnState>,
}

#[derive(Default)]
struct OwnState {
    /// The lock on the file's current version (`None`: no file), held while it lives.
    _lock: Option<File>,
    /// What the file holds, whole and without the counts read (so that a change of those
    /// alone waits for [`SEEN_EVERY`]).
    written: Vec<u8>,
    owed: Vec<u8>,
    written_at: Option<Instant>,
    /// Files whose content this process took in: named in its file until they are removed.
    absorbed: BTreeSet<String>,
    /// Those files, locked, not removed yet.
    taken: Vec<Taken>,
    /// Earlier releases' files named in a warning already.
    told: BTreeSet<String>,
}

impl OwnFile {
    fn state(&self) -> MutexGuard<'_, OwnState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The files in the folder this process may adopt (this release's, their lock free), locked,
    /// with their content.
    fn adoptable(&self) -> Vec<(Taken, Body)> {
        let Some(Ok(dir)) = self.path.parent().map(std::fs::read_dir) else {
            return Vec::new();
        };
        let mut found = Vec::new();
        for entry in dir.flatten() {
            let path = entry.path();
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            match kind_of(&name) {
                Some(Kind::Locked) if path != self.path => {}
                Some(Kind::Legacy) => {
                    self.tell_legacy(name, &path);
                    continue;
                }
                _ => continue,
            }
            let Some(mut lock) = lock_if_free(&path) else {
                continue;
            };
            let body = read_body(&mut lock, &path);
            found.push((
                Taken {
                    name,
                    path,
                    _lock: lock,
                },
                body,
            ));
        }
        found
    }

    /// Names an earlier release's file in a warning, once per process.
    fn tell_legacy(&self, name: String, path: &Path) {
        if self.state().told.insert(name) {
            log::warn!(
                "quota store: {} is an earlier release's carried-calls file and is not adopted \
                 (a gateway of that release may still write it): once none runs on this \
                 folder, rename it to {PREFIX}<hex digits>.json and the next sync takes it in \
                 (docs/operations.md, carried calls)",
                path.display()
            );
        }
    }

    /// Writes `entries` (or removes the file when there is nothing); `now`: the counts read
    /// too, without waiting for [`SEEN_EVERY`]. Once the file names the files this process took
    /// in, those go. Whether the file holds `entries` (but perhaps older counts read).
    fn write(&self, state: &mut OwnState, entries: Vec<Entry>, now: bool) -> bool {
        let (body, owed) = encode(entries, &state.absorbed);
        let fresh = state.written_at.is_some_and(|at| at.elapsed() < SEEN_EVERY);
        let unchanged = state.written == body || (owed == state.owed && fresh && !now);
        // Unchanged and still there (an operator may have removed it): nothing to write.
        if unchanged && (body.is_empty() || self.path.exists()) && state.taken.is_empty() {
            return true;
        }
        if let Some(folder) = self.path.parent() {
            let _ = std::fs::create_dir_all(folder);
        }
        let done = if body.is_empty() {
            match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(None),
            }
        } else {
            write_locked(&self.path, &body).map(Some)
        };
        match done {
            Ok(lock) => {
                state._lock = lock;
                state.written = body;
                state.owed = owed;
                state.written_at = Some(Instant::now());
                remove_taken(state);
                true
            }
            Err(e) => {
                log::error!(
                    "quota store: carried calls not kept in {} (none is sent to Redis until \
                     they are): {e}",
                    self.path.display()
                );
                false
            }
        }
    }
}

fn entry_of(slot: &Slot, carried: Carried) -> Option<Entry> {
    (!carried.is_empty() || carried.seen > 0).then(|| Entry {
        key: slot.key_id().to_owned(),
        month: slot.month.label(),
        calls: carried.calls,
        returned: carried.returned,
        unsure: carried
            .unsure
            .iter()
            .map(|b| [b.id, b.calls, b.returned])
            .collect(),
        seen: carried.seen,
        epoch: carried.epoch,
    })
}

/// The file's bytes for `entries` and `absorbed`, and the same without the counts read.
fn encode(entries: Vec<Entry>, absorbed: &BTreeSet<String>) -> (Vec<u8>, Vec<u8>) {
    if entries.is_empty() && absorbed.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let owed: Vec<Entry> = entries
        .iter()
        .filter(|e| e.calls > 0 || e.returned > 0 || !e.unsure.is_empty())
        .map(|e| Entry {
            seen: 0,
            epoch: 0,
            ..e.clone()
        })
        .collect();
    let whole = Body::Current {
        entries,
        absorbed: absorbed.clone(),
    };
    (
        serde_json::to_vec(&whole).unwrap_or_default(),
        serde_json::to_vec(&(owed, absorbed)).unwrap_or_default(),
    )
}

/// Writes `body` as `path`'s new version, locked before it is in place; the lock.
fn write_locked(path: &Path, body: &[u8]) -> io::Result<File> {
    use std::io::Write;
    let mut lock = None;
    drg_base::infra::fsutil::replace_with(path, 0o600, |f: &File| -> io::Result<()> {
        let held = f.try_clone()?;
        held.try_lock().map_err(io::Error::from)?;
        lock = Some(held);
        let mut out: &File = f;
        out.write_all(body)
    })
    .map_err(|e| match e {
        drg_base::infra::fsutil::ReplaceError::Fill(e)
        | drg_base::infra::fsutil::ReplaceError::Io(e) => e,
    })?;
    lock.ok_or_else(|| io::Error::other("no lock"))
}

/// Which save of the carried-calls file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Save {
    /// Before a round of the sync's calls leaves: it names them.
    Round,
    /// The sync's own, once a sync: a lease that served no call since the last one keeps its
    /// unused part for the file (idle for a whole sync, not for the moment between a round's
    /// save and this one). At shutdown, the counts read too, without waiting for
    /// [`SEEN_EVERY`].
    Sync { shutting_down: bool },
    /// After files were adopted: the counts read too, at once.
    Adopted,
}

/// A sync round's calls, named in the carried-calls file, not sent yet: put back into their
/// slots when dropped (the sync stopped, or its task was dropped), as calls that never left.
pub(super) struct Unsent(pub(super) Vec<(Arc<Slot>, Carry)>);

impl Drop for Unsent {
    fn drop(&mut self) {
        for (slot, carry) in self.0.drain(..) {
            slot.tally().unsettled(carry, false);
        }
    }
}

impl RedisStore {
    /// Takes what the slots owe Redis into one call per slot and writes the file naming those
    /// calls, before any leaves (see the module documentation); `None` when nothing is owed or
    /// the file could not be written (then everything is back in the slots).
    pub(super) fn named_round(&self, slots: &[Arc<Slot>]) -> Option<Unsent> {
        let round = Unsent(
            slots
                .iter()
                .filter_map(|slot| {
                    let mut tally = slot.tally();
                    tally
                        .owes()
                        .then(|| (slot.clone(), tally.carry(self.next_id())))
                })
                .collect(),
        );
        (!round.0.is_empty() && self.save_carried(slots, Save::Round)).then_some(round)
    }

    /// Keeps the carried calls in `folder` (see the module documentation).
    pub fn with_carried_folder(mut self, folder: PathBuf) -> Self {
        let mut tag = [0u8; 8];
        // Without randomness the tag is the time: it only has to differ from every other
        // file's in the folder.
        if getrandom::fill(&mut tag).is_err() {
            tag = (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64))
            .to_le_bytes();
        }
        self.carried = Some(OwnFile {
            path: folder.join(format!("{PREFIX}{}.json", hex::encode(tag))),
            state: Mutex::default(),
        });
        self
    }

    /// Adopts the files of processes that are gone: their calls join the slots for the next
    /// sync to send, their counts read become floors, and the files go. How many files.
    pub fn adopt_carried(&self) -> usize {
        let Some(own) = &self.carried else { return 0 };
        let found = own.adoptable();
        if found.is_empty() {
            return 0;
        }
        let n = found.len();
        self.take_in(&mut own.state(), found);
        self.save_carried(&self.slots.all(), Save::Adopted);
        n
    }

    /// Takes the found files' content into the slots (except what another file, or this
    /// process, took in already) and names them all as absorbed.
    fn take_in(&self, state: &mut OwnState, found: Vec<(Taken, Body)>) {
        let parts: Vec<(Taken, Vec<Entry>, BTreeSet<String>)> = found
            .into_iter()
            .map(|(taken, body)| {
                let (entries, absorbed) = body.into_parts();
                (taken, entries, absorbed)
            })
            .collect();
        let mut named: BTreeSet<String> = state.absorbed.clone();
        for (_, _, absorbed) in &parts {
            named.extend(absorbed.iter().cloned());
        }
        for (taken, entries, absorbed) in parts {
            if !named.contains(&taken.name) {
                self.restore_entries(entries, &taken.path);
            }
            state.absorbed.insert(taken.name.clone());
            state.absorbed.extend(absorbed);
            state.taken.push(taken);
        }
    }

    /// Takes `entries` (of the file at `path`) into the slots.
    fn restore_entries(&self, entries: Vec<Entry>, path: &Path) {
        let (mut total, mut returned) = (0, 0);
        for e in entries {
            let Some(month) = Month::parse_label(&e.month) else {
                continue;
            };
            let unsure: Vec<Batch> = e
                .unsure
                .iter()
                .map(|[id, calls, returned]| Batch {
                    id: *id,
                    calls: *calls,
                    returned: *returned,
                })
                .collect();
            total += e.calls + unsure.iter().map(|b| b.calls).sum::<u64>();
            returned += e.returned;
            self.slots.get(&e.key, month).tally().restore(Carried {
                calls: e.calls,
                returned: e.returned,
                unsure,
                seen: e.seen,
                epoch: e.epoch,
            });
        }
        if total > 0 || returned > 0 {
            log::info!(
                "quota store: {total} calls counted before the restart and not yet in Redis are \
                 sent, and {returned} leased calls never served are given back, with the next \
                 sync ({})",
                path.display()
            );
        }
    }

    /// Writes what the slots carry and the counts they read (or removes the file when there
    /// is nothing). Whether the file holds what the slots carry (always, when no file is
    /// kept); only then do the slots act on it ([`super::slots::Tally::saved`]).
    pub(super) fn save_carried(&self, slots: &[Arc<Slot>], save: Save) -> bool {
        let Some(own) = &self.carried else {
            return true;
        };
        let mut state = own.state();
        let mut entries = Vec::new();
        let mut savings = Vec::with_capacity(slots.len());
        let keep_idle = matches!(save, Save::Sync { .. });
        for slot in slots {
            let (carried, saving) = slot.tally().for_file(keep_idle);
            entries.extend(entry_of(slot, carried));
            savings.push(saving);
        }
        let now = matches!(
            save,
            Save::Sync {
                shutting_down: true
            } | Save::Adopted
        );
        let done = own.write(&mut state, entries, now);
        for (slot, saving) in slots.iter().zip(savings) {
            slot.tally().saved(saving, done);
        }
        done
    }
}

/// Removes the files this process took in, now that its own file names them; those removed
/// need not be named any longer (the next write leaves them out).
fn remove_taken(state: &mut OwnState) {
    let taken = std::mem::take(&mut state.taken);
    for t in taken {
        match std::fs::remove_file(&t.path) {
            Ok(()) => {
                state.absorbed.remove(&t.name);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                state.absorbed.remove(&t.name);
            }
            Err(e) => {
                log::error!("quota store: {} not removed: {e}", t.path.display());
                state.taken.push(t);
            }
        }
    }
}

/// The content of a locked file. One that does not parse is kept aside (`.bad`), logged, and
/// taken as empty.
fn read_body(file: &mut File, path: &Path) -> Body {
    let mut text = Vec::new();
    if let Err(e) = file.read_to_end(&mut text) {
        log::error!("quota store: {} unreadable: {e}", path.display());
        return Body::Empty;
    }
    match serde_json::from_slice(&text) {
        Ok(body) => body,
        Err(e) => {
            let aside = path.with_extension("json.bad");
            let _ = std::fs::rename(path, &aside);
            log::error!(
                "quota store: {} is not a list of carried calls ({e}); moved to {}",
                path.display(),
                aside.display()
            );
            Body::Empty
        }
    }
}

#[cfg(test)]
mod tests;
