//! What this gateway knows and owes Redis per key and month (a slot): the shared count last seen,
//! calls counted locally, batches whose reply timed out, and the lease. One map of slots, read
//! without a lock on the request path; each slot has its own small lock. Slots made since the
//! map was last rebuilt wait in a small side map under a short lock; the background sync folds
//! them in (one copy of the map per sync, not per new slot) and drops slots of past months
//! that owe Redis nothing.

use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use chrono::{DateTime, Utc};
use hashbrown::HashTable;

use super::leases::Lease;
use crate::quota::Month;

/// Counts sent to Redis under an id whose reply never came: Redis may or may not have applied
/// them, so they are sent again under the same id and Redis applies the id at most once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    pub id: u64,
    /// Calls counted locally, carried in this batch.
    pub calls: u64,
    /// Unused leased calls given back in this batch.
    pub returned: u64,
}

impl Batch {
    /// What this batch adds to the count.
    pub fn delta(&self) -> i64 {
        i64::try_from(self.calls).unwrap_or(i64::MAX) - i64::try_from(self.returned).unwrap_or(0)
    }
}

/// Batches carried in one Redis call at most (the rest wait for the next one).
pub const MAX_CARRIED_BATCHES: usize = 32;

/// What one Redis call takes out of a slot and sends along.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Carry {
    /// This call's own id: Redis records what the call added under it.
    pub id: u64,
    /// Calls this call asks to count: 0 (only adding), 1, or a lease of more.
    pub want: u64,
    /// `want` is a batch of calls to count all or none (not a lease that may shrink to one).
    pub exact: bool,
    /// Calls counted locally, added with this call.
    pub calls: u64,
    /// Unused leased calls given back with this call.
    pub returned: u64,
    /// Earlier batches with an unknown outcome, settled by id.
    pub unsure: Vec<Batch>,
    /// Ids of earlier calls whose reply came: Redis may forget them.
    pub applied: Vec<u64>,
    /// The shared count this gateway last saw: what a count found missing (flushed, evicted)
    /// is set back to.
    pub floor: u64,
    /// The epoch `floor` was read in (0: unknown): a reading from an earlier life of the count
    /// may raise it (`script.rs`).
    pub floor_epoch: u64,
    /// Calls counted here that Redis may lack and that this call does not carry (they are the
    /// sync's to send): the call's limit is lowered by them, so that its admission counts them.
    pub local: u64,
    /// The carried-calls file names this call's own batch (a sync's call that carries calls or
    /// give-backs): Redis may forget its id only once a later file no longer names it.
    pub named: bool,
}

impl Carry {
    /// What the call adds besides its own count (`calls - returned`).
    pub fn delta(&self) -> i64 {
        Batch {
            id: self.id,
            calls: self.calls,
            returned: self.returned,
        }
        .delta()
    }

    /// Whether the call asks for a lease (and so holds the slot's one lease request).
    pub fn leasing(&self) -> bool {
        self.want > 1 && !self.exact
    }
}

/// The state of one slot.
#[derive(Debug, Default)]
pub struct Tally {
    /// The shared count last seen (what fail-open admission starts from).
    pub known: u64,
    /// The epoch of the count `known` was read in (0: unknown).
    pub epoch: u64,
    /// Calls counted locally (Redis unreachable), not yet sent.
    pending: u64,
    /// Unused leased calls to give back, not yet sent.
    unused: u64,
    /// Sent batches whose reply never came.
    unsure: Vec<Batch>,
    /// Ids of calls Redis answered, to tell it with the next call.
    applied: Vec<u64>,
    /// Batches a sync's call is carrying now (its own, of what it took from `pending` and
    /// `unused`, and the earlier ones it settles): named in the carried-calls file before the
    /// call left, and still counted here until Redis has them.
    sending: Vec<Batch>,
    /// Ids of answered calls that a carried-calls file named: Redis may forget them (they join
    /// `applied`) once a file that no longer names them is written.
    forget_after_save: Vec<u64>,
    pub lease: Lease,
}

/// What a save of the carried-calls file took from a slot besides its content: what the slot
/// may do once that file is written.
#[derive(Debug, Default)]
pub struct Saving {
    /// The lease's unused part the file names.
    kept: u64,
    /// Ids the file no longer names.
    forget: Vec<u64>,
}

