//! The embedded quota store: per-key counters in a memory-mapped state file, updated in place.
//!
//! The state file is a fixed header and a fixed table of slots, mapped shared by every gateway
//! that opens it. A slot holds a key id and one word with the key's month and count; a call is
//! checked and counted by one compare-and-swap on that word, directly in the mapping. So with
//! limit L exactly L calls pass however many race, in one process or in several (a gateway and
//! its successor during a graceful upgrade, or several gateways on one host share one count, with
//! no lock and no merge). What a process writes lands in the kernel's page cache at once, so a
//! crash (even `kill -9`) loses no count; a periodic `msync` (every `flush_interval_ms`, off the
//! request path, and at shutdown) bounds what a power loss can take.
//!
//! A key's slot is found by open addressing on a hash of its id and claimed once, across
//! processes, by a compare-and-swap on the slot's state word (free -> claiming -> ready). Slots
//! are never freed, so a search that meets a free slot knows the key has none yet. A search that
//! meets a claim in progress waits for it asynchronously (the request's task sleeps, the Tokio
//! worker serves others). A call of a key that gets no slot (the table is full, or a claim never
//! completes) is refused, not let through uncounted: the gateway answers 503, which callers
//! treat as fail-open; logged, and counted in `status` and the metrics.
//!
//! The file is only ever created whole: initialised in a temp file, synced, then renamed into
//! place; a file that does not check out (magic, version, size, slots) stops the start rather
//! than resetting counts. A state file in the format before this one (JSON) is imported once.
//!
//! Here the store and its counting; the slot table and its search in `table`, the state file in
//! `file`, the legacy JSON format in `legacy`.

mod file;
pub mod legacy;
pub(crate) mod table;

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use memmap2::MmapOptions;

use super::{Consumed, Month, QuotaError, QuotaStore, Usage};
use table::{KeyWords, NoSlot, Table, MAX_KEY_ID_LEN, S_COUNT};

const COUNT_BITS: u32 = 40;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// The largest monthly limit this store counts (2^40 - 1): the count shares a word with the
/// month, and a limit it can never reach would mean unlimited. The config refuses larger ones
/// (`gateway.access.plans.*.monthly_limit` under `quota.store: local`).
pub const MAX_MONTHLY_LIMIT: u64 = COUNT_MASK;

fn pack(month: u32, count: u64) -> u64 {
    (u64::from(month) << COUNT_BITS) | count.min(COUNT_MASK)
}

fn unpack(word: u64) -> (u32, u64) {
    ((word >> COUNT_BITS) as u32, word & COUNT_MASK)
}

/// Month and count of `word` as seen in `month` (count 0 when the word holds an older month).
fn count_in(word: u64, month: u32) -> (u32, u64) {
    let (m, n) = unpack(word);
    // A clock stepping back keeps counting in the later month.
    let effective = m.max(month);
    (effective, if m == effective { n } else { 0 })
}

/// The smallest and largest slot table (`gateway.quota.slots`): 64 bytes each, so up to 1 GiB.
pub const MIN_SLOTS: u32 = 1;
pub const MAX_SLOTS: u32 = 1 << 24;
pub const DEFAULT_SLOTS: u32 = 65_536;

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
    #[error("quota state file {path} cannot be imported: {message}")]
    Import { path: PathBuf, message: String },
}

/// The embedded quota store.
pub struct LocalStore {
    table: Table,
    /// The state file, when counts persist (not for `in_memory`).
    state_file: Option<PathBuf>,
    /// Holds a shared flock on the state file while it is mapped.
    _file: Option<File>,
    /// Calls refused for want of a slot (any reason), reported in `status`.
    refused: AtomicU64,
    /// Of those, calls refused because every slot was taken.
    slots_full: AtomicU64,
    /// Per-project rates: in this process (the counters file holds months, not instants).
    rates: crate::rate::Limiter,
}

impl LocalStore {
    /// A store that keeps counts in memory only.
    pub fn in_memory() -> Self {
        LocalStore::anonymous(DEFAULT_SLOTS as usize)
    }

    fn anonymous(slots: usize) -> Self {
        let map = MmapOptions::new()
            .len(Table::bytes(slots))
            .map_anon()
            .expect("anonymous memory for the quota table");
        let table = Table {
            map: map.into(),
            slots,
        };
        table.init_header();
        LocalStore {
            table,
            state_file: None,
            _file: None,
            refused: AtomicU64::new(0),
            slots_full: AtomicU64::new(0),
            rates: Default::default(),
        }
    }

