//! `TableBuilder`: collects list entries and records, then resolves their overlaps, ranks the
//! flagged ones and freezes them into a [`DomainTable`].
//!
//! A list of millions of names is parsed in runs of lines on several threads ([`ParsedPiece`]:
//! each name checked, its public-suffix standing and its shard found, no allocation a name) and
//! inserted shard by shard, each shard on its own thread, in the lists' order: a name's state
//! depends only on the additions of that name, and those keep their order within its shard, so
//! the table is the one that adding the names one after another would make. Every pass of the
//! build over the names (overlaps, counts, ranking, typos, the content hash) runs shard by shard
//! the same way. How many threads is the caller's to say ([`TableBuilder::with_threads`]).

use std::hash::{BuildHasher, Hash, Hasher};

use super::name::DomainName;
use super::name_index::{shard_of, NameIndex, Shard, SHARDS};
use super::providers::ProviderTable;
use super::record::Reason;
use super::scores::Scores;
use super::stats::{Conflict, TableStats};
use super::table::{
    DatasetVersion, DomainTable, Entry, ExplicitRecord, ListKind, Origin, SourceId, StoredRecord,
    ALLOW, ALLOW_OVER_BLOCKLIST, BLOCKLIST_OVER_BROAD, BLOCKLIST_PARENT_OVER_BROAD,
    BLOCKLIST_UNDER_BROAD, BROAD_FREE, DISPOSABLE, FREE, FREE_OVER_BLOCKLIST, NOT_FREE,
    NOT_FREE_OVER_BROAD, NO_TYPO, RECORD, RELAY, RELAY_OVER_BLOCKLIST, RELAY_OVER_FREE,
};
use super::top::{keep_best, Candidate, TopDomains};
use super::typos::TypoIndex;

impl DomainTable {
    /// An empty table: everything is unknown.
    pub fn empty(scores: Scores) -> Self {
        TableBuilder::new().build(scores)
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
    records: Vec<StoredRecord>,
    record_index: NameIndex<u32>,
    /// Source names by id; index 0 is the unnamed source.
    sources: Vec<Box<str>>,
    providers: ProviderTable,
    stats: TableStats,
    relay_services: std::collections::HashMap<Box<str>, Box<str>>,
    /// The curated free providers in the order given (the first are the most common: a typo
    /// one edit from two of them is suggested the first).
    curated_free: Vec<Box<str>>,
    /// How many threads the build may use (0 and 1: the calling thread alone).
    threads: usize,
}

impl TableBuilder {
    pub fn new() -> Self {
        TableBuilder {
            sources: vec!["".into()],
            ..Self::default()
        }
    }

    pub fn with_capacity(names: usize) -> Self {
        TableBuilder {
            entries: NameIndex::with_capacity(names, names * 16),
            ..Self::new()
        }
    }

    /// Lets the build use `threads` threads (the calling thread's priority is theirs too).
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = threads;
        self
    }

    /// How many threads the build may use (at least 1).
    pub fn threads(&self) -> usize {
        self.threads.max(1)
    }

    /// The id of the source named `name` (a file, a URL, the built-in list), for
    /// [`add_from`](Self::add_from). Past 65,535 sources, further ones share the last id.
    pub fn source(&mut self, name: &str) -> SourceId {
        if self.sources.is_empty() {
            self.sources.push("".into());
        }
        if let Some(id) = self.sources.iter().position(|s| &**s == name) {
            return SourceId::try_from(id).unwrap_or(SourceId::MAX);
        }
        match SourceId::try_from(self.sources.len()) {
            Ok(id) => {
                self.sources.push(name.into());
                id
            }
            Err(_) => SourceId::MAX,
        }
    }

    /// Adds a list entry from no named source (see [`add_from`](Self::add_from)).
    pub fn add(&mut self, name: &DomainName, kind: ListKind) {
        self.add_from(name, kind, Origin::default());
    }

    /// Adds a list entry, noting where it came from. Public suffixes (`co.uk`, `github.io`) are
    /// skipped and reported: they are never matched, so listing one would have no effect but to
    /// surprise. A name keeps the origin of its list of highest precedence (the one a lookup
    /// will name), the first one given among equals.
    pub fn add_from(&mut self, name: &DomainName, kind: ListKind, origin: Origin) {
        if name.registrable().is_none() {
            self.skip_public_suffix(name);
            return;
        }
        if kind == ListKind::FreeProvider {
            self.curated_free.push(name.as_str().into());
        }
        note(self.entry(name), kind, origin);
    }

