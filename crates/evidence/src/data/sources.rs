//! Lists fetched from URLs (`gateway.data.sources`): a background service that refreshes each
//! one with a conditional GET and keeps its last good copy as a file the data loader reads.
//!
//! The cached copy is the hand-off: a download that passes its checks (size while streaming,
//! UTF-8, the loader's own parser, the shrink limit) atomically replaces the cached file, and
//! the domain table's reloader, which watches it like any data file, rebuilds and swaps. So a
//! fetched list goes through the same build-validate-swap path as the files, a failed or refused
//! fetch leaves the table as it is, and a restart serves the cached copies without waiting for
//! the network (a source never fetched is absent until its first fetch succeeds).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use drg_base::service::{Service, Shutdown};
use prometheus::{GaugeVec, IntCounterVec};
use serde::{Deserialize, Serialize};

use crate::data::config::{DataConfig, SourceConfig, SourceKind};
use crate::data::files::RECORDS_FILE;
use drg_domain::sources::{add_domain_list, add_records};
use drg_domain::{ListKind, SourceError, TableBuilder};
use drg_telemetry::metrics::Metrics;

/// A download's body as text, refused past `max` bytes (announced or read: one byte past the
/// limit tells a body that is too long without reading the rest).
fn read_bounded(
    response: ureq::http::Response<ureq::Body>,
    announced: Option<u64>,
    max: u64,
) -> Result<String, FetchError> {
    if announced.is_some_and(|l| l > max) {
        return Err(FetchError::TooLarge { max });
    }
    let mut body = Vec::new();
    response
        .into_body()
        .into_reader()
        .take(max + 1)
        .read_to_end(&mut body)
        .map_err(FetchError::Body)?;
    if body.len() as u64 > max {
        return Err(FetchError::TooLarge { max });
    }
    String::from_utf8(body).map_err(|_| FetchError::NotText)
}

/// The sidecar of a cached copy: where it came from and its validators.
fn meta_path(dir: &Path, source: &SourceConfig) -> PathBuf {
    dir.join(format!("{}.meta.json", source.name))
}

/// What is kept beside a cached copy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Meta {
    /// The URL the copy came from: validators are only sent back to it.
    url: String,
    etag: Option<String>,
    last_modified: Option<String>,
    /// Entries the copy holds (the base of the shrink check).
    entries: usize,
    /// Unix time the copy was last confirmed current (downloaded or answered 304).
    checked_at: u64,
}