    /// Counts one call of `key_id`, whose slot search came to `slot`.
    fn settle(
        &self,
        key_id: &str,
        slot: Result<usize, NoSlot>,
        limit: u64,
        calls: u64,
        now: DateTime<Utc>,
    ) -> Result<Consumed, QuotaError> {
        match slot {
            Ok(i) => Ok(self.count(i, limit, calls, now)),
            Err(why) => Err(self.refuse(key_id, why)),
        }
    }

    /// Checks and counts `calls` calls (at least one) in slot `i`, all or none: one
    /// compare-and-swap on its count word.
    fn count(&self, i: usize, limit: u64, calls: u64, now: DateTime<Utc>) -> Consumed {
        let calls = calls.max(1);
        let month = Month::containing(now);
        // The config refuses larger limits; should one come anyway, the count stops at the
        // largest the word holds instead of never reaching the limit (unlimited).
        let cap = limit.min(MAX_MONTHLY_LIMIT);
        let count = &self.table.slot(i)[S_COUNT];
        let mut word = count.load(Ordering::Acquire);
        loop {
            let (m, n) = count_in(word, month.index());
            let usage = Usage {
                used: n,
                limit,
                month: Month::from_index(m),
                now,
            };
            if n.saturating_add(calls) > cap {
                return Consumed::Exceeded(usage);
            }
            match count.compare_exchange_weak(
                word,
                pack(m, n + calls),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Consumed::Allowed(Usage {
                        used: n + calls,
                        ..usage
                    })
                }
                Err(actual) => word = actual,
            }
        }
    }

    /// A call the store cannot count is refused (the gateway answers 503, which callers treat
    /// as fail-open), never let through uncounted: a full table would otherwise give every new
    /// project unlimited calls. Counted in `status`; a full table is logged at WARN once (the
    /// metrics carry the rest), other reasons at the 1st, 2nd, 4th, 8th... such call.
    fn refuse(&self, key_id: &str, why: NoSlot) -> QuotaError {
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        if why == NoSlot::Full {
            if self.slots_full.fetch_add(1, Ordering::Relaxed) == 0 {
                log::warn!(
                    "quota: all {} slots of the quota table are taken: calls of projects without a slot (first: '{key_id}') are refused with 503 (gateway.quota.slots applies when the state file is created; see drg_quota_slots_full_total)",
                    self.table.slots
                );
            }
        } else if n.is_power_of_two() {
            let reason = match why {
                NoSlot::Stuck | NoSlot::Busy { .. } => "a claim of its slot never completed".into(),
                _ => format!("the key id is not 1 to {MAX_KEY_ID_LEN} bytes"),
            };
            log::error!(
                "quota: a call of key '{key_id}' is refused (503): {reason} ({n} calls refused for want of a slot so far)"
            );
        }
        QuotaError(format!("no quota slot for key '{key_id}'"))
    }

    /// The usage in slot `slot` (none: the key has not been counted yet).
    fn usage_in(&self, slot: Option<usize>, limit: u64, now: DateTime<Utc>) -> Usage {
        let month = Month::containing(now);
        let word = slot.map_or(0, |i| self.table.slot(i)[S_COUNT].load(Ordering::Acquire));
        let (m, n) = count_in(word, month.index());
        Usage {
            used: n,
            limit,
            month: Month::from_index(m),
            now,
        }
    }

    /// [`QuotaStore::consume`] on the calling thread (waits on a claim by sleeping it).
    #[cfg(test)]
    fn try_consume(
        &self,
        key_id: &str,
        limit: u64,
        now: DateTime<Utc>,
    ) -> Result<Consumed, QuotaError> {
        let slot = KeyWords::new(key_id)
            .ok_or(NoSlot::BadId)
            .and_then(|id| self.table.find_blocking(&id, true));
        self.settle(key_id, slot, limit, 1, now)
    }

    /// [`QuotaStore::usage`] on the calling thread.
    #[cfg(test)]
    fn read_usage(&self, key_id: &str, limit: u64, now: DateTime<Utc>) -> Usage {
        let slot = KeyWords::new(key_id).and_then(|id| self.table.find_blocking(&id, false).ok());
        self.usage_in(slot, limit, now)
    }

    /// Writes the counts through to the disk (`msync`): what a power loss can take is bounded
    /// by how often this runs. A crash of the process needs no flush. Blocking I/O: call it off
    /// the request threads.
    pub fn flush(&self) -> Result<(), StateError> {
        let Some(path) = &self.state_file else {
            return Ok(());
        };
        self.table.map.flush().map_err(|source| StateError::Io {
            path: path.clone(),
            source,
        })
    }
}

