//! Counters of what the public listener's connection limits did (open connections, refused,
//! header timeouts, ...): written by `edge::downstream`, read by readiness details and metrics.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Counters of what the limits did, for readiness details and metrics.
#[derive(Debug, Default)]
pub struct DownstreamStats {
    pub open: AtomicUsize,
    pub refused: AtomicU64,
    pub header_timeouts: AtomicU64,
    pub header_too_large: AtomicU64,
    pub idle_closed: AtomicU64,
}

/// A snapshot of [`DownstreamStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DownstreamCounts {
    pub open_connections: usize,
    pub refused_connections: u64,
    pub header_timeouts: u64,
    pub header_too_large: u64,
    pub idle_closed: u64,
}

impl DownstreamStats {
    pub fn counts(&self) -> DownstreamCounts {
        DownstreamCounts {
            open_connections: self.open.load(Ordering::Relaxed),
            refused_connections: self.refused.load(Ordering::Relaxed),
            header_timeouts: self.header_timeouts.load(Ordering::Relaxed),
            header_too_large: self.header_too_large.load(Ordering::Relaxed),
            idle_closed: self.idle_closed.load(Ordering::Relaxed),
        }
    }
}
