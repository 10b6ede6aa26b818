//! The embedded quota store: lock-free counters in memory, merged into a state file.
//!
//! Each key has one atomic word holding its month and count, so checking and counting is one
//! compare-and-swap: with limit L, exactly L calls pass however many race. Every flush (at least
//! each second, and at shutdown) merges this process's new counts into the state file under a
//! file lock (read, add, write a temp file, fsync, rename), and takes in what other processes on
//! the same file added: a gateway and its successor during a graceful upgrade, or several
//! gateways on one machine, share one count. Loss on a crash is bounded by the flush interval.

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

/// The embedded quota store.
pub struct LocalStore {
    counters: ArcSwap<HashMap<Arc<str>, Arc<Counter>>>,
    /// Serialises growth of `counters` (a new key) and flushes; never taken per request.
    grow: Mutex<()>,
    state_file: Option<PathBuf>,
}

impl LocalStore {
    /// A store that keeps counts in memory only.
    pub fn in_memory() -> Self {
        LocalStore {
            counters: ArcSwap::from_pointee(HashMap::new()),
            grow: Mutex::new(()),
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
        let _g = self.grow.lock().unwrap_or_else(|p| p.into_inner());
        let current = self.counters.load();
        if let Some(c) = current.get(key_id) {
            return c.clone();
        }
        let mut next = HashMap::clone(&current);
        let c = Arc::new(Counter::default());
        next.insert(Arc::from(key_id), c.clone());
        self.counters.store(Arc::new(next));
        c
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
        let _g = self.grow.lock().unwrap_or_else(|p| p.into_inner());
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
        // Keys other processes counted that this one has not seen yet.
        let missing: Vec<_> = file
            .keys
            .iter()
            .filter(|(id, _)| !counters.contains_key(id.as_str()))
            .collect();
        if !missing.is_empty() {
            let mut next = HashMap::clone(&counters);
            for (id, k) in missing {
                next.insert(
                    Arc::from(id.as_str()),
                    Arc::new(Counter::new(pack(k.month.0.index(), k.used))),
                );
            }
            self.counters.store(Arc::new(next));
        }
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

#[cfg(test)]
mod tests {
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