fn calls_of(batches: &[Batch]) -> u64 {
    batches.iter().map(|b| b.calls).sum()
}

impl Tally {
    /// Calls counted here that Redis may not have yet.
    pub fn local_calls(&self) -> u64 {
        self.pending + calls_of(&self.sending) + calls_of(&self.unsure)
    }

    /// Whether the sync has anything to send to Redis.
    pub fn owes(&self) -> bool {
        self.pending > 0 || self.unused > 0 || !self.unsure.is_empty()
    }

    /// Nothing here that Redis lacks or may still send: no local counts (sent or not), no
    /// lease. Ids to forget need not be sent: their markers expire with the month's count.
    fn settled_all(&self) -> bool {
        !self.owes() && self.sending.is_empty() && self.local_calls() == 0 && self.lease.is_idle()
    }

    /// Fail-open admission: counts one call locally if the last shared count plus the local
    /// counts are under `limit`. Returns the count after the call, or `Err` with the count when
    /// the limit is reached.
    #[cfg(test)]
    pub fn count_locally(&mut self, limit: u64) -> Result<u64, u64> {
        self.count_locally_n(limit, 1)
    }

    /// Fail-open admission of `calls` calls at once (a batch of lookups): all or none.
    pub fn count_locally_n(&mut self, limit: u64, calls: u64) -> Result<u64, u64> {
        let used = self.known + self.local_calls();
        if used.saturating_add(calls) > limit {
            return Err(used);
        }
        self.pending += calls;
        Ok(used + calls)
    }

    /// Gives unused leased calls back with the next Redis call.
    pub fn give_back(&mut self, calls: u64) {
        self.unused += calls;
    }

    /// A counting call (id `id`, counting `want` calls) on the request path: it carries nothing
    /// Redis lacks (the sync sends that, named in the carried-calls file first), only the ids
    /// Redis may forget, and lowers its limit by the local calls.
    pub fn call(&mut self, id: u64, want: u64) -> Carry {
        Carry {
            id,
            want,
            applied: std::mem::take(&mut self.applied),
            floor: self.known,
            floor_epoch: self.epoch,
            local: self.local_calls(),
            ..Carry::default()
        }
    }

    /// A sync's call (id `id`, counting nothing of its own): takes what Redis lacks (calls never
    /// sent, give-backs, a bounded number of batches whose reply never came) into batches the
    /// carried-calls file names from now on (see [`Self::for_file`]).
    pub fn carry(&mut self, id: u64) -> Carry {
        let n = self.unsure.len().min(MAX_CARRIED_BATCHES);
        let mut carry = Carry {
            id,
            calls: std::mem::take(&mut self.pending),
            returned: std::mem::take(&mut self.unused),
            unsure: self.unsure.drain(..n).collect(),
            applied: std::mem::take(&mut self.applied),
            floor: self.known,
            floor_epoch: self.epoch,
            ..Carry::default()
        };
        carry.named = carry.calls > 0 || carry.returned > 0;
        if carry.named {
            self.sending.push(Batch {
                id,
                calls: carry.calls,
                returned: carry.returned,
            });
        }
        self.sending.extend_from_slice(&carry.unsure);
        carry
    }

    /// The call for `carry` ended: its batches are no longer in flight.
    fn landed(&mut self, carry: &Carry) {
        self.sending
            .retain(|b| b.id != carry.id && !carry.unsure.iter().any(|u| u.id == b.id));
    }

    /// What the carried-calls file would hold for this slot now, the lease's part as kept.
    #[cfg(test)]
    pub fn carried(&self) -> Carried {
        self.carried_with(self.lease.kept())
    }

    /// What Redis may lack: calls never sent, calls Redis counts that will never be served
    /// (`kept` of the lease, and give-backs not sent yet), and batches whose reply never came
    /// or that a call is carrying now.
    fn carried_with(&self, kept: u64) -> Carried {
        Carried {
            calls: self.pending,
            returned: self.unused + kept,
            unsure: self.unsure.iter().chain(&self.sending).copied().collect(),
            seen: self.known,
            epoch: self.epoch,
        }
    }

