//! Pure domain logic: names, records, the table, its sources and classification.
//!
//! Nothing here does I/O or knows about Pingora, so all of it is unit-tested directly.

pub mod classify;
pub mod mail;
pub mod name;
pub mod name_index;
pub mod providers;
pub mod record;
pub mod sources;
pub mod table;
pub mod target;

pub use classify::{classify, Scores, Verdict};
pub use name::{DomainName, NameError};
pub use record::{FlaggedEntry, Reason, RiskRecord};
pub use table::{DomainTable, ListKind, TableBuilder, TableMatch, TableRule};
