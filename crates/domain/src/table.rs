//! `DomainTable`: the immutable snapshot every lookup reads, and the `TableBuilder` that makes it.
//!
//! A table is built once (at start or on reload) from lists and explicit records, then only read.
//! Lookups walk from the queried name up to its registrable domain, so `x.y.mailinator.com` finds
//! `mailinator.com`, while a public suffix such as `co.uk` is never an entry and never matched.
//!
//! Precedence follows how much each list is worth as evidence: the allowlist and the curated
//! free-provider list always win over a blocklist; a broad third-party free list (thousands of
//! names merged from many sources, blocklisted ones among them) only adds names that no blocklist
//! carries, at the name or a parent. Every overlap resolved is kept in [`TableStats`].
//!
//! The table keeps names and records; what a build also yields travels with it in the same
//! snapshot, made by its own module: the ranked, pre-rendered top-domains ([`TopDomains`]) and
//! the counts of the build ([`TableStats`]).
//!
//! Every entry remembers where its deciding list named it (source and line, see [`Origin`]), for
//! the evidence of `?explain=true`; and the table carries its [`DatasetVersion`] (generation and
//! content hash), which every answer shows as `X-Dataset-Version`.

use bytes::Bytes;

use super::name::DomainName;
use super::name_index::NameIndex;
use super::providers::ProviderTable;
use super::record::{Reason, RiskScore};
use super::scores::Scores;
use super::stats::TableStats;
use super::top::TopDomains;

/// Which list a plain domain entry comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    Disposable,
    Allow,
    /// Our curated list of consumer webmail providers: wins over any blocklist.
    FreeProvider,
    /// A broad third-party free-webmail list: loses to any blocklist.
    BroadFree,
    /// A privacy relay or masked-email service (curated `relays.txt`, operators' `relay_lists`):
    /// wins over every blocklist and every free list (a relay is neither throwaway nor webmail).
    Relay,
    /// An organisation's domain that a broad free list names (`free_exclusions.txt`): the broad
    /// list's word is void for it (the curated free list is not affected).
    NotFree,
}

impl ListKind {
    pub(super) fn bit(self) -> u8 {
        match self {
            ListKind::Disposable => DISPOSABLE,
            ListKind::Allow => ALLOW,
            ListKind::FreeProvider => FREE,
            ListKind::BroadFree => BROAD_FREE,
            ListKind::Relay => RELAY,
            ListKind::NotFree => NOT_FREE,
        }
    }

    /// The list of highest precedence among `live_top` (the order [`DomainTable::lookup`] asks
    /// them in), if any.
    pub(super) fn strongest(flags: u8) -> Option<ListKind> {
        [
            ListKind::Relay,
            ListKind::Allow,
            ListKind::FreeProvider,
            ListKind::Disposable,
            ListKind::BroadFree,
            ListKind::NotFree,
        ]
        .into_iter()
        .find(|k| flags & k.bit() != 0)
    }
}

pub(super) const DISPOSABLE: u8 = 1;
pub(super) const ALLOW: u8 = 2;
pub(super) const FREE: u8 = 4;
pub(super) const BROAD_FREE: u8 = 8;
/// The name has an explicit record (kept aside: few names have one).
pub(super) const RECORD: u8 = 16;
pub(super) const RELAY: u8 = 32;
pub(super) const NOT_FREE: u8 = 64;
/// Checked when the table was built: the name itself is no typo of a curated provider. Set on
/// blocklisted names only (typo domains are often listed, and most lookups of a listed name
/// would otherwise scan the providers for nothing); a name without it is checked at lookup.
pub(super) const NO_TYPO: u8 = 128;

/// What the table knows of one name. Small on purpose: tables hold millions of them. With the
/// index's offset and length it fills a 16-byte slot: the provenance rides in what was padding
/// next to the flags, and the record index moved out to a side index of the few names that have
/// a record, so knowing where each entry came from costs no byte a name.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Entry {
    pub(super) flags: u8,
    /// Below its registrable domain (`x.mailinator.com`): the build looks at its parents. Rides
    /// in what was padding.
    pub(super) below: bool,
    /// Where the entry's list of highest precedence named it (see [`Origin`]).
    pub(super) source: SourceId,
    pub(super) line: u32,
}

