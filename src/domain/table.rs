//! `DomainTable`: the immutable snapshot every lookup reads, and the `TableBuilder` that makes it.
//!
//! A table is built once (at start or on reload) from lists and explicit records, then only read.
//! Lookups walk from the queried name up to its registrable domain, so `x.y.mailinator.com` finds
//! `mailinator.com`, while a public suffix such as `co.uk` is never an entry and never matched.
//!
//! The table keeps names and records; what a build also yields travels with it in the same
//! snapshot, made by its own module: the ranked, pre-rendered top-domains ([`TopDomains`]) and
//! the counts of the build ([`TableStats`]).

use super::name::DomainName;
use super::name_index::NameIndex;
use super::providers::ProviderTable;
use super::record::{Reason, RiskScore};
use super::scores::Scores;
use super::stats::{Conflict, TableStats};
use super::top::{Candidate, TopDomains};

/// Which list a plain domain entry comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    Disposable,
    Allow,
    FreeProvider,
}

impl ListKind {
    fn bit(self) -> u8 {
        match self {
            ListKind::Disposable => DISPOSABLE,
            ListKind::Allow => ALLOW,
            ListKind::FreeProvider => FREE,
        }
    }
}

const DISPOSABLE: u8 = 1;
const ALLOW: u8 = 2;
const FREE: u8 = 4;
const NO_RECORD: u32 = u32::MAX;

/// What the table knows of one name. Small on purpose: tables hold millions of them.
#[derive(Debug, Clone, Copy)]
struct Entry {
    flags: u8,
    record: u32,
}

impl Default for Entry {
    fn default() -> Self {
        Entry {
            flags: 0,
            record: NO_RECORD,
        }
    }
}

/// An operator's explicit record (a row of `domains.csv`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExplicitRecord {
    pub reason: Reason,
    pub risk_score: RiskScore,
    pub mx_provider_label: Option<Box<str>>,
    /// How prominently a flagged record ranks in top-domains (higher first).
    pub flag_weight: u32,
}

