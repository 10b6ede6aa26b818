//! Configuration of domain-age lookups through RDAP (`gateway.rdap`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds, DurationSeconds};

use drg_base::infra::units::{ms, secs};

/// IANA's RDAP bootstrap registry for domain names (RFC 9224), the `bootstrap_url` to set.
pub const IANA_BOOTSTRAP_URL: &str = "https://data.iana.org/rdap/dns.json";

/// Domain age from the registries' RDAP servers: when the registrable domain of a looked-up
/// name was registered, fetched in the background and cached for days.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct RdapConfig {
    /// Fetch registration dates for names the table leaves open.
    pub enabled: bool,
    /// A name registered fewer than this many days ago is young (`scores.young_domain`,
    /// `scores.young_domain_weak_mx`); 0: the age is shown, never weighed.
    pub young_days: u32,
    /// A name registered at least this many days ago is established: its MX neighbours alone
    /// do not make it `disposable` (`scores.neighbourhood_established`); 0: never.
    pub established_days: u32,
    /// How long a lookup that the MX neighbourhood would answer `disposable` waits for the
    /// age of a name the cache does not hold (an established domain is not flipped), in
    /// milliseconds; past it, the neighbourhood's verdict stands. 0: never waits.
    #[serde(rename = "neighbourhood_budget_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub neighbourhood_budget: Duration,
    /// How long a lookup may wait for a fetch of a name the cache does not hold, in
    /// milliseconds. 0 (the default): never; the answer goes without the age and the fetch
    /// runs in the background for the next lookup.
    #[serde(rename = "budget_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub budget: Duration,
    /// Fetches running at once (threads), across all servers.
    pub concurrency: usize,
    /// Names waiting for a fetch at most; past it a miss is not queued (asked again at its
    /// next lookup).
    pub max_queued: usize,
    /// Names one project may have waiting: one caller's flood of new names cannot take the
    /// queue, and projects are served in turn, so it never delays another's.
    pub max_queued_per_project: usize,
    /// Spacing of requests to one RDAP server, in milliseconds (1000: one per second, 3,600
    /// names an hour per registry).
    #[serde(rename = "min_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub min_interval: Duration,
    /// Spacing of requests to one RDAP server for names an answer waits for (a neighbourhood
    /// finding the name's age could outweigh: an established company's first answer), in
    /// milliseconds (200: five a second); `min_interval_ms` when that is shorter. They go at
    /// their own pace beside the others.
    #[serde(rename = "waited_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub waited_interval: Duration,
    /// Timeout of one fetch (connect, TLS, answer), in milliseconds.
    #[serde(rename = "timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub timeout: Duration,
    /// A larger answer is refused.
    pub max_body_bytes: u64,
    /// Redirects followed at most, each only to a server the bootstrap names for the TLD.
    pub max_redirects: u32,
    /// Cached domains at most (memory and the state file).
    pub cache_entries: usize,
    /// How long a registration date is kept, in days.
    pub ttl_days: u32,
    /// How long "no such domain" (404) is kept, in seconds.
    #[serde(rename = "negative_ttl_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub negative_ttl: Duration,
    /// How long a failed fetch (error, timeout, refused answer) keeps a name from being asked
    /// again, in seconds.
    #[serde(rename = "failure_ttl_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub failure_ttl: Duration,
    /// The longest a server's back-off lasts (its `Retry-After` included), in seconds.
    #[serde(rename = "max_backoff_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub max_backoff: Duration,
    /// The bootstrap file (IANA's `dns.json`); default: `community/rdap-bootstrap/dns.json` in the data folder.
    pub bootstrap_file: Option<PathBuf>,
    /// Where a newer bootstrap is fetched from (none: the file only).
    pub bootstrap_url: Option<String>,
    /// How often `bootstrap_url` is asked, in hours.
    pub bootstrap_refresh_hours: u64,
    /// Base URLs by TLD, over the bootstrap's (private registries, tests): `{com: "https://..."}`.
    pub servers: BTreeMap<String, String>,
    /// Take `http://` servers from the bootstrap and `servers` (default: only `https://`,
    /// whose answers TLS vouches for).
    pub allow_plain_http: bool,
    /// The cache's state file; default: `rdap_cache.jsonl` beside the quota's `state_file`.
    pub state_file: Option<PathBuf>,
    /// How often the cache is written to its state file, in seconds (and at shutdown).
    #[serde(rename = "save_interval_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub save_interval: Duration,
}

impl Default for RdapConfig {
    fn default() -> Self {
        RdapConfig {
            enabled: true,
            young_days: 30,
            established_days: 365,
            neighbourhood_budget: Duration::from_millis(1_500),
            budget: Duration::ZERO,
            concurrency: 4,
            max_queued: 1_024,
            max_queued_per_project: 64,
            min_interval: Duration::from_millis(1_000),
            waited_interval: Duration::from_millis(200),
            timeout: Duration::from_millis(5_000),
            max_body_bytes: 256 * 1024,
            max_redirects: 2,
            cache_entries: 200_000,
            ttl_days: 7,
            negative_ttl: Duration::from_secs(6 * 3_600),
            failure_ttl: Duration::from_secs(600),
            max_backoff: Duration::from_secs(3_600),
            bootstrap_file: None,
            // Opt-in, like the lists fetched from URLs: the gateway reaches out only where told.
            bootstrap_url: None,
            bootstrap_refresh_hours: 24,
            servers: BTreeMap::new(),
            allow_plain_http: false,
            state_file: None,
            save_interval: Duration::from_secs(300),
        }
    }
}

