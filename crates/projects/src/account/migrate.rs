//! `migrate`: moves what an earlier release kept of the projects' state (the keys they made,
//! their overrides, webhooks, reports and the accepted verdicts, and their audit trail) into the
//! control store, once: the state folder's files of an embedded deployment and, with the
//! shared Redis, its rows. Each record is taken only
//! where the store holds nothing newer, and each source once (the store notes it), so a second
//! run takes nothing and revives no removal made since; the folder's files are renamed
//! `<name>.migrated`, the Redis rows are left for the operator to drop.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use drg_access::managed::ManagedKey;
use drg_base::infra::control::{audit, Control};
use drg_base::infra::records::sql::SqlRecords;
use drg_base::infra::records::{legacy, Record, RecordsError};
use drg_base::infra::redis::config::RedisConfig;
use drg_domain::overrides::Override;

use super::reports::{decisions, Decision, Report};
use super::webhooks::Hook;

/// The kinds of record, in the order they move.
const KINDS: [&str; 4] = [
    super::overrides::KIND,
    super::webhooks::KIND,
    super::reports::KIND,
    decisions::KIND,
];

/// Why a move stopped (what moved before stays: a move is idempotent).
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("{kind}: {source}")]
    Records {
        kind: &'static str,
        source: RecordsError,
    },
    #[error("audit: {0}")]
    Audit(#[from] super::audit::AuditError),
    #[error("audit: {0}")]
    Control(#[from] drg_base::infra::control::ControlError),
    #[error("keys: {0}")]
    Keys(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What one kind came to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Moved {
    pub kind: &'static str,
    /// Records read (removals included) from the sources taken now.
    pub found: usize,
    /// Of them, those that changed the store (it held nothing newer).
    pub taken: usize,
    /// The sources taken now.
    pub from: Vec<String>,
    /// The sources found that a run before took (not taken again).
    pub before: Vec<String>,
}

impl Moved {
    /// Notes what one source of `found` entries came to: `taken` of them, or `None` when a run
    /// before took the source.
    fn took(&mut self, source: &str, found: usize, taken: Option<usize>) {
        match taken {
            Some(taken) => {
                self.found += found;
                self.taken += taken;
                self.from.push(source.to_owned());
            }
            None => self.before.push(source.to_owned()),
        }
    }
}

/// The files an earlier release kept records, keys (`managed`) or its audit trail in, still
/// there.
pub fn left_behind(folder: &Path, managed: &Path) -> Vec<PathBuf> {
    let audit = Some(folder.join("audit.sqlite")).filter(|p| p.exists());
    let keys = Some(managed.to_path_buf()).filter(|p| p.exists());
    KINDS
        .iter()
        .flat_map(|kind| legacy::files(folder, kind))
        .chain(audit)
        .chain(keys)
        .collect()
}

/// Moves every kind from `folder` and the managed keys file `managed` (and `redis`, when the
/// earlier release kept state there) into `control`.
pub async fn migrate(
    control: &Arc<Control>,
    folder: &Path,
    managed: &Path,
    redis: Option<&RedisConfig>,
) -> Result<Vec<Moved>, MigrateError> {
    Ok(vec![
        keys(control, managed, redis).await?,
        kind::<Override>(control, folder, redis, KINDS[0]).await?,
        kind::<Hook>(control, folder, redis, KINDS[1]).await?,
        kind::<Report>(control, folder, redis, KINDS[2]).await?,
        kind::<Decision>(control, folder, redis, KINDS[3]).await?,
        audit(control, folder, redis).await?,
    ])
}
/// Moves the API-made keys an earlier release kept (the managed file, renamed
/// `<name>.migrated` once taken; the shared Redis's rows), once a source.
async fn keys(
    control: &Arc<Control>,
    managed: &Path,
    redis: Option<&RedisConfig>,
) -> Result<Moved, MigrateError> {
    use super::keys_api::{control as store, legacy as old};
    let kind = store::KIND;
    let mut moved = Moved {
        kind,
        ..Moved::default()
    };
    let mut sources = Vec::new();
    // Every revocation the earlier release remembered, wherever: a row or a cached key whose
    // revocation is on Redis, a key in a cache's own `revoked` list (issue 93: three such keys
    // answered `200` after `migrate`).
    let keys_error = |e: &dyn std::fmt::Display| MigrateError::Keys(e.to_string());
    let mut revoked = std::collections::HashSet::new();
    if managed.exists() {
        let (keys, gone) = old::from_file(managed).map_err(|e| keys_error(&e))?;
        revoked.extend(gone);
        let name = managed.file_name().unwrap_or_default().to_string_lossy();
        sources.push((format!("file:{name}"), keys, Some(managed)));
    }
    if let Some(redis) = redis {
        let keys = (old::from_redis(redis).await).map_err(|e| keys_error(&e))?;
        revoked.extend(
            old::revoked_on_redis(redis)
                .await
                .map_err(|e| keys_error(&e))?,
        );
        if !keys.is_empty() {
            sources.push(("redis keys:{keys}:rows".into(), keys, None));
        }
    }
    let all: Vec<&ManagedKey> = sources.iter().flat_map(|(_, keys, _)| keys).collect();
    let revoked = old::with_descendants(&revoked, &all);
    for (source, keys, file) in sources {
        let kept: Vec<ManagedKey> = keys
            .iter()
            .filter(|k| !revoked.contains(&k.id))
            .cloned()
            .collect();
        let taken = store::import(control, &source, &kept, &revoked).await?;
        moved.took(&source, keys.len(), taken);
        if let Some(path) = file {
            let mut to = path.as_os_str().to_owned();
            to.push(".migrated");
            std::fs::rename(path, &to).map_err(|source| MigrateError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        }
    }
    Ok(moved)
}

/// Moves the audit trail an earlier release kept (the state folder's `audit.sqlite`; the
/// shared Redis's streams) into the control store, each entry with its id, once a source.
async fn audit(
    control: &Arc<Control>,
    folder: &Path,
    redis: Option<&RedisConfig>,
) -> Result<Moved, MigrateError> {
    let kind = "audit";
    let mut moved = Moved {
        kind,
        ..Moved::default()
    };
    let file = folder.join("audit.sqlite");
    if file.exists() {
        let entries = super::audit::legacy::from_file(&file)?;
        take_audit(control, &mut moved, "file:audit.sqlite", &entries).await?;
        let mut to = file.as_os_str().to_owned();
        to.push(".migrated");
        std::fs::rename(&file, &to).map_err(|source| MigrateError::Io { path: file, source })?;
    }
    if let Some(redis) = redis {
        let entries = super::audit::legacy::from_redis(redis).await?;
        if !entries.is_empty() {
            take_audit(control, &mut moved, "redis drg:audit:{*}", &entries).await?;
        }
    }
    Ok(moved)
}

/// Takes one source's audit `entries` in (each with its id; one already there is kept), once.
async fn take_audit(
    control: &Arc<Control>,
    moved: &mut Moved,
    source: &str,
    entries: &[super::audit::Entry],
) -> Result<(), MigrateError> {
    let what = AuditImported { entries };
    let taken = drg_base::infra::control::import::import(control, source, &what).await?;
    moved.took(source, entries.len(), taken);
    Ok(())
}

/// One source's audit entries (see [`take_audit`]).
struct AuditImported<'a> {
    entries: &'a [super::audit::Entry],
}

#[async_trait::async_trait]
impl drg_base::infra::control::import::Import for AuditImported<'_> {
    fn kind(&self) -> &'static str {
        "audit"
    }

    fn followed(&self) -> bool {
        false
    }

    async fn take(&self, tx: &mut drg_base::infra::control::Tx) -> Result<usize, sqlx::Error> {
        let mut taken = 0;
        for e in self.entries {
            let row = super::audit::sql::row_of(e);
            taken += usize::from(audit::insert(tx, &row, 0).await?);
        }
        Ok(taken)
    }
}

async fn kind<R: Record>(
    control: &Arc<Control>,
    folder: &Path,
    redis: Option<&RedisConfig>,
    kind: &'static str,
) -> Result<Moved, MigrateError> {
    let failed = |source| MigrateError::Records { kind, source };
    let store = SqlRecords::<R>::new(control.clone(), kind);
    let mut moved = Moved {
        kind,
        ..Moved::default()
    };
    for path in legacy::files(folder, kind) {
        let records: Vec<R> = legacy::read_file(&path).map_err(failed)?;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let source = format!("file:{name}");
        take(&store, &mut moved, &source, &records)
            .await
            .map_err(failed)?;
        let mut to = path.as_os_str().to_owned();
        to.push(".migrated");
        std::fs::rename(&path, &to).map_err(|source| MigrateError::Io { path, source })?;
    }
    if let Some(redis) = redis {
        let rows: Vec<R> = legacy::from_redis(redis, kind).await.map_err(failed)?;
        if !rows.is_empty() {
            let source = format!("redis drg:{{{kind}}}:rows");
            take(&store, &mut moved, &source, &rows)
                .await
                .map_err(failed)?;
        }
    }
    Ok(moved)
}

/// Takes one source's `records` into `store`, noted in `moved`.
async fn take<R: Record>(
    store: &SqlRecords<R>,
    moved: &mut Moved,
    source: &str,
    records: &[R],
) -> Result<(), RecordsError> {
    moved.took(source, records.len(), store.import(source, records).await?);
    Ok(())
}
