//! The most flagged registrable domains of a stream of answers, in bounded memory: one
//! Space-Saving summary per day over a rolling window, merged into the live top-domains ranking.
//!
//! **Space-Saving** (Metwally, Agrawal, El Abbadi, 2005) keeps at most `capacity` (m) counters.
//! A name already monitored adds to its counter; a new name takes a free counter, or, when all
//! are taken, the counter with the smallest count `min`, starting from `min` (remembered as the
//! counter's `error`). Hence, after N flags in a summary:
//! - memory never exceeds m counters, whatever the stream (a flood of random names only churns
//!   the smallest counters);
//! - every estimate overstates the true count by at most `error <= min <= N / m`, never
//!   understates it; a name counted more than N / m times is always monitored;
//! - so when the true counts of the top k names differ from each other, and from the (k+1)th,
//!   by more than N / m, the top k of the summary is the exact top k in the exact order.
//!
//! **Daily buckets.** Each UTC day has its own summary; days older than the window are dropped
//! whole. Merging sums a name's counts over the days; a day that does not hold the name
//! contributes 0 where the truth is at most that day's `min`. So a merged count is within
//! N / m of the true count, N being the flags of the whole window: the same bound as one
//! summary over the window.
//!
//! **Ranking** ([`ranking`]): flags in the window (highest first), then risk score (highest
//! first), then name; the reason and score shown are those the table gives the registrable
//! domain itself when it flags it, else those of the latest flagged answer under it (an MX
//! verdict, or a blocklisted subdomain). A name the table now clears (allowlist, free provider,
//! a `safe` record) is left out. Below the counted names come the table's own flagged entries in
//! their fixed order (`flag_weight`, score, name), so with no flags the ranking is the table's.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::classify::classify_match;
use super::name::DomainName;
use super::record::{FlaggedEntry, Reason, RiskScore};
use super::table::{DomainTable, TableRule};
use super::top::{TopDomains, MAX_TOP};

/// Days since the Unix epoch (UTC).
pub type Day = u32;

/// What a flagged answer said of the name: shown when the table has no verdict of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Label {
    pub reason: Reason,
    pub score: RiskScore,
}

/// One monitored name.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Counter {
    name: Box<str>,
    count: u64,
    /// How much of `count` may belong to names this counter monitored before.
    error: u64,
    label: Label,
}

/// One Space-Saving summary: at most `capacity` counters, kept as a binary min-heap on the
/// count so the counter to take over is at the root.
#[derive(Debug, Clone)]
pub struct SpaceSaving {
    capacity: usize,
    heap: Vec<Counter>,
    /// Name -> position in `heap`.
    index: HashMap<Box<str>, usize, foldhash::fast::RandomState>,
    /// Flags added (N).
    total: u64,
}

/// A summary's counters as stored (the state file, Redis): `(name, count, error, label)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub total: u64,
    pub counters: Vec<(String, u64, u64, Label)>,
}

impl SpaceSaving {
    /// An empty summary of at most `capacity` counters (at least 1).
    pub fn new(capacity: usize) -> Self {
        SpaceSaving {
            capacity: capacity.max(1),
            heap: Vec::new(),
            index: HashMap::default(),
            total: 0,
        }
    }

    /// Counts `by` flags of `name`, which last said `label`.
    pub fn add(&mut self, name: &str, by: u64, label: Label) {
        self.total = self.total.saturating_add(by);
        if let Some(&at) = self.index.get(name) {
            let c = &mut self.heap[at];
            c.count = c.count.saturating_add(by);
            c.label = label;
            self.sift_down(at);
            return;
        }
        let name: Box<str> = name.into();
        if self.heap.len() < self.capacity {
            let at = self.heap.len();
            self.index.insert(name.clone(), at);
            self.heap.push(Counter {
                name,
                count: by,
                error: 0,
                label,
            });
            self.sift_up(at);
            return;
        }
        let min = self.heap[0].count;
        let old = std::mem::replace(
            &mut self.heap[0],
            Counter {
                name: name.clone(),
                count: min.saturating_add(by),
                error: min,
                label,
            },
        );
        self.index.remove(&old.name);
        self.index.insert(name, 0);
        self.sift_down(0);
    }

