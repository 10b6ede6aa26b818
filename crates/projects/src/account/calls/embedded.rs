//! The embedded call store: one SQLite file in the state folder, in WAL mode, so that several
//! gateways on one host (and a gateway and its successor during a graceful upgrade) write and
//! read it at once.
//!
//! A batch's entries of one project are one row of `chunks` (a compact binary encoding), not a
//! row each: a row costs SQLite a few microseconds of B-tree work, a batch of thousands of calls
//! would cost more than the requests themselves. Entry ids come from a counter per project
//! (`project_ids`, advanced inside the batch's write transaction, so across processes too) and
//! are consecutive within a chunk; newer entries always get larger ids, so paging back by id
//! neither skips nor repeats while new calls arrive. Per project, not one sequence for all: ids
//! and cursors are shown to the project, and a global one would tell every tenant the whole
//! gateway's traffic. `daily` holds the counts per project and UTC day. No operation runs on a
//! worker thread: writes (batches, sweeps) on the store's own writer thread at a low priority
//! (nice 10), so that encoding and writing a batch of thousands of calls waits for the gaps of
//! the request path instead of preempting it (the blocking pool's threads cannot be lowered:
//! they serve other work too); reads on the blocking pool.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, Utc};
use rusqlite::config::DbConfig;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::chunk::{decode, encode, Stored};
use super::{
    daily_counts, Call, CallStore, CallsError, DayCount, LogItem, Page, Written, MAX_BATCH,
};

