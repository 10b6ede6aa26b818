//! The domain data on disk: which files make a table, reading them, and building it.
//!
//! Our own curated files have fixed names; third-party lists (the community blocklist and
//! allowlist, broad free-webmail lists) are named in `gateway.data` and shipped under
//! `data/community/`. All files are optional; the folder must exist. Building is slow work (tens of milliseconds to
//! seconds), so the reloader runs it off the request threads. A reload in which a file lost more
//! than `gateway.reload.max_shrink_percent` of its entries is refused: a truncated or failed
//! download must not empty a list in service.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::data::config::{DataConfig, SourceKind};
use drg_domain::providers::ProviderTable;
use drg_domain::sources::{
    add_domain_list_named, add_records_named, add_relay_list_named, BUILTIN_SOURCE,
};
use drg_domain::stats::TableStats;
use drg_domain::table::{
    ALLOW_OVER_BLOCKLIST, BLOCKLIST_OVER_BROAD, BLOCKLIST_PARENT_OVER_BROAD, BLOCKLIST_UNDER_BROAD,
    FREE_OVER_BLOCKLIST, NOT_FREE_OVER_BROAD, RELAY_OVER_BLOCKLIST, RELAY_OVER_FREE,
};
use drg_domain::{DomainName, DomainTable, ListKind, Scores, SourceError, TableBuilder};

pub const DISPOSABLE_FILE: &str = "disposable.txt";
pub const ALLOWLIST_FILE: &str = "allowlist.txt";
pub const FREE_PROVIDERS_FILE: &str = "free_providers.txt";
pub const RECORDS_FILE: &str = "domains.csv";
pub const RELAYS_FILE: &str = "relays.txt";
pub const FREE_EXCLUSIONS_FILE: &str = "free_exclusions.txt";
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
    /// Third-party lists by kind, relative to `dir` (see [`DataConfig`]).
    pub blocklists: Vec<PathBuf>,
    pub allowlists: Vec<PathBuf>,
    pub broad_free_lists: Vec<PathBuf>,
    pub relay_lists: Vec<PathBuf>,
    /// Files in the `domains.csv` format besides it (the cached copies of `records` sources).
    pub records_lists: Vec<PathBuf>,
    pub scores: Scores,
    /// A reload whose files lost more than this percentage of their entries is refused.
    pub max_shrink_percent: u32,
}

impl DataSources {
    /// The table's inputs named by `data`, with the scores it answers with and the reload's
    /// shrink guard.
    pub fn from_config(data: &DataConfig, scores: Scores, max_shrink_percent: u32) -> Self {
        let mut sources = DataSources {
            dir: data.dir.clone(),
            builtin_disposable: data.builtin_disposable,
            blocklists: data.blocklists.clone(),
            allowlists: data.allowlists.clone(),
            broad_free_lists: data.broad_free_lists.clone(),
            relay_lists: data.relay_lists.clone(),
            records_lists: Vec::new(),
            scores,
            max_shrink_percent,
        };
        // The cached copies of URL sources join the files of their kind (absolute paths, so
        // `dir.join` keeps them); a copy not fetched yet is a missing file, i.e. absent.
        for source in &data.sources {
            let copy = source.cached_copy(&data.sources_dir);
            match source.kind {
                SourceKind::Disposable => sources.blocklists.push(copy),
                SourceKind::Allowlist => sources.allowlists.push(copy),
                SourceKind::Free => sources.broad_free_lists.push(copy),
                SourceKind::Records => sources.records_lists.push(copy),
            }
        }
        sources
    }

    /// The files whose changes trigger a reload (present or not).
    pub fn watched_files(&self) -> Vec<PathBuf> {
        let own = [
            DISPOSABLE_FILE,
            ALLOWLIST_FILE,
            FREE_PROVIDERS_FILE,
            RELAYS_FILE,
            FREE_EXCLUSIONS_FILE,
            RECORDS_FILE,
            MX_PROVIDERS_FILE,
        ];
        own.iter()
            .map(Path::new)
            .chain(self.lists().map(|(file, _)| file))
            .chain(self.records_lists.iter().map(PathBuf::as_path))
            .map(|f| self.dir.join(f))
            .collect()
    }