fn read_meta(dir: &Path, source: &SourceConfig) -> Option<Meta> {
    let text = std::fs::read_to_string(meta_path(dir, source)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Why a fetch did not give a new copy. The refusals are downloads that arrived but must not be
/// served; the rest never arrived.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("request failed: {0}")]
    Http(#[from] ureq::Error),
    #[error("answered HTTP {0}")]
    Status(u16),
    #[error("answered 304 Not Modified, but there is no cached copy")]
    NotModifiedWithoutCopy,
    #[error("cannot read the body: {0}")]
    Body(std::io::Error),
    #[error("the body is larger than max_bytes ({max} bytes); refused")]
    TooLarge { max: u64 },
    #[error("the body is not UTF-8 text; refused")]
    NotText,
    #[error("refused: {0}")]
    Parse(#[from] SourceError),
    #[error(
        "the new copy has {after} entries where the cached one has {before}: more than \
         {max_percent}% gone at once, refused as a likely truncated or broken list (raise \
         gateway.reload.max_shrink_percent if it is meant)"
    )]
    Shrunk {
        before: usize,
        after: usize,
        max_percent: u32,
    },
    #[error("cannot store the copy at {path}: {source}")]
    Store {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl FetchError {
    /// The `result` label of the fetch counter.
    fn result(&self) -> &'static str {
        match self {
            FetchError::TooLarge { .. }
            | FetchError::NotText
            | FetchError::Parse(_)
            | FetchError::Shrunk { .. } => "refused",
            _ => "error",
        }
    }
}

/// What a successful fetch came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetched {
    /// A new copy was stored.
    Updated { entries: usize, bytes: usize },
    /// The server said the cached copy is current.
    NotModified,
}

/// One source with its HTTP client and where its copy is kept.
pub struct Source {
    pub config: SourceConfig,
    dir: PathBuf,
    /// `domains.csv` of the data folder: a records source must not repeat one of its domains
    /// (the table build would fail on it).
    own_records: PathBuf,
    max_shrink_percent: u32,
    agent: ureq::Agent,
}

impl Source {
    pub fn new(config: SourceConfig, data: &DataConfig, max_shrink_percent: u32) -> Self {
        let agent = ureq::Agent::config_builder()
            .tls_config(drg_base::infra::http::system_tls())
            .timeout_global(Some(config.timeout))
            .max_redirects(config.max_redirects)
            // Status codes are handled here (304 is the point of the exercise).
            .http_status_as_error(false)
            // Lists are text; a compressed body would not be bounded by `max_bytes` as sent.
            .accept_encoding("identity")
            .user_agent(concat!("domain-risk-gateway/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Source {
            dir: data.sources_dir.clone(),
            own_records: data.dir.join(RECORDS_FILE),
            config,
            max_shrink_percent,
            agent,
        }
    }

    pub fn cached_copy(&self) -> PathBuf {
        self.config.cached_copy(&self.dir)
    }

    /// Asks for a new copy (conditionally, when one is cached), checks it and stores it.
    /// Blocking: run it off the async threads.
    pub fn fetch(&self) -> Result<Fetched, FetchError> {
        let copy = self.cached_copy();
        let held = read_meta(&self.dir, &self.config).filter(|_| copy.exists());
        // Validators only go back to the URL they came from; the shrink check compares with
        // the copy held whatever its URL, as the table reload would.
        let meta = held.clone().filter(|m| m.url == self.config.url);
        let mut request = self.agent.get(&self.config.url);
        if let Some(m) = &meta {
            if let Some(etag) = &m.etag {
                request = request.header("If-None-Match", etag);
            }
            if let Some(lm) = &m.last_modified {
                request = request.header("If-Modified-Since", lm);
            }
        }
        let response = request.call()?;
        let status = response.status().as_u16();
        if status == 304 {
            let Some(mut m) = meta else {
                return Err(FetchError::NotModifiedWithoutCopy);
            };
            m.checked_at = unix_now();
            // Only the time changes: losing this write costs nothing.
            let _ = write_atomic(&meta_path(&self.dir, &self.config), &meta_json(&m));
            return Ok(Fetched::NotModified);
        }
        if status != 200 {
            return Err(FetchError::Status(status));
        }
        let header = |name: &str| drg_base::infra::http::header(&response, name);
        let (etag, last_modified) = (header("etag"), header("last-modified"));
        let announced = header("content-length").and_then(|l| l.parse::<u64>().ok());
        let text = read_bounded(response, announced, self.config.max_bytes)?;
        let entries = self.validate(&text)?;
        if let Some(before) = held.as_ref().map(|m| m.entries) {
            let lost = before.saturating_sub(entries) as u128;
            if lost * 100 > u128::from(self.max_shrink_percent) * before as u128 {
                return Err(FetchError::Shrunk {
                    before,
                    after: entries,
                    max_percent: self.max_shrink_percent,
                });
            }
        }
        // The copy first, then its validators: a crash between the two leaves a new copy with
        // old validators, which at worst is downloaded once more.
        write_atomic(&copy, text.as_bytes())?;
        let meta = Meta {
            url: self.config.url.clone(),
            etag,
            last_modified,
            entries,
            checked_at: unix_now(),
        };
        write_atomic(&meta_path(&self.dir, &self.config), &meta_json(&meta))?;
        Ok(Fetched::Updated {
            entries,
            bytes: text.len(),
        })
    }

    /// Parses a download with the loader's own parser; returns how many entries it holds.
    fn validate(&self, text: &str) -> Result<usize, SourceError> {
        let origin = self.config.url.as_str();
        let kind = match self.config.kind {
            SourceKind::Disposable => ListKind::Disposable,
            SourceKind::Allowlist => ListKind::Allow,
            SourceKind::Free => ListKind::BroadFree,
            SourceKind::Records => {
                let mut builder = TableBuilder::with_capacity(1_000);
                // Our own records first, so that a download repeating one is refused here
                // rather than failing the table build. A broken domains.csv is not the
                // download's fault: the table build reports it.
                if let Ok(own) = std::fs::read_to_string(&self.own_records) {
                    let _ = add_records(&mut builder, &own, RECORDS_FILE);
                }
                return add_records(&mut builder, text, origin);
            }
        };
        add_domain_list(&mut TableBuilder::with_capacity(1_000), text, origin, kind)
    }
}

fn meta_json(meta: &Meta) -> Vec<u8> {
    serde_json::to_vec_pretty(meta).unwrap_or_default()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Replaces `path` with `content` in one step, mode 0600 (see [`drg_base::infra::fsutil`]): the reloader
/// never sees half a file, and a crash leaves the old copy or the new one. The temporary name
/// starts with '.', which no source name does, so it is no other source's file.
fn write_atomic(path: &Path, content: &[u8]) -> Result<(), FetchError> {
    drg_base::infra::fsutil::write_atomic(path, 0o600, content).map_err(|source| {
        FetchError::Store {
            path: path.to_owned(),
            source,
        }
    })
}

/// Why the sources folder cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("gateway.data.sources_dir {path}: {problem}")]
pub struct SourcesDirError {
    path: PathBuf,
    problem: String,
}

/// Creates the sources folder (mode 0700) if missing and checks no one else can write to it:
/// whoever can replace a cached copy decides what the gateway answers.
pub fn prepare_dir(path: &Path) -> Result<(), SourcesDirError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let fail = |problem: String| SourcesDirError {
        path: path.to_owned(),
        problem,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| fail(format!("cannot create it: {e}")))?;
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if !meta.is_dir() {
        return Err(fail("is not a folder".into()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(fail(format!(
            "is writable by its group or by others (mode {mode:04o}); chmod 700 it"
        )));
    }
    Ok(())
}

/// The fetch counters, by source.
#[derive(Clone)]
struct SourceMetrics {
    fetches: IntCounterVec,
    last_success: GaugeVec,
}

/// The background service refreshing every configured source.
pub struct Fetcher {
    sources: Vec<Arc<Source>>,
    metrics: SourceMetrics,
}

impl Fetcher {
    /// The sources of `data`, each with the state of its cached copy logged; registers the
    /// metrics.
    pub fn new(
        data: &DataConfig,
        max_shrink_percent: u32,
        metrics: &Metrics,
    ) -> Result<Self, prometheus::Error> {
        let metrics = SourceMetrics {
            fetches: metrics.counter_vec(
                "drg_source_fetches_total",
                "Fetches of URL sources, by source and result (ok, not_modified, error, refused).",
                &["source", "result"],
            )?,
            last_success: metrics.gauge_vec(
                "drg_source_last_success_timestamp_seconds",
                "Unix time the source's cached copy was last downloaded or confirmed current.",
                &["source"],
            )?,
        };
        let sources: Vec<Arc<Source>> = data
            .sources
            .iter()
            .map(|c| Arc::new(Source::new(c.clone(), data, max_shrink_percent)))
            .collect();
        for source in &sources {
            let name = source.config.name.as_str();
            for result in ["ok", "not_modified", "error", "refused"] {
                metrics.fetches.with_label_values(&[name, result]);
            }
            match read_meta(&source.dir, &source.config).filter(|_| source.cached_copy().exists()) {
                Some(m) => {
                    metrics
                        .last_success
                        .with_label_values(&[name])
                        .set(m.checked_at as f64);
                    log::info!(
                        "source {name}: serving the cached copy ({} entries, checked {} s ago) until {} answers",
                        m.entries,
                        unix_now().saturating_sub(m.checked_at),
                        source.config.url
                    );
                }
                None => log::info!(
                    "source {name}: no cached copy yet; absent from the table until {} answers",
                    source.config.url
                ),
            }
        }
        Ok(Fetcher { sources, metrics })
    }

    /// Fetches one source on a blocking thread; logs and counts the outcome; returns its
    /// `result` label.
    async fn refresh(&self, source: &Arc<Source>) -> &'static str {
        let started = Instant::now();
        let job = source.clone();
        let outcome = tokio::task::spawn_blocking(move || job.fetch()).await;
        let name = source.config.name.as_str();
        let took = started.elapsed().as_millis();
        let result = match outcome {
            Ok(Ok(Fetched::Updated { entries, bytes })) => {
                log::info!(
                    "source {name}: new copy from {} ({entries} entries, {bytes} bytes, {took} ms)",
                    source.config.url
                );
                "ok"
            }
            Ok(Ok(Fetched::NotModified)) => {
                log::info!("source {name}: not modified ({took} ms)");
                "not_modified"
            }
            Ok(Err(e)) => {
                let result = e.result();
                if result == "refused" {
                    log::warn!(
                        "source {name}: download from {} refused, keeping the current copy: {e}",
                        source.config.url
                    );
                } else {
                    log::warn!(
                        "source {name}: fetch from {} failed, keeping the current copy: {e}",
                        source.config.url
                    );
                }
                result
            }
            Err(e) => {
                log::error!("source {name}: the fetch thread died: {e}");
                "error"
            }
        };
        self.metrics
            .fetches
            .with_label_values(&[name, result])
            .inc();
        if matches!(result, "ok" | "not_modified") {
            self.metrics
                .last_success
                .with_label_values(&[name])
                .set(unix_now() as f64);
        }
        result
    }
}

#[async_trait]
impl Service for Fetcher {
    async fn run(&self, mut shutdown: Shutdown) {
        // Every source is fetched right after start, then every `refresh` after its last try.
        let mut due: Vec<Instant> = vec![Instant::now(); self.sources.len()];
        loop {
            for (i, source) in self.sources.iter().enumerate() {
                if *shutdown.borrow() {
                    return;
                }
                if due[i] <= Instant::now() {
                    // A fetch still running at shutdown is left to its thread (its write is
                    // atomic); the server does not wait up to `timeout_ms` for it.
                    let result = tokio::select! {
                        result = self.refresh(source) => result,
                        _ = shutdown.changed() => return,
                    };
                    let wait = match result {
                        // A network failure may be brief: try again sooner. A refused download
                        // would be refused again until the list changes.
                        "error" => source.config.refresh.min(source.config.retry),
                        _ => source.config.refresh,
                    };
                    due[i] = Instant::now() + wait;
                }
            }
            let Some(next) = due.iter().min().copied() else {
                return;
            };
            tokio::select! {
                _ = tokio::time::sleep_until(next.into()) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn source(kind: SourceKind, data: &DataConfig) -> Source {
        let config = SourceConfig {
            name: "s".into(),
            url: "http://lists.example/s".into(),
            kind,
            refresh: Duration::from_secs(60),
            max_bytes: 1_000,
            timeout: Duration::from_secs(1),
            retry: Duration::from_secs(1),
            max_redirects: 0,
        };
        Source::new(config, data, 50)
    }

    #[test]
    fn a_download_is_checked_with_the_loaders_own_parser() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(RECORDS_FILE),
            "domain,reason,risk_score\nown.com,safe,1\n",
        )
        .unwrap();
        let data = DataConfig {
            dir: dir.path().to_owned(),
            sources_dir: dir.path().join("sources"),
            ..DataConfig::default()
        };
        let list = source(SourceKind::Disposable, &data);
        assert_eq!(list.validate("# c\na.com\n\nb.com # x\n").unwrap(), 2);
        let err = list
            .validate("a.com\nnot a name\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("/s:2: 'not a name'"), "{err}");
        let records = source(SourceKind::Records, &data);
        assert_eq!(
            records
                .validate("domain,reason,risk_score\nnew.com,disposable,100\n")
                .unwrap(),
            1
        );
        // A record our own domains.csv already holds would fail the table build: refused here.
        let err = records
            .validate("domain,reason,risk_score\nown.com,disposable,100\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("own.com"), "{err}");
        assert!(records.validate("a.com\n").is_err(), "no header");
        assert_eq!(
            records.config.cached_copy(&data.sources_dir),
            dir.path().join("sources/s.csv")
        );
    }

    #[test]
    fn the_sources_folder_is_created_private_and_a_shared_one_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/sources");
        prepare_dir(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = prepare_dir(&path).unwrap_err().to_string();
        assert!(err.contains("gateway.data.sources_dir"), "{err}");
        assert!(err.contains("chmod 700"), "{err}");
    }
}