/// The schema version this build writes (`PRAGMA user_version`).
const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
-- The next entry id of each project. Added without a schema version change: builds before it
-- keep using meta's global `next_id`, which this one keeps above every id it gives, so both can
-- write one file during an upgrade.
CREATE TABLE IF NOT EXISTS project_ids (
    project TEXT PRIMARY KEY,
    next_id INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS chunks (
    project TEXT NOT NULL,
    first_id INTEGER NOT NULL,
    entries INTEGER NOT NULL,
    newest_at INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (project, first_id)
) WITHOUT ROWID;
-- Covers the per-batch `SUM(entries)` of a project's log without reading the chunks' blobs.
CREATE INDEX IF NOT EXISTS chunks_entries ON chunks (project, entries);
CREATE TABLE IF NOT EXISTS daily (
    project TEXT NOT NULL,
    day TEXT NOT NULL,
    total INTEGER NOT NULL,
    blocked INTEGER NOT NULL,
    PRIMARY KEY (project, day)
) WITHOUT ROWID;
";

/// Most calls one write transaction stores. Larger than the service's [`MAX_BATCH`]: a
/// transaction rewrites a handful of fixed pages (the id counters, the day's counts, the index)
/// besides its chunk, so 2,048 calls a transaction write about half the bytes per call of 512
/// and took 30-45% less of the writer's CPU under load, with the lookup's p99 unchanged. The
/// writer runs at a low priority with the kernel's shortest time slice, so a longer transaction
/// does not hold a worker's core longer.
const WRITE_BATCH: usize = 4 * MAX_BATCH;

/// The statements a batch runs, each prepared once per connection (`prepare_cached`).
const NEXT_GLOBAL_ID: &str = "SELECT value FROM meta WHERE name = 'next_id'";
const INSERT_CHUNK: &str = "INSERT INTO chunks (project, first_id, entries, newest_at, data) \
     VALUES (?1, ?2, ?3, ?4, ?5)";
const SET_PROJECT_ID: &str = "INSERT INTO project_ids (project, next_id) VALUES (?1, ?2) \
     ON CONFLICT (project) DO UPDATE SET next_id = excluded.next_id";
const SET_GLOBAL_ID: &str = "INSERT INTO meta (name, value) VALUES ('next_id', ?1) \
     ON CONFLICT (name) DO UPDATE SET value = excluded.value";
const COUNT_DAY: &str = "INSERT INTO daily (project, day, total, blocked) VALUES (?1, ?2, ?3, ?4) \
     ON CONFLICT (project, day) DO UPDATE SET \
     total = total + excluded.total, blocked = blocked + excluded.blocked";
const NEXT_PROJECT_ID: &str = "SELECT MAX( \
       COALESCE((SELECT next_id FROM project_ids WHERE project = ?1), 1), \
       COALESCE((SELECT first_id + entries FROM chunks WHERE project = ?1 \
                 ORDER BY first_id DESC LIMIT 1), 1))";
const LOG_LENGTH: &str = "SELECT COALESCE(SUM(entries), 0) FROM chunks WHERE project = ?1";
const OLDEST_CHUNK: &str = "SELECT first_id, entries, data FROM chunks WHERE project = ?1 \
     ORDER BY first_id LIMIT 1";
const DELETE_CHUNK: &str = "DELETE FROM chunks WHERE project = ?1 AND first_id = ?2";
#[cfg(test)]
const BATCH_STATEMENTS: [&str; 9] = [
    NEXT_GLOBAL_ID,
    INSERT_CHUNK,
    SET_PROJECT_ID,
    SET_GLOBAL_ID,
    COUNT_DAY,
    NEXT_PROJECT_ID,
    LOG_LENGTH,
    OLDEST_CHUNK,
    DELETE_CHUNK,
];

/// The bytes of a chunk after its first `n` entries, and the newest `created_at` among them;
/// `None` if the bytes are not a chunk.
fn suffix_after(data: &[u8], n: usize) -> Option<(&[u8], i64)> {
    let (mut at, mut i) = (0, 0);
    let (mut start, mut newest) = (data.len(), None::<i64>);
    while at < data.len() {
        let head = data.get(at..at + 11)?;
        if i == n {
            start = at;
        }
        if i >= n {
            let at_ms = i64::from_le_bytes(head[..8].try_into().ok()?);
            newest = Some(newest.map_or(at_ms, |t| t.max(at_ms)));
        }
        at += 11 + usize::from(head[10]);
        i += 1;
    }
    (at == data.len()).then(|| (&data[start..], newest.unwrap_or(0)))
}

fn corrupt(what: &str) -> rusqlite::Error {
    rusqlite::Error::InvalidParameterName(format!("corrupt chunk: {what}"))
}

/// A write for the writer thread, holding its own reply.
type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The SQLite call store.
pub struct EmbeddedStore {
    path: PathBuf,
    /// The writer thread's queue; the thread owns the write connection (batches and sweeps)
    /// and ends when the store is dropped. Started, and its connection opened, on the first
    /// write, not at open: a host's Pingora daemon mode forks after the store is opened, a
    /// thread does not survive a fork, and a connection carried across one holds none of its
    /// POSIX locks in the child (another opener then deletes the live `-wal`).
    writer: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Job>>>,
    /// Reads (`/v1/logs`, `/v1/stats`) on their own connection: in WAL mode they never wait
    /// for a batch being written. Opened at the first read, for the same reason.
    reader: Arc<Mutex<Option<Connection>>>,
    max_per_project: u64,
}

impl EmbeddedStore {
    /// Opens (or creates, mode 0600) the file and its schema. A file of a newer schema, or one
    /// that is not SQLite, stops the start.
    pub fn open(path: &Path, max_per_project: u64) -> Result<Self, CallsError> {
        let err = |source| CallsError::Sqlite {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| CallsError::Io {
                path: dir.display().to_string(),
                source,
            })?;
        }
        // Created before SQLite opens it, so it is private from the first byte (SQLite gives
        // its -wal and -shm files the same mode).
        drg_base::infra::fsutil::create_private(path).map_err(|source| CallsError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let writer = connect(path).map_err(err)?;
        let version: i64 = writer
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(err)?;
        if version > SCHEMA_VERSION {
            return Err(err(rusqlite::Error::InvalidParameterName(format!(
                "schema version {version} is newer than this build's {SCHEMA_VERSION}"
            ))));
        }
        writer
            .execute_batch(&format!(
                "BEGIN IMMEDIATE; {SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            ))
            .map_err(err)?;
        // Closed here: the process that serves opens its own (see `writer`).
        drop(writer);
        Ok(EmbeddedStore {
            path: path.to_owned(),
            writer: std::sync::OnceLock::new(),
            reader: Arc::new(Mutex::new(None)),
            max_per_project,
        })
    }

    /// Runs `f` on the write connection, on the writer thread.
    async fn write_with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, CallsError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let path = self.path.display().to_string();
        let job: Job = Box::new(move |conn| {
            let _ = tx.send(f(conn).map_err(|source| CallsError::Sqlite { path, source }));
        });
        let writer = self.writer.get_or_init(|| {
            let conn = connect(&self.path)
                .map_err(|e| log::error!("calls store {}: {e}", self.path.display()))
                .ok()?;
            writer_thread(conn)
                .map_err(|e| log::error!("calls store: the writer thread did not start: {e}"))
                .ok()
        });
        writer
            .as_ref()
            .ok_or_else(|| CallsError::Task("the calls writer thread did not start".into()))?
            .send(job)
            .map_err(|_| CallsError::Task("the calls writer thread has stopped".into()))?;
        rx.await
            .map_err(|_| CallsError::Task("the calls writer thread dropped a write".into()))?
    }

    /// Runs `f` on the read connection, on the blocking pool.
    async fn with<T: Send + 'static>(
        &self,
        conn: &Arc<Mutex<Option<Connection>>>,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, CallsError> {
        let conn = conn.clone();
        let file = self.path.clone();
        let path = self.path.display().to_string();
        tokio::task::spawn_blocking(move || {
            let mut guard = conn
                .lock()
                .map_err(|_| CallsError::Task("connection lock poisoned".into()))?;
            let run = |guard: &mut Option<Connection>| {
                let conn = match guard {
                    Some(conn) => conn,
                    None => guard.insert(connect(&file)?),
                };
                f(conn)
            };
            run(&mut guard).map_err(|source| CallsError::Sqlite { path, source })
        })
        .await
        .map_err(|e| CallsError::Task(e.to_string()))?
    }
}

/// Starts the writer thread on `conn`, at a low priority: it runs each job in turn until the
/// store (the queue's sender) is dropped. A job that panics loses its own write only.
fn writer_thread(mut conn: Connection) -> std::io::Result<std::sync::mpsc::Sender<Job>> {
    let (tx, rx) = std::sync::mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("drg-calls-writer".into())
        .spawn(move || {
            if !drg_base::infra::priority::lower_this_thread(
                drg_base::infra::priority::Priority::Low,
            ) {
                log::debug!("could not lower the calls writer thread's priority");
            }
            while let Ok(job) = rx.recv() {
                let run = std::panic::AssertUnwindSafe(|| job(&mut conn));
                if std::panic::catch_unwind(run).is_err() {
                    log::error!("calls store: a write panicked; its calls are lost");
                }
            }
        })?;
    Ok(tx)
}

fn connect(path: &Path) -> rusqlite::Result<Connection> {
    // NORMAL: a power loss may take the last batches, never corrupts the file.
    let conn =
        drg_base::infra::sqlite::connect(path, drg_base::infra::sqlite::Synchronous::Normal)?;
    // One plan per statement, whatever its values: without it SQLite compiles a statement again
    // whenever new values are bound to a parameter it compared while planning (the per-project id
    // query names its project twice), and a batch spent a fifth of its time in the parser.
    conn.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(conn)
}

/// Stores one batch in one transaction: its log entries as a chunk per project, the projects'
/// id counters, the daily counts, each log trimmed to `max` entries.
fn store_batch(conn: &mut Connection, calls: &[Call], max: i64) -> rusqlite::Result<()> {
    // Immediate: the id counters are read and advanced under the write lock, so two
    // gateways on one file never hand out the same ids.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    {
        let chunks = chunks_of(calls, max);
        let mut global: i64 = tx
            .prepare_cached(NEXT_GLOBAL_ID)?
            .query_row([], |r| r.get(0))
            .optional()?
            .unwrap_or(1);
        for c in &chunks {
            let next = next_id(&tx, c.project)?;
            let written = c.calls - c.first;
            if written > 0 {
                // Taken from the cache and given back at once: one still held when `trim`
                // asks for it would be compiled again.
                tx.prepare_cached(INSERT_CHUNK)?.execute(params![
                    c.project,
                    next + c.first,
                    written,
                    c.newest,
                    c.data
                ])?;
            }
            tx.prepare_cached(SET_PROJECT_ID)?
                .execute(params![c.project, next + c.calls])?;
            global = global.max(next + c.calls);
        }
        tx.prepare_cached(SET_GLOBAL_ID)?.execute(params![global])?;
        let mut count = tx.prepare_cached(COUNT_DAY)?;
        for (project, day, total, blocked) in daily_counts(calls) {
            count.execute(params![
                &*project,
                day_text(day),
                total as i64,
                blocked as i64
            ])?;
        }
        for c in &chunks {
            trim(&tx, c.project, max)?;
        }
    }
    tx.commit()
}

fn millis(at: DateTime<Utc>) -> i64 {
    at.timestamp_millis()
}

fn day_text(d: NaiveDate) -> String {
    d.format("%Y-%m-%d").to_string()
}

#[async_trait]
impl CallStore for EmbeddedStore {
    /// SQLite runs on the store's writer and reader threads.
    fn works_on_own_threads(&self) -> bool {
        true
    }

    async fn write(&self, calls: Vec<Call>) -> Result<(), CallsError> {
        let max = i64::try_from(self.max_per_project).unwrap_or(i64::MAX);
        self.write_with(move |conn| store_batch(conn, &calls, max))
            .await
    }

    /// One job on the writer thread for the whole tick, a transaction per [`WRITE_BATCH`] calls,
    /// giving the core back between them: awaiting each batch from the service's thread made
    /// the two threads hand the core to each other for every batch, and kept a worker off it
    /// for up to 0.6 ms at a time.
    async fn write_all(&self, calls: Vec<Call>) -> Written {
        let max = i64::try_from(self.max_per_project).unwrap_or(i64::MAX);
        let total = calls.len() as u64;
        let path = self.path.display().to_string();
        let done = self.write_with(move |conn| {
            let mut written = Written::default();
            for batch in calls.chunks(WRITE_BATCH) {
                let n = batch.len() as u64;
                match store_batch(conn, batch, max) {
                    Ok(()) => written.stored += n,
                    Err(source) => written.lost.push((
                        n,
                        CallsError::Sqlite {
                            path: path.clone(),
                            source,
                        },
                    )),
                }
                // Lets a runnable worker have the core before the next batch; a no-op when
                // none is waiting.
                std::thread::yield_now();
            }
            Ok(written)
        });
        match done.await {
            Ok(written) => written,
            Err(e) => Written {
                stored: 0,
                lost: vec![(total, e)],
            },
        }
    }

    async fn page(
        &self,
        project: &str,
        before: Option<&str>,
        limit: usize,
        since: DateTime<Utc>,
    ) -> Result<Option<Page>, CallsError> {
        let before = match before {
            None => i64::MAX,
            Some(p) => match p.parse::<i64>() {
                Ok(id) if id > 0 => id,
                _ => return Ok(None),
            },
        };
        let project = project.to_owned();
        let since = millis(since);
        let mut found = self
            .with(&self.reader, move |conn| {
                let mut q = conn.prepare(
                    "SELECT first_id, newest_at, data FROM chunks \
                     WHERE project = ?1 AND first_id < ?2 ORDER BY first_id DESC",
                )?;
                let mut rows = q.query(params![project, before])?;
                let mut found: Vec<(i64, Stored)> = Vec::new();
                while let Some(row) = rows.next()? {
                    let (first, newest): (i64, i64) = (row.get(0)?, row.get(1)?);
                    // Newest first: a chunk wholly past the retention ends the log.
                    if newest < since {
                        break;
                    }
                    let entries =
                        decode(row.get_ref(2)?.as_blob()?).ok_or_else(|| corrupt(&project))?;
                    for (i, e) in entries.into_iter().enumerate().rev() {
                        let id = first + i as i64;
                        if id < before && e.at_ms >= since {
                            found.push((id, e));
                        }
                    }
                    if found.len() > limit {
                        break;
                    }
                }
                Ok(found)
            })
            .await?;
        let more = found.len() > limit;
        found.truncate(limit);
        let items: Vec<LogItem> = found
            .into_iter()
            .filter_map(|(id, e)| {
                Some(LogItem {
                    id: id.to_string(),
                    email_domain: e.domain,
                    risk_score: e.verdict.risk_score,
                    reason: e.verdict.reason,
                    created_at: super::created_at(DateTime::from_timestamp_millis(e.at_ms)?),
                })
            })
            .collect();
        Ok(Some(Page::of(items, more)))
    }

    async fn days(
        &self,
        project: &str,
        first: NaiveDate,
        last: NaiveDate,
    ) -> Result<Vec<DayCount>, CallsError> {
        let project = project.to_owned();
        let rows = self
            .with(&self.reader, move |conn| {
                let mut q = conn.prepare(
                    "SELECT day, total, blocked FROM daily \
                     WHERE project = ?1 AND day >= ?2 AND day <= ?3",
                )?;
                let rows = q.query_map(params![project, day_text(first), day_text(last)], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })?;
                rows.collect::<rusqlite::Result<Vec<_>>>()
            })
            .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(day, total, blocked)| {
                Some(DayCount {
                    date: day.parse().ok()?,
                    total_requests: u64::try_from(total).ok()?,
                    blocked_count: u64::try_from(blocked).ok()?,
                })
            })
            .collect())
    }

    async fn sweep(
        &self,
        cutoffs: &[(Arc<str>, DateTime<Utc>)],
        oldest: DateTime<Utc>,
        first_day: NaiveDate,
    ) -> Result<u64, CallsError> {
        let cutoffs: Vec<(String, i64)> = cutoffs
            .iter()
            .map(|(p, c)| (p.to_string(), millis(*c)))
            .collect();
        let oldest = millis(oldest);
        self.write_with(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut deleted: i64 = 0;
            {
                // Whole chunks past the retention go; a chunk partly past it waits (reads
                // never show the expired part).
                let mut delete = tx.prepare(
                    "DELETE FROM chunks WHERE project = ?1 AND newest_at < ?2 RETURNING entries",
                )?;
                for (project, cutoff) in &cutoffs {
                    for n in delete.query_map(params![project, cutoff], |r| r.get::<_, i64>(0))? {
                        deleted += n?;
                    }
                }
                let mut delete =
                    tx.prepare("DELETE FROM chunks WHERE newest_at < ?1 RETURNING entries")?;
                for n in delete.query_map(params![oldest], |r| r.get::<_, i64>(0))? {
                    deleted += n?;
                }
            }
            tx.execute(
                "DELETE FROM daily WHERE day < ?1",
                params![day_text(first_day)],
            )?;
            tx.commit()?;
            Ok(u64::try_from(deleted).unwrap_or(0))
        })
        .await
    }
}

