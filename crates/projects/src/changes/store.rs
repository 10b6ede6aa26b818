//! What the verdict changes keep, and the two places they keep it: the embedded SQLite file
//! (`embedded.rs`, one gateway or several on one host) and Redis (`redis.rs`, with
//! `quota.store: redis`: several gateways, one record of each change and one sender a project).
//!
//! A change's id is the microsecond it was recorded at (since 1970, UTC, by the store's clock:
//! Redis's `TIME`, or the gateway's for the file), or the project's previous id plus one when
//! that is not larger. So ids increase and never repeat, also when the store lost its data (a
//! `FLUSHALL`, a deleted file): the sequence starts again from the time, after every id given
//! before, and a cursor or sent mark from before the loss hides nothing after it. They fit in a
//! JSON number exactly (below 2^53, until the year 2255).

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;

use super::{Change, Seen, Told};

/// Why the change store failed.
#[derive(Debug, thiserror::Error)]
pub enum ChangesError {
    #[error("changes store {path}: {source}")]
    Sqlite {
        path: String,
        source: rusqlite::Error,
    },
    #[error("changes store (redis): {0}")]
    Redis(#[from] ::redis::RedisError),
    #[error("changes store: {0}")]
    Other(String),
}

/// Now, in microseconds since 1970: the embedded store's floor for a new id.
pub fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}

/// A change a pass found, to record if the project was still told `from`.
#[derive(Debug, Clone)]
pub struct Proposed {
    pub domain: String,
    pub from: Told,
    pub to: Told,
    pub rule: String,
    /// What the verdict rests on (`judge::Basis::as_str`).
    pub basis: &'static str,
    /// When it was found, unix milliseconds: the project is told `to` from then on (a lookup
    /// answered before it no longer overwrites what it was told).
    pub at_ms: i64,
    pub dataset_version: String,
}

impl Proposed {
    /// Unix seconds, as `changed_at` shows it.
    pub fn at(&self) -> i64 {
        self.at_ms.div_euclid(1_000)
    }
}

/// What recording a proposed change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Recorded under this id.
    New(u64),
    /// The project was told something else meanwhile (another gateway recorded it, or it
    /// looked the domain up again): nothing to record.
    Stale,
}

/// The changes not yet sent of a project: how many, the last id, and counts per transition
/// (`from->to`), for a summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    pub total: u64,
    pub last_id: u64,
    pub transitions: BTreeMap<String, u64>,
}

/// One page of a project's watched domains and where the next starts (`None`: the last).
pub type ScanPage = (Vec<(String, Told)>, Option<String>);

/// Whether one of `names` covers `domain`: is it, or a parent of it.
pub fn covered(names: &[String], domain: &str) -> bool {
    names.iter().any(|n| {
        domain == n || (domain.strip_suffix(n.as_str())).is_some_and(|head| head.ends_with('.'))
    })
}

/// `domain` spelt backwards, as the stores index watched domains: the subdomains of a name `n`
/// are then the keys after `reversed(n) + "."` and before `reversed(n) + "/"` (a range).
pub fn reversed(domain: &str) -> String {
    domain.chars().rev().collect()
}

#[async_trait]
pub trait ChangeStore: Send + Sync {
    /// Keeps what each project was told of each domain and when it asked; a project's new
    /// domains only while it watches fewer than `cap`. Only forwards in time: a lookup older
    /// than what the project was last told (a late tick of another gateway, or a change
    /// recorded since) leaves that standing. Returns the domains refused for the cap.
    async fn watch(&self, seen: Vec<Seen>, cap: u32) -> Result<u64, ChangesError>;
    /// The projects with watched domains or changes.
    async fn projects(&self) -> Result<Vec<String>, ChangesError>;
    /// Up to `n` of `project`'s watched domains from `cursor` (`""`: the first).
    async fn scan(&self, project: &str, cursor: &str, n: usize) -> Result<ScanPage, ChangesError>;
    /// `project`'s watched domains that `names` cover (each name and its subdomains), read by
    /// name and by a range of the reversed names: what is read is what `names` cover, not the
    /// whole watch list (but for entries an earlier build wrote, see each store).
    async fn watched_under(
        &self,
        project: &str,
        names: &[String],
    ) -> Result<Vec<(String, Told)>, ChangesError>;
    /// Records `change` if `project` was still told `change.from` (then it is told
    /// `change.to`), under a new id (see the module's documentation). A recorded change is
    /// never removed but by age: a poller may have read it.
    async fn record(&self, project: &str, change: &Proposed) -> Result<Recorded, ChangesError>;
    /// `project`'s changes after id `after`, made at or after `since` (unix seconds), oldest
    /// first, `n` at most.
    async fn list(
        &self,
        project: &str,
        after: u64,
        since: i64,
        n: usize,
    ) -> Result<Vec<Change>, ChangesError>;
    /// The last change id `project` was sent (0: none).
    async fn sent_upto(&self, project: &str) -> Result<u64, ChangesError>;
    /// The changes of `project` with ids in `after..=upto` (exclusive of `after`).
    async fn pending(&self, project: &str, after: u64, upto: u64) -> Result<Pending, ChangesError>;
    /// `project` was sent every change up to `upto` (never moves back; a store that lost its
    /// sequence lost this mark with it).
    async fn mark_sent(&self, project: &str, upto: u64) -> Result<(), ChangesError>;
    /// Whether `holder` may send `project`'s changes for `ttl` (held or taken; one holder
    /// at a time across gateways).
    async fn lease(&self, project: &str, holder: &str, ttl: Duration)
        -> Result<bool, ChangesError>;
    /// Forgets watched domains not looked up since their project's cutoff (`cutoffs`, unix
    /// seconds; any other project's: `other`) and changes made before `changes_before`.
    async fn sweep(
        &self,
        cutoffs: &[(String, i64)],
        other: i64,
        changes_before: i64,
    ) -> Result<u64, ChangesError>;
}
