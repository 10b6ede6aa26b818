//! Small per-project records every gateway of a deployment serves (a project's overrides, its
//! webhooks, its reports and the accepted verdicts): kept in the control store (`sql.rs`, a
//! row a record), held by each gateway as a snapshot that follows the store's revision
//! (`snapshot.rs`). What an earlier release kept elsewhere is read by `legacy.rs`, for the
//! operator's `migrate`.
//!
//! Records merge last-writer-wins on their stamp, and a removal is a record too (`removed`):
//! a snapshot read before a write never undoes it, and an import never revives a removal.
//! Removals are bounded like the rest: a project keeps its newest [`tombstones_kept`] markers
//! (at least [`MIN_TOMBSTONES`]), and a write costs the project's bound, not its history.

pub mod legacy;
mod merged;
pub mod once;
pub mod snapshot;
pub mod sql;

pub use merged::{Merged, Moved};

/// One record (the trait is pure, in the domain crate, where overrides implement it).
pub use drg_domain::lww::Record;

/// Why a store did not answer.
#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not a records file: {source}")]
    Format {
        path: String,
        source: serde_json::Error,
    },
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    #[error("the control store: no answer within {0} ms")]
    TimedOut(u128),
    #[error("{path}: {source}")]
    Sqlite {
        path: String,
        source: rusqlite::Error,
    },
    #[error("a record is not JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Control(String),
}

/// What a write came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// Written; `created`: no record of the key was in force before.
    Done { created: bool },
    /// The project holds as many records in force as it may.
    Full,
    /// The store holds a newer record of the key (another gateway's write won).
    Stale,
    /// A removal found no record of the key in force in the store: nothing was written. A
    /// `DELETE` is decided here, by the store, never by a gateway's copy (which may not hold
    /// a write another gateway committed a moment ago).
    Absent,
}

/// The audit entry a write records, made from what the write came to (`None`: nothing to
/// record, as for a refusal), written in the write's transaction; `keep_days`: how long its
/// project keeps entries.
pub struct Audited<'a> {
    pub entry: &'a (dyn Fn(&Put) -> Option<crate::infra::control::audit::AuditRow> + Sync),
    pub keep_days: u32,
}

/// Removal markers a project keeps at most, for a bound of `max_live` records in force: they
/// stop an older copy from reviving a removal, and a project's churn (set, remove, set another)
/// must not grow the state or the cost of a write without limit. The oldest go first.
pub fn tombstones_kept(max_live: u32) -> usize {
    (max_live as usize).max(MIN_TOMBSTONES)
}

/// Removal markers kept per project at the least, whatever its bound.
pub const MIN_TOMBSTONES: usize = 100;

/// A stamp for a write now: the microsecond, larger than `held` and than `last` (the last stamp
/// this gateway gave, updated).
pub fn next_stamp(last: &std::sync::atomic::AtomicU64, held: u64) -> u64 {
    use std::sync::atomic::Ordering;
    let now = u64::try_from(chrono::Utc::now().timestamp_micros()).unwrap_or(0);
    let want = now.max(held.saturating_add(1));
    let prev = last
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |l| {
            Some(want.max(l.saturating_add(1)))
        })
        .unwrap_or(0);
    want.max(prev.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use drg_domain::overrides::{Override, OverrideVerdict};

    /// An override of project `p` (the stores' tests use it too).
    pub(crate) fn over(domain: &str, stamp: u64, removed: bool) -> Override {
        Override {
            project: "p".into(),
            domain: domain.into(),
            verdict: OverrideVerdict::Block,
            note: String::new(),
            set_by: "k".into(),
            set_at: 0,
            stamp,
            removed,
        }
    }

    #[test]
    fn a_projects_removal_markers_are_bounded_by_its_bound_at_the_least_min() {
        assert_eq!(tombstones_kept(2), MIN_TOMBSTONES);
        assert_eq!(tombstones_kept(1_000), 1_000);
    }
}
