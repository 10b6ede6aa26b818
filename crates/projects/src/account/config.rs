//! Configuration of the keys API (`/v1/keys`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds, DurationSeconds};

use drg_access::quota::config::QuotaConfig;
use drg_base::infra::units::{ms, secs};

/// `GET/POST /v1/keys`, `DELETE /v1/keys/{id}`, `POST /v1/keys/{id}/rotate`: projects listing,
/// making, revoking and rotating keys.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KeysApiConfig {
    /// Off: the routes answer 404 (keys made before keep working).
    pub enabled: bool,
    /// Where an earlier release kept API-made keys (now in the control store): the file
    /// `migrate` takes them from. Relative to the config file. Default: `keys.managed.json` in
    /// the folder of `quota.state_file`.
    pub file: Option<PathBuf>,
    /// Largest `POST /v1/keys` body, in bytes (64 to 65536).
    pub max_body_bytes: usize,
    /// How long a `POST /v1/keys` body may take to arrive, in milliseconds (100 to 60000).
    #[serde(rename = "body_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub body_timeout: Duration,
    /// How often the last use of API-made keys is saved to the control store, in seconds
    /// (1 to 3600). Between saves it is kept in memory.
    #[serde(rename = "last_used_flush_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub last_used_flush: Duration,
    /// Kept so that configs which set it still load (a warning says so); it decides nothing
    /// now: keys follow the control store (`gateway.control.poll_ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_poll_ms: Option<u64>,
    /// How long a read of the control store vouches for the API-made keys a gateway holds, in
    /// seconds (10 to 86400): with the store away longer (or a gateway started while it is
    /// away from a cache older than that), API-made keys answer `503`, since one may have been
    /// revoked meanwhile. Operator keys are not concerned.
    #[serde(rename = "unverified_after_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub unverified_after: Duration,
    /// How long a rotated key keeps working beside its successor when the rotation names no
    /// `overlap_hours`, in hours (0 to 720).
    pub rotate_overlap_hours: u32,
}

impl Default for KeysApiConfig {
    fn default() -> Self {
        KeysApiConfig {
            enabled: true,
            file: None,
            max_body_bytes: 4_096,
            body_timeout: Duration::from_millis(5_000),
            last_used_flush: Duration::from_secs(60),
            shared_poll_ms: None,
            unverified_after: Duration::from_secs(900),
            rotate_overlap_hours: 24,
        }
    }
}

impl KeysApiConfig {
    /// The file an earlier release kept API-made keys in: `file`, or `keys.managed.json`
    /// beside the quota state file.
    pub fn managed_file(&self, quota: &QuotaConfig) -> PathBuf {
        self.file.clone().unwrap_or_else(|| {
            quota
                .state_file
                .parent()
                .unwrap_or(Path::new("."))
                .join("keys.managed.json")
        })
    }

    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !(64..=65_536).contains(&self.max_body_bytes) {
            out.push(format!(
                "gateway.keys_api.max_body_bytes: {} is outside 64..=65536",
                self.max_body_bytes
            ));
        }
        if !(100..=60_000).contains(&ms(self.body_timeout)) {
            out.push(format!(
                "gateway.keys_api.body_timeout_ms: {} is outside 100..=60000",
                ms(self.body_timeout)
            ));
        }
        if !(1..=3_600).contains(&secs(self.last_used_flush)) {
            out.push(format!(
                "gateway.keys_api.last_used_flush_seconds: {} is outside 1..=3600",
                secs(self.last_used_flush)
            ));
        }
        if !(10..=86_400).contains(&secs(self.unverified_after)) {
            out.push(format!(
                "gateway.keys_api.unverified_after_seconds: {} is outside 10..=86400",
                secs(self.unverified_after)
            ));
        }
        if self.rotate_overlap_hours > 720 {
            out.push(format!(
                "gateway.keys_api.rotate_overlap_hours: {} is outside 0..=720",
                self.rotate_overlap_hours
            ));
        }
        if self.file.as_ref().is_some_and(|f| f.as_os_str().is_empty()) {
            out.push("gateway.keys_api.file: empty".to_owned());
        }
        out
    }
}