impl RdapConfig {
    /// Resolves the file paths against the config's folder: the bootstrap defaults into the
    /// data folder, the state file beside the quota's.
    pub fn resolve_paths(&mut self, base: &Path, data_dir: &Path, quota_state_file: &Path) {
        let resolve = |p: Option<PathBuf>, default: PathBuf| match p {
            Some(p) if p.is_relative() => base.join(p),
            Some(p) => p,
            None => default,
        };
        self.bootstrap_file = Some(resolve(
            self.bootstrap_file.take(),
            data_dir.join("community/rdap-bootstrap/dns.json"),
        ));
        let state_dir = quota_state_file.parent().unwrap_or(base);
        self.state_file = Some(resolve(
            self.state_file.take(),
            state_dir.join("rdap_cache.jsonl"),
        ));
    }

    /// The bootstrap file (after [`RdapConfig::resolve_paths`]).
    pub fn bootstrap_path(&self) -> PathBuf {
        self.bootstrap_file
            .clone()
            .unwrap_or_else(|| PathBuf::from("rdap_dns.json"))
    }

    /// The cache's state file (after [`RdapConfig::resolve_paths`]).
    pub fn state_path(&self) -> PathBuf {
        self.state_file
            .clone()
            .unwrap_or_else(|| PathBuf::from("rdap_cache.jsonl"))
    }

    /// Problems of `gateway.rdap`, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let key = "gateway.rdap";
        let mut out = Vec::new();
        let mut range = |name: &str, v: u64, lo: u64, hi: u64| {
            if !(lo..=hi).contains(&v) {
                out.push(format!("{key}.{name}: {v} is outside {lo}..={hi}"));
            }
        };
        range("young_days", u64::from(self.young_days), 0, 3_650);
        range(
            "established_days",
            u64::from(self.established_days),
            0,
            36_500,
        );
        range("budget_ms", ms(self.budget), 0, 5_000);
        range(
            "neighbourhood_budget_ms",
            ms(self.neighbourhood_budget),
            0,
            5_000,
        );
        range("concurrency", self.concurrency as u64, 1, 64);
        range("max_queued", self.max_queued as u64, 1, 1_000_000);
        range(
            "max_queued_per_project",
            self.max_queued_per_project as u64,
            1,
            1_000_000,
        );
        range("min_interval_ms", ms(self.min_interval), 1, 3_600_000);
        range("waited_interval_ms", ms(self.waited_interval), 1, 3_600_000);
        range("timeout_ms", ms(self.timeout), 100, 60_000);
        range("max_body_bytes", self.max_body_bytes, 1_024, 16 << 20);
        range("max_redirects", u64::from(self.max_redirects), 0, 5);
        range("cache_entries", self.cache_entries as u64, 1, 10_000_000);
        range("ttl_days", u64::from(self.ttl_days), 1, 365);
        range(
            "negative_ttl_seconds",
            secs(self.negative_ttl),
            1,
            30 * 86_400,
        );
        range("failure_ttl_seconds", secs(self.failure_ttl), 1, 86_400);
        range("max_backoff_seconds", secs(self.max_backoff), 1, 86_400);
        range(
            "bootstrap_refresh_hours",
            self.bootstrap_refresh_hours,
            1,
            8_760,
        );
        range("save_interval_seconds", secs(self.save_interval), 1, 86_400);
        if self.established_days > 0 && self.established_days <= self.young_days {
            out.push(format!(
                "{key}.established_days: {} is not above young_days ({}): a domain cannot be both",
                self.established_days, self.young_days
            ));
        }
        for (tld, url) in &self.servers {
            if tld.is_empty() || tld.contains('.') || tld != &tld.to_ascii_lowercase() {
                out.push(format!(
                    "{key}.servers: '{tld}' is not a TLD in lowercase ASCII (e.g. `com`, `xn--p1ai`)"
                ));
            }
            if let Err(why) = super::bootstrap::check_base_url(url, self.allow_plain_http) {
                out.push(format!("{key}.servers.{tld}: {why}"));
            }
        }
        if let Some(url) = &self.bootstrap_url {
            if let Err(why) = super::bootstrap::check_base_url(url, self.allow_plain_http) {
                out.push(format!("{key}.bootstrap_url: {why}"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_bad_values_are_named() {
        assert!(RdapConfig::default().problems().is_empty());
        let iana = RdapConfig {
            bootstrap_url: Some(IANA_BOOTSTRAP_URL.to_owned()),
            ..RdapConfig::default()
        };
        assert!(iana.problems().is_empty());
        let bad = RdapConfig {
            concurrency: 0,
            servers: [("Com".to_owned(), "ftp://x".to_owned())].into(),
            ..RdapConfig::default()
        };
        let p = bad.problems();
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(p[0].starts_with("gateway.rdap.concurrency"));
        assert!(p[1].contains("'Com'"));
        assert!(p[2].starts_with("gateway.rdap.servers.Com"));
    }
}
