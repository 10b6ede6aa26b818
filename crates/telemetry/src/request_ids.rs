//! Request ids the gateway makes: a random per-process prefix and a counter, unique without a
//! system call per request.

use std::sync::atomic::{AtomicU64, Ordering};

/// Hands out request ids: `<16 hex digits of prefix><8 hex digits of counter>`.
pub struct RequestIds {
    prefix: u64,
    counter: AtomicU64,
}

impl RequestIds {
    pub fn new() -> Self {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is seeded from the OS; one hash of the time gives an unpredictable prefix.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        RequestIds {
            prefix: h.finish(),
            counter: AtomicU64::new(0),
        }
    }

    pub fn next(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}{:08x}", self.prefix, n)
    }
}

impl Default for RequestIds {
    fn default() -> Self {
        RequestIds::new()
    }
}
