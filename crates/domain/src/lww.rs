//! Last-writer-wins records: what a record must say for copies of it, put back in any order,
//! to agree on one value (the gateway's records engine keeps them; a project's overrides are
//! some). Pure: no I/O.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// One record: whose, which, and when it was written.
pub trait Record: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {
    fn project(&self) -> &str;
    /// The record's name within its project.
    fn key(&self) -> &str;
    /// Orders two writes of one record: microseconds, larger than the stamp it replaced.
    fn stamp(&self) -> u64;
    fn removed(&self) -> bool;
    /// Who wrote it: breaks a tie between two stamps.
    fn writer(&self) -> &str;

    /// Whether a removal stays a record of its own (a decided report is listed with its
    /// state); otherwise a store drops the record it removes, and only a gateway's memory of
    /// its own recent writes keeps the marker.
    const KEEPS_REMOVED: bool = false;

    /// Whether `self` replaces `other` (the same project and key): every gateway picks the same.
    fn newer_than(&self, other: &Self) -> bool {
        (self.stamp(), self.removed(), self.writer())
            > (other.stamp(), other.removed(), other.writer())
    }
}

/// Implements [`Record`] for a struct with `project: String`, `stamp: u64`, `removed: bool`
/// and the two named fields: its key within the project, and who wrote it; `keeps_removed` after
/// them for a record whose removal stays a record ([`Record::KEEPS_REMOVED`]).
#[macro_export]
macro_rules! record_fields {
    ($ty:ty, key: $key:ident, writer: $writer:ident, keeps_removed) => {
        $crate::record_fields!(@impl $ty, $key, $writer, const KEEPS_REMOVED: bool = true;);
    };
    ($ty:ty, key: $key:ident, writer: $writer:ident) => {
        $crate::record_fields!(@impl $ty, $key, $writer,);
    };
    (@impl $ty:ty, $key:ident, $writer:ident, $($extra:tt)*) => {
        impl $crate::lww::Record for $ty {
            $($extra)*
            fn project(&self) -> &str {
                &self.project
            }
            fn key(&self) -> &str {
                &self.$key
            }
            fn stamp(&self) -> u64 {
                self.stamp
            }
            fn removed(&self) -> bool {
                self.removed
            }
            fn writer(&self) -> &str {
                &self.$writer
            }
        }
    };
}