    /// What the carried-calls file about to be written holds for this slot, and what the slot
    /// may do once it is written ([`Self::saved`]). With `keep_idle`, the lease's part it names
    /// is decided afresh and kept from now on ([`Lease::keep_for_file`]); else it is the part
    /// kept already.
    pub fn for_file(&mut self, keep_idle: bool) -> (Carried, Saving) {
        let kept = match keep_idle {
            true => self.lease.keep_for_file(),
            false => self.lease.kept(),
        };
        let saving = Saving {
            kept,
            forget: std::mem::take(&mut self.forget_after_save),
        };
        (self.carried_with(kept), saving)
    }

    /// The file [`Self::for_file`] went into is written (`done`) or not: once it is, the lease
    /// serves what the file no longer names, and Redis may forget the ids it no longer names.
    pub fn saved(&mut self, saving: Saving, done: bool) {
        if done {
            self.lease.file_written(saving.kept);
            self.applied.extend(saving.forget);
        } else {
            self.forget_after_save.extend(saving.forget);
        }
    }

    /// Takes back what a process that is gone carried (its carried-calls file) for the next
    /// sync: its calls are sent, its unused lease given back; a higher count it had seen
    /// becomes the floor (what a count lost in Redis is set back or raised to).
    pub fn restore(&mut self, carried: Carried) {
        self.pending += carried.calls;
        self.unused += carried.returned;
        self.unsure.extend(carried.unsure);
        self.saw(carried.seen, carried.epoch);
    }

    /// Another reading of the count (a gone process's file): kept if higher than what this
    /// gateway saw, with its epoch.
    pub fn saw(&mut self, used: u64, epoch: u64) {
        if used > self.known {
            self.known = used;
            self.epoch = epoch;
        }
    }

    /// Redis answered the call: everything it carried is applied. `marked`: the call left a
    /// marker under its id (it added something), which Redis may now drop. `epoch`: the
    /// count's, which `used` was read in.
    pub fn settled(&mut self, carry: &Carry, used: u64, marked: bool, epoch: u64) {
        self.landed(carry);
        self.known = used;
        self.epoch = epoch;
        match (marked, carry.named) {
            (true, false) => self.applied.push(carry.id),
            (true, true) => self.forget_after_save.push(carry.id),
            (false, _) => {}
        }
    }

    /// The call failed. `maybe_ran`: the script may have run (a timeout or a broken connection,
    /// not a refusal): its id and what it carried become a batch that Redis settles by id later,
    /// setting that id's contribution to the carried counts whatever the call itself did.
    pub fn unsettled(&mut self, carry: Carry, maybe_ran: bool) {
        self.landed(&carry);
        self.unsure.extend(carry.unsure);
        // Forgetting ids is idempotent: send them again.
        self.applied.extend(carry.applied);
        if maybe_ran {
            // A call that counts nothing and carries nothing added nothing, ran or not.
            if carry.want > 0 || carry.calls > 0 || carry.returned > 0 {
                self.unsure.push(Batch {
                    id: carry.id,
                    calls: carry.calls,
                    returned: carry.returned,
                });
            }
        } else {
            self.pending += carry.calls;
            self.unused += carry.returned;
        }
    }
}

/// What one key and month owes Redis, as the carried-calls file keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Carried {
    /// Counted here, never sent.
    pub calls: u64,
    /// Counted in Redis, never served: to give back.
    pub returned: u64,
    /// Sent, reply never came.
    pub unsure: Vec<Batch>,
    /// The shared count this gateway last saw, and its epoch: the floor a count lost in Redis
    /// is put back to after a restart.
    pub seen: u64,
    pub epoch: u64,
}

impl Carried {
    /// Owes Redis nothing (what was seen aside).
    pub fn is_empty(&self) -> bool {
        self.calls == 0 && self.returned == 0 && self.unsure.is_empty()
    }
}

/// One key and month.
#[derive(Debug)]
pub struct Slot {
    key_id: Box<str>,
    pub month: Month,
    /// `q:{<key_id>}:<YYYY-MM>`: the shared count. The `{hash tag}` puts every key of one id
    /// in one cluster slot, so that the script may touch them all.
    pub count_key: String,
    /// `q:{<key_id>}:<YYYY-MM>:op:`: what a recent call added is under this plus its id.
    pub marker_prefix: String,
    /// `q:<key_id>:<YYYY-MM>`: the count's name before the hash tag (releases before cluster
    /// support), adopted by the first call of the month on a single server.
    pub legacy_count_key: String,
    tally: Mutex<Tally>,
    /// Rung when a lease request ends (granted or not): calls that found the lease empty while
    /// it was in flight wait for it instead of each going to Redis on its own.
    pub lease_ended: tokio::sync::Notify,
}

