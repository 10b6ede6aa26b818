//! Live flag counts behind `GET /v1/public/top-domains`: the lookup path records each flagged
//! answer into per-thread buffers; a background service ([`keeper::Keeper`]) drains them into
//! daily heavy-hitter summaries ([`drg_domain::heavy_hitters`]), re-renders the ranking at
//! most every `render_interval_ms`, keeps the counts in the state directory and, with
//! `quota.store: redis`, shares them with the other gateways through Redis ([`shared`]).
//!
//! The request path never ranks or serialises: a flag costs one uncontended lock and a
//! Space-Saving update of its thread's own summary, and top-domains copies bytes rendered in the
//! background. The thread summaries are bounded like the daily ones and add their own error
//! (at most N/m over all drains), so a count shown is within 2N/m of the truth, never below it.

pub mod keeper;
pub mod shared;
pub mod state;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use prometheus::IntCounter;
use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds};

use drg_domain::classify::Verdict;
use drg_domain::heavy_hitters::{Label, SpaceSaving};
use drg_domain::table::TableRule;
use drg_domain::top::TopDomains;
use drg_domain::{DomainName, Reason, RiskRecord};

/// `gateway.top_domains`.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TopDomainsConfig {
    /// Count flags and rank top-domains by them; `false`: the fixed ranking of the table.
    pub enabled: bool,
    /// The rolling window, in UTC days (1 to 366).
    pub window_days: u32,
    /// Counters per day (Space-Saving capacity m, 100 to 1000000): each count is within N / m
    /// of the truth (N: flags in the window), and memory is at most `window_days x capacity`
    /// counters. Also bounds the distinct names each thread buffers between two drains.
    pub capacity: usize,
    /// The ranking is re-rendered at most this often, in milliseconds (10 to 60000).
    #[serde(rename = "render_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub render_interval: Duration,
    /// How often the counts are written to `state_file`, in milliseconds (100 to 3600000); also
    /// at shutdown.
    #[serde(rename = "persist_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub persist_interval: Duration,
    /// With `quota.store: redis`: how often local counts are added to Redis and the shared
    /// counts read back, in milliseconds (10 to 600000).
    #[serde(rename = "sync_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub sync_interval: Duration,
    /// Where the counts are kept across restarts. Relative to the config file.
    pub state_file: PathBuf,
    /// A name flagged only because DNS found no mail host for it (`undeliverable` with no list
    /// or record behind it) is ranked once this many distinct projects flagged it (1 to 1000;
    /// 1: at once). Anyone with a key can make such names up by the thousand; list evidence and
    /// disposable-mail MX hosts rank at once.
    pub no_mx_min_projects: usize,
}

impl Default for TopDomainsConfig {
    fn default() -> Self {
        TopDomainsConfig {
            enabled: true,
            window_days: 30,
            capacity: 5_000,
            render_interval: Duration::from_millis(1_000),
            persist_interval: Duration::from_millis(60_000),
            sync_interval: Duration::from_millis(2_000),
            state_file: PathBuf::from("../state/top_domains.json"),
            no_mx_min_projects: 2,
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl TopDomainsConfig {
    /// Semantic problems, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !(1..=366).contains(&self.window_days) {
            out.push(format!(
                "gateway.top_domains.window_days: {} is outside 1..=366",
                self.window_days
            ));
        }
        if !(100..=1_000_000).contains(&self.capacity) {
            out.push(format!(
                "gateway.top_domains.capacity: {} is outside 100..=1000000",
                self.capacity
            ));
        }
        for (key, value, range) in [
            ("render_interval_ms", self.render_interval, 10..=60_000),
            (
                "persist_interval_ms",
                self.persist_interval,
                100..=3_600_000,
            ),
            ("sync_interval_ms", self.sync_interval, 10..=600_000),
        ] {
            if !range.contains(&ms(value)) {
                out.push(format!(
                    "gateway.top_domains.{key}: {} is outside {}..={}",
                    ms(value),
                    range.start(),
                    range.end()
                ));
            }
        }
        if !(1..=1_000).contains(&self.no_mx_min_projects) {
            out.push(format!(
                "gateway.top_domains.no_mx_min_projects: {} is outside 1..=1000",
                self.no_mx_min_projects
            ));
        }
        if self.state_file.as_os_str().is_empty() {
            out.push("gateway.top_domains.state_file: empty".to_owned());
        }
        out
    }
}

/// What a flag rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhyFlagged {
    /// A list or record of the table, or mail hosts at a disposable-mail service: ranked at once.
    Evidence,
    /// Only that DNS found no mail host (`undeliverable` for a name the table leaves open):
    /// ranked once enough distinct projects flagged the name.
    NoMailHost,
    /// An inference from learned neighbours (the MX neighbourhood): never ranked. The public
    /// list names only what lists, records or a throwaway service's own hosts confirm, so
    /// neighbours planted to flag a company cannot put it there either.
    Inferred,
}

