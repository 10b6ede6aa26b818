//! Where an earlier release kept the API-made keys, read for the operator's `migrate`: the
//! managed file of an embedded deployment (`keys.managed.json`, with the revocations it
//! remembered) and, with the shared Redis, its rows (`keys:{keys}:rows`, the last uses in
//! `keys:{keys}:used`, the revocations in `keys:{keys}:revoked`). Nothing here writes.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use drg_access::managed::{self, ManagedError, ManagedKey};
use drg_base::infra::redis::config::RedisConfig;
use drg_base::infra::redis::{LazyLink, LinkError};

/// The rows of the shared Redis an earlier release kept keys in.
const ROWS: &str = "keys:{keys}:rows";
const USED: &str = "keys:{keys}:used";
/// Hash: key id -> its revocation (`{"project", "at"}`), every key revoked on that Redis.
const REVOKED: &str = "keys:{keys}:revoked";

/// The keys of an earlier release's managed file at `path` (none when it is not there), and
/// the ids the file remembers as revoked (its `revoked` list: a gateway's cache kept every
/// revocation it saw, beside keys it had not dropped yet).
pub fn from_file(path: &Path) -> Result<(Vec<ManagedKey>, HashSet<String>), ManagedError> {
    if !path.exists() {
        return Ok((Vec::new(), HashSet::new()));
    }
    let file = managed::read(path)?;
    let revoked = (file.unknown.get("revoked"))
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| t.get("id").and_then(serde_json::Value::as_str))
        .map(str::to_owned)
        .collect();
    Ok((
        file.keys.iter().map(|k| ManagedKey::clone(k)).collect(),
        revoked,
    ))
}

/// The ids of the keys revoked on the shared Redis of an earlier release.
pub async fn revoked_on_redis(config: &RedisConfig) -> Result<HashSet<String>, LinkError> {
    let link = LazyLink::new(config, Duration::from_secs(5));
    let mut conn = link.get().await?;
    let ids: Vec<String> = link
        .timed(redis::cmd("HKEYS").arg(REVOKED).query_async(&mut conn))
        .await?;
    Ok(ids.into_iter().collect())
}

/// `revoked` with every key of `keys` a revoked key made, and theirs: revoking a key revokes
/// what it made, so no descendant is taken in as a key of its own.
pub fn with_descendants(revoked: &HashSet<String>, keys: &[&ManagedKey]) -> HashSet<String> {
    let mut out = revoked.clone();
    loop {
        let more: Vec<String> = (keys.iter())
            .filter(|k| !out.contains(&k.id))
            .filter(|k| k.created_by.as_ref().is_some_and(|by| out.contains(by)))
            .map(|k| k.id.clone())
            .collect();
        if more.is_empty() {
            return out;
        }
        out.extend(more);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, by: Option<&str>) -> ManagedKey {
        serde_json::from_value(serde_json::json!({
            "id": id, "project": "p", "plan": "free", "sha256": "00", "prefix": "x",
            "created_at": "2026-01-01T00:00:00Z", "created_by": by,
        }))
        .unwrap()
    }

    #[test]
    fn a_revoked_key_takes_what_it_made_and_theirs_with_it() {
        let keys = [
            key("a", Some("op")),
            key("b", Some("a")),
            key("c", Some("b")),
            key("d", Some("op")),
        ];
        let all: Vec<&ManagedKey> = keys.iter().collect();
        let revoked = with_descendants(&HashSet::from(["a".to_owned()]), &all);
        let mut ids: Vec<&str> = revoked.iter().map(String::as_str).collect();
        ids.sort_unstable();
        assert_eq!(ids, ["a", "b", "c"]);
    }
}
