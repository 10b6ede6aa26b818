//! The control store: what a project creates through the API and must not lose (here: its
//! overrides, webhooks, reports and the accepted verdicts), in one database. SQLite in the state
//! folder (`control.sqlite`) on one machine, PostgreSQL (`gateway.control`) for several
//! gateways; one code path speaks both (sqlx's `Any` driver), the few words the two engines say
//! differently are in `schema.rs`. A write is one transaction (the record, its project's bound,
//! the kind's revision); each gateway follows the revision into its snapshot and never writes
//! its copy back: the database is the truth, its loss the operator's restore.
//!
//! The pool is made, and the schema migrated, at first use: in the process and runtime that
//! serve (a host may fork after building, and the pool's tasks need a runtime), and a database
//! down at start delays no start.

pub mod audit;
pub mod config;
pub mod follow;
pub mod import;
pub mod listen;
mod revision;
mod schema;
mod sqlite_file;
pub mod watch;

pub use revision::{
    changes_since, diverged, move_revision, revision, token_at, Changes, Own, Owned, Revision,
    Touched,
};

/// A transaction on the control store.
pub type Tx = sqlx::Transaction<'static, sqlx::Any>;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::AnyPool;
use sqlx::Executor;

use config::{ControlConfig, DEFAULT_POLL, SQLITE_CALL_TIMEOUT};

/// Which database holds the control store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// The state folder's `control.sqlite`: one gateway (or several sharing the folder).
    Sqlite,
    /// `gateway.control.url`: every gateway of a deployment.
    Postgres,
}

impl Engine {
    pub fn name(self) -> &'static str {
        match self {
            Engine::Sqlite => "sqlite",
            Engine::Postgres => "postgres",
        }
    }
}

