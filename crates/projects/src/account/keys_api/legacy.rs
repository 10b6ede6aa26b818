//! Where an earlier release kept the API-made keys, read for the operator's `migrate`: the
//! managed file of an embedded deployment (`keys.managed.json`) and, with the shared Redis, its
//! rows (`keys:{keys}:rows`, the last uses in `keys:{keys}:used`). Nothing here writes.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use drg_access::managed::{self, ManagedError, ManagedKey};
use drg_base::infra::redis::config::RedisConfig;
use drg_base::infra::redis::{LazyLink, LinkError};

/// The rows of the shared Redis an earlier release kept keys in.
const ROWS: &str = "keys:{keys}:rows";
const USED: &str = "keys:{keys}:used";

/// The keys of an earlier release's managed file at `path` (none when it is not there).
pub fn from_file(path: &Path) -> Result<Vec<ManagedKey>, ManagedError> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    Ok(managed::read(path)?.keys)
}

/// The keys an earlier release kept on the shared Redis, with their last uses.
pub async fn from_redis(config: &RedisConfig) -> Result<Vec<ManagedKey>, LinkError> {
    let link = LazyLink::new(config, Duration::from_secs(5));
    let mut conn = link.get().await?;
    let rows: Vec<String> = link
        .timed(redis::cmd("HVALS").arg(ROWS).query_async(&mut conn))
        .await?;
    let used: HashMap<String, u64> = link
        .timed(redis::cmd("HGETALL").arg(USED).query_async(&mut conn))
        .await?;
    // A row that does not parse (another release's) is left out, as the store did.
    Ok(rows
        .iter()
        .filter_map(|r| serde_json::from_str::<ManagedKey>(r).ok())
        .map(|mut k| {
            k.last_used = used.get(&k.id).copied().or(k.last_used);
            k
        })
        .collect())
}