    /// The count a name not monitored may have had at most (0 while counters are free).
    pub fn min_count(&self) -> u64 {
        if self.heap.len() < self.capacity {
            0
        } else {
            self.heap.first().map_or(0, |c| c.count)
        }
    }

    /// The estimate of `name` and its error (`None`: not monitored).
    pub fn estimate(&self, name: &str) -> Option<(u64, u64)> {
        self.index
            .get(name)
            .map(|&at| (self.heap[at].count, self.heap[at].error))
    }

    /// Flags added (N).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Counters in use (never more than the capacity).
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Each monitored name with its estimate and latest label.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64, Label)> {
        self.heap.iter().map(|c| (&*c.name, c.count, c.label))
    }

    /// The counters, for storing.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            total: self.total,
            counters: self
                .heap
                .iter()
                .map(|c| (c.name.to_string(), c.count, c.error, c.label))
                .collect(),
        }
    }

    /// A summary from stored counters; beyond `capacity`, the largest counts are kept, and a
    /// name listed twice keeps its first counter.
    pub fn from_snapshot(capacity: usize, mut snapshot: Snapshot) -> Self {
        let mut s = SpaceSaving::new(capacity);
        snapshot.counters.sort_by_key(|c| std::cmp::Reverse(c.1));
        for (name, count, error, label) in snapshot.counters {
            if s.heap.len() == s.capacity {
                break;
            }
            if s.index.contains_key(name.as_str()) {
                continue;
            }
            let at = s.heap.len();
            let name: Box<str> = name.into();
            s.index.insert(name.clone(), at);
            s.heap.push(Counter {
                name,
                count,
                error: error.min(count),
                label,
            });
            s.sift_up(at);
        }
        s.total = snapshot.total.max(s.heap.iter().map(|c| c.count).sum());
        s
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        for at in [a, b] {
            if let Some(i) = self.index.get_mut(&self.heap[at].name) {
                *i = at;
            }
        }
    }

    fn sift_up(&mut self, mut at: usize) {
        while at > 0 {
            let parent = (at - 1) / 2;
            if self.heap[parent].count <= self.heap[at].count {
                break;
            }
            self.swap(parent, at);
            at = parent;
        }
    }

    fn sift_down(&mut self, mut at: usize) {
        loop {
            let (l, r) = (2 * at + 1, 2 * at + 2);
            let mut low = at;
            if l < self.heap.len() && self.heap[l].count < self.heap[low].count {
                low = l;
            }
            if r < self.heap.len() && self.heap[r].count < self.heap[low].count {
                low = r;
            }
            if low == at {
                break;
            }
            self.swap(at, low);
            at = low;
        }
    }
}

/// One summary per day over the last `days` days.
#[derive(Debug, Clone)]
pub struct Window {
    days: u32,
    capacity: usize,
    buckets: BTreeMap<Day, SpaceSaving>,
}

impl Window {
    pub fn new(days: u32, capacity: usize) -> Self {
        Window {
            days: days.max(1),
            capacity,
            buckets: BTreeMap::new(),
        }
    }

    /// Counts `by` flags of `name` on `day`.
    pub fn add(&mut self, day: Day, name: &str, by: u64, label: Label) {
        let capacity = self.capacity;
        self.buckets
            .entry(day)
            .or_insert_with(|| SpaceSaving::new(capacity))
            .add(name, by, label);
    }

    /// Drops the days that left the window ending on `today`; whether any did.
    pub fn expire(&mut self, today: Day) -> bool {
        let first = self.first_day(today);
        let before = self.buckets.len();
        self.buckets.retain(|day, _| *day >= first);
        self.buckets.len() != before
    }

    /// The oldest day of the window ending on `today`.
    pub fn first_day(&self, today: Day) -> Day {
        today.saturating_sub(self.days - 1)
    }

    pub fn buckets(&self) -> impl Iterator<Item = (Day, &SpaceSaving)> {
        self.buckets.iter().map(|(d, s)| (*d, s))
    }

    /// Takes every bucket out, leaving the window empty.
    pub fn take(&mut self) -> BTreeMap<Day, SpaceSaving> {
        std::mem::take(&mut self.buckets)
    }

    /// Sets one day's summary (a stored one, or one read from a shared store).
    pub fn put(&mut self, day: Day, summary: SpaceSaving) {
        self.buckets.insert(day, summary);
    }