    /// Adds a relay entry (see [`ListKind::Relay`]) and, when its list names one, its service.
    pub fn add_relay(&mut self, name: &DomainName, service: Option<&str>, origin: Origin) {
        self.add_from(name, ListKind::Relay, origin);
        if let (Some(service), Some(_)) = (service, name.registrable()) {
            self.relay_services
                .entry(name.as_str().into())
                .or_insert_with(|| service.into());
        }
    }

    /// Records how many entries a source held (see [`TableStats::sources`]).
    pub fn count_source(&mut self, source: &str, entries: usize) {
        self.stats.sources.push((source.into(), entries));
    }

    /// Sets the mail provider patterns.
    pub fn set_providers(&mut self, providers: ProviderTable) {
        self.providers = providers;
    }

    /// Adds an explicit record for exactly `name`, from no named source.
    pub fn add_record(
        &mut self,
        name: &DomainName,
        record: ExplicitRecord,
    ) -> Result<(), DuplicateRecord> {
        self.add_record_from(name, record, Origin::default())
    }

    /// Adds an explicit record for exactly `name`, noting where it came from.
    pub fn add_record_from(
        &mut self,
        name: &DomainName,
        record: ExplicitRecord,
        origin: Origin,
    ) -> Result<(), DuplicateRecord> {
        if name.registrable().is_none() {
            self.skip_public_suffix(name);
            return Ok(());
        }
        let entry = self.entry(name);
        if entry.flags & RECORD != 0 {
            return Err(DuplicateRecord(name.as_str().into()));
        }
        entry.flags |= RECORD;
        *self.record_index.get_or_insert(name.as_str()) = self.records.len() as u32;
        self.records.push(StoredRecord { record, origin });
        Ok(())
    }

    fn skip_public_suffix(&mut self, name: &DomainName) {
        self.stats.skipped_public_suffixes += 1;
        self.stats.public_suffixes.push(name.as_str().into());
    }

    /// The entry of `name`, a name with a registrable domain.
    fn entry(&mut self, name: &DomainName) -> &mut Entry {
        let below = name
            .registrable()
            .is_some_and(|r| r.len() != name.as_str().len());
        let entry = self.entries.get_or_insert(name.as_str());
        entry.below = below;
        entry
    }

    /// Makes room for `names` more names of `bytes` bytes in all (avoids regrowth on big lists).
    pub fn reserve(&mut self, names: usize, bytes: usize) {
        self.entries.reserve(names, bytes);
    }

    /// Adds the names of parsed runs of one list (see [`ParsedPiece`]), all of `kind` from
    /// `source`, in the runs' order: the table this makes is the one [`add_from`](Self::add_from)
    /// for each name in turn makes. `text` is the list the pieces were parsed from. Not for the
    /// curated free list, whose order the typo suggestions keep (it goes through `add_from`).
    pub fn add_pieces(
        &mut self,
        text: &str,
        pieces: &[ParsedPiece],
        kind: ListKind,
        source: SourceId,
    ) {
        debug_assert!(kind != ListKind::FreeProvider);
        let mut bases = Vec::with_capacity(pieces.len());
        let mut base = 0;
        for piece in pieces {
            bases.push(base);
            base += piece.lines;
        }
        self.entries
            .par_shards_mut(self.threads, |s, shard, hasher| {
                let names: usize = pieces.iter().map(|p| p.by_shard[s].len()).sum();
                let bytes: usize = pieces
                    .iter()
                    .flat_map(|p| &p.by_shard[s])
                    .map(|n| usize::from(n.len))
                    .sum();
                shard.reserve(names, bytes, hasher);
                for (piece, base) in pieces.iter().zip(&bases) {
                    std::thread::yield_now();
                    for pending in &piece.by_shard[s] {
                        let name = piece.name(text, pending);
                        let entry = shard.get_or_insert(hasher.hash_one(name), name, hasher);
                        entry.below = pending.below;
                        let line = u32::try_from(base + pending.line as usize).unwrap_or(0);
                        note(entry, kind, Origin { source, line });
                    }
                }
            });
        for piece in pieces {
            for suffix in &piece.suffixes {
                self.stats.skipped_public_suffixes += 1;
                self.stats.public_suffixes.push(suffix.clone());
            }
        }
    }