/// A source of a build (a file, a URL, the built-in list), by its index in the table's source
/// names. 0 is "no source named" (entries added with
/// [`TableBuilder::add`](super::builder::TableBuilder::add)).
pub type SourceId = u16;

/// Where an entry or a record came from: a source and a line of it (0 when the source has no
/// lines, e.g. the built-in list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Origin {
    pub source: SourceId,
    pub line: u32,
}

/// The provenance of a table rule, as [`DomainTable::provenance`] tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Provenance<'t> {
    /// The list that decided (`None` for an explicit record).
    pub kind: Option<ListKind>,
    /// The source's name (`None` when it was given none).
    pub source: Option<&'t str>,
    /// Line of the source, from 1 (`None` when the source has no lines).
    pub line: Option<u32>,
}

/// A record with where it came from.
#[derive(Debug)]
pub(super) struct StoredRecord {
    pub(super) record: ExplicitRecord,
    pub(super) origin: Origin,
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
    /// A consumer webmail provider: on the curated list (never disposable, whatever the
    /// blocklists say), or only on a broad list with no blocklist entry at the name or a parent.
    FreeProvider { at: &'t str },
    /// On a blocklist, at this name (`at` equals the name) or at a parent.
    Blocklist { at: &'t str },
    /// A privacy relay or masked-email service, at this name or a parent; `service` names it
    /// when its list did.
    Relay {
        at: &'t str,
        service: Option<&'t str>,
    },
    /// The table has nothing to say.
    Unknown,
}

/// The outcome of a table lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableMatch<'t> {
    pub rule: TableRule<'t>,
    pub is_free_provider: bool,
    /// Free only by a broad third-party list (not our curated one): MX evidence of a business
    /// mailbox can overrule it.
    pub broad_only: bool,
    /// The name is on `free_exclusions.txt` (an organisation a broad free list names).
    pub not_free_listed: bool,
    /// An explicit record for the name, also when another rule decided.
    pub record: Option<&'t ExplicitRecord>,
    /// Known when the table was built: the name itself is no typo of a curated provider
    /// (`false`: not known, check it).
    pub no_typo: bool,
}

/// An immutable, fully built domain table.
#[derive(Debug)]
pub struct DomainTable {
    pub(super) entries: NameIndex<Entry>,
    pub(super) records: Vec<StoredRecord>,
    /// Names with a record, to their index in `records`.
    pub(super) record_index: NameIndex<u32>,
    /// Source names by [`SourceId`] (index 0: none).
    pub(super) sources: Vec<Box<str>>,
    pub(super) version: DatasetVersion,
    pub(super) top: TopDomains,
    /// The scores the table was built (and its top ranked) with; classification reads them here
    /// so that both always agree.
    pub(super) scores: Scores,
    pub(super) providers: ProviderTable,
    pub(super) stats: TableStats,
    /// The service of each relay entry whose list named one (few names: a plain map).
    pub(super) relay_services: std::collections::HashMap<Box<str>, Box<str>>,
    /// Typos of the curated free providers.
    pub(super) typos: super::typos::TypoIndex,
}

impl DomainTable {
    /// Looks a name up: allowlist first, then the name's own record, then the curated free
    /// list, then the blocklists, then the broad free lists, each on the name and its parents up
    /// to the registrable domain.
    pub fn lookup<'t>(&'t self, name: &DomainName) -> TableMatch<'t> {
        let mut allow_at = None;
        let mut free_at = None;
        let mut broad_at = None;
        let mut blocked_at = None;
        let mut relay_at = None;
        let mut not_free = false;
        let mut record = None;
        let mut no_typo = false;
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
                if depth == 0 && entry.flags & RECORD != 0 {
                    record = self.record_of(key);
                }
                if entry.flags & ALLOW != 0 {
                    allow_at.get_or_insert(key);
                }
                if entry.flags & FREE != 0 {
                    free_at.get_or_insert(key);
                }
                if entry.flags & BROAD_FREE != 0 {
                    broad_at.get_or_insert(key);
                }
                if entry.flags & DISPOSABLE != 0 {
                    blocked_at.get_or_insert(key);
                }
                if entry.flags & RELAY != 0 {
                    relay_at.get_or_insert(key);
                }
                not_free |= depth == 0 && entry.flags & NOT_FREE != 0;
                no_typo |= depth == 0 && entry.flags & NO_TYPO != 0;
            }
        }
        // A blocklist entry voids a broad list's word, unless the allowlist voided it first.
        let broad_at = broad_at.filter(|_| blocked_at.is_none() || allow_at.is_some());
        let rule = match (allow_at, record, free_at, blocked_at) {
            // A relay is safe like an allowlisted name, and says more: what the address is.
            // Only the operator's own record for the very name says more still.
            (_, None, _, _) if relay_at.is_some() => {
                let at = relay_at.unwrap_or_default();
                TableRule::Relay {
                    at,
                    service: self.relay_services.get(at).map(|s| &**s),
                }
            }
            (Some(at), _, _, _) => TableRule::Allowlist { at },
            (None, Some(rec), _, _) => TableRule::Record(rec),
            (None, None, Some(at), _) => TableRule::FreeProvider { at },
            (None, None, None, Some(at)) => TableRule::Blocklist { at },
            (None, None, None, None) => match broad_at {
                Some(at) => TableRule::FreeProvider { at },
                None => TableRule::Unknown,
            },
        };
        TableMatch {
            rule,
            // A relay forwards to a mailbox elsewhere: not a webmail provider of its own.
            is_free_provider: relay_at.is_none() && (free_at.is_some() || broad_at.is_some()),
            broad_only: relay_at.is_none() && free_at.is_none() && broad_at.is_some(),
            not_free_listed: not_free,
            record,
            no_typo,
        }
    }

    fn record_of(&self, name: &str) -> Option<&ExplicitRecord> {
        self.stored_record(name).map(|r| &r.record)
    }

    fn stored_record(&self, name: &str) -> Option<&StoredRecord> {
        let (_, index) = self.record_index.get(name)?;
        self.records.get(*index as usize)
    }

    /// Where the rule that decided a lookup of `name` came from: the list and the source line
    /// that named the matched entry, or the record's. `None` for [`TableRule::Unknown`].
    pub fn provenance(&self, name: &DomainName, rule: &TableRule<'_>) -> Option<Provenance<'_>> {
        let (kind, origin) = match rule {
            TableRule::Record(_) => (None, self.stored_record(name.as_str())?.origin),
            TableRule::Allowlist { at }
            | TableRule::FreeProvider { at }
            | TableRule::Relay { at, .. }
            | TableRule::Blocklist { at } => {
                let (_, entry) = self.entries.get(at)?;
                (
                    ListKind::strongest(entry.flags),
                    Origin {
                        source: entry.source,
                        line: entry.line,
                    },
                )
            }
            TableRule::Unknown => return None,
        };
        Some(Provenance {
            kind,
            source: self
                .sources
                .get(usize::from(origin.source))
                .map(|s| &**s)
                .filter(|_| origin.source != 0),
            line: (origin.line != 0).then_some(origin.line),
        })
    }

    /// Every name a blocklist holds (as listed: whether a rule of higher rank, such as the
    /// allowlist, overrules it is for [`DomainTable::lookup`] to say).
    pub fn blocklisted(&self) -> impl Iterator<Item = &str> {
        self.entries
            .iter()
            .filter(|(_, e)| e.flags & DISPOSABLE != 0)
            .map(|(name, _)| name)
    }

    /// The listed names whose mail hosts teach the neighbourhood, sorted: every name a
    /// blocklist holds that the table still answers as blocklisted (no relay, allowlist,
    /// record or curated free list overrules it) and that is its own registrable domain.
    pub fn listed_registrable(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .blocklisted()
            .filter_map(|n| {
                let name = DomainName::parse(n).ok()?;
                let listed = matches!(self.lookup(&name).rule, TableRule::Blocklist { .. });
                (listed && name.registrable() == Some(n)).then(|| n.to_owned())
            })
            .collect();
        names.sort_unstable();
        names
    }

    /// `name` as the table stores it, if it is an entry.
    pub fn entry_name(&self, name: &str) -> Option<&str> {
        self.entries.get(name).map(|(key, _)| key)
    }

    /// Which data answered: the generation and content hash of this table.
    pub fn version(&self) -> &DatasetVersion {
        &self.version
    }

    /// Takes the place of `previous` in service: one generation after it.
    pub fn succeed(&mut self, previous: &DomainTable) {
        self.version = DatasetVersion::new(previous.version.generation + 1, self.version.hash);
    }

    /// The most prominent flagged entries, ranked and rendered for top-domains.
    pub fn top(&self) -> &TopDomains {
        &self.top
    }

    pub fn scores(&self) -> &Scores {
        &self.scores
    }

    /// The curated free provider `name` is likely a typo of (see [`super::typos`]).
    pub fn typo_of(&self, name: &str) -> Option<&str> {
        self.typos.suggest(name)
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

/// Which data answered (`X-Dataset-Version`): the table's generation (1 for the table loaded at
/// start, one more at each swap) and a short hash of its content, e.g. `g42-3f9a1c`.
///
/// The hash is over the built entries (each name with its lists after overlaps were resolved and
/// its provenance), the records, the MX provider patterns and the scores: what an answer,
/// evidence included, can show. Two gateways built from the same files show the same hash,
/// and a change anywhere in it (a name moved to another line too) changes the hash. Entries are
/// summed, so the index's iteration order does not matter.
#[derive(Debug, Clone)]
pub struct DatasetVersion {
    pub generation: u64,
    /// 24 bits of the content hash (six hex digits: enough to tell versions apart at a glance).
    pub hash: u32,
    /// Rendered once per build, so that answers copy a header value and format nothing.
    text: Bytes,
}

impl DatasetVersion {
    pub(super) fn new(generation: u64, hash: u32) -> Self {
        DatasetVersion {
            generation,
            hash,
            text: Bytes::from(format!("g{generation}-{hash:06x}")),
        }
    }

    /// The value of the `X-Dataset-Version` header (ASCII letters, digits and `-`), shared.
    pub fn header_bytes(&self) -> &Bytes {
        &self.text
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.text).unwrap_or_default()
    }
}

pub const ALLOW_OVER_BLOCKLIST: &str = "on the allowlist and a blocklist: allowlist wins";
pub const FREE_OVER_BLOCKLIST: &str =
    "on the curated free-provider list and a blocklist: free provider wins";
pub const NOT_FREE_OVER_BROAD: &str =
    "an organisation (free_exclusions.txt) on a broad free list: not a free provider";
pub const RELAY_OVER_BLOCKLIST: &str =
    "on the relay list and a blocklist: relay wins (safe, a real mailbox)";
pub const RELAY_OVER_FREE: &str = "on the relay list and a free list: relay, not free";
pub const BLOCKLIST_OVER_BROAD: &str = "on a broad free list and a blocklist: disposable, not free";
pub const BLOCKLIST_PARENT_OVER_BROAD: &str =
    "on a broad free list under a blocklisted parent: disposable, not free";
pub const BLOCKLIST_UNDER_BROAD: &str =
    "on a blocklist under a broad free-list parent: disposable, not free";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::{DuplicateRecord, TableBuilder};

    fn n(s: &str) -> DomainName {
        DomainName::parse(s).unwrap()
    }

    fn table(disposable: &[&str], allow: &[&str], free: &[&str]) -> DomainTable {
        broad_table(disposable, allow, free, &[])
    }

    #[test]
    fn relays_win_over_blocklists_allowlists_and_free_lists_but_not_records() {
        let mut b = TableBuilder::new();
        let origin = Origin::default();
        for name in ["duck.com", "33mail.com", "mine.example"] {
            b.add(&n(name), ListKind::Disposable);
            b.add(&n(name), ListKind::BroadFree);
        }
        b.add(&n("duck.com"), ListKind::Allow);
        b.add_relay(&n("duck.com"), Some("DuckDuckGo"), origin);
        b.add_relay(&n("33mail.com"), None, origin);
        b.add_relay(&n("mine.example"), None, origin);
        let record = ExplicitRecord {
            reason: Reason::RoleAccount,
            risk_score: 60,
            mx_provider_label: None,
            flag_weight: 0,
        };
        b.add_record(&n("mine.example"), record).unwrap();
        let t = b.build(Scores::default());
        let duck = t.lookup(&n("duck.com"));
        assert_eq!(
            duck.rule,
            TableRule::Relay {
                at: "duck.com",
                service: Some("DuckDuckGo")
            }
        );
        assert!(!duck.is_free_provider);
        let sub = t.lookup(&n("me.33mail.com"));
        assert_eq!(
            sub.rule,
            TableRule::Relay {
                at: "33mail.com",
                service: None
            }
        );
        assert!(matches!(
            t.lookup(&n("mine.example")).rule,
            TableRule::Record(_)
        ));
        assert_eq!(t.stats().relays, 3);
        // Only the record (a role account) is flagged: no relay is ranked.
        let ranked: Vec<&str> = t.top().entries(10).iter().map(|e| &*e.domain).collect();
        assert_eq!(ranked, ["mine.example"]);
    }

    #[test]
    fn the_version_hashes_content_and_counts_swaps() {
        let a = table(&["mailinator.com", "yopmail.com"], &["126.com"], &[]);
        let same = table(&["yopmail.com", "mailinator.com"], &["126.com"], &[]);
        let other = table(&["mailinator.com"], &["126.com"], &[]);
        assert_eq!(a.version().generation, 1);
        assert_eq!(a.version().hash, same.version().hash, "order is no content");
        assert_ne!(a.version().hash, other.version().hash);
        let text = a.version().as_str().to_owned();
        assert!(text.starts_with("g1-") && text.len() == 9, "{text}");
        let mut next = table(&["mailinator.com"], &["126.com"], &[]);
        next.succeed(&a);
        assert_eq!(next.version().generation, 2);
        assert_eq!(
            next.version().as_str(),
            format!("g2-{:06x}", other.version().hash)
        );
    }

    #[test]
    fn provenance_costs_no_byte_a_name() {
        // With the index's u32 offset and u8 length, an 8-byte entry keeps slots at 16 bytes.
        assert_eq!(std::mem::size_of::<Entry>(), 8);
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

    fn broad_table(
        disposable: &[&str],
        allow: &[&str],
        free: &[&str],
        broad: &[&str],
    ) -> DomainTable {
        let mut b = TableBuilder::new();
        for (names, kind) in [
            (broad, ListKind::BroadFree),
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
    fn listed_names_are_checked_for_typos_once_at_build() {
        let t = table(&["hotmial.com", "throwaway.example"], &[], &["hotmail.com"]);
        // A listed typo: not settled at build, so the lookup checks it (and finds it).
        let typo = t.lookup(&n("hotmial.com"));
        assert!(!typo.no_typo);
        assert_eq!(t.typo_of("hotmial.com"), Some("hotmail.com"));
        // A listed name one edit from no provider: settled, no scan at lookup.
        assert!(t.lookup(&n("throwaway.example")).no_typo);
        // Under a listed name, and unlisted names: not known, checked at lookup.
        assert!(!t.lookup(&n("a.throwaway.example")).no_typo);
        assert!(!t.lookup(&n("hotmall.com")).no_typo);
    }

    #[test]
    fn a_broad_free_list_only_adds_names_no_blocklist_carries() {
        let t = broad_table(
            &[
                "mailinator.com",
                "126.com",
                "gmail.com",
                "dyn.example",
                "x.lycos.example",
            ],
            &["126.com"],
            &["gmail.com"],
            &[
                "mailinator.com",
                "126.com",
                "gmail.com",
                "lycos.example",
                "a.dyn.example",
            ],
        );
        let m = t.lookup(&n("mailinator.com"));
        assert_eq!(
            m.rule,
            TableRule::Blocklist {
                at: "mailinator.com"
            }
        );
        assert!(!m.is_free_provider, "disposable and not free");
        // The allowlist and the curated list win over the blocklist; the broad list still adds
        // that the allowlisted name is a free provider.
        let m = t.lookup(&n("126.com"));
        assert_eq!(m.rule, TableRule::Allowlist { at: "126.com" });
        assert!(m.is_free_provider);
        assert_eq!(
            t.lookup(&n("gmail.com")).rule,
            TableRule::FreeProvider { at: "gmail.com" }
        );
        // Only on the broad list: a free provider, for its subdomains too.
        for q in ["lycos.example", "mx.lycos.example"] {
            let m = t.lookup(&n(q));
            assert_eq!(
                m.rule,
                TableRule::FreeProvider {
                    at: "lycos.example"
                },
                "{q}"
            );
            assert!(m.is_free_provider, "{q}");
        }
        // A blocklisted name under a broad entry, and a broad entry under a blocklisted
        // parent: the blocklist wins both ways.
        for (q, at) in [
            ("x.lycos.example", "x.lycos.example"),
            ("y.x.lycos.example", "x.lycos.example"),
            ("a.dyn.example", "dyn.example"),
        ] {
            let m = t.lookup(&n(q));
            assert_eq!(m.rule, TableRule::Blocklist { at }, "{q}");
            assert!(!m.is_free_provider, "{q}");
        }
        let stats = t.stats();
        let resolved: Vec<(&str, &str)> = stats
            .conflicts
            .iter()
            .map(|c| (&*c.domain, c.resolution))
            .collect();
        assert_eq!(
            resolved,
            [
                ("126.com", ALLOW_OVER_BLOCKLIST),
                ("a.dyn.example", BLOCKLIST_PARENT_OVER_BROAD),
                ("gmail.com", FREE_OVER_BLOCKLIST),
                ("mailinator.com", BLOCKLIST_OVER_BROAD),
                ("x.lycos.example", BLOCKLIST_UNDER_BROAD),
            ]
        );
        assert_eq!(
            stats.conflict_counts().len(),
            5,
            "{:?}",
            stats.conflict_counts()
        );
        // Free: gmail.com (curated), 126.com and lycos.example (broad only).
        assert_eq!((stats.free_providers, stats.broad_free_only), (3, 2));
        assert_eq!(
            stats.disposable, 3,
            "mailinator.com, dyn.example, x.lycos.example"
        );
        let top: Vec<_> = t.top().entries(10).iter().map(|e| &*e.domain).collect();
        assert_eq!(top, ["dyn.example", "mailinator.com", "x.lycos.example"]);
    }

    #[test]
    fn public_suffixes_on_any_list_are_skipped_and_named() {
        let t = broad_table(
            &["github.io"],
            &["co.uk"],
            &["net.ua"],
            &["com.au", "ok.example"],
        );
        assert_eq!(t.stats().skipped_public_suffixes, 4);
        let mut named: Vec<&str> = t.stats().public_suffixes.iter().map(|s| &**s).collect();
        named.sort_unstable();
        assert_eq!(named, ["co.uk", "com.au", "github.io", "net.ua"]);
        for q in [
            "github.io",
            "user.github.io",
            "example.co.uk",
            "shop.net.ua",
            "x.com.au",
        ] {
            let m = t.lookup(&n(q));
            assert_eq!(m.rule, TableRule::Unknown, "{q}");
            assert!(!m.is_free_provider, "{q}");
        }
        assert_eq!(t.len(), 1);
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
