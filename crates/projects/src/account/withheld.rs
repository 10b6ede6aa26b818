//! The operator's `restore-withheld`: puts back into the shared Redis what this gateway's state
//! folder withheld when the store was found lost while its copy was not in step with it (the
//! gateway stopped or cut off meanwhile, see `drg_base::infra::records::replica`), less every
//! removal and revocation the store holds by then.

use std::path::{Path, PathBuf};

use drg_access::managed;
use drg_access::shared_keys::{SharedKeys, SharedKeysError};
use drg_base::infra::records::file::FileRecords;
use drg_base::infra::records::redis::RedisRecords;
use drg_base::infra::records::replica::withheld_path;
use drg_base::infra::records::{Record, RecordStore, RecordsError};
use drg_base::infra::redis::config::RedisConfig;

use super::keys_api::sync;
use super::reports::{decisions, Decision, Report};
use super::webhooks::Hook;
use drg_domain::overrides::Override;

/// Why a restore stopped (what was put back before stays: a restore is idempotent).
#[derive(Debug, thiserror::Error)]
pub enum WithheldError {
    #[error("{kind}: {source}")]
    Records { kind: String, source: RecordsError },
    #[error("keys: {0}")]
    Keys(#[from] SharedKeysError),
    #[error("keys: {0}")]
    KeysFile(#[from] managed::ManagedError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("keys: {0}")]
    Random(#[from] getrandom::Error),
}

/// What one kind put back: its name and how many records (keys) the withheld file held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub kind: &'static str,
    pub records: usize,
}

/// Puts every withheld copy in `folder` (the state folder; `keys_cache` the keys' cache in it)
/// back into `redis`: each record kept only where the store holds nothing newer (a removal made
/// meanwhile stays), each key less every tombstone there. A file put back is renamed
/// `<name>.restored`, so a second run puts nothing back twice.
pub async fn restore(
    folder: &Path,
    keys_cache: &Path,
    redis: &RedisConfig,
) -> Result<Vec<Restored>, WithheldError> {
    let mut done = Vec::new();
    done.extend(records::<Override>(folder, super::overrides::KIND, redis).await?);
    done.extend(records::<Hook>(folder, super::webhooks::KIND, redis).await?);
    done.extend(records::<Report>(folder, super::reports::KIND, redis).await?);
    done.extend(records::<Decision>(folder, decisions::KIND, redis).await?);
    done.extend(keys(keys_cache, redis).await?);
    Ok(done)
}

/// The files a withheld copy may be kept in (for the admin `/readyz`, which names those there).
pub fn paths(folder: &Path, keys_cache: &Path) -> Vec<PathBuf> {
    let kinds = [
        super::overrides::KIND,
        super::webhooks::KIND,
        super::reports::KIND,
        decisions::KIND,
    ];
    (kinds.iter())
        .map(|k| withheld_path(folder, k))
        .chain([sync::withheld_path(keys_cache)])
        .collect()
}

async fn records<R: Record>(
    folder: &Path,
    kind: &'static str,
    redis: &RedisConfig,
) -> Result<Option<Restored>, WithheldError> {
    let path = withheld_path(folder, kind);
    let failed = |source| WithheldError::Records {
        kind: kind.to_owned(),
        source,
    };
    let held = FileRecords::<R>::new(path.clone())
        .read_now()
        .map_err(failed)?;
    if held.is_empty() {
        return Ok(None);
    }
    let store = RedisRecords::<R>::new(redis, kind);
    store.restore(&held).await.map_err(failed)?;
    set_aside(&path)?;
    Ok(Some(Restored {
        kind,
        records: held.len(),
    }))
}

async fn keys(cache: &Path, redis: &RedisConfig) -> Result<Option<Restored>, WithheldError> {
    let path = sync::withheld_path(cache);
    let held = managed::read(&path)?;
    if held.keys.is_empty() && held.revoked.is_empty() {
        return Ok(None);
    }
    let store = SharedKeys::new(redis)?;
    store.restore(&held.keys, &held.revoked, false).await?;
    set_aside(&path)?;
    Ok(Some(Restored {
        kind: "keys",
        records: held.keys.len(),
    }))
}

fn set_aside(path: &Path) -> Result<(), WithheldError> {
    let mut to = path.as_os_str().to_owned();
    to.push(".restored");
    std::fs::rename(path, &to).map_err(|source| WithheldError::Io {
        path: path.to_owned(),
        source,
    })
}