impl Slot {
    fn new(key_id: &str, month: Month) -> Self {
        let count_key = format!("q:{{{key_id}}}:{}", month.label());
        Slot {
            key_id: key_id.into(),
            month,
            legacy_count_key: format!("q:{key_id}:{}", month.label()),
            marker_prefix: format!("{count_key}:op:"),
            count_key,
            tally: Mutex::new(Tally::default()),
            lease_ended: tokio::sync::Notify::new(),
        }
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    pub fn tally(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|p| p.into_inner())
    }
}

type Table = HashTable<Arc<Slot>>;

/// A slot of a month that ended is dropped this long after the month's end at the earliest (if
/// it owes Redis nothing and nothing holds it): far longer than any request runs, so no request
/// still working in that month can meet a dropped slot.
const PRUNE_AFTER: chrono::TimeDelta = chrono::TimeDelta::hours(1);

/// All slots this gateway holds. A lookup of a known slot allocates nothing and takes no lock;
/// a new slot is made under a short lock in `recent` (O(1)), never by copying the whole map on
/// a request thread (which made the first calls of a month, one new slot per project,
/// quadratic). [`Slots::maintain`] folds `recent` into `table` off the request path.
pub struct Slots {
    table: ArcSwap<Table>,
    /// Slots made since `table` was last rebuilt. Also held while `table` is replaced, so that
    /// under this lock the two together are every slot, each once.
    recent: Mutex<Table>,
    hasher: foldhash::fast::RandomState,
}

