//! The operator's `restore-withheld`: puts back into the shared Redis the API-made keys this
//! gateway's state folder withheld when the shared key store was found lost while its copy was
//! not in step with it (the gateway stopped or cut off meanwhile, see
//! `keys_api::sync`), less every revocation the store holds by then. (Records live in the
//! control store, which no gateway writes back to.)

use std::path::{Path, PathBuf};

use drg_access::managed;
use drg_access::shared_keys::{SharedKeys, SharedKeysError};
use drg_base::infra::redis::config::RedisConfig;

use super::keys_api::sync;

/// Why a restore stopped (what was put back before stays: a restore is idempotent).
#[derive(Debug, thiserror::Error)]
pub enum WithheldError {
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

/// What was put back: its kind and how many keys the withheld file held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub kind: &'static str,
    pub records: usize,
}

/// Puts the withheld keys beside `keys_cache` (the keys' cache in the state folder) back into
/// `redis`, less every tombstone there. A file put back is renamed `<name>.restored`, so a
/// second run puts nothing back twice.
pub async fn restore(
    keys_cache: &Path,
    redis: &RedisConfig,
) -> Result<Vec<Restored>, WithheldError> {
    Ok(keys(keys_cache, redis).await?.into_iter().collect())
}

/// The file a withheld copy may be kept in (for the admin `/readyz`, which names it when there).
pub fn paths(keys_cache: &Path) -> Vec<PathBuf> {
    vec![sync::withheld_path(keys_cache)]
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