    /// Resolves conflicts, ranks the flagged entries and freezes the table.
    pub fn build(mut self, scores: Scores) -> DomainTable {
        let threads = self.threads;
        let mut stats = std::mem::take(&mut self.stats);
        let conflicts = self.entries.par_shards_mut(threads, |_, shard, _| {
            let mut conflicts = Vec::new();
            for (name, entry) in shard.iter_mut() {
                if let Some(resolution) = resolve(entry) {
                    conflicts.push(Conflict {
                        domain: name.into(),
                        resolution,
                    });
                }
            }
            conflicts
        });
        stats.conflicts.extend(conflicts.into_iter().flatten());
        self.resolve_across_levels(&mut stats);
        for counts in self.entries.par_shards(threads, count_lists) {
            stats.disposable += counts[0];
            stats.allow += counts[1];
            stats.relays += counts[2];
            stats.free_providers += counts[3];
            stats.broad_free_only += counts[4];
        }
        stats.conflicts.sort_by(|a, b| a.domain.cmp(&b.domain));
        stats.records = self.records.len();
        let top = self.rank(&scores);
        let typos = self.typos();
        self.entries.par_shards_mut(threads, |_, shard, _| {
            for (name, entry) in shard.iter_mut() {
                if entry.flags & DISPOSABLE != 0 && typos.suggest(name).is_none() {
                    entry.flags |= NO_TYPO;
                }
            }
        });
        let hash = self.content_hash(&scores);
        if self.sources.is_empty() {
            self.sources.push("".into());
        }
        self.entries.shrink(threads);
        DomainTable {
            entries: self.entries,
            records: self.records,
            record_index: self.record_index,
            sources: self.sources,
            version: DatasetVersion::new(1, hash),
            top,
            scores,
            providers: self.providers,
            stats,
            relay_services: self.relay_services,
            typos,
        }
    }

    /// Typos of the names still answered as curated providers (a relay on the list is not one).
    fn typos(&self) -> TypoIndex {
        TypoIndex::build(
            self.curated_free
                .iter()
                .filter(|n| {
                    self.entries
                        .get(n)
                        .is_some_and(|(_, e)| e.flags & FREE != 0)
                })
                .map(|n| &**n),
        )
    }

    /// Top-domains: the best flagged names of each shard, then the best of those.
    fn rank(&self, scores: &Scores) -> TopDomains {
        let best = self.entries.par_shards(self.threads, |shard| {
            let mut candidates = flagged(shard, self, scores);
            keep_best(&mut candidates);
            candidates
        });
        TopDomains::rank(best.into_iter().flatten().collect())
    }

    /// The content hash of [`DatasetVersion`]. Entries are summed, so the index's (random)
    /// iteration order and its shards do not matter; each is hashed with a fixed seed, so equal
    /// data gives an equal hash in every process of one build of the gateway.
    fn content_hash(&self, scores: &Scores) -> u32 {
        let state = foldhash::fast::FixedState::with_seed(0x6461_7461);
        let source = |id: SourceId| self.sources.get(usize::from(id)).map_or("", |s| &**s);
        let sums = self.entries.par_shards(self.threads, |shard| {
            shard.iter().fold(0u64, |sum, (name, entry)| {
                sum.wrapping_add(state.hash_one((
                    name,
                    entry.flags,
                    source(entry.source),
                    entry.line,
                )))
            })
        });
        let mut sum = sums.into_iter().fold(0u64, u64::wrapping_add);
        for (name, index) in self.record_index.iter() {
            if let Some(r) = self.records.get(*index as usize) {
                let rec = &r.record;
                sum = sum.wrapping_add(state.hash_one((
                    name,
                    rec.reason,
                    rec.risk_score,
                    rec.mx_provider_label.as_deref(),
                    rec.flag_weight,
                    source(r.origin.source),
                    r.origin.line,
                )));
            }
        }
        let mut h = state.build_hasher();
        sum.hash(&mut h);
        self.entries.len().hash(&mut h);
        self.providers.fingerprint(&mut h);
        format!("{scores:?}").hash(&mut h);
        (h.finish() >> 40) as u32
    }

