//! Connections and files shared by the parts: the Redis link and atomic file replacement.

pub mod fsutil;
pub mod redis;
pub mod units;
