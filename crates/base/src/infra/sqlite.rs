//! SQLite opened one way for every file the gateway keeps (the call log, verdict changes, the
//! webhook outbox, quota alerts' included): WAL (readers and the writer do not block each other,
//! across processes too), waiting up to five seconds for another writer, each connection used by
//! one thread at a time; the file created private to the owner first (its `-wal` and `-shm` take
//! its mode).

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

/// How long a statement waits for another writer's lock.
pub const BUSY: Duration = Duration::from_secs(5);

/// How much a commit waits for the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Synchronous {
    /// On disk before the commit returns: what a promise rests on (a claimed alert, a change, a
    /// message handed over).
    Full,
    /// A power loss may take the last commits, never corrupts the file (the call log).
    Normal,
}

/// Opens `path` (created 0600 with its folder when missing); see [`connect`].
pub fn open(path: &Path, synchronous: Synchronous) -> Result<Connection, OpenError> {
    let io = |source| OpenError::Io {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    crate::infra::fsutil::create_private(path).map_err(io)?;
    connect(path, synchronous).map_err(|source| OpenError::Sqlite {
        path: path.display().to_string(),
        source,
    })
}

/// Opens `path` as [`open`] does, runs `schema` (idempotent statements), and closes it again: a
/// store made before the process that serves exists (it may yet fork into a daemon, and a
/// connection carried across a fork holds none of its locks) opens its own at first use.
pub fn prepare(path: &Path, synchronous: Synchronous, schema: &str) -> Result<(), OpenError> {
    let conn = open(path, synchronous)?;
    conn.execute_batch(schema)
        .map_err(|source| OpenError::Sqlite {
            path: path.display().to_string(),
            source,
        })
}

/// A connection to `path` in WAL mode, commits as `synchronous` says.
pub fn connect(path: &Path, synchronous: Synchronous) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    let sync = match synchronous {
        Synchronous::Full => "FULL",
        Synchronous::Normal => "NORMAL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    Ok(conn)
}

/// Keeps `conn`'s write-ahead log small: checkpointed every 16 pages and cut back to 64 KiB
/// after each checkpoint, so a store's disk is its rows' (the default lets the log reach 4 MB
/// and stay that size), for stores whose writes are few and small.
pub fn keep_log_small(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch("PRAGMA wal_autocheckpoint = 16; PRAGMA journal_size_limit = 65536;")
}

/// Why a file did not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Sqlite {
        path: String,
        source: rusqlite::Error,
    },
}