impl Default for Slots {
    fn default() -> Self {
        Slots {
            table: ArcSwap::from_pointee(HashTable::new()),
            recent: Mutex::new(HashTable::new()),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl Slots {
    fn hash(&self, key_id: &str, month: Month) -> u64 {
        self.hasher.hash_one((key_id, month.index()))
    }

    fn find(table: &Table, hash: u64, key_id: &str, month: Month) -> Option<Arc<Slot>> {
        table
            .find(hash, |s| s.month == month && &*s.key_id == key_id)
            .cloned()
    }

    fn recent(&self) -> MutexGuard<'_, Table> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The slot of `key_id` in `month`, made on first use.
    pub fn get(&self, key_id: &str, month: Month) -> Arc<Slot> {
        let hash = self.hash(key_id, month);
        if let Some(slot) = Self::find(&self.table.load(), hash, key_id, month) {
            return slot;
        }
        let mut recent = self.recent();
        // `maintain` may have moved it into the table since the look above.
        if let Some(slot) = Self::find(&self.table.load(), hash, key_id, month)
            .or_else(|| Self::find(&recent, hash, key_id, month))
        {
            return slot;
        }
        let fresh = Arc::new(Slot::new(key_id, month));
        recent.insert_unique(hash, fresh.clone(), |s| self.hash(&s.key_id, s.month));
        fresh
    }

    /// A snapshot of every slot.
    pub fn all(&self) -> Vec<Arc<Slot>> {
        let recent = self.recent();
        let table = self.table.load();
        table.iter().chain(recent.iter()).cloned().collect()
    }

    /// Whether `slot` may be dropped: its month is before `open` (the month [`PRUNE_AFTER`]
    /// ago, so it ended at least that long ago), only the map holds it, and it owes Redis
    /// nothing. The month is compared first: most slots are current and cost no lock.
    fn stale(slot: &Arc<Slot>, open: Month) -> bool {
        slot.month < open && Arc::strong_count(slot) == 1 && slot.tally().settled_all()
    }

    /// Folds the slots made since the last call into the lock-free map and drops stale slots
    /// of past months; returns how many were dropped. For the background sync, off the request
    /// path: it copies the map, at most once per call and only when there is something to do.
    pub fn maintain(&self, now: DateTime<Utc>) -> usize {
        let open = Month::containing(now - PRUNE_AFTER);
        // Scanned before taking the lock: new slots are not held up by it.
        let any_stale = self.table.load().iter().any(|s| Self::stale(s, open));
        let mut recent = self.recent();
        if recent.is_empty() && !any_stale {
            return 0;
        }
        // Only this replaces the table, and under the lock held: what a stale slot is, is
        // decided again below.
        let table = self.table.load_full();
        let mut next = Table::with_capacity(table.len() + recent.len());
        let mut dropped = 0;
        for slot in table.iter().chain(recent.iter()) {
            if Self::stale(slot, open) {
                dropped += 1;
                continue;
            }
            let hash = self.hash(&slot.key_id, slot.month);
            next.insert_unique(hash, slot.clone(), |s| self.hash(&s.key_id, s.month));
        }
        // Published before `recent` is emptied, under its lock: a `get` meets each slot in one
        // of the two.
        self.table.store(Arc::new(next));
        recent.clear();
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn month() -> Month {
        Month {
            year: 2026,
            month: 3,
        }
    }

    #[test]
    fn one_slot_per_key_and_month_with_its_keys_built_once() {
        let slots = Slots::default();
        let a = slots.get("k", month());
        assert!(Arc::ptr_eq(&a, &slots.get("k", month())));
        assert!(!Arc::ptr_eq(&a, &slots.get("k", month().next())));
        assert!(!Arc::ptr_eq(&a, &slots.get("k2", month())));
        assert_eq!(a.count_key, "q:{k}:2026-03");
        assert_eq!(a.marker_prefix, "q:{k}:2026-03:op:");
        assert_eq!(a.legacy_count_key, "q:k:2026-03");
        assert_eq!(slots.all().len(), 3);
    }

    #[test]
    fn slots_of_past_months_are_dropped_once_they_owe_nothing() {
        let slots = Slots::default();
        let (march, april) = (month(), month().next());
        for key in ["a", "b", "c", "d"] {
            slots.get(key, march);
        }
        slots.get("a", april);
        // New slots wait in the side map: the lock-free map is not copied per new slot.
        assert_eq!(slots.table.load().len(), 0);
        assert_eq!(slots.all().len(), 5);
        // Still March, or April within the grace: folded in, nothing dropped.
        let april_1st = april.start();
        assert_eq!(slots.maintain(april_1st), 0);
        assert_eq!(slots.table.load().len(), 5);
        assert_eq!(slots.recent().len(), 0);
        assert_eq!(slots.maintain(april_1st + PRUNE_AFTER / 2), 0);
        // Past the grace: March's slots go, except one owing counts to Redis and one a request
        // still holds.
        slots.get("b", march).tally().count_locally(10).unwrap();
        let held = slots.get("c", march);
        assert_eq!(slots.maintain(april_1st + PRUNE_AFTER), 2);
        let mut left: Vec<(String, Month)> = slots
            .all()
            .iter()
            .map(|s| (s.key_id.to_string(), s.month))
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                ("a".to_owned(), april),
                ("b".to_owned(), march),
                ("c".to_owned(), march)
            ]
        );
        // Once synced and let go, they go too.
        let b = slots.get("b", march);
        let carry = b.tally().carry(1);
        b.tally().settled(&carry, 1, true, 1);
        drop((b, held));
        assert_eq!(slots.maintain(april_1st + PRUNE_AFTER), 2);
        assert_eq!(slots.all().len(), 1);
        // A dropped slot is made afresh if asked for again.
        assert_eq!(slots.get("d", march).tally().known, 0);
        assert_eq!(slots.all().len(), 2);
    }

    #[test]
    fn racing_first_uses_make_one_slot() {
        let slots = Arc::new(Slots::default());
        let got: Vec<Arc<Slot>> = (0..8)
            .map(|_| {
                let slots = slots.clone();
                std::thread::spawn(move || slots.get("k", month()))
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        assert!(got.iter().all(|s| Arc::ptr_eq(s, &got[0])));
        assert_eq!(slots.all().len(), 1);
    }

    #[test]
    fn a_batch_is_counted_locally_whole_or_not_at_all() {
        let mut t = Tally {
            known: 10,
            ..Tally::default()
        };
        assert_eq!(t.count_locally_n(14, 5), Err(10));
        assert_eq!(t.count_locally_n(14, 4), Ok(14));
        assert_eq!(t.carry(1).calls, 4);
    }

    #[test]
    fn the_sync_carries_local_counts_under_a_named_id_and_requests_count_them_below_the_limit() {
        let mut t = Tally {
            known: 10,
            ..Tally::default()
        };
        assert_eq!(t.count_locally(12), Ok(11));
        assert_eq!(t.count_locally(12), Ok(12));
        assert_eq!(t.count_locally(12), Err(12));
        t.give_back(3);
        // A request's call carries none of it: its limit is lowered by the local calls.
        let r = t.call(6, 1);
        assert_eq!((r.calls, r.returned, r.unsure.len(), r.local), (0, 0, 0, 2));
        assert!(!r.named);
        t.settled(&r, 11, true, 1);
        assert!(t.owes());
        let c = t.carry(7);
        assert_eq!((c.calls, c.returned, c.delta(), c.named), (2, 3, -1, true));
        // The request's id was never in a file: Redis may forget it at once.
        assert_eq!(c.applied, vec![6]);
        assert!(!t.owes());
        // Until Redis has them, carried calls still count here, and the file names them under
        // the call's id (sent again under it after a kill, Redis applies them once).
        assert_eq!(t.local_calls(), 2);
        assert_eq!(t.count_locally(12), Err(13));
        let named = t.carried();
        assert_eq!((named.calls, named.returned), (0, 0));
        assert_eq!(
            named.unsure,
            [Batch {
                id: 7,
                calls: 2,
                returned: 3
            }]
        );
        t.settled(&c, 20, true, 1);
        assert_eq!(t.known, 20);
        assert_eq!(t.local_calls(), 0);
        // Its id is forgotten only once a file that no longer names it is written.
        assert!(t.call(8, 1).applied.is_empty());
        let (held, saving) = t.for_file(true);
        assert!(held.unsure.is_empty());
        t.saved(saving, false);
        assert!(t.call(9, 1).applied.is_empty(), "the write failed");
        let (_, saving) = t.for_file(true);
        t.saved(saving, true);
        assert_eq!(t.call(10, 1).applied, vec![7]);
    }

    #[test]
    fn a_refused_call_puts_its_counts_back() {
        let mut t = Tally::default();
        t.count_locally(100).unwrap();
        let c = t.carry(1);
        t.unsettled(c, false);
        assert_eq!(t.local_calls(), 1);
        assert_eq!(t.carried().calls, 1);
        let again = t.carry(2);
        assert_eq!((again.calls, again.unsure.len()), (1, 0));
    }

    #[test]
    fn a_timed_out_call_becomes_a_batch_settled_by_its_id() {
        let mut t = Tally::default();
        t.count_locally(100).unwrap();
        t.count_locally(100).unwrap();
        let first = t.carry(1);
        t.unsettled(first, true);
        assert_eq!(t.count_locally(100), Ok(3));
        assert_eq!(t.local_calls(), 3);
        let second = t.carry(2);
        assert_eq!(
            second.unsure,
            vec![Batch {
                id: 1,
                calls: 2,
                returned: 0
            }]
        );
        assert_eq!(second.calls, 1);
        // It timed out too: both batches wait, neither is merged into plain counts.
        t.unsettled(second, true);
        // A request's call that timed out may have counted its call: a batch of its own (the
        // call itself, served locally, is a plain local count).
        let third = t.call(3, 1);
        t.unsettled(third, true);
        let fourth = t.carry(4);
        assert_eq!(
            fourth.unsure.iter().map(|b| b.id).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(fourth.calls, 0);
        t.settled(&fourth, 3, false, 1);
        assert!(
            t.call(5, 1).applied.is_empty(),
            "no marker, nothing to drop"
        );
        assert!(!t.owes());
    }

    #[test]
    fn a_call_that_could_have_added_nothing_leaves_no_batch() {
        let mut t = Tally::default();
        let c = t.carry(1);
        t.unsettled(c, true);
        assert!(!t.owes());
        // But one that asked to count a call could have counted it.
        let c = t.call(2, 1);
        t.unsettled(c, true);
        assert!(t.owes());
        assert_eq!(t.local_calls(), 0);
    }

    #[test]
    fn batches_are_carried_a_bounded_number_at_a_time() {
        let mut t = Tally::default();
        for id in 0..(MAX_CARRIED_BATCHES as u64 + 5) {
            let c = t.call(id, 1);
            t.unsettled(c, true);
        }
        let c = t.carry(1_000);
        assert_eq!(c.unsure.len(), MAX_CARRIED_BATCHES);
        assert_eq!(t.carried().unsure.len(), MAX_CARRIED_BATCHES + 5);
        t.settled(&c, 0, false, 1);
        assert_eq!(t.carry(1_001).unsure.len(), 5);
    }
}
