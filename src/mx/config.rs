//! Configuration of MX lookups: resolvers, budget, cache and concurrency.

use std::time::Duration;

use crate::infra::units::{ms, secs};
use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds, DurationSeconds};
use std::net::SocketAddr;

/// DNS lookups of a domain's MX records (for `undeliverable`, provider labels, corporate mail).
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MxConfig {
    /// Look MX records up for domains the table does not decide.
    pub enabled: bool,
    /// DNS servers as `ip:port`; empty: the system's (`/etc/resolv.conf`).
    pub servers: Vec<String>,
    /// How long a request waits for DNS, in milliseconds; then it is answered from what is known
    /// and the lookup finishes in the background.
    #[serde(rename = "budget_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub budget: Duration,
    /// Timeout of one DNS query, in milliseconds.
    #[serde(rename = "query_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub query_timeout: Duration,
    /// Lookups in flight at most, those finishing in the background included (each holds its
    /// slot for at most twice `query_timeout_ms`); past it a request is answered at once as if
    /// the budget had run out, so names under a slow nameserver cannot pile up tasks and sockets.
    pub max_inflight: usize,
    /// Cached domains at most.
    pub cache_entries: usize,
    /// Cache lifetime bounds for answers, in seconds (record TTLs are clamped to them).
    #[serde(rename = "min_ttl_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub min_ttl: Duration,
    #[serde(rename = "max_ttl_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub max_ttl: Duration,
    /// Upper bound for negative answers (NXDOMAIN, no records), in seconds.
    #[serde(rename = "negative_max_ttl_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub negative_max_ttl: Duration,
    /// How long a failed lookup (SERVFAIL, timeout) is remembered, in seconds.
    #[serde(rename = "failure_ttl_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub failure_ttl: Duration,
}

impl Default for MxConfig {
    fn default() -> Self {
        MxConfig {
            enabled: true,
            servers: Vec::new(),
            budget: Duration::from_millis(250),
            query_timeout: Duration::from_millis(2_000),
            max_inflight: 256,
            cache_entries: 100_000,
            min_ttl: Duration::from_secs(60),
            max_ttl: Duration::from_secs(86_400),
            negative_max_ttl: Duration::from_secs(3_600),
            failure_ttl: Duration::from_secs(30),
        }
    }
}

impl MxConfig {
    /// Problems of `gateway.mx`, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for server in &self.servers {
            if server.parse::<SocketAddr>().is_err() {
                out.push(format!("gateway.mx.servers: '{server}' is not ip:port"));
            }
        }
        if !(1..=10_000).contains(&ms(self.budget)) {
            out.push(format!(
                "gateway.mx.budget_ms: {} is outside 1..=10000",
                ms(self.budget)
            ));
        }
        if !(1..=30_000).contains(&ms(self.query_timeout)) {
            out.push(format!(
                "gateway.mx.query_timeout_ms: {} is outside 1..=30000",
                ms(self.query_timeout)
            ));
        }
        if !(1..=1_000_000).contains(&self.max_inflight) {
            out.push(format!(
                "gateway.mx.max_inflight: {} is outside 1..=1000000",
                self.max_inflight
            ));
        }
        if self.cache_entries == 0 {
            out.push("gateway.mx.cache_entries: must be at least 1".to_owned());
        }
        if secs(self.min_ttl) > secs(self.max_ttl) {
            out.push("gateway.mx.min_ttl_seconds: larger than max_ttl_seconds".to_owned());
        }
        out
    }
}