/// The rule of the table that decided a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableRule<'t> {
    /// On the allowlist, at this name or a parent: never flagged.
    Allowlist { at: &'t str },
    /// An explicit record for exactly this name.
    Record(&'t ExplicitRecord),
    /// A consumer webmail provider (never disposable, whatever the blocklists say).
    FreeProvider { at: &'t str },
    /// On a blocklist, at this name (`at` equals the name) or at a parent.
    Blocklist { at: &'t str },
    /// The table has nothing to say.
    Unknown,
}

/// The outcome of a table lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableMatch<'t> {
    pub rule: TableRule<'t>,
    pub is_free_provider: bool,
    /// An explicit record for the name, also when another rule decided.
    pub record: Option<&'t ExplicitRecord>,
}

/// An immutable, fully built domain table.
#[derive(Debug)]
pub struct DomainTable {
    entries: NameIndex<Entry>,
    records: Vec<ExplicitRecord>,
    top: TopDomains,
    /// The scores the table was built (and its top ranked) with; classification reads them here
    /// so that both always agree.
    scores: Scores,
    providers: ProviderTable,
    stats: TableStats,
}

impl DomainTable {
    /// An empty table: everything is unknown.
    pub fn empty(scores: Scores) -> Self {
        TableBuilder::new().build(scores)
    }

    /// Looks a name up: allowlist first, then the name's own record, then the free list, then
    /// the blocklists, each on the name and its parents up to the registrable domain.
    pub fn lookup<'t>(&'t self, name: &DomainName) -> TableMatch<'t> {
        let mut allow_at = None;
        let mut free_at = None;
        let mut blocked_at = None;
        let mut record = None;
        if let Some(registrable) = name.registrable() {
            let stop = name.as_str().len() - registrable.len();
            for level in name.suffixes() {
                let depth = name.as_str().len() - level.len();
                if depth > stop {
                    break;
                }
                let Some((key, entry)) = self.entries.get(level) else {
                    continue;
                };
                if depth == 0 && entry.record != NO_RECORD {
                    record = self.records.get(entry.record as usize);
                }
                if entry.flags & ALLOW != 0 {
                    allow_at.get_or_insert(key);
                }
                if entry.flags & FREE != 0 {
                    free_at.get_or_insert(key);
                }
                if entry.flags & DISPOSABLE != 0 {
                    blocked_at.get_or_insert(key);
                }
            }
        }
        let rule = match (allow_at, record, free_at, blocked_at) {
            (Some(at), _, _, _) => TableRule::Allowlist { at },
            (None, Some(rec), _, _) => TableRule::Record(rec),
            (None, None, Some(at), _) => TableRule::FreeProvider { at },
            (None, None, None, Some(at)) => TableRule::Blocklist { at },
            (None, None, None, None) => TableRule::Unknown,
        };
        TableMatch {
            rule,
            is_free_provider: free_at.is_some(),
            record,
        }
    }

    /// The most prominent flagged entries, ranked and rendered for top-domains.
    pub fn top(&self) -> &TopDomains {
        &self.top
    }

    pub fn scores(&self) -> &Scores {
        &self.scores
    }

    /// Mail providers, to recognise MX hosts.
    pub fn providers(&self) -> &ProviderTable {
        &self.providers
    }

    pub fn stats(&self) -> &TableStats {
        &self.stats
    }

    /// Heap bytes of the name index (names plus hash table).
    pub fn index_bytes(&self) -> usize {
        self.entries.heap_bytes()
    }

    /// Number of distinct names in the table.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A record was given twice for one name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a record for {0} was given already")]
pub struct DuplicateRecord(pub Box<str>);

/// Collects entries, then builds a [`DomainTable`].
#[derive(Debug, Default)]
pub struct TableBuilder {
    entries: NameIndex<Entry>,
    records: Vec<ExplicitRecord>,
    providers: ProviderTable,
    stats: TableStats,
}

impl TableBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(names: usize) -> Self {
        TableBuilder {
            entries: NameIndex::with_capacity(names, names * 16),
            ..Self::default()
        }
    }

    /// Adds a list entry. Public suffixes (`co.uk`) are skipped and counted: they are never
    /// matched, so listing one would have no effect but to surprise.
    pub fn add(&mut self, name: &DomainName, kind: ListKind) {
        if name.registrable().is_none() {
            self.stats.skipped_public_suffixes += 1;
            return;
        }
        self.entry(name).flags |= kind.bit();
    }

    /// Records how many entries a source held (see [`TableStats::sources`]).
    pub fn count_source(&mut self, source: &str, entries: usize) {
        self.stats.sources.push((source.into(), entries));
    }

    /// Sets the mail provider patterns.
    pub fn set_providers(&mut self, providers: ProviderTable) {
        self.providers = providers;
    }

    /// Adds an explicit record for exactly `name`.
    pub fn add_record(
        &mut self,
        name: &DomainName,
        record: ExplicitRecord,
    ) -> Result<(), DuplicateRecord> {
        if name.registrable().is_none() {
            self.stats.skipped_public_suffixes += 1;
            return Ok(());
        }
        let index = self.records.len() as u32;
        let entry = self.entry(name);
        if entry.record != NO_RECORD {
            return Err(DuplicateRecord(name.as_str().into()));
        }
        entry.record = index;
        self.records.push(record);
        Ok(())
    }

    fn entry(&mut self, name: &DomainName) -> &mut Entry {
        self.entries.get_or_insert(name.as_str())
    }

    /// Makes room for `names` more names of `bytes` bytes in all (avoids regrowth on big lists).
    pub fn reserve(&mut self, names: usize, bytes: usize) {
        self.entries.reserve(names, bytes);
    }

    /// Resolves conflicts, ranks the flagged entries and freezes the table.
    pub fn build(mut self, scores: Scores) -> DomainTable {
        let mut stats = std::mem::take(&mut self.stats);
        for (name, entry) in self.entries.iter_mut() {
            if entry.flags & DISPOSABLE != 0 && entry.flags & (ALLOW | FREE) != 0 {
                entry.flags &= !DISPOSABLE;
                stats.conflicts.push(Conflict {
                    domain: name.into(),
                    resolution: if entry.flags & ALLOW != 0 {
                        "on the allowlist and a blocklist: allowlist wins"
                    } else {
                        "on the free-provider list and a blocklist: free provider wins"
                    },
                });
            }
            stats.disposable += usize::from(entry.flags & DISPOSABLE != 0);
            stats.allow += usize::from(entry.flags & ALLOW != 0);
            stats.free_providers += usize::from(entry.flags & FREE != 0);
        }
        stats.conflicts.sort_by(|a, b| a.domain.cmp(&b.domain));
        stats.records = self.records.len();
        let top = TopDomains::rank(flagged(&self, &scores));
        DomainTable {
            entries: self.entries,
            records: self.records,
            top,
            scores,
            providers: self.providers,
            stats,
        }
    }
}

