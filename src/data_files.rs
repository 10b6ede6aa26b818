//! The domain data on disk: which files make a table, reading them, and building it.
//!
//! All files are optional; the folder must exist. Building is slow work (tens of milliseconds to
//! seconds), so the reloader runs it off the request threads.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::config::GatewayConfig;
use crate::domain::providers::ProviderTable;
use crate::domain::sources::{add_domain_list, add_records, SourceError};
use crate::domain::{DomainName, DomainTable, ListKind, Scores, TableBuilder};

pub const DISPOSABLE_FILE: &str = "disposable.txt";
pub const ALLOWLIST_FILE: &str = "allowlist.txt";
pub const FREE_PROVIDERS_FILE: &str = "free_providers.txt";
pub const RECORDS_FILE: &str = "domains.csv";
pub const MX_PROVIDERS_FILE: &str = "mx_providers.csv";

/// Why a table could not be built.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("data folder {path} cannot be read: {source}")]
    Folder {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Parse(#[from] SourceError),
}

/// Where a table's data comes from, as configured.
#[derive(Debug, Clone)]
pub struct DataSources {
    pub dir: PathBuf,
    pub builtin_disposable: bool,
    pub scores: Scores,
}

impl DataSources {
    pub fn from_config(config: &GatewayConfig) -> Self {
        DataSources {
            dir: config.data.dir.clone(),
            builtin_disposable: config.data.builtin_disposable,
            scores: config.scores,
        }
    }

    /// The files whose changes trigger a reload (present or not).
    pub fn watched_files(&self) -> Vec<PathBuf> {
        [
            DISPOSABLE_FILE,
            ALLOWLIST_FILE,
            FREE_PROVIDERS_FILE,
            RECORDS_FILE,
        ]
        .iter()
        .map(|f| self.dir.join(f))
        .collect()
    }

    /// Reads every source and builds a table.
    pub fn build(&self) -> Result<DomainTable, LoadError> {
        let started = Instant::now();
        std::fs::read_dir(&self.dir).map_err(|source| LoadError::Folder {
            path: self.dir.clone(),
            source,
        })?;
        let mut builder = TableBuilder::with_capacity(if self.builtin_disposable {
            60_000
        } else {
            1_000
        });
        if self.builtin_disposable {
            let skipped = add_builtin_disposable(&mut builder);
            if skipped > 0 {
                log::debug!(
                    "built-in disposable list: skipped {skipped} entries that are not hostnames"
                );
            }
        }
        for (file, kind) in [
            (DISPOSABLE_FILE, ListKind::Disposable),
            (ALLOWLIST_FILE, ListKind::Allow),
            (FREE_PROVIDERS_FILE, ListKind::FreeProvider),
        ] {
            if let Some((path, text)) = self.read_optional(file)? {
                add_domain_list(&mut builder, &text, &path.display().to_string(), kind)?;
            }
        }
        if let Some((path, text)) = self.read_optional(RECORDS_FILE)? {
            add_records(&mut builder, &text, &path.display().to_string())?;
        }
        if let Some((path, text)) = self.read_optional(MX_PROVIDERS_FILE)? {
            builder.set_providers(ProviderTable::parse(&text, &path.display().to_string())?);
        }
        let table = builder.build(self.scores);
        log::info!(
            "domain table built in {} ms; name index {:.1} MiB ({:.0} bytes a name)",
            started.elapsed().as_millis(),
            table.index_bytes() as f64 / 1_048_576.0,
            table.index_bytes() as f64 / table.len().max(1) as f64
        );
        Ok(table)
    }

    fn read_optional(&self, file: &str) -> Result<Option<(PathBuf, String)>, LoadError> {
        let path = self.dir.join(file);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some((path, text))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(LoadError::Read { path, source }),
        }
    }
}

/// Adds the `mailchecker` crate's list; returns how many of its entries were not hostnames.
fn add_builtin_disposable(builder: &mut TableBuilder) -> usize {
    let mut skipped = 0;
    for entry in mailchecker::blacklist() {
        match DomainName::parse(entry) {
            Ok(name) => builder.add(&name, ListKind::Disposable),
            Err(_) => skipped += 1,
        }
    }
    skipped
}

/// One line for logs: what a table holds.
pub fn summary(table: &DomainTable) -> String {
    let s = table.stats();
    format!(
        "{} names ({} disposable, {} allowlisted, {} free providers, {} records, {} MX provider patterns; {} conflicts resolved, {} public suffixes skipped)",
        table.len(),
        s.disposable,
        s.allow,
        s.free_providers,
        s.records,
        table.providers().len(),
        s.conflicts.len(),
        s.skipped_public_suffixes
    )
}

/// Logs the conflicts a build resolved (the first few by name, then a count).
pub fn log_conflicts(table: &DomainTable, dir: &Path) {
    let conflicts = &table.stats().conflicts;
    for c in conflicts.iter().take(10) {
        log::warn!("{}: {} ({})", dir.display(), c.domain, c.resolution);
    }
    if conflicts.len() > 10 {
        log::warn!(
            "{}: {} more conflicts resolved the same way",
            dir.display(),
            conflicts.len() - 10
        );
    }
}

/// The domain table as a [`Reloadable`](crate::reload::Reloadable) source.
impl crate::reload::Reloadable for DataSources {
    type Snapshot = DomainTable;
    type Error = LoadError;

    fn name(&self) -> &str {
        "domain table"
    }

    fn watched_files(&self) -> Vec<PathBuf> {
        DataSources::watched_files(self)
    }

    fn build(&self) -> Result<DomainTable, LoadError> {
        DataSources::build(self)
    }

    fn published(&self, table: &DomainTable) {
        log::info!("domain table reloaded: {}", summary(table));
        log_conflicts(table, &self.dir);
    }
}
