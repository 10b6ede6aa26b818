//! The trail an earlier release kept, read for the operator's `migrate`: the state folder's
//! `audit.sqlite` (a row an entry) and the shared Redis's streams (`drg:audit:{<project>}`,
//! each entry one field of JSON, its stream id `ms-seq` made the increasing id `ms * 1000 +
//! seq`). Nothing here writes.

use std::path::Path;
use std::time::Duration;

use drg_base::infra::redis::config::RedisConfig;
use drg_base::infra::redis::{LazyLink, LinkError};

use super::{AuditError, Entry};

/// Every entry of `audit.sqlite` at `path`.
pub fn from_file(path: &Path) -> Result<Vec<Entry>, AuditError> {
    let err = |e: rusqlite::Error| AuditError::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(e),
    };
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(err)?;
    let mut stmt = conn
        .prepare("SELECT project, id, at, key_id, action, target, detail FROM entries")
        .map_err(err)?;
    let rows = stmt
        .query_map([], |r| {
            Ok(Entry {
                project: r.get(0)?,
                id: r.get::<_, i64>(1)?.to_string(),
                at: r.get(2)?,
                key_id: r.get(3)?,
                action: r.get(4)?,
                target: r.get(5)?,
                detail: r.get(6)?,
            })
        })
        .map_err(err)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(err)
}

/// Every entry of every project's stream on `redis`.
pub async fn from_redis(redis: &RedisConfig) -> Result<Vec<Entry>, AuditError> {
    let link = LazyLink::new(redis, Duration::from_secs(5));
    let mut conn = link.get().await.map_err(LinkError::from)?;
    let mut streams: Vec<String> = Vec::new();
    let mut cursor = 0u64;
    loop {
        let mut scan = ::redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg("drg:audit:{*}")
            .arg("COUNT")
            .arg(1000);
        let (next, keys): (u64, Vec<String>) = link.timed(scan.query_async(&mut conn)).await?;
        streams.extend(keys);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let mut out = Vec::new();
    for stream in streams {
        let mut range = ::redis::cmd("XRANGE");
        range.arg(&stream).arg("-").arg("+");
        type Reply = Vec<(String, Vec<(String, String)>)>;
        let rows: Reply = link.timed(range.query_async(&mut conn)).await?;
        for (id, fields) in rows {
            let Some(json) = fields.into_iter().find(|(k, _)| k == "e").map(|(_, v)| v) else {
                continue;
            };
            let Ok(mut e) = serde_json::from_str::<Entry>(&json) else {
                continue;
            };
            let Some((ms, seq)) = id.split_once('-') else {
                continue;
            };
            let (Ok(ms), Ok(seq)) = (ms.parse::<i64>(), seq.parse::<i64>()) else {
                continue;
            };
            e.id = (ms * 1000 + seq.min(999)).to_string();
            out.push(e);
        }
    }
    Ok(out)
}
