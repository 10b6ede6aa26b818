//! The cache's keys in files of their own beside it (`<cache>.keys/NN.json`, one a shard of
//! projects): a change to some projects' keys rewrites their shards' files, not every key
//! stored, so what a key change costs a gateway does not grow with the keys it holds whole.

use std::path::{Path, PathBuf};

use super::{io, ManagedError, ManagedKey, Rows};

/// The folder of the key files of the cache at `path`.
pub fn folder(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".keys");
    PathBuf::from(name)
}

fn file(path: &Path, shard: usize) -> PathBuf {
    folder(path).join(format!("{shard:02}.json"))
}

/// Reads the `count` key files of the cache at `path`; a missing one is an error (the cache
/// names how many it wrote, so a lost file is never taken for keys that are gone).
pub fn read(path: &Path, count: usize) -> Result<Rows, ManagedError> {
    let mut rows = Rows::default();
    for shard in 0..count {
        let at = file(path, shard);
        let text = std::fs::read(&at).map_err(io(&at))?;
        let keys: Vec<ManagedKey> =
            serde_json::from_slice(&text).map_err(|e| ManagedError::Format {
                path: at.clone(),
                message: e.to_string(),
            })?;
        for key in keys {
            rows.push(key);
        }
    }
    Ok(rows)
}

/// Writes `rows` shard by shard, each shard `written` shares skipped while its file is there
/// (it holds those keys already); how many files it wrote. Call under the cache's lock.
pub fn write(path: &Path, rows: &Rows, written: Option<&Rows>) -> Result<usize, ManagedError> {
    super::private_folder(&folder(path))?;
    let mut wrote = 0;
    for (shard, keys) in rows.shards().enumerate() {
        let at = file(path, shard);
        if written.is_some_and(|w| rows.shares(w, shard)) && at.exists() {
            continue;
        }
        let keys: Vec<_> = keys.collect();
        let mut body = serde_json::to_vec(&keys).map_err(|e| ManagedError::Format {
            path: at.clone(),
            message: e.to_string(),
        })?;
        body.push(b'\n');
        drg_base::infra::fsutil::write_atomic(&at, 0o600, &body).map_err(io(&at))?;
        wrote += 1;
    }
    Ok(wrote)
}

/// How many key files [`write()`] keeps.
pub fn count(rows: &Rows) -> usize {
    rows.shards().len()
}
