//! Records in the state folder's `<kind>.records.sqlite` (mode 0600, WAL, commits on disk), for
//! gateways on one host or sharing a folder: a row a record, so a write is one transaction on
//! the rows it touches (the record, its project's count in force, its project's oldest removal
//! markers past the bound), never the whole set, and two gateways on the folder never lose each
//! other's writes. The poll's version is a counter every write moves. A `<kind>.json` an older
//! release kept is taken in once, at the first use, and renamed `<kind>.json.imported`.

use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::{tombstones_kept, Put, Record, RecordStore, RecordsError, Token};
use crate::infra::sqlite::{self, Synchronous};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS records (
  project TEXT NOT NULL,
  key TEXT NOT NULL,
  stamp INTEGER NOT NULL,
  removed INTEGER NOT NULL,
  body TEXT NOT NULL,
  PRIMARY KEY (project, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS records_removed ON records (project, removed, stamp);
CREATE TABLE IF NOT EXISTS version (id INTEGER PRIMARY KEY CHECK (id = 0), n INTEGER NOT NULL);
INSERT OR IGNORE INTO version (id, n) VALUES (0, 0);
";

/// The SQLite store of one kind of record.
pub struct SqliteRecords<R> {
    path: Arc<PathBuf>,
    /// Opened at first use, in the process that serves (a host may fork after building).
    conn: Arc<Mutex<Option<Connection>>>,
    _records: PhantomData<fn() -> R>,
}

impl<R> Clone for SqliteRecords<R> {
    fn clone(&self) -> Self {
        SqliteRecords {
            path: self.path.clone(),
            conn: self.conn.clone(),
            _records: PhantomData,
        }
    }
}

fn sql(path: &Path) -> impl Fn(rusqlite::Error) -> RecordsError + '_ {
    move |e| RecordsError::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(e),
    }
}

impl<R: Record> SqliteRecords<R> {
    pub fn new(path: PathBuf) -> SqliteRecords<R> {
        SqliteRecords {
            path: Arc::new(path),
            conn: Arc::default(),
            _records: PhantomData,
        }
    }

    /// Runs `f` on the connection, opened (and a legacy file taken in) the first time.
    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection, &Path) -> Result<T, RecordsError>,
    ) -> Result<T, RecordsError> {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if conn.is_none() {
            let mut opened =
                sqlite::open(&self.path, Synchronous::Full).map_err(|e| RecordsError::Io {
                    path: self.path.display().to_string(),
                    source: std::io::Error::other(e),
                })?;
            opened.execute_batch(SCHEMA).map_err(sql(&self.path))?;
            sqlite::keep_log_small(&opened).map_err(sql(&self.path))?;
            self.import_legacy(&mut opened)?;
            *conn = Some(opened);
        }
        f(conn.as_mut().expect("opened above"), &self.path)
    }

    /// Takes in `<kind>.json` beside the file (an older release's store), once.
    fn import_legacy(&self, conn: &mut Connection) -> Result<(), RecordsError> {
        let name = self.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let kind = name.strip_suffix(".records.sqlite").unwrap_or(name);
        let legacy = self.path.with_file_name(format!("{kind}.json"));
        if !legacy.exists() {
            return Ok(());
        }
        let records = super::file::FileRecords::<R>::new(legacy.clone()).read_now()?;
        let tx = conn.transaction().map_err(sql(&self.path))?;
        for r in &records {
            upsert(&tx, &self.path, r)?;
        }
        tx.commit().map_err(sql(&self.path))?;
        std::fs::rename(&legacy, legacy.with_extension("json.imported")).map_err(|source| {
            RecordsError::Io {
                path: legacy.display().to_string(),
                source,
            }
        })
    }

    fn put_now(&self, record: &R, max_live: u32) -> Result<Put, RecordsError> {
        self.with(|conn, path| {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(sql(path))?;
            let held: Option<R> = tx
                .query_row(
                    "SELECT body FROM records WHERE project = ?1 AND key = ?2",
                    params![record.project(), record.key()],
                    |r| r.get::<_, String>(0),
                )
                .optional()
                .map_err(sql(path))?
                .and_then(|b| serde_json::from_str(&b).ok());
            if held.as_ref().is_some_and(|h| !record.newer_than(h)) {
                return Ok(Put::Stale);
            }
            let was_live = held.as_ref().is_some_and(|h| !h.removed());
            if !record.removed()
                && !was_live
                && live_count(&tx, path, record.project())? >= max_live
            {
                return Ok(Put::Full);
            }
            upsert(&tx, path, record)?;
            if record.removed() {
                compact(&tx, path, record.project(), tombstones_kept(max_live))?;
            }
            tx.commit().map_err(sql(path))?;
            Ok(Put::Done { created: !was_live })
        })
    }

    fn read_all(&self) -> Result<Vec<R>, RecordsError> {
        self.with(|conn, path| {
            let mut stmt = conn
                .prepare_cached("SELECT body FROM records")
                .map_err(sql(path))?;
            let rows = stmt
                .query_map([], |r| r.get::<_, String>(0))
                .map_err(sql(path))?;
            let mut out = Vec::new();
            for body in rows {
                // A row that does not parse (another release's) is left out.
                if let Ok(r) = serde_json::from_str(&body.map_err(sql(path))?) {
                    out.push(r);
                }
            }
            Ok(out)
        })
    }

    fn restore_now(&self, records: &[R]) -> Result<(), RecordsError> {
        self.with(|conn, path| {
            let tx = conn.transaction().map_err(sql(path))?;
            for r in records {
                let held: Option<R> = tx
                    .query_row(
                        "SELECT body FROM records WHERE project = ?1 AND key = ?2",
                        params![r.project(), r.key()],
                        |row| row.get::<_, String>(0),
                    )
                    .optional()
                    .map_err(sql(path))?
                    .and_then(|b| serde_json::from_str(&b).ok());
                if held.is_none_or(|h| r.newer_than(&h)) {
                    upsert(&tx, path, r)?;
                }
            }
            tx.commit().map_err(sql(path))
        })
    }
}

