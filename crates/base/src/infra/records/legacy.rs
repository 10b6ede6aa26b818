//! What earlier releases kept of a kind of record, read for the operator's `migrate`: the state
//! folder's `<kind>.records.sqlite` (one gateway), its `<kind>.json` (older still), the copies
//! kept beside the shared Redis (`<kind>.redis-cache.json`, `<kind>.withheld.json`) and the
//! shared Redis itself (`drg:{<kind>}:rows`). Nothing here writes: the control store takes what
//! is read, each record only where it holds nothing newer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{Record, RecordsError};
use crate::infra::redis::config::RedisConfig;
use crate::infra::redis::LazyLink;

/// The JSON files' layout (`{ "version": 1, "entries": [...] }`).
#[derive(Deserialize)]
#[serde(bound = "R: Record")]
struct RecordsFile<R> {
    entries: Vec<R>,
}

/// The files of the state folder an earlier release kept `kind` in, those that exist.
pub fn files(folder: &Path, kind: &str) -> Vec<PathBuf> {
    [
        "records.sqlite",
        "json",
        "redis-cache.json",
        "withheld.json",
    ]
    .iter()
    .map(|ext| folder.join(format!("{kind}.{ext}")))
    .filter(|p| p.exists())
    .collect()
}

/// The records of one of those files.
pub fn read_file<R: Record>(path: &Path) -> Result<Vec<R>, RecordsError> {
    if path.extension().is_some_and(|e| e == "sqlite") {
        from_sqlite(path)
    } else {
        from_json(path)
    }
}

fn from_json<R: Record>(path: &Path) -> Result<Vec<R>, RecordsError> {
    let bytes = std::fs::read(path).map_err(|source| RecordsError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let file: RecordsFile<R> =
        serde_json::from_slice(&bytes).map_err(|source| RecordsError::Format {
            path: path.display().to_string(),
            source,
        })?;
    Ok(file.entries)
}

fn from_sqlite<R: Record>(path: &Path) -> Result<Vec<R>, RecordsError> {
    let err = |source| RecordsError::Sqlite {
        path: path.display().to_string(),
        source,
    };
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(err)?;
    let mut stmt = conn.prepare("SELECT body FROM records").map_err(err)?;
    let bodies = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .map_err(err)?
        .collect::<Result<Vec<String>, _>>()
        .map_err(err)?;
    // A row that does not parse (another release's) is left out, as the store did.
    Ok(bodies
        .iter()
        .filter_map(|b| serde_json::from_str(b).ok())
        .collect())
}

/// Every record of `kind` an earlier release kept on the shared Redis.
pub async fn from_redis<R: Record>(
    config: &RedisConfig,
    kind: &str,
) -> Result<Vec<R>, RecordsError> {
    let link = LazyLink::new(config, Duration::from_secs(5));
    let mut conn = link.get().await?;
    let rows: Vec<String> = link
        .timed(
            ::redis::cmd("HVALS")
                .arg(format!("drg:{{{kind}}}:rows"))
                .query_async(&mut conn),
        )
        .await
        .map_err(|e| match e {
            crate::infra::redis::LinkError::Redis(e) => RecordsError::Redis(e),
            crate::infra::redis::LinkError::TimedOut(ms) => RecordsError::TimedOut(ms),
        })?;
    Ok(rows
        .iter()
        .filter_map(|r| serde_json::from_str(r).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::records::tests::over;
    use drg_domain::overrides::Override;

    #[test]
    fn an_earlier_releases_files_are_read_the_newest_of_each_record_kept() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("overrides.records.sqlite");
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "CREATE TABLE records (project TEXT, key TEXT, stamp INTEGER, removed INTEGER,
             body TEXT, PRIMARY KEY (project, key))",
        )
        .unwrap();
        let body = serde_json::to_string(&over("a.example", 5, false)).unwrap();
        conn.execute(
            "INSERT INTO records VALUES ('p', 'a.example', 5, 0, ?1)",
            [body],
        )
        .unwrap();
        let json = serde_json::json!({ "version": 1, "entries": [
            over("a.example", 7, true), over("b.example", 1, false)] });
        std::fs::write(
            dir.path().join("overrides.redis-cache.json"),
            json.to_string(),
        )
        .unwrap();
        let found = files(dir.path(), "overrides");
        assert_eq!(found.len(), 2);
        let read: Vec<Vec<Override>> = found.iter().map(|p| read_file(p).unwrap()).collect();
        assert_eq!(read[0], [over("a.example", 5, false)]);
        assert_eq!(read[1].len(), 2);
        assert!(files(dir.path(), "reports").is_empty());
    }
}