/// Why the control store did not answer.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("{0}: {1}")]
    Sql(&'static str, sqlx::Error),
    #[error("{0}: no answer within {1} ms")]
    TimedOut(&'static str, u64),
    #[error("{0}: the write did not commit")]
    NotCommitted(&'static str),
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{misplaced}: an earlier release kept the control store here by mistake, and {file} holds one too; keep the one that is the truth at {file} (the other moved aside) and start again")]
    TwoStores { misplaced: PathBuf, file: PathBuf },
}

/// Kinds told moved that a slow snapshot may fall behind on (it then reads anyway).
const MOVED_BACKLOG: usize = 64;

/// A write's transaction, and when it can no longer commit.
pub struct Write {
    pub tx: sqlx::Transaction<'static, sqlx::Any>,
    /// Past this instant the database refuses the transaction's `COMMIT` (PostgreSQL's
    /// deadline; on SQLite no answer is ever lost), so what it holds then is the outcome.
    pub settled: std::time::Instant,
    /// PostgreSQL's id of the transaction (see [`Control::commit`]).
    pub xid: Option<i64>,
}

/// How often a transaction whose `COMMIT` answer is late is asked after.
const SETTLE_POLL: Duration = Duration::from_millis(20);

/// How much later than the deadline's half-budget a lost commit's outcome is read: the
/// database's clock read the deadline after this gateway sent it, and the two clocks' rates
/// differ by far less.
const SETTLE_MARGIN: Duration = Duration::from_millis(50);

/// A PostgreSQL connection idle this long is asked whether it is alive before a call takes it.
const IDLE_BEFORE_PING: Duration = Duration::from_secs(1);

/// Whether a failed `COMMIT` may have landed: the database refused it (an error it sent,
/// such as the deadline's) or it landed; anything else (the connection lost, an answer that
/// did not parse) leaves it unknown.
pub fn commit_unknown(e: &sqlx::Error) -> bool {
    !matches!(e, sqlx::Error::Database(_))
}

/// The file the control store is kept in without `gateway.control`.
pub fn sqlite_path(folder: &Path) -> PathBuf {
    folder.join("control.sqlite")
}

/// The control store (see the module).
pub struct Control {
    engine: Engine,
    options: AnyConnectOptions,
    /// SQLite: the file, made with mode 0600 before the first connection.
    file: Option<PathBuf>,
    max_connections: u32,
    call_timeout: Duration,
    pool: tokio::sync::OnceCell<AnyPool>,
    /// Snapshots opened on this store that have not tried their first read yet (see
    /// [`Control::loading`]).
    unread: std::sync::atomic::AtomicUsize,
    /// How often snapshots ask the revisions.
    poll: Duration,
    /// PostgreSQL: where `listen.rs` connects (never logged: it may hold a password).
    url: Option<String>,
    /// The kinds a notification said moved (`*`: any, after the listener reconnected).
    moved: tokio::sync::broadcast::Sender<String>,
}

impl Control {
    /// The store `config` names, else the state folder's SQLite file (nothing is connected yet).
    pub fn open(
        config: Option<&ControlConfig>,
        folder: &Path,
    ) -> Result<Arc<Control>, ControlError> {
        match config {
            Some(config) => Control::postgres(config),
            None => Control::sqlite(&sqlite_path(folder)),
        }
    }

    /// PostgreSQL at `config.url`.
    pub fn postgres(config: &ControlConfig) -> Result<Arc<Control>, ControlError> {
        sqlx::any::install_default_drivers();
        let options = (config.url.parse::<AnyConnectOptions>())
            .map_err(|e| ControlError::Sql(Engine::Postgres.name(), e))?;
        Ok(Arc::new(Control {
            engine: Engine::Postgres,
            options,
            file: None,
            max_connections: config.max_connections,
            call_timeout: config.call_timeout,
            pool: tokio::sync::OnceCell::new(),
            unread: std::sync::atomic::AtomicUsize::new(0),
            poll: config.poll,
            url: Some(config.url.clone()),
            moved: tokio::sync::broadcast::channel(MOVED_BACKLOG).0,
        }))
    }

    /// SQLite in the file at `path`, made if missing (its folder now), and moved there first
    /// from where an earlier release kept it by mistake ([`sqlite_file`]).
    pub fn sqlite(path: &Path) -> Result<Arc<Control>, ControlError> {
        sqlx::any::install_default_drivers();
        let file = sqlite_file::resolve(path)?;
        sqlite_file::adopt_misplaced(&format!("sqlite://{}?mode=rwc", url_path(path)), &file)?;
        // Resolved, the path has no dot segments for the URL's rules to remove.
        let url = format!("sqlite://{}?mode=rwc", url_path(&file));
        let options = (url.parse::<AnyConnectOptions>())
            .map_err(|e| ControlError::Sql(Engine::Sqlite.name(), e))?;
        Ok(Arc::new(Control {
            engine: Engine::Sqlite,
            options,
            file: Some(file),
            // One writer at a time in any case; readers wait on none (WAL).
            max_connections: 4,
            call_timeout: SQLITE_CALL_TIMEOUT,
            pool: tokio::sync::OnceCell::new(),
            unread: std::sync::atomic::AtomicUsize::new(0),
            poll: DEFAULT_POLL,
            url: None,
            moved: tokio::sync::broadcast::channel(MOVED_BACKLOG).0,
        }))
    }

    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// How often a snapshot asks its kind's revision (behind the notifications).
    pub fn poll(&self) -> Duration {
        self.poll
    }

    /// The kinds the database says moved, as they are told (see `listen.rs`).
    pub fn moved(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.moved.subscribe()
    }

    /// Where the store is, for messages (SQLite: the file; PostgreSQL: never its URL, which may
    /// hold a password).
    pub fn described(&self) -> String {
        match &self.file {
            Some(path) => format!("SQLite ({})", path.display()),
            None => "PostgreSQL (gateway.control)".into(),
        }
    }

    /// The pool, the schema migrated.
    pub async fn pool(&self) -> Result<&AnyPool, ControlError> {
        self.pool
            .get_or_try_init(|| async {
                if let Some(path) = &self.file {
                    private_file(path)?;
                }
                let engine = self.engine;
                let ms = crate::infra::units::ms(self.call_timeout);
                let pool = AnyPoolOptions::new()
                    .max_connections(self.max_connections)
                    // A local file needs no round trip to be known alive; a server's connection
                    // does once it sat idle (a restart or a network cut since). One in use a
                    // moment ago is taken as it is: a round trip saved on every call (the pool
                    // already asks at each release), and a call on a connection that broke
                    // since fails before it commits anything.
                    .test_before_acquire(false)
                    .before_acquire(move |conn, meta| {
                        Box::pin(async move {
                            if engine == Engine::Postgres && meta.idle_for >= IDLE_BEFORE_PING {
                                sqlx::Connection::ping(conn).await?;
                            }
                            Ok(true)
                        })
                    })
                    .acquire_timeout(self.call_timeout)
                    .after_connect(move |conn, _| {
                        Box::pin(async move {
                            let session = schema::session(engine, ms);
                            conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(session)))
                                .await?;
                            Ok(())
                        })
                    })
                    .connect_lazy_with(self.options.clone());
                self.within(schema::migrate(self.engine, &pool)).await?;
                Ok::<_, ControlError>(pool)
            })
            .await
    }

    /// Whether a snapshot on this store has not tried its first read yet: the gateway is not
    /// ready meanwhile, so that no request is answered without the overrides a restart found.
    /// A first read that failed counts as tried (the database down at start delays no start).
    pub fn loading(&self) -> bool {
        self.unread.load(std::sync::atomic::Ordering::Acquire) > 0
    }

    /// A snapshot was opened (its first read is awaited).
    pub fn snapshot_opened(&self) {
        self.unread
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// A snapshot tried its first read.
    pub fn snapshot_read(&self) {
        self.unread
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// A transaction that writes, for a call that gives up at `until` (see
    /// [`schema::begin_write`]): its commit is refused past half the time left, so that its
    /// answer is back well before the call gives up, and one given up never commits later.
    pub async fn write(&self, until: std::time::Instant) -> Result<Write, ControlError> {
        self.write_telling(until, None).await
    }

    /// [`Control::write`] of a kind of record: every gateway is told it moved when the
    /// transaction commits (PostgreSQL's `NOTIFY`; SQLite has none: its gateways poll).
    pub async fn write_telling(
        &self,
        until: std::time::Instant,
        tell: Option<&'static str>,
    ) -> Result<Write, ControlError> {
        self.write_locked(until, tell, None).await
    }

    /// [`Control::write_telling`] that takes `lock` first: the writes that name the same lock
    /// go one at a time (PostgreSQL's advisory lock, in the round trip that begins the write;
    /// SQLite's writes go one at a time already).
    pub async fn write_locked(
        &self,
        until: std::time::Instant,
        tell: Option<&'static str>,
        lock: Option<&str>,
    ) -> Result<Write, ControlError> {
        let pool = self.pool().await?;
        let left = until.saturating_duration_since(std::time::Instant::now());
        let begun = schema::begin_write(self.engine, pool, left / 2, tell, lock).await;
        let (tx, xid) = begun.map_err(self.sql())?;
        // The database took its deadline before this instant; its clock's second may run a
        // little ahead of ours.
        let settled = std::time::Instant::now() + left / 2 + SETTLE_MARGIN;
        Ok(Write { tx, settled, xid })
    }

    /// Commits `w`: `Ok` once committed, an error once it never will. A `COMMIT` whose answer
    /// is late (past the write's deadline: a synchronous standby that is gone, a disk that
    /// stalls) or lost (the connection broken) is never taken for a refusal: the database is
    /// asked what came of the transaction, until it can tell, within the call's budget.
    pub async fn commit(&self, w: Write) -> Result<(), ControlError> {
        let sql = self.sql();
        let Write { tx, settled, xid } = w;
        let Some(xid) = xid else {
            return tx.commit().await.map_err(sql);
        };
        let wait = settled.saturating_duration_since(std::time::Instant::now());
        let (why, detail) = match tokio::time::timeout(wait, tx.commit()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) if !commit_unknown(&e) => return Err(sql(e)),
            Ok(Err(e)) => ("was lost", e.to_string()),
            Err(_) => (
                "was late",
                format!("none within {} ms", crate::infra::units::ms(wait)),
            ),
        };
        log::warn!(
            "control store: the answer to a commit {why} ({detail}); asking the database what \
             came of it"
        );
        // Boxed: rare, and every write's future would otherwise hold it inline.
        Box::pin(self.settle(xid, settled, why)).await
    }

    /// Asks the database what came of transaction `xid` until it can tell (see
    /// [`Control::commit`]).
    async fn settle(
        &self,
        xid: i64,
        settled: std::time::Instant,
        why: &str,
    ) -> Result<(), ControlError> {
        let sql = self.sql();
        let pool = self.pool().await?;
        loop {
            let fate = schema::fate(pool, xid).await.map_err(&sql)?;
            match fate {
                schema::Fate::Committed | schema::Fate::Aborted => {
                    let landed = fate == schema::Fate::Committed;
                    log::warn!(
                        "control store: the commit whose answer {why} {}",
                        if landed { "landed" } else { "did not land" }
                    );
                    return if landed {
                        Ok(())
                    } else {
                        Err(ControlError::NotCommitted(self.engine.name()))
                    };
                }
                // Past the deadline, what is still open is settled by ending its session: a
                // commit made durable stays, anything else (its `COMMIT` not come, or waiting
                // on another commit's lock) rolls back and can never land after a `503`.
                schema::Fate::Open { pid } if pid > 0 && std::time::Instant::now() >= settled => {
                    schema::end_session(pool, pid).await.map_err(&sql)?;
                    tokio::time::sleep(SETTLE_POLL).await;
                }
                schema::Fate::Open { .. } => tokio::time::sleep(SETTLE_POLL).await,
            }
        }
    }

    /// When a call that starts now gives up.
    pub fn deadline(&self) -> std::time::Instant {
        std::time::Instant::now() + self.call_timeout
    }

    /// `call` within the call budget. On SQLite the call is not cut: its statements run on the
    /// driver's own thread, which finishes a `COMMIT` it was given whatever the caller does, so
    /// an answer given up on could be a write that landed; a wait for another writer's lock is
    /// bounded by `busy_timeout` (the budget) instead, and ends in a rollback.
    pub async fn within<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, ControlError>>,
    ) -> Result<T, ControlError> {
        self.within_for(self.call_timeout, call).await
    }

    /// [`Control::within`] a budget of its own (`migrate`'s imports, which no caller waits on).
    pub async fn within_for<T>(
        &self,
        budget: Duration,
        call: impl std::future::Future<Output = Result<T, ControlError>>,
    ) -> Result<T, ControlError> {
        if self.engine == Engine::Sqlite {
            return call.await;
        }
        let ms = crate::infra::units::ms(budget);
        tokio::time::timeout(budget, call)
            .await
            .unwrap_or(Err(ControlError::TimedOut(self.engine.name(), ms)))
    }

    /// A database error of this engine.
    pub fn sql(&self) -> impl Fn(sqlx::Error) -> ControlError {
        let name = self.engine.name();
        move |e| ControlError::Sql(name, e)
    }
}

