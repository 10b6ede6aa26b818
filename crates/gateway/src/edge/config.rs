//! Configuration of the public listener: its certificate (TLS) and per-connection limits.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds};

use drg_base::infra::units::ms;

/// The public listener's certificate (see docs/operations.md, "TLS").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsConfig {
    /// PEM certificate, leaf first, then any intermediates. Relative to the config file.
    /// Reloaded when it changes on disk.
    pub cert: PathBuf,
    /// PEM private key of the leaf. Relative to the config file. Reloaded with `cert`.
    pub key: PathBuf,
    /// Offer HTTP/2 through ALPN (HTTP/1.1 stays available).
    #[serde(default)]
    pub h2: bool,
}

/// Per-connection limits of the public listener (see docs/security.md).
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LimitsConfig {
    /// Largest request header (request line and all header lines), in bytes; larger: `431`.
    pub max_header_bytes: usize,
    /// Most header lines in one request; more: `431`.
    pub max_headers: usize,
    /// Time a client has to send a whole request header, from its first byte (and, on a new
    /// connection, from the accept), in milliseconds; then `408` and the connection closes.
    #[serde(rename = "header_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub header_timeout: Duration,
    /// How long an idle keep-alive connection is kept open between requests, in milliseconds.
    #[serde(rename = "idle_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub idle_timeout: Duration,
    /// Open client connections at most; beyond it new connections are closed at once.
    pub max_connections: usize,
    /// Requests served on one connection before it is closed (the client reconnects).
    pub max_requests_per_connection: u32,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_header_bytes: 16 * 1024,
            max_headers: 64,
            header_timeout: Duration::from_millis(10_000),
            idle_timeout: Duration::from_millis(60_000),
            max_connections: 10_000,
            max_requests_per_connection: 10_000,
        }
    }
}

impl LimitsConfig {
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let ranges: [(&str, u64, u64, u64); 6] = [
            (
                "max_header_bytes",
                self.max_header_bytes as u64,
                1_024,
                1_048_575,
            ),
            ("max_headers", self.max_headers as u64, 8, 256),
            ("header_timeout_ms", ms(self.header_timeout), 100, 300_000),
            ("idle_timeout_ms", ms(self.idle_timeout), 100, 3_600_000),
            (
                "max_connections",
                self.max_connections as u64,
                1,
                10_000_000,
            ),
            (
                "max_requests_per_connection",
                u64::from(self.max_requests_per_connection),
                1,
                u64::from(u32::MAX),
            ),
        ];
        for (key, value, min, max) in ranges {
            if !(min..=max).contains(&value) {
                out.push(format!(
                    "gateway.limits.{key}: {value} is outside {min}..={max}"
                ));
            }
        }
        out
    }
}

/// `POST /v1/public/domains`: many lookups in one request (docs/api.md, "Batch lookups").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BatchConfig {
    /// Off: the route answers 404.
    pub enabled: bool,
    /// Names one request may carry (1 to 10000); more: `422`.
    pub max_names: usize,
    /// Largest request body, in bytes (1024 to 1048576); larger: `413`. The body is read
    /// within `gateway.limits.header_timeout_ms`.
    pub max_body_bytes: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            enabled: true,
            max_names: 1_000,
            max_body_bytes: 64 * 1024,
        }
    }
}

impl BatchConfig {
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !(1..=10_000).contains(&self.max_names) {
            out.push(format!(
                "gateway.batch.max_names: {} is outside 1..=10000",
                self.max_names
            ));
        }
        if !(1_024..=1_048_576).contains(&self.max_body_bytes) {
            out.push(format!(
                "gateway.batch.max_body_bytes: {} is outside 1024..=1048576",
                self.max_body_bytes
            ));
        }
        out
    }
}