    /// Counters in use over all days (at most `days x capacity`).
    pub fn counters(&self) -> usize {
        self.buckets.values().map(SpaceSaving::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.values().all(SpaceSaving::is_empty)
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn days(&self) -> u32 {
        self.days
    }
}

/// A name's merged count over the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tally<'a> {
    pub name: &'a str,
    pub flags: u64,
    /// The label of the newest day that counted the name.
    pub label: Label,
}

/// Sums each name's counts over the buckets given (several sources may hold the same day:
/// their counts add up) and keeps the `limit` largest, highest first (ties by name).
pub fn merge<'a>(
    buckets: impl IntoIterator<Item = (Day, &'a SpaceSaving)>,
    limit: usize,
) -> Vec<Tally<'a>> {
    let mut sums: HashMap<&'a str, (u64, Day, Label), foldhash::fast::RandomState> =
        HashMap::default();
    for (day, summary) in buckets {
        for c in &summary.heap {
            let e = sums.entry(&c.name).or_insert((0, day, c.label));
            e.0 = e.0.saturating_add(c.count);
            if day >= e.1 {
                (e.1, e.2) = (day, c.label);
            }
        }
    }
    let mut out: Vec<Tally<'a>> = sums
        .into_iter()
        .map(|(name, (flags, _, label))| Tally { name, flags, label })
        .collect();
    let order = |a: &Tally<'_>, b: &Tally<'_>| b.flags.cmp(&a.flags).then(a.name.cmp(b.name));
    if out.len() > limit && limit > 0 {
        out.select_nth_unstable_by(limit - 1, order);
    }
    out.truncate(limit);
    out.sort_unstable_by(order);
    out
}

/// What top-domains shows for a counted name, or `None` when the table now clears it.
pub fn shown(table: &DomainTable, name: &str, label: Label) -> Option<(Reason, RiskScore)> {
    let Ok(parsed) = DomainName::parse(name) else {
        return Some((label.reason, label.score));
    };
    let found = table.lookup(&parsed);
    let rule = found.rule;
    let record = classify_match(table, &parsed, found, None, None).record;
    if record.reason != Reason::Safe {
        return Some((record.reason, record.risk_score));
    }
    match rule {
        TableRule::Unknown if label.reason != Reason::Safe => Some((label.reason, label.score)),
        _ => None,
    }
}