impl WhyFlagged {
    /// The basis of a classification's flag.
    pub fn of(verdict: &Verdict<'_>) -> WhyFlagged {
        if verdict.inferred() {
            WhyFlagged::Inferred
        } else if verdict.rule == TableRule::Unknown
            && verdict.record.reason == Reason::Undeliverable
        {
            WhyFlagged::NoMailHost
        } else {
            WhyFlagged::Evidence
        }
    }
}

/// What the gateway holds: the flag buffers it records into and the ranking it serves.
pub struct LiveTop {
    /// A request records into its thread's shard: a worker thread's lock is only ever contended
    /// by the drain, once per render interval. Each shard is itself a Space-Saving summary, so
    /// a flood of distinct names between two drains churns its smallest counters instead of
    /// growing it or dropping the flags of the heavy hitters.
    shards: Box<[Mutex<SpaceSaving>]>,
    capacity: usize,
    /// Names flagged on [`WhyFlagged::NoMailHost`] not yet seen by enough projects. One lock for all
    /// threads (two projects' flags must meet), taken only by such flags.
    waiting: Mutex<Waiting>,
    /// `None` until a flag was counted: top-domains then serves the table's own ranking.
    rendered: ArcSwapOption<TopDomains>,
    recorded: IntCounter,
}

impl LiveTop {
    /// Buffers of `capacity` names per shard; names without evidence ranked once two projects
    /// flagged them (see [`with_min_projects`](Self::with_min_projects)).
    pub fn new(capacity: usize, recorded: IntCounter) -> Self {
        let shards = std::thread::available_parallelism()
            .map_or(4, usize::from)
            .clamp(1, 64);
        LiveTop {
            shards: (0..shards)
                .map(|_| Mutex::new(SpaceSaving::new(capacity)))
                .collect(),
            capacity,
            waiting: Mutex::new(Waiting::new(2, capacity)),
            rendered: ArcSwapOption::empty(),
            recorded,
        }
    }

    /// Names flagged on [`WhyFlagged::NoMailHost`] are ranked once `n` distinct projects flagged them.
    pub fn with_min_projects(mut self, n: usize) -> Self {
        self.waiting = Mutex::new(Waiting::new(n, self.capacity));
        self
    }

    /// Counts one answer of `project` for its registrable domain if it flags the name.
    pub fn record(
        &self,
        name: &DomainName,
        answer: &RiskRecord<'_>,
        basis: WhyFlagged,
        project: &str,
    ) {
        if answer.reason == Reason::Safe {
            return;
        }
        let Some(registrable) = name.registrable() else {
            return;
        };
        let label = Label {
            reason: answer.reason,
            score: answer.risk_score,
        };
        match basis {
            WhyFlagged::Inferred => {}
            WhyFlagged::Evidence => self.record_name(registrable, label),
            WhyFlagged::NoMailHost => {
                let ready = self
                    .waiting
                    .lock()
                    .map_or(0, |mut w| w.flag(registrable, project));
                if ready > 0 {
                    self.add(registrable, ready, label);
                }
            }
        }
    }

    /// Counts one flag of `registrable` (already a registrable domain).
    pub fn record_name(&self, registrable: &str, label: Label) {
        self.add(registrable, 1, label);
    }

    fn add(&self, registrable: &str, flags: u64, label: Label) {
        if let Ok(mut shard) = self.shards[shard_index(self.shards.len())].lock() {
            shard.add(registrable, flags, label);
        }
        self.recorded.inc_by(flags);
    }

    /// Takes every buffered flag out of the shards.
    pub fn drain(&self) -> Vec<SpaceSaving> {
        self.shards
            .iter()
            .filter_map(|s| {
                let mut shard = s.lock().ok()?;
                (!shard.is_empty())
                    .then(|| std::mem::replace(&mut *shard, SpaceSaving::new(self.capacity)))
            })
            .collect()
    }

    /// The body of `top-domains?limit=N` from the live ranking, or `None` before any flag.
    pub fn json(&self, limit: usize) -> Option<String> {
        self.rendered.load().as_ref().map(|t| t.json(limit))
    }

