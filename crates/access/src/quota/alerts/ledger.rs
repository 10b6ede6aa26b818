//! What this process knows of each project's alerts ([`Marks`]), found without a lock on the
//! request path.
//!
//! Why not one `Mutex<HashMap>`: every counted call of every project above the lowest threshold
//! asks, so one lock made those calls (on every worker thread) queue behind each other. Here the
//! projects live in a map behind an [`ArcSwap`]: a call of a known project loads it, finds its
//! marks and reads one atomic word, taking no lock and writing nothing shared. A project met for
//! the first time (rare: once per process, or per month after a sweep) goes into a small side map
//! under a short lock; the service folds that side map into the lock-free one off the request
//! path, one copy of the map per tick at most, never one per new project (which would make a
//! month's first crossings quadratic). A sharded map of mutexes would still lock on every call,
//! and a lock-free hash map crate would be a dependency for what this shape does with `arc-swap`,
//! already in the tree.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;

use super::marks::{Marks, MAX_THRESHOLDS};
use crate::quota::Month;

/// Shared `Marks`: a table copied by a fold keeps the very marks calls may be changing.
type Table = HashMap<Arc<str>, Arc<Marks>, foldhash::fast::RandomState>;

/// Each project's marks, and the configured thresholds they are bits of.
pub struct Ledger {
    thresholds: Vec<u32>,
    table: ArcSwap<Table>,
    /// Projects met since the last fold. Also held while `table` is replaced, so that under this
    /// lock the two together hold every project, each once.
    recent: Mutex<Table>,
    /// The latest month a call was counted in (what [`Ledger::fold`] keeps).
    latest: AtomicU32,
}

impl Ledger {
    /// A ledger knowing nothing, for `thresholds` (ascending; beyond [`MAX_THRESHOLDS`] ignored,
    /// which the configuration refuses anyway).
    pub fn new(mut thresholds: Vec<u32>) -> Ledger {
        thresholds.truncate(MAX_THRESHOLDS);
        Ledger {
            thresholds,
            table: ArcSwap::from_pointee(Table::default()),
            recent: Mutex::new(Table::default()),
            latest: AtomicU32::new(0),
        }
    }

    pub fn thresholds(&self) -> &[u32] {
        &self.thresholds
    }

    fn recent(&self) -> MutexGuard<'_, Table> {
        // A poisoned lock only means another thread panicked between two map operations.
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on `project`'s marks, made on first use. A project in the table takes no lock.
    fn with<R>(&self, project: &str, f: impl FnOnce(&Marks) -> R) -> R {
        let table = self.table.load();
        if let Some(marks) = table.get(project) {
            return f(marks);
        }
        drop(table);
        let mut recent = self.recent();
        // `fold` may have moved it into the table since the look above.
        let table = self.table.load();
        if let Some(marks) = table.get(project) {
            return f(marks);
        }
        f(recent.entry(Arc::from(project)).or_default())
    }

    /// The thresholds (bits) of `reached` the call is to offer (see [`Marks::claim`]).
    pub fn claim(&self, project: &str, month: u32, reached: u32) -> u32 {
        // Written once a month, read by every call: no shared write in the usual case.
        if self.latest.load(Ordering::Relaxed) < month {
            self.latest.fetch_max(month, Ordering::Relaxed);
        }
        self.with(project, |m| m.claim(month, reached))
    }

    /// The month index and threshold bit of an alert of `month` (`YYYY-MM`) at `threshold`;
    /// `None` for a threshold no longer configured.
    fn place(&self, month: &str, threshold: u32) -> Option<(u32, u32)> {
        let bit = self.thresholds.iter().position(|t| *t == threshold)?;
        Some((Month::parse_label(month)?.index(), 1 << bit))
    }

    /// The outbox has `project`'s alert of `month` at `threshold`: no call offers it again.
    pub fn recorded(&self, project: &str, month: &str, threshold: u32) {
        if let Some((month, bit)) = self.place(month, threshold) {
            self.with(project, |m| m.record(month, bit));
        }
    }