#[async_trait]
impl QuotaStore for LocalStore {
    fn consume_now(
        &self,
        key_id: &str,
        limit: u64,
        calls: u64,
        now: DateTime<Utc>,
    ) -> Option<Result<Consumed, QuotaError>> {
        let slot = match KeyWords::new(key_id) {
            Some(id) => match self.table.find(&id, true) {
                // Another thread or process is claiming the slot: `consume_n` waits for it.
                Err(NoSlot::Busy { .. }) => return None,
                found => found,
            },
            None => Err(NoSlot::BadId),
        };
        Some(self.settle(key_id, slot, limit, calls, now))
    }

    async fn consume_n(
        &self,
        key_id: &str,
        limit: u64,
        calls: u64,
        now: DateTime<Utc>,
    ) -> Result<Consumed, QuotaError> {
        let slot = match KeyWords::new(key_id) {
            Some(id) => self.table.find_waiting(&id, true).await,
            None => Err(NoSlot::BadId),
        };
        self.settle(key_id, slot, limit, calls, now)
    }

    async fn usage(
        &self,
        key_id: &str,
        limit: u64,
        now: DateTime<Utc>,
    ) -> Result<Usage, QuotaError> {
        let slot = match KeyWords::new(key_id) {
            Some(id) => self.table.find_waiting(&id, false).await.ok(),
            None => None,
        };
        Ok(self.usage_in(slot, limit, now))
    }

    async fn take_rate_n(
        &self,
        project: &std::sync::Arc<str>,
        rate: crate::rate::RateConfig,
        calls: u64,
    ) -> Result<crate::rate::RateStanding, QuotaError> {
        Ok(self.rates.check_n(project, rate, calls))
    }

    async fn give_back_rate_n(
        &self,
        project: &std::sync::Arc<str>,
        rate: crate::rate::RateConfig,
        calls: u64,
    ) -> Result<crate::rate::RateStanding, QuotaError> {
        Ok(self.rates.give_back_n(project, rate, calls))
    }

    fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "store": "local",
            "state_file": self.state_file.as_ref().map(|p| p.display().to_string()),
            "slots": self.table.slots,
            "slots_used": self.table.used_slots(),
            "refused_calls": self.refused.load(Ordering::Relaxed),
            "slots_full_calls": self.slots_full.load(Ordering::Relaxed),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::file::check_slots;
    use super::legacy::parse_state;
    use super::table::*;
    use super::*;
    use std::collections::BTreeMap;
    use std::path::Path;
    use std::sync::Arc;

