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
    pub free_providers: usize,
    pub records: usize,
    pub skipped_public_suffixes: usize,
    /// Every conflict the builder resolved (allowlist or free list against a blocklist).
    pub conflicts: Vec<Conflict>,
    /// Entries each source held as read (e.g. `disposable.txt` -> 1200), in the order given;
    /// a reload compares them to refuse a file that lost most of its entries at once.
    pub sources: Vec<(Box<str>, usize)>,
}