/// Writes `record`'s row and moves the version.
fn upsert<R: Record>(c: &Connection, path: &Path, record: &R) -> Result<(), RecordsError> {
    let body = serde_json::to_string(record)?;
    let stamp = i64::try_from(record.stamp()).unwrap_or(i64::MAX);
    c.execute(
        "INSERT OR REPLACE INTO records (project, key, stamp, removed, body)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            record.project(),
            record.key(),
            stamp,
            record.removed(),
            body
        ],
    )
    .map_err(sql(path))?;
    c.execute("UPDATE version SET n = n + 1 WHERE id = 0", [])
        .map_err(sql(path))?;
    Ok(())
}

/// `project`'s records in force.
fn live_count(c: &Connection, path: &Path, project: &str) -> Result<u32, RecordsError> {
    c.query_row(
        "SELECT COUNT(*) FROM records WHERE project = ?1 AND removed = 0",
        params![project],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
    .map_err(sql(path))
}

/// Drops `project`'s oldest removal markers beyond `keep`.
fn compact(c: &Connection, path: &Path, project: &str, keep: usize) -> Result<(), RecordsError> {
    c.execute(
        "DELETE FROM records WHERE project = ?1 AND removed = 1 AND key IN (
           SELECT key FROM records WHERE project = ?1 AND removed = 1
           ORDER BY stamp DESC LIMIT -1 OFFSET ?2)",
        params![project, i64::try_from(keep).unwrap_or(i64::MAX)],
    )
    .map(drop)
    .map_err(sql(path))
}

/// Runs blocking SQLite work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RecordsError> + Send + 'static,
) -> Result<T, RecordsError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(RecordsError::Io {
            path: "records".into(),
            source: std::io::Error::other(e),
        })
    })
}

#[async_trait::async_trait]
impl<R: Record> RecordStore<R> for SqliteRecords<R> {
    async fn put(&self, record: &R, max_live: u32) -> Result<Put, RecordsError> {
        let (me, record) = (self.clone(), record.clone());
        blocking(move || me.put_now(&record, max_live)).await
    }

    async fn token(&self) -> Result<Token, RecordsError> {
        let me = self.clone();
        blocking(move || {
            me.with(|conn, path| {
                conn.query_row("SELECT n FROM version WHERE id = 0", [], |r| {
                    r.get::<_, i64>(0)
                })
                .map(|n| Token::At(format!("sqlite:{n}")))
                .map_err(sql(path))
            })
        })
        .await
    }

    async fn read(&self) -> Result<Vec<R>, RecordsError> {
        let me = self.clone();
        blocking(move || me.read_all()).await
    }

    async fn restore(&self, records: &[R]) -> Result<(), RecordsError> {
        let (me, records) = (self.clone(), records.to_vec());
        blocking(move || me.restore_now(&records)).await
    }
}