    /// Overlaps across levels: a broad free-list entry under a blocklisted parent is voided, and
    /// a blocklisted name under a broad free-list parent is noted. Allowlisted or curated-free
    /// names are left alone. Only names below their registrable domain have parents to look at.
    fn resolve_across_levels(&mut self, stats: &mut TableStats) {
        let entries = &self.entries;
        let found = entries.par_shards(self.threads, |shard| {
            let (mut voided, mut conflicts) = (Vec::new(), Vec::new());
            for (name, entry) in shard.iter() {
                let listed = entry.flags & (BROAD_FREE | DISPOSABLE) != 0;
                if !listed || !entry.below {
                    continue;
                }
                if let Some((void, conflict)) = across_levels(entries, name, entry) {
                    voided.extend(void.then(|| Box::<str>::from(name)));
                    conflicts.push(conflict);
                }
            }
            (voided, conflicts)
        });
        for (voided, conflicts) in found {
            stats.conflicts.extend(conflicts);
            for name in voided {
                self.entries.get_or_insert(&name).flags &= !BROAD_FREE;
            }
        }
    }
}

/// What the levels above `name` (a listed name below its registrable domain) say of it: whether
/// its broad free-list entry is void, and the conflict noted.
fn across_levels(
    entries: &NameIndex<Entry>,
    name: &str,
    entry: &Entry,
) -> Option<(bool, Conflict)> {
    let (own_broad, own_blocked) = (entry.flags & BROAD_FREE != 0, entry.flags & DISPOSABLE != 0);
    // Names are stored canonical: the registrable part is a suffix of the name.
    let registrable = psl::domain_str(name)?;
    let stop = name.len() - registrable.len();
    if stop == 0 {
        return None;
    }
    let (mut allow, mut free, mut broad, mut blocked) = (false, false, false, false);
    let parents = name[..stop]
        .match_indices('.')
        .map(|(dot, _)| &name[dot + 1..]);
    for (depth, level) in std::iter::once((0, name)).chain(parents.map(|l| (1, l))) {
        if let Some((_, e)) = entries.get(level) {
            allow |= e.flags & ALLOW != 0;
            free |= e.flags & (FREE | RELAY) != 0;
            if depth > 0 {
                broad |= e.flags & BROAD_FREE != 0;
                blocked |= e.flags & DISPOSABLE != 0;
            }
        }
    }
    if allow || free {
        return None;
    }
    let conflict = |resolution| Conflict {
        domain: name.into(),
        resolution,
    };
    if own_broad && blocked {
        Some((true, conflict(BLOCKLIST_PARENT_OVER_BROAD)))
    } else if own_blocked && broad {
        Some((false, conflict(BLOCKLIST_UNDER_BROAD)))
    } else {
        None
    }
}

/// A list entry's flags after one more list named it; the origin kept is that of the list of
/// highest precedence, the first one given among equals.
fn note(entry: &mut Entry, kind: ListKind, origin: Origin) {
    let before = ListKind::strongest(entry.flags);
    entry.flags |= kind.bit();
    if before != ListKind::strongest(entry.flags) {
        entry.source = origin.source;
        entry.line = origin.line;
    }
}

/// A shard's counts of disposable, allowlisted, relay, free and broad-only-free names.
fn count_lists(shard: &Shard<Entry>) -> [usize; 5] {
    let mut counts = [0; 5];
    for (_, entry) in shard.iter() {
        let free = entry.flags & (FREE | BROAD_FREE) != 0;
        counts[0] += usize::from(entry.flags & DISPOSABLE != 0);
        counts[1] += usize::from(entry.flags & ALLOW != 0);
        counts[2] += usize::from(entry.flags & RELAY != 0);
        counts[3] += usize::from(free);
        counts[4] += usize::from(free && entry.flags & FREE == 0);
    }
    counts
}

/// Resolution of the lists one name is on: the allowlist and the curated free list void a
/// blocklist entry; a blocklist entry voids a broad free-list entry. Returns how, if it did.
fn resolve(entry: &mut Entry) -> Option<&'static str> {
    if entry.flags & NOT_FREE != 0 && entry.flags & BROAD_FREE != 0 {
        entry.flags &= !BROAD_FREE;
        if entry.flags & DISPOSABLE == 0 {
            return Some(NOT_FREE_OVER_BROAD);
        }
    }
    if entry.flags & RELAY != 0 && entry.flags & (FREE | BROAD_FREE) != 0 {
        entry.flags &= !(FREE | BROAD_FREE);
        if entry.flags & DISPOSABLE == 0 {
            return Some(RELAY_OVER_FREE);
        }
    }
    if entry.flags & DISPOSABLE == 0 {
        return None;
    }
    if entry.flags & ALLOW != 0 {
        entry.flags &= !DISPOSABLE;
        Some(ALLOW_OVER_BLOCKLIST)
    } else if entry.flags & RELAY != 0 {
        entry.flags &= !DISPOSABLE;
        Some(RELAY_OVER_BLOCKLIST)
    } else if entry.flags & FREE != 0 {
        entry.flags &= !DISPOSABLE;
        Some(FREE_OVER_BLOCKLIST)
    } else if entry.flags & BROAD_FREE != 0 {
        entry.flags &= !BROAD_FREE;
        Some(BLOCKLIST_OVER_BROAD)
    } else {
        None
    }
}