/// One project's entries of a batch, as written.
struct Chunk<'a> {
    project: &'a str,
    /// Entries of the batch (ids taken), written or not.
    calls: i64,
    /// Entries still to skip (the oldest, beyond `max_per_project`).
    skip: i64,
    /// Offset of the first written entry within the batch's ids.
    first: i64,
    data: Vec<u8>,
    newest: i64,
}

impl<'a> Chunk<'a> {
    fn new(project: &'a str) -> Self {
        Chunk {
            project,
            calls: 1,
            skip: 0,
            first: 0,
            data: Vec::new(),
            newest: i64::MIN,
        }
    }
}

/// One chunk per project of a batch, entries in the order the calls were answered. A project's
/// entries beyond `max` in one batch would be trimmed at once (a flood): they take their ids
/// but are never written.
fn chunks_of(calls: &[Call], max: i64) -> Vec<Chunk<'_>> {
    let mut chunks: Vec<Chunk<'_>> = Vec::new();
    for call in calls {
        if call.verdict.is_none() {
            continue;
        }
        match chunks
            .iter_mut()
            .find(|c| same_project(c.project, &call.project))
        {
            Some(c) => c.calls += 1,
            None => chunks.push(Chunk::new(&call.project)),
        }
    }
    for c in &mut chunks {
        c.skip = (c.calls - max).max(0);
        // An entry is 11 bytes and its domain: one allocation for most batches, not a doubling.
        c.data = Vec::with_capacity(usize::try_from(c.calls - c.skip).unwrap_or(0) * 32);
    }
    for call in calls {
        let Some(v) = call.verdict else { continue };
        let Some(c) = chunks
            .iter_mut()
            .find(|c| same_project(c.project, &call.project))
        else {
            continue;
        };
        if c.skip > 0 {
            c.skip -= 1;
            c.first += 1;
            continue;
        }
        let at = millis(call.at);
        encode(&mut c.data, at, v, &call.email_domain);
        c.newest = c.newest.max(at);
    }
    chunks
}

