//! `TableStats`: what a table build counted and resolved, for the load logs, `check-config` and
//! the reload guard that refuses a file which lost most of its entries at once.
//!
//! Filled by the `TableBuilder`, read by `data_files`; lookups never touch it.

/// A list entry that two lists disagreed on, and how the builder resolved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub domain: Box<str>,
    pub resolution: &'static str,
}

/// Counts of one table build.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableStats {
    pub disposable: usize,
    pub allow: usize,
    /// Privacy relays and masked-email services (`relays.txt`, `relay_lists`).
    pub relays: usize,
    /// Names answered as free providers: the curated list plus what the broad lists added.
    pub free_providers: usize,
    /// Of `free_providers`, the names only a broad third-party list carries.
    pub broad_free_only: usize,
    pub records: usize,
    pub skipped_public_suffixes: usize,
    /// The public suffixes a list named (never entries, never matched), in the order met.
    pub public_suffixes: Vec<Box<str>>,
    /// Every overlap the builder resolved (an allowlist or free list against a blocklist).
    pub conflicts: Vec<Conflict>,
    /// Entries each source held as read (e.g. `disposable.txt` -> 1200), in the order given;
    /// a reload compares them to refuse a file that lost most of its entries at once.
    pub sources: Vec<(Box<str>, usize)>,
}

impl TableStats {
    /// How many overlaps were resolved each way, in the order the ways were first met.
    pub fn conflict_counts(&self) -> Vec<(&'static str, usize)> {
        let mut counts: Vec<(&'static str, usize)> = Vec::new();
        for c in &self.conflicts {
            match counts.iter_mut().find(|(r, _)| *r == c.resolution) {
                Some((_, n)) => *n += 1,
                None => counts.push((c.resolution, 1)),
            }
        }
        counts
    }
}