/// Every flagged name of a shard: flagged explicit records, and blocklist entries with no record of their
/// own; never a name on the allowlist or the free list.
fn flagged<'b>(
    shard: &'b Shard<Entry>,
    builder: &'b TableBuilder,
    scores: &Scores,
) -> Vec<Candidate<'b>> {
    let mut candidates = Vec::new();
    for (name, entry) in shard.iter() {
        // A relay is never flagged, unless the operator's own record for it says otherwise.
        let relay_only = entry.flags & RELAY != 0 && entry.flags & RECORD == 0;
        if entry.flags & (ALLOW | FREE | BROAD_FREE) != 0 || relay_only {
            continue;
        }
        let rec = (entry.flags & RECORD != 0)
            .then(|| builder.record_index.get(name))
            .flatten()
            .and_then(|(_, i)| builder.records.get(*i as usize))
            .map(|r| &r.record);
        if let Some(rec) = rec {
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

/// One name of a parsed run, waiting for its shard: where it lies (in the list's text, or in
/// the run's own arena when parsing changed it) and its line in the run. 12 bytes.
#[derive(Debug, Clone, Copy)]
struct PendingName {
    offset: u32,
    line: u32,
    len: u8,
    /// In the run's `owned` arena rather than the text.
    owned: bool,
    /// Below its registrable domain (`x.mailinator.com`): has parents to look at.
    below: bool,
}

/// A run of a list's lines, parsed (on any thread) and sorted by shard, for
/// [`TableBuilder::add_pieces`].
#[derive(Debug)]
pub struct ParsedPiece {
    by_shard: Vec<Vec<PendingName>>,
    /// Names that parsing changed (Unicode, upper case): not slices of the text.
    owned: String,
    /// Public suffixes the run named (never entries), in line order.
    suffixes: Vec<Box<str>>,
    /// Lines of the run, for the line numbers of the runs after it.
    pub lines: usize,
    /// Lines that held a name.
    pub count: usize,
}

impl Default for ParsedPiece {
    fn default() -> Self {
        ParsedPiece {
            by_shard: vec![Vec::new(); SHARDS],
            owned: String::new(),
            suffixes: Vec::new(),
            lines: 0,
            count: 0,
        }
    }
}

impl ParsedPiece {
    /// A piece for a run of about `lines` lines: each shard's list sized for its share (with a
    /// margin), so that none grows by doubling (which, over millions of names, costs as much
    /// memory again at the build's peak).
    pub fn for_lines(lines: usize) -> Self {
        let per = lines / SHARDS + lines / SHARDS / 8 + 4;
        ParsedPiece {
            by_shard: (0..SHARDS).map(|_| Vec::with_capacity(per)).collect(),
            ..Self::default()
        }
    }

    /// Adds `name` (canonical: see [`DomainName::canonical`]), read on line `line` of the run
    /// (from 1). `text` is the whole list: a name that is a slice of it is kept as its place.
    pub fn push(&mut self, text: &str, name: &str, line: usize, builder: &TableBuilder) {
        self.count += 1;
        let Some(registrable) = psl::domain_str(name) else {
            self.suffixes.push(name.into());
            return;
        };
        let base = text.as_ptr() as usize;
        let at = (name.as_ptr() as usize).wrapping_sub(base);
        let in_text = at < text.len() && at + name.len() <= text.len();
        let offset = if in_text {
            at
        } else {
            self.owned.push_str(name);
            self.owned.len() - name.len()
        };
        let shard = shard_of(builder.entries.hash(name));
        self.by_shard[shard].push(PendingName {
            offset: u32::try_from(offset).expect("a list over 4 GiB"),
            line: u32::try_from(line).unwrap_or(0),
            len: u8::try_from(name.len()).expect("a name over 255 bytes"),
            owned: !in_text,
            below: registrable.len() != name.len(),
        });
    }

    fn name<'a>(&'a self, text: &'a str, pending: &PendingName) -> &'a str {
        let from = if pending.owned { &self.owned } else { text };
        &from[pending.offset as usize..pending.offset as usize + usize::from(pending.len)]
    }
}