    fn t(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    fn used(c: Result<Consumed, QuotaError>) -> Result<u64, u64> {
        match c.expect("counted") {
            Consumed::Allowed(u) => Ok(u.used),
            Consumed::Exceeded(u) => Err(u.used),
        }
    }

    const NOW: &str = "2026-11-10T00:00:00Z";

    #[test]
    fn a_state_file_with_an_impossible_year_is_refused() {
        // Found by fuzzing: this year overflowed the month index when the file was read.
        let text = r#"{"version":1,"keys":{"k":{"month":"580100730-2","used":42}}}"#;
        assert!(parse_state(text).is_err());
        let ok = r#"{"version":1,"keys":{"k":{"month":"2026-02","used":42}}}"#;
        assert_eq!(parse_state(ok).unwrap().len(), 1);
    }

    #[test]
    fn counts_up_to_the_limit_then_refuses() {
        let s = LocalStore::in_memory();
        let now = t(NOW);
        assert_eq!(used(s.try_consume("k", 2, now)), Ok(1));
        assert_eq!(used(s.try_consume("k", 2, now)), Ok(2));
        assert_eq!(used(s.try_consume("k", 2, now)), Err(2));
        assert_eq!(s.read_usage("k", 2, now).used, 2);
        assert_eq!(s.read_usage("other", 2, now).used, 0);
    }

    #[tokio::test]
    async fn a_batch_counts_whole_or_not_at_all() {
        let s = LocalStore::in_memory();
        let now = t(NOW);
        assert_eq!(used(s.consume_n("k", 10, 6, now).await), Ok(6));
        assert_eq!(used(s.consume_n("k", 10, 5, now).await), Err(6));
        assert_eq!(
            s.read_usage("k", 10, now).used,
            6,
            "the refused batch counted nothing"
        );
        assert_eq!(used(s.consume_n("k", 10, 4, now).await), Ok(10));
    }

    #[test]
    fn a_new_month_starts_from_zero() {
        let s = LocalStore::in_memory();
        s.try_consume("k", 1, t("2026-11-30T23:59:59Z")).unwrap();
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
        assert_eq!(race(&[s], 2500), 2500);
    }

    /// 8 threads, spread over `stores`, each trying 1000 calls of key `k` with `limit`; how
    /// many passed.
    fn race(stores: &[Arc<LocalStore>], limit: u64) -> usize {
        let now = t(NOW);
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let s = stores[i % stores.len()].clone();
                std::thread::spawn(move || {
                    (0..1000)
                        .filter(|_| used(s.try_consume("k", limit, now)).is_ok())
                        .count()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    }

    #[test]
    fn threads_claiming_the_same_new_keys_get_one_slot_each() {
        // A small table so the keys collide and probe past each other's slots.
        let s = Arc::new(LocalStore::anonymous(64));
        let now = t(NOW);
        let keys: Vec<String> = (0..48).map(|i| format!("key-{i}")).collect();
        let start = Arc::new(std::sync::Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (s, keys, start) = (s.clone(), keys.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for _ in 0..10 {
                        for k in &keys {
                            assert!(used(s.try_consume(k, u64::MAX >> 30, now)).is_ok());
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        for k in &keys {
            assert_eq!(s.read_usage(k, 1000, now).used, 80, "{k}");
        }
        assert_eq!(s.table.used_slots(), keys.len());
        check_slots(&s.table).unwrap();
        assert_eq!(s.refused.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn two_stores_on_one_file_share_one_count_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/quota.counters");
        let now = t(NOW);
        let a = Arc::new(LocalStore::open(&path, 1024).unwrap());
        let b = Arc::new(LocalStore::open(&path, 1024).unwrap());
        assert_eq!(race(&[a.clone(), b.clone()], 3001), 3001);
        assert_eq!(a.read_usage("k", 3001, now).used, 3001);
        assert_eq!(b.read_usage("k", 3001, now).used, 3001);
        // A key one store claims is counted by the other at once, no flush in between.
        assert_eq!(used(a.try_consume("new", 10, now)), Ok(1));
        assert_eq!(used(b.try_consume("new", 10, now)), Ok(2));
    }

    #[test]
    fn the_counters_file_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("quota.counters");
        LocalStore::open(&path, 64).unwrap();
        for file in [path.clone(), path.with_extension("lock")] {
            let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", file.display());
        }
    }

    #[test]
    fn counts_survive_a_reopen_without_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("quota.counters");
        let now = t(NOW);
        {
            let s = LocalStore::open(&path, 16).unwrap();
            for _ in 0..7 {
                s.try_consume("k", 100, now).unwrap();
            }
            // Dropped unflushed, like a killed process: the page cache holds the counts.
        }
        let s = LocalStore::open(&path, 16).unwrap();
        assert_eq!(s.read_usage("k", 100, now).used, 7);
        s.flush().unwrap();
        // The file keeps the slot count it was created with.
        let s = LocalStore::open(&path, 99).unwrap();
        assert_eq!(s.table.slots, 16);
        assert_eq!(s.read_usage("k", 100, now).used, 7);
    }

    #[test]
    fn a_full_table_refuses_calls_of_keys_without_a_slot() {
        let s = LocalStore::anonymous(2);
        let now = t(NOW);
        assert_eq!(used(s.try_consume("a", 5, now)), Ok(1));
        assert_eq!(used(s.try_consume("b", 5, now)), Ok(1));
        assert!(s.try_consume("c", 5, now).is_err());
        assert!(s.try_consume("c", 5, now).is_err());
        assert_eq!(s.read_usage("c", 5, now).used, 0);
        // Keys with a slot keep counting.
        assert_eq!(used(s.try_consume("a", 5, now)), Ok(2));
        let status = s.status();
        assert_eq!(
            (&status["refused_calls"], &status["slots_full_calls"]),
            (&2.into(), &2.into())
        );
        assert_eq!(
            (&status["slots"], &status["slots_used"]),
            (&2.into(), &2.into())
        );
        let long = "x".repeat(MAX_KEY_ID_LEN + 1);
        assert!(s.try_consume(&long, 5, now).is_err());
        assert_eq!(s.status()["refused_calls"], 3);
        assert_eq!(s.status()["slots_full_calls"], 2, "not for want of a slot");
        assert!(
            s.try_consume(&"y".repeat(MAX_KEY_ID_LEN), 5, now).is_err(),
            "the longest id fits a slot, but the table is full"
        );
        assert_eq!(s.status()["refused_calls"], 4);
    }

    #[test]
    fn a_limit_beyond_the_count_word_is_not_unlimited() {
        let s = LocalStore::anonymous(4);
        let now = t(NOW);
        let i = s
            .table
            .find_blocking(&KeyWords::new("k").unwrap(), true)
            .unwrap();
        s.table.slot(i)[S_COUNT].store(
            pack(Month::containing(now).index(), MAX_MONTHLY_LIMIT - 1),
            Ordering::Relaxed,
        );
        assert_eq!(
            used(s.try_consume("k", u64::MAX, now)),
            Ok(MAX_MONTHLY_LIMIT)
        );
        assert_eq!(
            used(s.try_consume("k", u64::MAX, now)),
            Err(MAX_MONTHLY_LIMIT)
        );
    }

    #[test]
    fn a_claim_in_progress_is_waited_on_without_blocking_the_worker() {
        // One slot, claimed by a live process (this one) that does not complete the claim.
        let s = Arc::new(LocalStore::anonymous(1));
        let now = t(NOW);
        s.table.slot(0)[S_STATE].store(claiming(std::process::id()), Ordering::Release);
        // A single-threaded runtime: a wait that blocked its thread would keep every other task
        // from running until it gave up (and refused the call).
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let store = s.clone();
            let call =
                tokio::spawn(async move { crate::quota::consume(&*store, "k", 5, 1, now).await });
            // Let the call run until it waits on the claim.
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            assert!(!call.is_finished(), "the call waits on the claim");
            // This task runs meanwhile: the claimer gives the slot up.
            s.table.slot(0)[S_STATE].store(FREE, Ordering::Release);
            assert_eq!(used(call.await.unwrap()), Ok(1));
        });
    }

    #[test]
    fn the_keys_file_refuses_an_id_longer_than_a_slot_holds() {
        let plans: BTreeMap<String, u64> = [("free".to_owned(), 100)].into();
        let row = |id: &str| {
            format!(
                "keys:\n  - {{ id: {id}, sha256: {}, plan: free }}\n",
                "0".repeat(64)
            )
        };
        let fits = "a".repeat(MAX_KEY_ID_LEN);
        assert!(crate::keys::parse_keys(&row(&fits), "k", &plans).is_ok());
        let err = crate::keys::parse_keys(&row(&format!("{fits}b")), "k", &plans)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("longer than 48"), "{err}");
    }

    /// The pid of a process that has exited.
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn a_claim_left_by_a_killed_process_is_undone() {
        let now = t(NOW);
        // Waiting on the claim: after a while its claimer is found dead and the slot freed.
        let s = LocalStore::anonymous(1);
        s.table.slot(0)[S_STATE].store(claiming(dead_pid()), Ordering::Release);
        assert_eq!(used(s.try_consume("k", 5, now)), Ok(1));
        // Opening the file: such claims are undone before any request.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("quota.counters");
        let s = LocalStore::open(&path, 1).unwrap();
        s.table.slot(0)[S_STATE].store(claiming(dead_pid()), Ordering::Release);
        s.flush().unwrap();
        drop(s);
        let s = LocalStore::open(&path, 1).unwrap();
        assert_eq!(s.table.used_slots(), 0);
        assert_eq!(used(s.try_consume("k", 5, now)), Ok(1));
    }

    fn corrupt(path: &Path) -> String {
        match LocalStore::open(path, 16) {
            Err(e @ StateError::Corrupt { .. }) => e.to_string(),
            Err(e) => panic!("not refused as corrupt: {e}"),
            Ok(_) => panic!("a corrupt state file was opened"),
        }
    }

    #[test]
    fn a_state_file_that_does_not_check_out_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("quota.counters");
        let now = t(NOW);
        {
            let s = LocalStore::open(&path, 16).unwrap();
            s.try_consume("k", 100, now).unwrap();
        }
        let good = std::fs::read(&path).unwrap();
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            std::fs::write(&path, b).unwrap();
            corrupt(&path)
        };
        assert!(with(&|b| b[..8].copy_from_slice(b"NOTQUOTA")).contains("wrong magic"));
        assert!(with(&|b| b[8] = 9).contains("format version 9"));
        assert!(with(&|b| b.truncate(good.len() - 64)).contains("slots take"));
        assert!(with(&|b| b.truncate(10)).contains("shorter than its header"));
        assert!(with(&|b| b.clear()).contains("shorter than its header"));
        // A slot with a state no gateway writes, or an id that is not one.
        let slot = |i: usize| (HEADER_WORDS + i * SLOT_WORDS) * 8;
        let used_slot = (0..16).find(|&i| good[slot(i)] == READY as u8).unwrap();
        assert!(with(&|b| b[slot(used_slot)] = 7).contains("unknown state"));
        assert!(with(&|b| b[slot(used_slot) + S_ID * 8] = 0).contains("no valid key id"));
        // Left as it was, it opens with its count.
        std::fs::write(&path, &good).unwrap();
        let s = LocalStore::open(&path, 16).unwrap();
        assert_eq!(s.read_usage("k", 100, now).used, 1);
    }

    #[test]
    fn a_corrupt_legacy_state_file_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("quota.json");
        std::fs::write(&path, "{ not json").unwrap();
        corrupt(&path);
        assert!(path.exists(), "the legacy file is left alone");
        assert!(!dir.path().join("quota.counters").exists());
    }