/// Every flagged name: flagged explicit records, and blocklist entries with no record of their
/// own; never a name on the allowlist or the free list.
fn flagged<'b>(builder: &'b TableBuilder, scores: &Scores) -> Vec<Candidate<'b>> {
    let mut candidates = Vec::new();
    for (name, entry) in builder.entries.iter() {
        if entry.flags & (ALLOW | FREE) != 0 {
            continue;
        }
        if let Some(rec) = builder.records.get(entry.record as usize) {
            if rec.reason != Reason::Safe {
                candidates.push(Candidate {
                    weight: rec.flag_weight,
                    score: rec.risk_score,
                    reason: rec.reason,
                    name,
                });
            }
        } else if entry.flags & DISPOSABLE != 0 {
            candidates.push(Candidate {
                weight: 0,
                score: scores.disposable,
                reason: Reason::Disposable,
                name,
            });
        }
    }
    candidates
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> DomainName {
        DomainName::parse(s).unwrap()
    }

    fn table(disposable: &[&str], allow: &[&str], free: &[&str]) -> DomainTable {
        let mut b = TableBuilder::new();
        for (names, kind) in [
            (disposable, ListKind::Disposable),
            (allow, ListKind::Allow),
            (free, ListKind::FreeProvider),
        ] {
            for d in names {
                b.add(&n(d), kind);
            }
        }
        b.build(Scores::default())
    }

    #[test]
    fn blocklist_matches_name_and_parents_up_to_registrable() {
        let t = table(&["mailinator.com"], &[], &[]);
        for q in ["mailinator.com", "x.mailinator.com", "x.y.mailinator.com"] {
            assert_eq!(
                t.lookup(&n(q)).rule,
                TableRule::Blocklist {
                    at: "mailinator.com"
                },
                "{q}"
            );
        }
        assert_eq!(t.lookup(&n("notmailinator.com")).rule, TableRule::Unknown);
        assert_eq!(t.lookup(&n("mailinator.co")).rule, TableRule::Unknown);
    }

    #[test]
    fn public_suffixes_are_never_entries_nor_matched() {
        let t = table(&["co.uk", "github.io"], &[], &[]);
        assert_eq!(t.stats().skipped_public_suffixes, 2);
        assert_eq!(t.lookup(&n("example.co.uk")).rule, TableRule::Unknown);
        assert_eq!(t.lookup(&n("co.uk")).rule, TableRule::Unknown);
        assert_eq!(t.lookup(&n("someone.github.io")).rule, TableRule::Unknown);
        assert!(t.is_empty());
    }

    #[test]
    fn subdomain_entry_does_not_flag_its_parent() {
        let t = table(&["spam.example.com"], &[], &[]);
        assert_eq!(t.lookup(&n("example.com")).rule, TableRule::Unknown);
        assert!(matches!(
            t.lookup(&n("a.spam.example.com")).rule,
            TableRule::Blocklist { .. }
        ));
    }

    #[test]
    fn allowlist_and_free_list_win_and_conflicts_are_reported() {
        let t = table(
            &["126.com", "99.com", "dispo.net"],
            &["126.com", "dispo.net"],
            &["99.com"],
        );
        assert_eq!(
            t.lookup(&n("126.com")).rule,
            TableRule::Allowlist { at: "126.com" }
        );
        // An allowlisted parent also wins over a listed subdomain.
        assert_eq!(
            t.lookup(&n("sub.dispo.net")).rule,
            TableRule::Allowlist { at: "dispo.net" }
        );
        let m = t.lookup(&n("99.com"));
        assert_eq!(m.rule, TableRule::FreeProvider { at: "99.com" });
        assert!(m.is_free_provider);
        let names: Vec<_> = t.stats().conflicts.iter().map(|c| &*c.domain).collect();
        assert_eq!(names, ["126.com", "99.com", "dispo.net"]);
        assert_eq!(t.stats().disposable, 0);
        assert!(t.top().is_empty());
    }

    #[test]
    fn records_are_exact_and_rank_by_weight_then_score_then_name() {
        let mut b = TableBuilder::new();
        b.add(&n("b-dispo.com"), ListKind::Disposable);
        b.add(&n("a-dispo.com"), ListKind::Disposable);
        let rec = |reason, risk_score, flag_weight| ExplicitRecord {
            reason,
            risk_score,
            mx_provider_label: None,
            flag_weight,
        };
        b.add_record(&n("role.example"), rec(Reason::RoleAccount, 60, 5))
            .unwrap();
        b.add_record(&n("dead.example"), rec(Reason::Undeliverable, 90, 0))
            .unwrap();
        b.add_record(&n("fine.example"), rec(Reason::Safe, 3, 99))
            .unwrap();
        assert_eq!(
            b.add_record(&n("fine.example"), rec(Reason::Safe, 3, 0)),
            Err(DuplicateRecord("fine.example".into()))
        );
        let t = b.build(Scores::default());
        let top: Vec<_> = t.top().entries(10).iter().map(|e| &*e.domain).collect();
        assert_eq!(
            top,
            ["role.example", "a-dispo.com", "b-dispo.com", "dead.example"]
        );
        let body: serde_json::Value = serde_json::from_str(&t.top().json(2)).unwrap();
        assert_eq!(body["count"], 2);
        assert_eq!(body["domains"][0]["domain"], "role.example");
        assert_eq!(body["domains"][0]["reason"], "role_account");
        assert_eq!(body["domains"][1]["risk_score"], 100);
        assert!(matches!(
            t.lookup(&n("role.example")).rule,
            TableRule::Record(ExplicitRecord {
                reason: Reason::RoleAccount,
                ..
            })
        ));
        assert_eq!(t.lookup(&n("x.role.example")).rule, TableRule::Unknown);
    }
}