/// `path` as a URL's path: `%`, `?`, `#` and spaces escaped (SQLite's URL decodes them back).
fn url_path(path: &Path) -> String {
    let mut out = String::new();
    for c in path.to_string_lossy().chars() {
        match c {
            '%' => out.push_str("%25"),
            '?' => out.push_str("%3F"),
            '#' => out.push_str("%23"),
            ' ' => out.push_str("%20"),
            c => out.push(c),
        }
    }
    out
}

/// Makes `path` readable by its owner only, before SQLite opens it (the records hold webhook
/// secrets; SQLite gives its journal files the database file's mode).
fn private_file(path: &Path) -> Result<(), ControlError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = |source| ControlError::File {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(file)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map_err(file)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_with_odd_characters_still_names_its_file() {
        assert_eq!(url_path(Path::new("/a b/c?d#e%f")), "/a%20b/c%3Fd%23e%25f");
    }

    #[tokio::test]
    async fn the_sqlite_store_is_made_private_and_migrated_once() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = sqlite_path(&dir.path().join("odd folder"));
        for _ in 0..2 {
            let control = Control::sqlite(&path).unwrap();
            let pool = control.pool().await.unwrap();
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM drg_schema")
                .fetch_one(pool)
                .await
                .unwrap();
            assert_eq!(n, schema::latest());
        }
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