    const LEGACY: &str = r#"{"version":1,"keys":{"a":{"month":"2026-11","used":41},"b":{"month":"2026-10","used":7}}}"#;

    #[test]
    fn a_legacy_json_state_file_is_imported_once() {
        let dir = tempfile::tempdir().unwrap();
        let legacy = dir.path().join("quota.json");
        std::fs::write(&legacy, LEGACY).unwrap();
        let now = t(NOW);
        // The configured path names the legacy file: the counters go next to it.
        let s = LocalStore::open(&legacy, 16).unwrap();
        assert_eq!(s.read_usage("a", 100, now).used, 41);
        assert_eq!(s.read_usage("b", 100, now).used, 0, "October's count");
        assert_eq!(s.read_usage("b", 100, t("2026-10-31T00:00:00Z")).used, 7);
        assert_eq!(used(s.try_consume("a", 100, now)), Ok(42));
        drop(s);
        assert!(!legacy.exists());
        assert_eq!(
            std::fs::read_to_string(dir.path().join("quota.json.migrated")).unwrap(),
            LEGACY
        );
        assert!(dir.path().join("quota.counters").exists());
        let s = LocalStore::open(&legacy, 16).unwrap();
        assert_eq!(s.read_usage("a", 100, now).used, 42);
    }

    #[test]
    fn a_legacy_file_next_to_the_counters_path_is_imported() {
        let now = t(NOW);
        // The new default path, with the old default file next to it.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("quota.json"), LEGACY).unwrap();
        let s = LocalStore::open(&dir.path().join("quota.counters"), 16).unwrap();
        assert_eq!(s.read_usage("a", 100, now).used, 41);
        assert!(!dir.path().join("quota.json").exists());
        assert!(dir.path().join("quota.json.migrated").exists());
        // A legacy file at a path not named .json.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("quota.state");
        std::fs::write(&path, LEGACY).unwrap();
        let s = LocalStore::open(&path, 16).unwrap();
        assert_eq!(s.read_usage("a", 100, now).used, 41);
        assert!(dir.path().join("quota.state.migrated").exists());
        drop(s);
        let s = LocalStore::open(&path, 16).unwrap();
        assert_eq!(s.read_usage("a", 100, now).used, 41);
    }

    #[test]
    fn a_migration_cut_short_is_finished_without_counting_twice() {
        let dir = tempfile::tempdir().unwrap();
        let legacy = dir.path().join("quota.json");
        std::fs::write(&legacy, LEGACY).unwrap();
        let now = t(NOW);
        drop(LocalStore::open(&legacy, 16).unwrap());
        // As if the start stopped after the counters file took over, before the old file went.
        std::fs::remove_file(dir.path().join("quota.json.migrated")).unwrap();
        std::fs::write(&legacy, LEGACY).unwrap();
        let s = LocalStore::open(&legacy, 16).unwrap();
        assert_eq!(s.read_usage("a", 100, now).used, 41);
        assert!(!legacy.exists());
        assert!(dir.path().join("quota.json.migrated").exists());
        // A JSON file next to a counters file that never imported one is left alone.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("quota.counters");
        drop(LocalStore::open(&path, 16).unwrap());
        std::fs::write(dir.path().join("quota.json"), LEGACY).unwrap();
        let s = LocalStore::open(&path, 16).unwrap();
        assert_eq!(s.read_usage("a", 100, now).used, 0);
        assert!(dir.path().join("quota.json").exists());
    }
}