    /// `project`'s alert of `month` at `threshold` was offered and is not in the outbox: the
    /// project's next call offers it again.
    pub fn released(&self, project: &str, month: &str, threshold: u32) {
        if let Some((month, bit)) = self.place(month, threshold) {
            self.released_bits(project, month, bit);
        }
    }

    /// [`Ledger::released`] by bits.
    pub fn released_bits(&self, project: &str, month: u32, bits: u32) {
        self.with(project, |m| m.release(month, bits));
    }

    /// At start: the outbox's (project, threshold) of `month` are recorded (the outbox is the
    /// truth; a threshold it lacks is offered by the project's next call over it).
    pub fn preload(&self, month: u32, rows: impl IntoIterator<Item = (String, u32)>) {
        self.latest.fetch_max(month, Ordering::Relaxed);
        for (project, threshold) in rows {
            if let Some(bit) = self.thresholds.iter().position(|t| *t == threshold) {
                self.with(&project, |m| m.record(month, 1 << bit));
            }
        }
        self.fold();
    }

    /// Folds the projects met since the last fold into the lock-free table, and forgets those
    /// with nothing of the latest month (a call of theirs starts over, the outbox having the
    /// truth). For the service, off the request path: one copy of the table, only when a new
    /// project came.
    pub fn fold(&self) {
        let mut recent = self.recent();
        if recent.is_empty() {
            return;
        }
        let month = self.latest.load(Ordering::Relaxed);
        let mut table: Table = Table::clone(&self.table.load());
        table.retain(|_, m| m.current(month));
        table.extend(recent.drain());
        self.table.store(Arc::new(table));
    }

    /// Projects in the lock-free table, and in the side map.
    #[cfg(test)]
    fn sizes(&self) -> (usize, usize) {
        (self.table.load().len(), self.recent().len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::alerts::marks::first;

    fn nov() -> u32 {
        Month::parse_label("2026-11").unwrap().index()
    }

    #[test]
    fn what_the_outbox_holds_at_start_is_not_offered_again() {
        let ledger = Ledger::new(vec![50, 80, 100]);
        // 80 is a threshold; 70 is no longer configured.
        ledger.preload(nov(), [("acme".into(), 50), ("acme".into(), 70)]);
        assert_eq!(ledger.sizes(), (1, 0), "folded at once");
        assert_eq!(ledger.claim("acme", nov(), first(3)), 0b110);
        assert_eq!(ledger.claim("other", nov(), first(1)), 0b1);
        ledger.recorded("acme", "2026-11", 80);
        ledger.released("acme", "2026-11", 100);
        assert_eq!(
            ledger.claim("acme", nov(), first(3)),
            0b100,
            "only 100 again"
        );
    }

    #[test]
    fn new_projects_are_folded_in_and_past_months_forgotten() {
        let ledger = Ledger::new(vec![50]);
        assert_eq!(ledger.claim("a", nov(), 1), 1);
        assert_eq!(ledger.claim("b", nov(), 1), 1);
        assert_eq!(ledger.sizes(), (0, 2));
        ledger.fold();
        assert_eq!(ledger.sizes(), (2, 0));
        ledger.recorded("a", "2026-11", 50);
        assert_eq!(ledger.claim("a", nov(), 1), 0, "found in the table");
        // December: a new project's fold forgets November's.
        assert_eq!(ledger.claim("c", nov() + 1, 1), 1);
        ledger.fold();
        assert_eq!(ledger.sizes(), (1, 0));
        assert_eq!(ledger.claim("a", nov() + 1, 1), 1, "a starts over");
    }

    #[test]
    fn a_known_project_takes_no_lock() {
        let ledger = Arc::new(Ledger::new(vec![50, 100]));
        ledger.preload(nov(), [("acme".into(), 50)]);
        // The side map's lock held (as by a fold, or a first call of another project): a call of
        // a known project still goes through, whether it has something to offer or not.
        let held = ledger.recent();
        let other = ledger.clone();
        let done = std::thread::spawn(move || {
            (
                other.claim("acme", nov(), first(1)),
                other.claim("acme", nov(), first(2)),
            )
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !done.is_finished() {
            assert!(std::time::Instant::now() < deadline, "the call waited");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        drop(held);
        assert_eq!(done.join().unwrap(), (0, 0b10));
    }
}
