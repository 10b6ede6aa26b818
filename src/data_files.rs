//! The domain data on disk: which files make a table, reading them, and building it.
//!
//! All files are optional; the folder must exist. Building is slow work (tens of milliseconds to
//! seconds), so the reloader runs it off the request threads. A reload in which a file lost more
//! than `gateway.reload.max_shrink_percent` of its entries is refused: a truncated or failed
//! download must not empty a list in service.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::config::GatewayConfig;
use crate::domain::providers::ProviderTable;
use crate::domain::sources::{add_domain_list, add_records};
use crate::domain::stats::TableStats;
use crate::domain::{DomainName, DomainTable, ListKind, Scores, SourceError, TableBuilder};

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
    #[error(
        "{}: more than {max_percent}% of the entries gone at once, refused as a likely truncated \
         or failed download; if it is meant, raise gateway.reload.max_shrink_percent (100 turns \
         the check off) or restart the gateway (the load at start is not compared)",
        shrunk_list(dir, files)
    )]
    Shrunk {
        dir: PathBuf,
        files: Vec<Shrunk>,
        max_percent: u32,
    },
}

/// A data file that holds fewer entries than the table in service was built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shrunk {
    pub file: Box<str>,
    pub before: usize,
    pub after: usize,
}

fn shrunk_list(dir: &Path, files: &[Shrunk]) -> String {
    files
        .iter()
        .map(|f| {
            format!(
                "{} went from {} to {} entries",
                dir.join(&*f.file).display(),
                f.before,
                f.after
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The sources of `current` that lost more than `max_percent` of their entries in `next` (a
/// source missing from `next`, e.g. a deleted file, has 0). Sources new in `next` are fine.
pub fn shrunk_sources(current: &TableStats, next: &TableStats, max_percent: u32) -> Vec<Shrunk> {
    current
        .sources
        .iter()
        .filter_map(|(file, before)| {
            let after = next
                .sources
                .iter()
                .find(|(f, _)| f == file)
                .map_or(0, |(_, n)| *n);
            let lost = before.saturating_sub(after) as u128;
            (lost * 100 > u128::from(max_percent) * *before as u128).then(|| Shrunk {
                file: file.clone(),
                before: *before,
                after,
            })
        })
        .collect()
}

/// Where a table's data comes from, as configured.
#[derive(Debug, Clone)]
pub struct DataSources {
    pub dir: PathBuf,
    pub builtin_disposable: bool,
    pub scores: Scores,
    /// A reload whose files lost more than this percentage of their entries is refused.
    pub max_shrink_percent: u32,
}

impl DataSources {
    pub fn from_config(config: &GatewayConfig) -> Self {
        DataSources {
            dir: config.data.dir.clone(),
            builtin_disposable: config.data.builtin_disposable,
            scores: config.scores,
            max_shrink_percent: config.reload.max_shrink_percent,
        }
    }

    /// The files whose changes trigger a reload (present or not).
    pub fn watched_files(&self) -> Vec<PathBuf> {
        [
            DISPOSABLE_FILE,
            ALLOWLIST_FILE,
            FREE_PROVIDERS_FILE,
            RECORDS_FILE,
            MX_PROVIDERS_FILE,
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
                let n = add_domain_list(&mut builder, &text, &path.display().to_string(), kind)?;
                builder.count_source(file, n);
            }
        }
        if let Some((path, text)) = self.read_optional(RECORDS_FILE)? {
            let n = add_records(&mut builder, &text, &path.display().to_string())?;
            builder.count_source(RECORDS_FILE, n);
        }
        if let Some((path, text)) = self.read_optional(MX_PROVIDERS_FILE)? {
            let providers = ProviderTable::parse(&text, &path.display().to_string())?;
            builder.count_source(MX_PROVIDERS_FILE, providers.len());
            builder.set_providers(providers);
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

    fn accept(&self, current: &DomainTable, next: &DomainTable) -> Result<(), LoadError> {
        let files = shrunk_sources(current.stats(), next.stats(), self.max_shrink_percent);
        if files.is_empty() {
            return Ok(());
        }
        Err(LoadError::Shrunk {
            dir: self.dir.clone(),
            files,
            max_percent: self.max_shrink_percent,
        })
    }

    fn published(&self, table: &DomainTable) {
        log::info!("domain table reloaded: {}", summary(table));
        log_conflicts(table, &self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(sources: &[(&str, usize)]) -> TableStats {
        TableStats {
            sources: sources.iter().map(|(f, n)| ((*f).into(), *n)).collect(),
            ..TableStats::default()
        }
    }

    #[test]
    fn a_source_that_lost_more_than_the_limit_is_named() {
        let current = stats(&[("disposable.txt", 100), ("allowlist.txt", 2)]);
        let shrunk = |next: &[(&str, usize)], percent| {
            shrunk_sources(&current, &stats(next), percent)
                .into_iter()
                .map(|s| (s.file.to_string(), s.before, s.after))
                .collect::<Vec<_>>()
        };
        let both = [("disposable.txt", 50), ("allowlist.txt", 2)];
        assert_eq!(shrunk(&both, 50), [], "exactly half lost: allowed");
        let cut = [("disposable.txt", 49), ("allowlist.txt", 2)];
        assert_eq!(shrunk(&cut, 50), [("disposable.txt".into(), 100, 49)]);
        // A deleted file lost everything; a new file is no loss.
        let gone = [("disposable.txt", 100), ("domains.csv", 3)];
        assert_eq!(shrunk(&gone, 50), [("allowlist.txt".into(), 2, 0)]);
        assert_eq!(shrunk(&[], 100), [], "100 turns the check off");
        assert_eq!(
            shrunk(&[("disposable.txt", 99), ("allowlist.txt", 2)], 0).len(),
            1
        );
    }

    #[test]
    fn the_build_counts_the_entries_of_each_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(DISPOSABLE_FILE), "# list\na.com\nb.com\n").unwrap();
        std::fs::write(
            dir.path().join(RECORDS_FILE),
            "domain,reason,risk_score\nr.com,safe,1\n",
        )
        .unwrap();
        let sources = DataSources {
            dir: dir.path().to_owned(),
            builtin_disposable: false,
            scores: Scores::default(),
            max_shrink_percent: 50,
        };
        let table = sources.build().unwrap();
        let counts: Vec<(&str, usize)> = table
            .stats()
            .sources
            .iter()
            .map(|(f, n)| (&**f, *n))
            .collect();
        assert_eq!(counts, [(DISPOSABLE_FILE, 2), (RECORDS_FILE, 1)]);
    }
}