    /// The third-party domain lists with their kinds. Load order changes no answer: the builder
    /// resolves overlaps by kind, whichever file a name came from.
    fn lists(&self) -> impl Iterator<Item = (&Path, ListKind)> {
        [
            (&self.blocklists, ListKind::Disposable),
            (&self.allowlists, ListKind::Allow),
            (&self.broad_free_lists, ListKind::BroadFree),
            (&self.relay_lists, ListKind::Relay),
        ]
        .into_iter()
        .flat_map(|(files, kind)| files.iter().map(move |f| (f.as_path(), kind)))
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
        })
        .with_threads(build_threads());
        if self.builtin_disposable {
            let skipped = add_builtin_disposable(&mut builder);
            if skipped > 0 {
                log::debug!(
                    "built-in disposable list: skipped {skipped} entries that are not hostnames"
                );
            }
        }
        let own = [
            (DISPOSABLE_FILE, ListKind::Disposable),
            (ALLOWLIST_FILE, ListKind::Allow),
            (FREE_PROVIDERS_FILE, ListKind::FreeProvider),
            (RELAYS_FILE, ListKind::Relay),
            (FREE_EXCLUSIONS_FILE, ListKind::NotFree),
        ];
        let own = own.iter().map(|(f, k)| (Path::new(f), *k));
        for (file, kind) in own.chain(self.lists()) {
            if let Some((path, text)) = self.read_optional(file)? {
                // Evidence names the file relative to the data folder; errors, the full path.
                let name = file.display().to_string();
                let origin = path.display().to_string();
                let n = match kind {
                    ListKind::Relay => add_relay_list_named(&mut builder, &text, &origin, &name)?,
                    _ => add_domain_list_named(&mut builder, &text, &origin, &name, kind)?,
                };
                builder.count_source(&name, n);
            }
        }
        if let Some((path, text)) = self.read_optional(RECORDS_FILE)? {
            let n = add_records_named(
                &mut builder,
                &text,
                &path.display().to_string(),
                RECORDS_FILE,
            )?;
            builder.count_source(RECORDS_FILE, n);
        }
        for file in &self.records_lists {
            if let Some((path, text)) = self.read_optional(file)? {
                let name = file.display().to_string();
                let n = add_records_named(&mut builder, &text, &path.display().to_string(), &name)?;
                builder.count_source(&name, n);
            }
        }
        if let Some((path, text)) = self.read_optional(MX_PROVIDERS_FILE)? {
            let providers = ProviderTable::parse(&text, &path.display().to_string())?;
            builder.count_source(MX_PROVIDERS_FILE, providers.len());
            builder.set_providers(providers);
        }
        let table = builder.build(self.scores);
        // The build's transient memory (the files' text, the parsed runs) goes back to the
        // system now rather than when the allocator next gets round to it.
        drg_base::infra::alloc::release_free_memory();
        log::info!(
            "domain table built in {} ms; name index {:.1} MiB ({:.0} bytes a name)",
            started.elapsed().as_millis(),
            table.index_bytes() as f64 / 1_048_576.0,
            table.index_bytes() as f64 / table.len().max(1) as f64
        );
        Ok(table)
    }

    fn read_optional(
        &self,
        file: impl AsRef<Path>,
    ) -> Result<Option<(PathBuf, String)>, LoadError> {
        let path = self.dir.join(file);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some((path, text))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(LoadError::Read { path, source }),
        }
    }
}

/// How many threads a table build uses: every core (a rebuild's threads run at its low
/// priority, so they take only what the request workers leave).
fn build_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Adds the `mailchecker` crate's list; returns how many of its entries were not hostnames.
fn add_builtin_disposable(builder: &mut TableBuilder) -> usize {
    let mut skipped = 0;
    let origin = drg_domain::table::Origin {
        source: builder.source(BUILTIN_SOURCE),
        line: 0,
    };
    for entry in mailchecker::blacklist() {
        match DomainName::parse(entry) {
            Ok(name) => builder.add_from(&name, ListKind::Disposable, origin),
            Err(_) => skipped += 1,
        }
    }
    skipped
}

/// One line for logs and `check-config`: what a table holds and the overlaps it resolved.
pub fn summary(table: &DomainTable) -> String {
    let s = table.stats();
    let overlaps: Vec<String> = s
        .conflict_counts()
        .iter()
        .map(|(resolution, n)| format!("{n} {}", overlap_label(resolution)))
        .collect();
    format!(
        "{} names ({} disposable, {} allowlisted, {} relays, {} free providers ({} only on broad lists), {} records, {} MX provider patterns; {} overlaps resolved{}, {} public suffixes skipped)",
        table.len(),
        s.disposable,
        s.allow,
        s.relays,
        s.free_providers,
        s.broad_free_only,
        s.records,
        table.providers().len(),
        s.conflicts.len(),
        if overlaps.is_empty() {
            String::new()
        } else {
            format!(": {}", overlaps.join(", "))
        },
        s.skipped_public_suffixes
    )
}

