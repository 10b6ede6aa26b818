//! The embedded quota store: lock-free counters in memory, merged into a state file.
//!
//! Each key has one atomic word holding its month and count, so checking and counting is one
//! compare-and-swap: with limit L, exactly L calls pass however many race. Every flush (at least
//! each second, and at shutdown) merges this process's new counts into the state file under a
//! file lock (read, add, write a temp file, fsync, rename), and takes in what other processes on
//! the same file added: a gateway and its successor during a graceful upgrade, or several
//! gateways on one machine, share one count. Loss on a crash is bounded by the flush interval.
//!
//! The request path never waits on the flusher: a key seen for the first time is added to the
//! counter map by a compare-and-swap on the map, not under a lock the flusher holds while it
//! waits for the state file's lock or the disk; the file's count for such a key is merged in at
//! the next flush (the flusher also publishes counters for keys other processes counted).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Consumed, Month, QuotaError, QuotaStore, Usage};

const COUNT_BITS: u32 = 40;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

fn pack(month: u32, count: u64) -> u64 {
    (u64::from(month) << COUNT_BITS) | count.min(COUNT_MASK)
}

fn unpack(word: u64) -> (u32, u64) {
    ((word >> COUNT_BITS) as u32, word & COUNT_MASK)
}

/// One key's count and how much of it the state file already holds.
#[derive(Debug, Default)]
struct Counter {
    /// Month and count as this process sees them.
    current: AtomicU64,
    /// Month and count last written to / read from the state file.
    synced: AtomicU64,
}

impl Counter {
    fn new(word: u64) -> Self {
        Counter {
            current: AtomicU64::new(word),
            synced: AtomicU64::new(word),
        }
    }

    /// Count in `month` (0 when the word holds an older month).
    fn count_in(word: u64, month: u32) -> (u32, u64) {
        let (m, n) = unpack(word);
        // A clock stepping back keeps counting in the later month.
        let effective = m.max(month);
        (effective, if m == effective { n } else { 0 })
    }
}

/// The state file: per key, its month and count.
#[derive(Debug, Default, Serialize, Deserialize)]
struct StateFile {
    version: u32,
    keys: BTreeMap<String, KeyState>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct KeyState {
    month: MonthLabel,
    used: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MonthLabel(Month);

impl Serialize for MonthLabel {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.label())
    }
}

impl<'de> Deserialize<'de> for MonthLabel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Month::parse_label(&s)
            .map(MonthLabel)
            .ok_or_else(|| serde::de::Error::custom(format!("'{s}' is not a YYYY-MM month")))
    }
}

/// Why the state file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("quota state file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("quota state file {path} is corrupt ({message}); refusing to start rather than reset the counts: fix or move it away")]
    Corrupt { path: PathBuf, message: String },
}

type Counters = HashMap<Arc<str>, Arc<Counter>>;

/// The embedded quota store.
pub struct LocalStore {
    /// Grown copy-on-write by compare-and-swap (by requests for a new key, by the flusher for
    /// keys other processes counted); never replaced wholesale, so no counter is lost.
    counters: ArcSwap<Counters>,
    /// Serialises flushes; never taken on the request path.
    flushing: Mutex<()>,
    state_file: Option<PathBuf>,
}

impl LocalStore {
    /// A store that keeps counts in memory only.
    pub fn in_memory() -> Self {
        LocalStore {
            counters: ArcSwap::from_pointee(HashMap::new()),
            flushing: Mutex::new(()),
            state_file: None,
        }
    }