/// Whether two project ids are the same: the calls of a project share its key's `Arc`, so the
/// pointers tell at once (every call of a batch was compared byte for byte before).
fn same_project(a: &str, b: &str) -> bool {
    std::ptr::eq(a, b) || a == b
}

/// The next entry id of `project`: its counter, or past its newest chunk when that is further
/// (a file whose chunks were written with the one global counter of earlier builds, or by such
/// a build running on the same file during an upgrade).
fn next_id(tx: &rusqlite::Transaction<'_>, project: &str) -> rusqlite::Result<i64> {
    tx.prepare_cached(NEXT_PROJECT_ID)?
        .query_row(params![project], |r| r.get(0))
}

/// Keeps the newest `max` entries of `project`: whole oldest chunks go while the rest hold
/// `max`, then the oldest remaining chunk loses its oldest entries.
fn trim(tx: &rusqlite::Transaction<'_>, project: &str, max: i64) -> rusqlite::Result<()> {
    let total: i64 = tx
        .prepare_cached(LOG_LENGTH)?
        .query_row(params![project], |r| r.get(0))?;
    let mut excess = total - max;
    while excess > 0 {
        let (first, entries, data): (i64, i64, Vec<u8>) = tx
            .prepare_cached(OLDEST_CHUNK)?
            .query_row(params![project], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        tx.prepare_cached(DELETE_CHUNK)?
            .execute(params![project, first])?;
        if entries > excess {
            // The rest is a suffix of the chunk's bytes: found by walking the entry headers,
            // nothing decoded (a chunk holds up to `max` entries, trimmed every batch).
            let drop = usize::try_from(excess).unwrap_or(usize::MAX);
            let (rest, newest) = suffix_after(&data, drop).ok_or_else(|| corrupt(project))?;
            tx.prepare_cached(INSERT_CHUNK)?.execute(params![
                project,
                first + excess,
                entries - excess,
                newest,
                rest
            ])?;
        }
        excess -= entries;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::calls::Verdict;
    use drg_domain::Reason;

    fn call(project: &str, domain: &str, at: &str, reason: Option<Reason>) -> Call {
        Call {
            project: project.into(),
            retention: std::time::Duration::from_secs(3600),
            email_domain: domain.into(),
            verdict: reason.map(|reason| Verdict {
                risk_score: 50,
                reason,
            }),
            lookup: true,
            at: at.parse().unwrap(),
            queued: None,
        }
    }

    #[test]
    fn a_chunk_is_trimmed_by_its_bytes_as_by_its_entries() {
        let v = Verdict {
            risk_score: 95,
            reason: Reason::Disposable,
        };
        let mut data = Vec::new();
        for (i, d) in ["a.example", "bb.example", "c.example"].iter().enumerate() {
            encode(&mut data, 10 - i as i64, v, d);
        }
        let (rest, newest) = suffix_after(&data, 1).unwrap();
        let kept = decode(rest).unwrap();
        assert_eq!(kept.len(), 2);
        assert_eq!(kept[0].domain, "bb.example");
        assert_eq!(newest, 9);
        assert_eq!(suffix_after(&data, 0).unwrap().0, &data[..]);
        assert_eq!(suffix_after(&data, 3).unwrap(), (&[][..], 0));
        assert!(
            suffix_after(&data[..data.len() - 1], 1).is_none(),
            "a cut entry"
        );
    }

    #[tokio::test]
    async fn trimming_cuts_across_batches_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("c.sqlite3"), 4).unwrap();
        let t = "2026-11-22T10:00:00Z";
        for batch in [0..3, 3..6, 6..7] {
            store
                .write(
                    batch
                        .map(|i| call("p", &format!("d{i}.com"), t, Some(Reason::Safe)))
                        .collect(),
                )
                .await
                .unwrap();
        }
        let since: DateTime<Utc> = "2026-11-01T00:00:00Z".parse().unwrap();
        let page = store.page("p", None, 10, since).await.unwrap().unwrap();
        let names: Vec<_> = page.items.iter().map(|i| i.email_domain.as_str()).collect();
        assert_eq!(names, ["d6.com", "d5.com", "d4.com", "d3.com"]);
        let ids: Vec<_> = page.items.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["7", "6", "5", "4"]);
        let page = store.page("p", Some("6"), 2, since).await.unwrap().unwrap();
        let ids: Vec<_> = page.items.iter().map(|i| i.id.as_str()).collect();
        assert_eq!((ids, page.next.as_deref()), (vec!["5", "4"], None));
    }

    /// A batch's statements are compiled once per connection, not once per batch. SQLite
    /// recompiles a statement whose parameter values could change its plan each time new values
    /// are bound: that parser work was a fifth of the writer thread's CPU under load.
    #[tokio::test]
    async fn a_batchs_statements_are_compiled_once() {
        use rusqlite::StatementStatus;
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(&dir.path().join("c.sqlite3"), 4).unwrap();
        let t = "2026-11-22T10:00:00Z";
        let batches = 6;
        for b in 0..batches {
            // Two projects and a growing log: every statement runs, trimming included.
            let calls = (0..5)
                .map(|i| {
                    let project = if i % 2 == 0 { "p" } else { "q" };
                    call(project, &format!("d{b}-{i}.com"), t, Some(Reason::Safe))
                })
                .collect();
            store.write(calls).await.unwrap();
        }
        let counts = store
            .write_with(|conn| {
                let mut counts = Vec::new();
                for sql in BATCH_STATEMENTS {
                    let stmt = conn.prepare_cached(sql)?;
                    counts.push((
                        sql,
                        stmt.get_status(StatementStatus::Run),
                        stmt.get_status(StatementStatus::RePrepare),
                    ));
                }
                Ok(counts)
            })
            .await
            .unwrap();
        for (sql, runs, recompiled) in &counts {
            assert!(*runs >= batches, "{sql}: ran {runs} times");
            assert_eq!(*recompiled, 0, "{sql}: compiled again {recompiled} times");
        }
        // Two chunks a batch, plus the rest of each chunk cut by the trim: a statement still
        // held by the batch when the trim asks for it is compiled anew instead, and its runs are
        // not counted here.
        let (_, inserts, _) = counts
            .iter()
            .find(|(sql, ..)| *sql == INSERT_CHUNK)
            .unwrap();
        assert!(*inserts > 2 * batches, "{inserts} inserts");
    }

    #[tokio::test]
    async fn ids_are_per_project_and_continue_past_global_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sqlite3");
        let store = EmbeddedStore::open(&path, 100).unwrap();
        let t = "2026-11-22T10:00:00Z";
        let since: DateTime<Utc> = "2026-11-01T00:00:00Z".parse().unwrap();
        let ids = |page: Page| -> Vec<String> { page.items.into_iter().map(|i| i.id).collect() };
        let busy: Vec<Call> = (0..50)
            .map(|i| call("busy", &format!("d{i}.com"), t, Some(Reason::Safe)))
            .collect();
        store.write(busy).await.unwrap();
        store
            .write(vec![call("quiet", "q.com", t, Some(Reason::Safe))])
            .await
            .unwrap();
        // The quiet project's first entry is its 1, whatever the busy one did.
        let page = store.page("quiet", None, 10, since).await.unwrap().unwrap();
        assert_eq!(ids(page), ["1"]);
        // A file written by an earlier build (one global counter): the project's ids go on
        // past its newest chunk, and the global counter stays above every id given.
        store
            .write_with(|conn| {
                conn.execute_batch(
                    "DELETE FROM project_ids WHERE project = 'quiet'; \
                     UPDATE chunks SET first_id = 70 WHERE project = 'quiet';",
                )
            })
            .await
            .unwrap();
        store
            .write(vec![call("quiet", "r.com", t, Some(Reason::Safe))])
            .await
            .unwrap();
        let page = store.page("quiet", None, 10, since).await.unwrap().unwrap();
        assert_eq!(ids(page), ["71", "70"]);
        let global: i64 = store
            .with(&store.reader, |conn| {
                conn.query_row("SELECT value FROM meta WHERE name = 'next_id'", [], |r| {
                    r.get(0)
                })
            })
            .await
            .unwrap();
        assert_eq!(global, 72);
    }

    #[tokio::test]
    async fn pages_trims_counts_and_sweeps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/calls.sqlite3");
        let store = EmbeddedStore::open(&path, 5).unwrap();
        let t = "2026-11-22T10:00:00Z";
        let batch: Vec<Call> = (0..7)
            .map(|i| call("p", &format!("d{i}.com"), t, Some(Reason::Disposable)))
            .chain([
                call("p", "x.com", t, None),
                call("q", "q.com", t, Some(Reason::Safe)),
            ])
            .collect();
        store.write(batch).await.unwrap();
        let since: DateTime<Utc> = "2026-11-01T00:00:00Z".parse().unwrap();
        let first = store.page("p", None, 3, since).await.unwrap().unwrap();
        let names: Vec<_> = first
            .items
            .iter()
            .map(|i| i.email_domain.as_str())
            .collect();
        assert_eq!(names, ["d6.com", "d5.com", "d4.com"]);
        let second = store
            .page("p", first.next.as_deref(), 3, since)
            .await
            .unwrap()
            .unwrap();
        let names: Vec<_> = second
            .items
            .iter()
            .map(|i| i.email_domain.as_str())
            .collect();
        // Only the newest 5 are kept (the 2 oldest of the batch were never written, their
        // ids taken all the same).
        assert_eq!(names, ["d3.com", "d2.com"]);
        let ids: Vec<_> = second.items.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["4", "3"]);
        assert_eq!(second.next, None);
        assert_eq!(store.page("p", Some("x"), 3, since).await.unwrap(), None);
        let day: NaiveDate = "2026-11-22".parse().unwrap();
        let days = store.days("p", day, day).await.unwrap();
        assert_eq!((days[0].total_requests, days[0].blocked_count), (8, 7));
        let later: DateTime<Utc> = "2026-11-23T00:00:00Z".parse().unwrap();
        store
            .sweep(&[("p".into(), later)], since, day)
            .await
            .unwrap();
        assert!(store
            .page("p", None, 3, since)
            .await
            .unwrap()
            .unwrap()
            .items
            .is_empty());
        assert_eq!(
            store
                .page("q", None, 3, since)
                .await
                .unwrap()
                .unwrap()
                .items
                .len(),
            1
        );
        drop(store);
        // Reopened: what was kept is still there.
        let store = EmbeddedStore::open(&path, 5).unwrap();
        assert_eq!(
            store.days("q", day, day).await.unwrap()[0].total_requests,
            1
        );
    }
}