/// A short name for a way an overlap was resolved (the summary line has room for no more).
fn overlap_label(resolution: &str) -> &'static str {
    match resolution {
        ALLOW_OVER_BLOCKLIST => "allowlist over blocklist",
        FREE_OVER_BLOCKLIST => "curated free over blocklist",
        RELAY_OVER_BLOCKLIST => "relay over blocklist",
        RELAY_OVER_FREE => "relay over free list",
        NOT_FREE_OVER_BROAD => "organisation over broad free",
        BLOCKLIST_OVER_BROAD => "blocklist over broad free",
        BLOCKLIST_PARENT_OVER_BROAD => "blocklisted parent over broad free",
        BLOCKLIST_UNDER_BROAD => "blocklisted subdomain over broad free parent",
        _ => "other",
    }
}

/// How many examples of each kind of overlap, and of skipped public suffixes, the log names.
const LOGGED_EXAMPLES: usize = 5;

/// Logs the overlaps a build resolved (a count and the first few names of each kind) and the
/// public suffixes the lists named. A blocklist losing to our own lists is a warning (worth a
/// look: one of them is wrong); a broad list losing to a blocklist is expected.
pub fn log_conflicts(table: &DomainTable, dir: &Path) {
    let stats = table.stats();
    for (resolution, n) in stats.conflict_counts() {
        let examples: Vec<&str> = stats
            .conflicts
            .iter()
            .filter(|c| c.resolution == resolution)
            .take(LOGGED_EXAMPLES)
            .map(|c| &*c.domain)
            .collect();
        let level = match resolution {
            ALLOW_OVER_BLOCKLIST | FREE_OVER_BLOCKLIST => log::Level::Warn,
            _ => log::Level::Info,
        };
        log::log!(
            level,
            "{}: {n} names {resolution}, e.g. {}",
            dir.display(),
            examples.join(", ")
        );
    }
    if !stats.public_suffixes.is_empty() {
        let examples: Vec<&str> = stats
            .public_suffixes
            .iter()
            .take(LOGGED_EXAMPLES)
            .map(|s| &**s)
            .collect();
        log::warn!(
            "{}: {} list entries are public suffixes, skipped (never matched), e.g. {}",
            dir.display(),
            stats.public_suffixes.len(),
            examples.join(", ")
        );
    }
}

/// The domain table as a [`Reloadable`](drg_base::reload::Reloadable) source.
impl drg_base::reload::Reloadable for DataSources {
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

    fn succeed(&self, current: &DomainTable, next: &mut DomainTable) {
        next.succeed(current);
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
    fn third_party_lists_are_loaded_by_kind_counted_and_watched() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("community")).unwrap();
        let write = |f: &str, text: &str| std::fs::write(dir.path().join(f), text).unwrap();
        write("free_providers.txt", "sify.com\n");
        write("community/block.conf", "sify.com\nthrowaway.example\n");
        write("community/allow.conf", "relay.example\n");
        write(
            "community/free.txt",
            "sify.com\nthrowaway.example\nrelay.example\nwebmail.example\nnet.ua\n",
        );
        let sources = DataSources {
            dir: dir.path().to_owned(),
            builtin_disposable: false,
            blocklists: vec!["community/block.conf".into()],
            allowlists: vec!["community/allow.conf".into(), "missing.conf".into()],
            broad_free_lists: vec!["community/free.txt".into()],
            relay_lists: vec![],
            records_lists: vec![],
            scores: Scores::default(),
            max_shrink_percent: 50,
        };
        assert!(sources
            .watched_files()
            .contains(&dir.path().join("community/free.txt")));
        let table = sources.build().unwrap();
        let counts: Vec<(&str, usize)> = table
            .stats()
            .sources
            .iter()
            .map(|(f, n)| (&**f, *n))
            .collect();
        assert_eq!(
            counts,
            [
                (FREE_PROVIDERS_FILE, 1),
                ("community/block.conf", 2),
                ("community/allow.conf", 1),
                ("community/free.txt", 5),
            ]
        );
        let free = |d: &str| {
            let m = table.lookup(&DomainName::parse(d).unwrap());
            (
                matches!(m.rule, drg_domain::TableRule::Blocklist { .. }),
                m.is_free_provider,
            )
        };
        assert_eq!(free("sify.com"), (false, true), "curated wins");
        assert_eq!(free("throwaway.example"), (true, false), "blocklist wins");
        assert_eq!(free("relay.example"), (false, true));
        assert_eq!(free("webmail.example"), (false, true));
        assert_eq!(table.stats().public_suffixes, [Box::<str>::from("net.ua")]);
        let line = summary(&table);
        for needle in [
            "3 free providers (2 only on broad lists)",
            "2 overlaps resolved: 1 curated free over blocklist, 1 blocklist over broad free",
            "1 public suffixes skipped",
        ] {
            assert!(line.contains(needle), "missing {needle}: {line}");
        }
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
            blocklists: vec![],
            allowlists: vec![],
            broad_free_lists: vec![],
            relay_lists: vec![],
            records_lists: vec![],
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