    /// A store persisted to `path`, loading what it holds. A file that exists but cannot be
    /// read is an error: counts are never silently reset.
    pub fn open(path: &Path) -> Result<Self, StateError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StateError::Io {
                path: path.to_owned(),
                source,
            })?;
        }
        let store = LocalStore {
            state_file: Some(path.to_owned()),
            ..LocalStore::in_memory()
        };
        let state = read_state(path)?;
        let map: HashMap<Arc<str>, Arc<Counter>> = state
            .keys
            .into_iter()
            .map(|(id, k)| {
                (
                    Arc::from(id),
                    Arc::new(Counter::new(pack(k.month.0.index(), k.used))),
                )
            })
            .collect();
        store.counters.store(Arc::new(map));
        Ok(store)
    }

    fn counter(&self, key_id: &str) -> Arc<Counter> {
        if let Some(c) = self.counters.load().get(key_id) {
            return c.clone();
        }
        let made = Arc::new(Counter::default());
        // Set by each attempt: the last one is the one `add_counters` published (or found the
        // key already there).
        let mut inserted = false;
        self.add_counters(|current| {
            inserted = !current.contains_key(key_id);
            if inserted {
                vec![(Arc::from(key_id), made.clone())]
            } else {
                Vec::new()
            }
        });
        if inserted {
            return made;
        }
        // Keys are never removed from the map, so the one another thread added is still there.
        self.counters.load().get(key_id).cloned().unwrap_or(made)
    }

    /// Adds the counters `missing` picks from the current map, without a lock: copy, insert,
    /// publish unless the map changed meanwhile, else pick again from the newer map.
    fn add_counters(&self, mut missing: impl FnMut(&Counters) -> Vec<(Arc<str>, Arc<Counter>)>) {
        let mut current = self.counters.load_full();
        loop {
            let add = missing(&current);
            if add.is_empty() {
                return;
            }
            let mut next = Counters::clone(&current);
            next.extend(add);
            let previous = self.counters.compare_and_swap(&current, Arc::new(next));
            if Arc::ptr_eq(&previous, &current) {
                return;
            }
            current = arc_swap::Guard::into_inner(previous);
        }
    }

    fn try_consume(&self, key_id: &str, limit: u64, now: DateTime<Utc>) -> Consumed {
        let month = Month::containing(now);
        let counter = self.counter(key_id);
        let mut word = counter.current.load(Ordering::Acquire);
        loop {
            let (m, n) = Counter::count_in(word, month.index());
            let usage = Usage {
                used: n,
                limit,
                month: Month::from_index(m),
                now,
            };
            if n >= limit {
                return Consumed::Exceeded(usage);
            }
            match counter.current.compare_exchange_weak(
                word,
                pack(m, n + 1),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Consumed::Allowed(Usage {
                        used: n + 1,
                        ..usage
                    })
                }
                Err(actual) => word = actual,
            }
        }
    }

    fn read_usage(&self, key_id: &str, limit: u64, now: DateTime<Utc>) -> Usage {
        let month = Month::containing(now);
        let word = self
            .counters
            .load()
            .get(key_id)
            .map_or(0, |c| c.current.load(Ordering::Acquire));
        let (m, n) = Counter::count_in(word, month.index());
        Usage {
            used: n,
            limit,
            month: Month::from_index(m),
            now,
        }
    }

    /// Merges this process's new counts into the state file and takes in other processes'.
    /// Blocking I/O: call it off the request threads.
    pub fn flush(&self) -> Result<(), StateError> {
        let Some(path) = &self.state_file else {
            return Ok(());
        };
        let io = |source| StateError::Io {
            path: path.clone(),
            source,
        };
        let _g = self.flushing.lock().unwrap_or_else(|p| p.into_inner());
        let lock = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.with_extension("lock"))
            .map_err(io)?;
        lock.lock().map_err(io)?;
        let mut file = read_state(path)?;
        let counters = self.counters.load_full();
        let mut changed = false;
        let mut merged: Vec<(Arc<Counter>, u64, u64)> = Vec::new();
        for (id, counter) in counters.iter() {
            let seen = counter.current.load(Ordering::Acquire);
            let (cm, n) = unpack(seen);
            let (sm, sn) = unpack(counter.synced.load(Ordering::Acquire));
            let delta = if sm == cm { n.saturating_sub(sn) } else { n };
            let (fm, fc) = file
                .keys
                .get(&**id)
                .map_or((0, 0), |k| (k.month.0.index(), k.used));
            let month = cm.max(fm);
            let total = if fm == month { fc } else { 0 } + if cm == month { delta } else { 0 };
            if delta > 0 || fm != month {
                changed = true;
                file.keys.insert(
                    id.to_string(),
                    KeyState {
                        month: MonthLabel(Month::from_index(month)),
                        used: total,
                    },
                );
            }
            merged.push((counter.clone(), seen, pack(month, total)));
        }
        if changed {
            file.version = 1;
            write_atomic(path, &file).map_err(io)?;
        }
        // Local views become the file's total plus whatever was counted during the flush.
        for (counter, seen, total) in merged {
            let mut word = counter.current.load(Ordering::Acquire);
            loop {
                let (wm, wn) = unpack(word);
                let (sm, sn) = unpack(seen);
                let (tm, tn) = unpack(total);
                let next = if wm == sm {
                    pack(tm, tn + (wn - sn))
                } else {
                    // Rolled over during the flush: the new month's count stands.
                    word
                };
                match counter.current.compare_exchange_weak(
                    word,
                    next,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break,
                    Err(actual) => word = actual,
                }
            }
            counter.synced.store(total, Ordering::Release);
        }
        // Keys other processes counted that this one has not seen yet. A key a request added
        // since `counters` was loaded keeps its counter (its file count joins at the next flush).
        self.add_counters(|current| {
            file.keys
                .iter()
                .filter(|(id, _)| !current.contains_key(id.as_str()))
                .map(|(id, k)| {
                    (
                        Arc::from(id.as_str()),
                        Arc::new(Counter::new(pack(k.month.0.index(), k.used))),
                    )
                })
                .collect()
        });
        drop(lock);
        Ok(())
    }
}

