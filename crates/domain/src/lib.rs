//! Pure domain logic (the `drg-domain` crate): names, records, the table, its sources,
//! classification and the MX neighbourhood's rule.
//!
//! Nothing here does I/O or knows about Pingora, so all of it is unit-tested directly.
//!
//! Imports run one way (each module uses only those before it):
//! `parallel` <- `name`, `name_index`, `mail`, `record`, `error`, `stats`, `age` <- `scores`,
//! `top`, `providers`, `target`, `typos`, `neighbourhood` <- `table` <- `builder` <- `sources`,
//! `classify` <- `evidence`, `heavy_hitters`, `lww` <- `overrides`.

pub mod age;
pub mod builder;
pub mod classify;
pub mod error;
pub mod evidence;
pub mod heavy_hitters;
pub mod listed_holds;
pub mod lww;
pub mod mail;
pub mod name;
pub mod name_index;
pub mod neighbour_index;
pub mod overrides;
pub mod parallel;
pub mod providers;
pub mod record;
pub mod scores;
pub mod shards;
pub mod sources;
pub mod stats;
pub mod table;
pub mod target;
pub mod top;
pub mod typos;

pub use builder::TableBuilder;
pub use classify::{classify, Verdict};
pub use error::SourceError;
pub use name::{DomainName, NameError};
pub use record::{FlaggedEntry, Reason, RiskRecord};
pub use scores::Scores;
pub use table::{DomainTable, ListKind, TableMatch, TableRule};
