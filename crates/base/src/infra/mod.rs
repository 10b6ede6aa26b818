//! Connections and files shared by the parts: the Redis link, the DNS client, outgoing HTTP's TLS
//! and atomic file replacement; the small per-project records every gateway shares; the
//! process's allocator.

pub mod alloc;
pub mod breaker;
pub mod control;
pub mod deadlines;
pub mod dns;
pub mod fsutil;
pub mod http;
pub mod priority;
pub mod records;
pub mod redis;
pub mod sqlite;
pub mod units;