    /// [`json`](Self::json) as a response body: the default `limit`'s is rendered once per
    /// ranking and shared, not copied per request.
    pub fn body(&self, limit: usize) -> Option<bytes::Bytes> {
        self.rendered.load().as_ref().map(|t| t.body(limit))
    }

    fn publish(&self, top: Option<TopDomains>) {
        self.rendered.store(top.map(Arc::new));
    }
}

/// Names flagged without evidence, each with the projects that flagged it, until enough did.
/// Bounded: two generations of at most `capacity` names; when the current one is full the older
/// is forgotten (a flood of made-up names then delays a real one, never ranks a made-up one).
struct Waiting {
    min_projects: usize,
    capacity: usize,
    /// Seeded per process: nobody can pick project names whose hashes collide.
    hasher: foldhash::fast::RandomState,
    current: HashMap<Box<str>, Seen>,
    previous: HashMap<Box<str>, Seen>,
}

/// One waiting name.
#[derive(Debug, Default)]
struct Seen {
    /// Hashes of the projects that flagged it (at most `min_projects`; a small key, where two
    /// projects colliding would only merge their votes); empty once confirmed.
    projects: Vec<u64>,
    /// Flags held back while it waited.
    flags: u64,
    confirmed: bool,
}

impl Waiting {
    fn new(min_projects: usize, capacity: usize) -> Self {
        Waiting {
            min_projects: min_projects.max(1),
            capacity: capacity.max(1),
            hasher: foldhash::fast::RandomState::default(),
            current: HashMap::new(),
            previous: HashMap::new(),
        }
    }

    /// One flag of `name` by `project`: how many flags to count now (0 while it waits; at
    /// confirmation, all the flags it held back).
    fn flag(&mut self, name: &str, project: &str) -> u64 {
        if self.min_projects <= 1 {
            return 1;
        }
        if !self.current.contains_key(name) {
            if self.current.len() >= self.capacity {
                self.previous = std::mem::take(&mut self.current);
            }
            let seen = self.previous.remove(name).unwrap_or_default();
            self.current.insert(name.into(), seen);
        }
        let Some(seen) = self.current.get_mut(name) else {
            return 0;
        };
        if seen.confirmed {
            return 1;
        }
        seen.flags += 1;
        let p = std::hash::BuildHasher::hash_one(&self.hasher, project);
        if !seen.projects.contains(&p) {
            seen.projects.push(p);
        }
        if seen.projects.len() < self.min_projects {
            return 0;
        }
        seen.confirmed = true;
        seen.projects = Vec::new();
        std::mem::take(&mut seen.flags)
    }
}