fn read_state(path: &Path) -> Result<StateFile, StateError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(StateFile::default()),
        Err(source) => {
            return Err(StateError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    serde_json::from_str(&text).map_err(|e| StateError::Corrupt {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

fn write_atomic(path: &Path, state: &StateFile) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::File::create(&tmp)?;
        serde_json::to_writer_pretty(&mut f, state)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[async_trait]
impl QuotaStore for LocalStore {
    async fn consume(
        &self,
        key_id: &str,
        limit: u64,
        now: DateTime<Utc>,
    ) -> Result<Consumed, QuotaError> {
        Ok(self.try_consume(key_id, limit, now))
    }

    async fn usage(
        &self,
        key_id: &str,
        limit: u64,
        now: DateTime<Utc>,
    ) -> Result<Usage, QuotaError> {
        Ok(self.read_usage(key_id, limit, now))
    }

    fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "store": "local",
            "state_file": self.state_file.as_ref().map(|p| p.display().to_string()),
        })
    }
}

/// Parses state-file text as `open` does: each key's month and count (the fuzz target's entry).
pub fn parse_state(text: &str) -> Result<Vec<(String, Month, u64)>, serde_json::Error> {
    let file: StateFile = serde_json::from_str(text)?;
    Ok(file
        .keys
        .into_iter()
        .map(|(id, k)| (id, k.month.0, k.used))
        .collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_state_file_with_an_impossible_year_is_refused() {
        // Found by fuzzing: this year overflowed the month index when the file was read.
        let text = r#"{"version":1,"keys":{"k":{"month":"580100730-2","used":42}}}"#;
        assert!(super::parse_state(text).is_err());
        let ok = r#"{"version":1,"keys":{"k":{"month":"2026-02","used":42}}}"#;
        assert_eq!(super::parse_state(ok).unwrap().len(), 1);
    }

    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn used(c: Consumed) -> Result<u64, u64> {
        match c {
            Consumed::Allowed(u) => Ok(u.used),
            Consumed::Exceeded(u) => Err(u.used),
        }
    }

    #[test]
    fn counts_up_to_the_limit_then_refuses() {
        let s = LocalStore::in_memory();
        let now = t("2026-11-10T00:00:00Z");
        assert_eq!(used(s.try_consume("k", 2, now)), Ok(1));
        assert_eq!(used(s.try_consume("k", 2, now)), Ok(2));
        assert_eq!(used(s.try_consume("k", 2, now)), Err(2));
        assert_eq!(s.read_usage("k", 2, now).used, 2);
        assert_eq!(s.read_usage("other", 2, now).used, 0);
    }

    #[test]
    fn a_new_month_starts_from_zero() {
        let s = LocalStore::in_memory();
        s.try_consume("k", 1, t("2026-11-30T23:59:59Z"));
        assert_eq!(
            used(s.try_consume("k", 1, t("2026-11-30T23:59:59Z"))),
            Err(1)
        );
        let dec = t("2026-12-01T00:00:00Z");
        assert_eq!(s.read_usage("k", 1, dec).used, 0);
        assert_eq!(used(s.try_consume("k", 1, dec)), Ok(1));
        // A clock stepping back does not reopen the old month's quota.
        assert_eq!(
            used(s.try_consume("k", 1, t("2026-11-30T23:59:59Z"))),
            Err(1)
        );
    }

    #[test]
    fn exactly_the_limit_passes_under_contention() {
        let s = Arc::new(LocalStore::in_memory());
        let now = t("2026-11-10T00:00:00Z");
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let s = s.clone();
                std::thread::spawn(move || {
                    (0..1000)
                        .filter(|_| used(s.try_consume("k", 2500, now)).is_ok())
                        .count()
                })
            })
            .collect();
        let total: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(total, 2500);
    }

    #[test]
    fn state_survives_a_restart_and_processes_merge() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/quota.json");
        let now = t("2026-11-10T00:00:00Z");
        let a = LocalStore::open(&path).unwrap();
        for _ in 0..3 {
            a.try_consume("k", 100, now);
        }
        a.flush().unwrap();
        // A second process on the same file (e.g. the successor in a graceful upgrade).
        let b = LocalStore::open(&path).unwrap();
        assert_eq!(b.read_usage("k", 100, now).used, 3);
        b.try_consume("k", 100, now);
        a.try_consume("k", 100, now);
        b.flush().unwrap();
        a.flush().unwrap();
        b.flush().unwrap();
        assert_eq!(a.read_usage("k", 100, now).used, 5);
        assert_eq!(b.read_usage("k", 100, now).used, 5);
        let c = LocalStore::open(&path).unwrap();
        assert_eq!(c.read_usage("k", 100, now).used, 5);
    }

    #[test]
    fn a_new_key_is_counted_while_a_flush_waits_for_the_state_file_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("quota.json");
        let now = t("2026-11-10T00:00:00Z");
        let store = Arc::new(LocalStore::open(&path).unwrap());
        store.try_consume("old", 100, now);
        // Another process holds the state file's lock.
        let other = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.with_extension("lock"))
            .unwrap();
        other.lock().unwrap();
        let flusher = {
            let store = store.clone();
            std::thread::spawn(move || store.flush())
        };
        // The flush has begun (and cannot finish while `other` holds the lock).
        while store.flushing.try_lock().is_ok() {
            std::thread::yield_now();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let store = store.clone();
            std::thread::spawn(move || {
                let first = used(store.try_consume("new", 100, now));
                let second = used(store.try_consume("new", 100, now));
                let _ = tx.send((first, second));
            });
        }
        // Not a speed bound: only how long to wait before calling it a deadlock.
        let counted = rx.recv_timeout(std::time::Duration::from_secs(60));
        other.unlock().unwrap();
        assert_eq!(
            counted.expect("the first call of a new key waited for the flush"),
            (Ok(1), Ok(2))
        );
        flusher.join().unwrap().unwrap();
        // The flush that ran meanwhile must not have dropped the new key's counter.
        store.try_consume("new", 100, now);
        store.flush().unwrap();
        let reopened = LocalStore::open(&path).unwrap();
        assert_eq!(reopened.read_usage("new", 100, now).used, 3);
        assert_eq!(reopened.read_usage("old", 100, now).used, 1);
    }

    #[test]
    fn a_key_counted_elsewhere_and_new_here_merges_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("quota.json");
        let now = t("2026-11-10T00:00:00Z");
        let a = LocalStore::open(&path).unwrap();
        let b = LocalStore::open(&path).unwrap();
        // `b` counts a key `a` has never seen, then `a` sees it first-hand before any flush.
        for _ in 0..4 {
            b.try_consume("k", 100, now);
        }
        b.flush().unwrap();
        assert_eq!(used(a.try_consume("k", 100, now)), Ok(1));
        a.flush().unwrap();
        assert_eq!(a.read_usage("k", 100, now).used, 5);
        b.flush().unwrap();
        assert_eq!(b.read_usage("k", 100, now).used, 5);
    }

    #[test]
    fn a_corrupt_state_file_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("quota.json");
        std::fs::write(&path, "{ not json").unwrap();
        assert!(matches!(
            LocalStore::open(&path),
            Err(StateError::Corrupt { .. })
        ));
    }
}