/// The live top-domains: the counted names in rank order, then the table's own ranking.
pub fn ranking(table: &DomainTable, tallies: &[Tally<'_>]) -> TopDomains {
    let mut counted: Vec<(u64, FlaggedEntry)> = tallies
        .iter()
        .filter_map(|t| {
            shown(table, t.name, t.label).map(|(reason, risk_score)| {
                (
                    t.flags,
                    FlaggedEntry {
                        domain: t.name.into(),
                        risk_score,
                        reason,
                    },
                )
            })
        })
        .collect();
    counted.sort_unstable_by(|(fa, a), (fb, b)| {
        fb.cmp(fa)
            .then(b.risk_score.cmp(&a.risk_score))
            .then(a.domain.cmp(&b.domain))
    });
    counted.truncate(MAX_TOP);
    let mut entries: Vec<FlaggedEntry> = counted.into_iter().map(|(_, e)| e).collect();
    if entries.len() < MAX_TOP {
        let listed: std::collections::HashSet<Box<str>> =
            entries.iter().map(|e| e.domain.clone()).collect();
        let rest = table.top().entries(MAX_TOP);
        entries.extend(
            rest.iter()
                .filter(|e| !listed.contains(&e.domain))
                .take(MAX_TOP - entries.len())
                .cloned(),
        );
    }
    TopDomains::from_ranked(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Scores;
    use crate::{
        table::{ExplicitRecord, ListKind},
        TableBuilder,
    };

    const DISPOSABLE: Label = Label {
        reason: Reason::Disposable,
        score: 100,
    };

    /// A small deterministic generator (xorshift), so the tests need no dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// The names of the top `k` estimates, highest first (ties by name).
    fn top(s: &SpaceSaving, k: usize) -> Vec<String> {
        merge([(0, s)], k)
            .into_iter()
            .map(|t| t.name.to_owned())
            .collect()
    }

    #[test]
    fn estimates_are_exact_while_counters_are_free() {
        let mut s = SpaceSaving::new(4);
        for (name, n) in [("a.com", 3), ("b.com", 1), ("c.com", 2)] {
            for _ in 0..n {
                s.add(name, 1, DISPOSABLE);
            }
        }
        assert_eq!(s.estimate("a.com"), Some((3, 0)));
        assert_eq!(s.estimate("c.com"), Some((2, 0)));
        assert_eq!(s.min_count(), 0);
        assert_eq!(top(&s, 10), ["a.com", "c.com", "b.com"]);
        s.add("d.com", 1, DISPOSABLE);
        // Full: a new name takes over the smallest counter and inherits its count as error.
        s.add("e.com", 1, DISPOSABLE);
        assert_eq!(s.len(), 4);
        let (count, error) = s.estimate("e.com").unwrap();
        assert_eq!((count, error), (2, 1));
        assert_eq!(s.total(), 8);
    }

    #[test]
    fn a_skewed_stream_gives_the_exact_top_k_within_the_bound() {
        // 10 heavy names with well separated counts, drowned in 20,000 flags of 5,000 light
        // names, all shuffled; capacity 300.
        let capacity = 300;
        let mut stream: Vec<String> = Vec::new();
        let heavy: Vec<(String, usize)> = (0..10)
            .map(|i| (format!("heavy{i}.example"), 2_000 - 150 * i))
            .collect();
        for (name, n) in &heavy {
            stream.extend(std::iter::repeat_n(name.clone(), *n));
        }
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            stream.push(format!("light{}.example", rng.next() % 5_000));
        }
        for i in (1..stream.len()).rev() {
            stream.swap(i, (rng.next() % (i as u64 + 1)) as usize);
        }
        let mut s = SpaceSaving::new(capacity);
        for name in &stream {
            s.add(name, 1, DISPOSABLE);
        }
        let n = stream.len() as u64;
        let bound = n / capacity as u64;
        // The gaps (150) and the distance to the light names (>= 650) exceed the bound.
        assert!(bound < 150, "bound {bound}");
        assert!(s.min_count() <= bound);
        let want: Vec<String> = heavy.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(top(&s, 10), want);
        for (name, truth) in &heavy {
            let (count, error) = s.estimate(name).unwrap();
            assert!(
                count >= *truth as u64 && count - error <= *truth as u64,
                "{name}"
            );
            assert!(count - *truth as u64 <= bound, "{name}");
        }
        assert_eq!(s.len(), capacity);
    }

    #[test]
    fn a_flood_of_random_names_neither_evicts_heavy_hitters_nor_grows_memory() {
        let capacity = 100;
        let mut s = SpaceSaving::new(capacity);
        for _ in 0..500 {
            s.add("heavy-a.example", 1, DISPOSABLE);
            s.add("heavy-b.example", 1, DISPOSABLE);
        }
        let mut rng = Rng(42);
        for i in 0..30_000u64 {
            s.add(&format!("r{}.flood.example", rng.next()), 1, DISPOSABLE);
            if i % 100 == 0 {
                s.add("heavy-a.example", 1, DISPOSABLE);
            }
            assert!(s.len() <= capacity);
            assert!(s.index.len() <= capacity);
        }
        // The flood is 30,000 names: the bound N / m is about 305, below the heavy counts.
        assert!(s.min_count() <= s.total() / capacity as u64);
        assert_eq!(top(&s, 2), ["heavy-a.example", "heavy-b.example"]);
        assert_eq!(s.estimate("heavy-a.example"), Some((800, 0)));
        assert_eq!(s.estimate("heavy-b.example"), Some((500, 0)));
        assert_eq!(s.len(), capacity);
    }

    #[test]
    fn the_heap_and_index_stay_consistent() {
        let mut s = SpaceSaving::new(16);
        let mut rng = Rng(7);
        for _ in 0..5_000 {
            let name = format!("n{}.com", rng.next() % 40);
            s.add(&name, 1 + rng.next() % 3, DISPOSABLE);
            for (i, c) in s.heap.iter().enumerate() {
                assert_eq!(s.index[&c.name], i);
                if i > 0 {
                    assert!(s.heap[(i - 1) / 2].count <= c.count);
                }
            }
        }
        assert_eq!(s.index.len(), s.heap.len());
    }

    #[test]
    fn snapshots_round_trip_and_respect_the_capacity() {
        let mut s = SpaceSaving::new(8);
        for i in 0..20u64 {
            s.add(&format!("n{}.com", i % 10), i, DISPOSABLE);
        }
        let snap = s.snapshot();
        let back = SpaceSaving::from_snapshot(8, snap.clone());
        assert_eq!(back.total(), s.total());
        for (name, count, error, _) in &snap.counters {
            assert_eq!(back.estimate(name), Some((*count, *error)));
        }
        let small = SpaceSaving::from_snapshot(3, snap.clone());
        assert_eq!(small.len(), 3);
        let mut counts: Vec<u64> = snap.counters.iter().map(|c| c.1).collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let kept: Vec<String> = top(&small, 3);
        for (name, want) in kept.iter().zip(&counts) {
            assert_eq!(small.estimate(name).unwrap().0, *want);
        }
    }

    #[test]
    fn days_merge_expire_and_the_newest_label_wins() {
        let mut w = Window::new(3, 10);
        let undeliverable = Label {
            reason: Reason::Undeliverable,
            score: 90,
        };
        w.add(100, "a.com", 5, DISPOSABLE);
        w.add(101, "b.com", 3, DISPOSABLE);
        w.add(102, "b.com", 3, undeliverable);
        w.add(102, "a.com", 1, DISPOSABLE);
        let merged = merge(w.buckets(), 10);
        assert_eq!(
            merged,
            [
                Tally {
                    name: "a.com",
                    flags: 6,
                    label: DISPOSABLE
                },
                Tally {
                    name: "b.com",
                    flags: 6,
                    label: undeliverable
                },
            ]
        );
        assert!(!w.expire(102));
        assert!(w.expire(103));
        let merged = merge(w.buckets(), 1);
        assert_eq!(merged[0].name, "b.com");
        assert_eq!(merged[0].flags, 6);
        assert!(w.expire(200));
        assert!(w.is_empty());
    }

    fn table() -> DomainTable {
        let mut b = TableBuilder::new();
        let n = |s: &str| DomainName::parse(s).unwrap();
        b.add(&n("mailinator.com"), ListKind::Disposable);
        b.add(&n("yopmail.com"), ListKind::Disposable);
        b.add(&n("sub.plain.example"), ListKind::Disposable);
        b.add(&n("cleared.example"), ListKind::Allow);
        b.add_record(
            &n("team.example"),
            ExplicitRecord {
                reason: Reason::RoleAccount,
                risk_score: 60,
                mx_provider_label: None,
                flag_weight: 5,
            },
        )
        .unwrap();
        b.build(Scores::default())
    }

    #[test]
    fn the_ranking_is_flags_then_score_then_name_then_the_tables_own() {
        let t = table();
        let mx_dead = Label {
            reason: Reason::Undeliverable,
            score: 90,
        };
        let tallies = [
            Tally {
                name: "zz-dead.example",
                flags: 7,
                label: mx_dead,
            },
            Tally {
                name: "yopmail.com",
                flags: 7,
                label: DISPOSABLE,
            },
            Tally {
                name: "mailinator.com",
                flags: 7,
                label: Label {
                    reason: Reason::Disposable,
                    score: 95,
                },
            },
            Tally {
                name: "plain.example",
                flags: 9,
                label: Label {
                    reason: Reason::Disposable,
                    score: 95,
                },
            },
            Tally {
                name: "cleared.example",
                flags: 50,
                label: DISPOSABLE,
            },
        ];
        let top = ranking(&t, &tallies);
        let got: Vec<(&str, u8, Reason)> = top
            .entries(usize::MAX)
            .iter()
            .map(|e| (&*e.domain, e.risk_score, e.reason))
            .collect();
        assert_eq!(
            got,
            [
                ("plain.example", 95, Reason::Disposable),
                // 7 flags each: the table's own score (100) for the two blocklisted names.
                ("mailinator.com", 100, Reason::Disposable),
                ("yopmail.com", 100, Reason::Disposable),
                ("zz-dead.example", 90, Reason::Undeliverable),
                // Never counted: the table's ranking.
                ("team.example", 60, Reason::RoleAccount),
                ("sub.plain.example", 100, Reason::Disposable),
            ]
        );
        assert_eq!(
            ranking(&t, &[]).entries(usize::MAX),
            t.top().entries(usize::MAX)
        );
    }
}