/// This thread's shard number.
fn shard_index(shards: usize) -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    INDEX.with(|i| *i) % shards
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(names: usize) -> LiveTop {
        LiveTop::new(names, IntCounter::new("r", "r").unwrap())
    }

    fn record(l: &LiveTop, name: &str, reason: Reason, score: u8) {
        let name = DomainName::parse(name).unwrap();
        let answer = RiskRecord {
            domain: name.as_str(),
            risk_score: score,
            reason,
            is_free_provider: false,
            is_corporate_email: false,
            mx_provider_label: None,
        };
        l.record(&name, &answer, WhyFlagged::Evidence, "p");
    }

    #[test]
    fn flagged_answers_count_for_their_registrable_domain_only() {
        let l = live(10);
        record(&l, "x.y.mailinator.com", Reason::Disposable, 95);
        record(&l, "mailinator.com", Reason::Disposable, 100);
        record(&l, "gmail.com", Reason::Safe, 10);
        record(&l, "a.b.co.uk", Reason::Undeliverable, 90);
        let drained = l.drain();
        let mut all: Vec<(String, u64, Label)> = drained
            .iter()
            .flat_map(|s| s.iter())
            .map(|(n, c, label)| (n.into(), c, label))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        let label = |reason, score| Label { reason, score };
        assert_eq!(
            all,
            [
                ("b.co.uk".into(), 1, label(Reason::Undeliverable, 90)),
                ("mailinator.com".into(), 2, label(Reason::Disposable, 100)),
            ]
        );
        assert_eq!(l.recorded.get(), 3);
        assert!(l.drain().is_empty());
    }

    fn no_mx(l: &LiveTop, name: &str, project: &str) {
        let name = DomainName::parse(name).unwrap();
        let answer = RiskRecord {
            domain: name.as_str(),
            risk_score: 90,
            reason: Reason::Undeliverable,
            is_free_provider: false,
            is_corporate_email: false,
            mx_provider_label: None,
        };
        l.record(&name, &answer, WhyFlagged::NoMailHost, project);
    }

    fn counts(l: &LiveTop) -> Vec<(String, u64)> {
        let mut all: Vec<(String, u64)> = l
            .drain()
            .iter()
            .flat_map(|s| {
                s.iter()
                    .map(|(n, c, _)| (n.to_owned(), c))
                    .collect::<Vec<_>>()
            })
            .collect();
        all.sort();
        all
    }

    #[test]
    fn names_without_evidence_wait_for_enough_projects() {
        let l = live(10).with_min_projects(2);
        for _ in 0..5 {
            no_mx(&l, "made-up.example", "a");
        }
        assert_eq!(counts(&l), []);
        // A second project: the name ranks with every flag held back, then counts as any.
        no_mx(&l, "made-up.example", "b");
        assert_eq!(counts(&l), [("made-up.example".to_owned(), 6)]);
        no_mx(&l, "made-up.example", "a");
        assert_eq!(counts(&l), [("made-up.example".to_owned(), 1)]);
        assert_eq!(l.recorded.get(), 7);
        // One project is enough when so configured.
        let l = live(10).with_min_projects(1);
        no_mx(&l, "made-up.example", "a");
        assert_eq!(counts(&l), [("made-up.example".to_owned(), 1)]);
    }

    #[test]
    fn waiting_names_are_bounded_and_a_flood_ranks_nothing() {
        let mut w = Waiting::new(2, 3);
        assert_eq!(w.flag("real.example", "a"), 0);
        for i in 0..100 {
            assert_eq!(w.flag(&format!("n{i}.example"), "flooder"), 0);
        }
        assert!(w.current.len() <= 3 && w.previous.len() <= 3);
        // The real name was forgotten by the flood: it waits again, and two projects still rank it.
        assert_eq!(w.flag("real.example", "b"), 0);
        assert_eq!(w.flag("real.example", "c"), 2);
        assert_eq!(w.flag("real.example", "a"), 1);
    }

    #[test]
    fn the_basis_is_no_mail_host_only_for_undeliverable_names_the_table_left_open() {
        use drg_domain::classify::classify_match;
        use drg_domain::mail::MxEvidence;
        use drg_domain::{
            table::{ExplicitRecord, ListKind},
            TableBuilder,
        };
        let n = |s: &str| DomainName::parse(s).unwrap();
        let mut b = TableBuilder::new();
        b.add(&n("mailinator.com"), ListKind::Disposable);
        b.add_record(
            &n("dead.example"),
            ExplicitRecord {
                reason: Reason::Undeliverable,
                risk_score: 90,
                mx_provider_label: None,
                flag_weight: 0,
            },
        )
        .unwrap();
        let table = b.build(drg_domain::Scores::default());
        let no_mx = MxEvidence::NoMailHost;
        let basis = |name: &DomainName| {
            let v = classify_match(&table, name, table.lookup(name), Some(&no_mx), None);
            (v.record.reason, WhyFlagged::of(&v))
        };
        assert_eq!(
            basis(&n("made-up.example")),
            (Reason::Undeliverable, WhyFlagged::NoMailHost)
        );
        assert_eq!(
            basis(&n("dead.example")),
            (Reason::Undeliverable, WhyFlagged::Evidence)
        );
        assert_eq!(
            basis(&n("x.mailinator.com")),
            (Reason::Disposable, WhyFlagged::Evidence)
        );
    }

    #[test]
    fn a_shard_holds_at_most_its_capacity_of_names() {
        let l = live(2);
        for name in ["a.com", "a.com", "a.com", "b.com", "c.com", "d.com"] {
            record(&l, name, Reason::Disposable, 100);
        }
        assert_eq!(l.recorded.get(), 6);
        let drained = l.drain();
        let names: usize = drained.iter().map(SpaceSaving::len).sum();
        assert_eq!(names, 2);
        assert_eq!(drained[0].estimate("a.com"), Some((3, 0)));
    }

    #[test]
    fn config_defaults_are_valid_and_bad_values_are_named() {
        assert!(TopDomainsConfig::default().problems().is_empty());
        let bad = TopDomainsConfig {
            window_days: 0,
            capacity: 5,
            render_interval: Duration::from_millis(1),
            ..TopDomainsConfig::default()
        };
        let problems = bad.problems().join("\n");
        for key in ["window_days", "capacity", "render_interval_ms"] {
            assert!(problems.contains(key), "{problems}");
        }
    }
}
