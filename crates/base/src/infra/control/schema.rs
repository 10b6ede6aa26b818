//! The control store's schema, one migration a version, versioned here and applied once by
//! whichever gateway reaches the store first (`drg_schema`), and the few words the two engines
//! say differently: a session's settings and the lock two gateways migrating at once take.

use sqlx::AnyPool;
use sqlx::AssertSqlSafe;

use super::{ControlError, Engine};

/// The migrations, in order; each runs once, in a transaction, and is written in the SQL both
/// engines speak; [`POSTGRES_ONLY`] adds what only PostgreSQL has.
const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE drg_records (
       kind TEXT NOT NULL,
       project TEXT NOT NULL,
       key TEXT NOT NULL,
       stamp BIGINT NOT NULL,
       removed BOOLEAN NOT NULL,
       body TEXT NOT NULL,
       PRIMARY KEY (kind, project, key));
     CREATE INDEX drg_records_removed ON drg_records (kind, project, removed, stamp);
     CREATE TABLE drg_revision (
       kind TEXT PRIMARY KEY,
       n BIGINT NOT NULL CHECK (n >= 0));",
    ),
    // What `migrate` took in, a row a source, so that a source is taken once: a record removed
    // since (its row dropped) is never brought back by a second run.
    (
        2,
        "CREATE TABLE drg_imports (
       source TEXT PRIMARY KEY,
       kind TEXT NOT NULL,
       records BIGINT NOT NULL,
       at BIGINT NOT NULL);",
    ),
    (3, "SELECT 1"),
    // The first answer of each write that carried an `Idempotency-Key` (`records/once.rs`).
    (
        4,
        "CREATE TABLE drg_idempotency (
       project TEXT NOT NULL,
       key TEXT NOT NULL,
       fingerprint TEXT NOT NULL,
       status BIGINT NOT NULL,
       body TEXT NOT NULL,
       at BIGINT NOT NULL,
       PRIMARY KEY (project, key));
     CREATE INDEX drg_idempotency_at ON drg_idempotency (project, at);",
    ),
    // The projects' audit trail (`account/audit/sql.rs`).
    (
        5,
        "CREATE TABLE drg_audit (
       project TEXT NOT NULL,
       id BIGINT NOT NULL,
       at TEXT NOT NULL,
       key_id TEXT NOT NULL,
       action TEXT NOT NULL,
       target TEXT NOT NULL,
       detail TEXT NOT NULL,
       PRIMARY KEY (project, id));",
    ),
    // The keys projects make through `/v1/keys` (`keys_api/control.rs`): a row a key, its
    // lineage a constraint (a key made by an API-made key names it as `parent`, and goes with
    // it), the last use a column of its own (saved without moving the revision).
    (
        6,
        "CREATE TABLE drg_keys (
       id TEXT PRIMARY KEY,
       project TEXT NOT NULL,
       parent TEXT REFERENCES drg_keys (id) ON DELETE CASCADE,
       last_used BIGINT NOT NULL DEFAULT 0,
       body TEXT NOT NULL);
     CREATE INDEX drg_keys_project ON drg_keys (project);
     CREATE INDEX drg_keys_parent ON drg_keys (parent);",
    ),
    // Operator keys `key sync` retired (a keys file applied without them): what they made is
    // gone with them, and every gateway refuses them whatever its own keys file says.
    (
        7,
        "CREATE TABLE drg_retired (
       id TEXT PRIMARY KEY,
       at TEXT NOT NULL);",
    ),
    // A revision's token, and the tokens of each kind's recent revisions (`revision.rs`): a
    // restore whose counter climbs back is told from writes that only moved on.
    (
        8,
        "ALTER TABLE drg_revision ADD COLUMN token TEXT NOT NULL DEFAULT '';
     CREATE TABLE drg_revision_log (
       kind TEXT NOT NULL,
       n BIGINT NOT NULL,
       token TEXT NOT NULL,
       PRIMARY KEY (kind, n));",
    ),
    // The operator keys (and their projects) of the keys file `key sync` last applied: one
    // that a later file lacks is retired though it made no key (`keys_api/retire.rs`).
    (
        9,
        "CREATE TABLE drg_applied_keys (
       id TEXT PRIMARY KEY,
       project TEXT NOT NULL);",
    ),
    // The project each revision of a kind changed (none: the whole kind, as an import), so a
    // gateway reads the projects that changed since the revision it holds, not the whole kind.
    (10, "ALTER TABLE drg_revision_log ADD COLUMN project TEXT;"),
    // The record's key within that project (none: the whole project, as a write that trims
    // its removal markers), so a gateway reads the rows that changed, not the project's all.
    (11, "ALTER TABLE drg_revision_log ADD COLUMN key TEXT;"),
];

/// What PostgreSQL adds to a migration of [`MIGRATIONS`] (by version).
///
/// 3: a write's deadline, checked at its `COMMIT`. A server paused mid-write (`SIGSTOP`, a VM
/// frozen) runs the statements a gateway sent before it gave up once it resumes, `COMMIT`
/// included, and `statement_timeout` counts only from then. Every write sets `drg.deadline` (on
/// the database's clock, well before the gateway gives up) and moves its kind's revision row;
/// this deferred trigger on that row runs inside `COMMIT` and refuses one past the deadline, so
/// a write answered `503` never lands later.
const POSTGRES_ONLY: &[(i64, &str)] = &[(
    3,
    "CREATE FUNCTION drg_deadline() RETURNS trigger LANGUAGE plpgsql AS $fn$
     DECLARE d text := current_setting('drg.deadline', true);
     BEGIN
       IF d IS NOT NULL AND d <> '' AND clock_timestamp() > d::timestamptz THEN
         RAISE EXCEPTION 'the write''s deadline passed before its commit'
           USING ERRCODE = '57014';
       END IF;
       RETURN NULL;
     END $fn$;
     CREATE CONSTRAINT TRIGGER drg_revision_deadline AFTER INSERT OR UPDATE ON drg_revision
       DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION drg_deadline();",
)];

/// The schema's version once every migration ran.
#[cfg(test)]
pub fn latest() -> i64 {
    MIGRATIONS.last().map_or(0, |(v, _)| *v)
}

/// Any fixed number: the advisory lock two gateways starting at once on PostgreSQL take to
/// migrate in turn (on SQLite the first write of the migration's transaction serializes them).
const MIGRATION_LOCK: i64 = 0x0064_7267_5f63_746c;

/// What every new connection is told: on PostgreSQL, the database ends a statement, or a
/// transaction left idle, past the call budget (`ms`), so a call answered `503` never commits
/// later; on SQLite, the journal that lets readers go on during a write, commits on disk, and
/// a writer waiting at most the budget for another, and the key lineage's constraint enforced.
pub fn session(engine: Engine, ms: u64) -> String {
    match engine {
        Engine::Postgres => format!(
            "SET statement_timeout = {ms}; SET idle_in_transaction_session_timeout = {ms}; \
             SET application_name = 'domain-risk-gateway'"
        ),
        Engine::Sqlite => format!(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = {ms}; \
             PRAGMA foreign_keys = ON"
        ),
    }
}

/// A transaction that writes: on SQLite it takes the write lock at once (`BEGIN IMMEDIATE`),
/// so that two writers wait in turn instead of one failing when it upgrades a read; on
/// PostgreSQL it carries its deadline, `within` from now on the database's clock (see
/// [`POSTGRES_ONLY`]), tells every gateway at its commit that `tell` (a kind) moved, and
/// gives its transaction id, by which a `COMMIT` whose answer is late or lost is settled.
pub async fn begin_write(
    engine: Engine,
    pool: &AnyPool,
    within: std::time::Duration,
    tell: Option<&'static str>,
    lock: Option<&str>,
) -> Result<(sqlx::Transaction<'static, sqlx::Any>, Option<i64>), sqlx::Error> {
    match engine {
        Engine::Postgres => {
            let mut tx = pool.begin().await?;
            let ms = i64::try_from(within.as_millis()).unwrap_or(i64::MAX);
            // The deadline, for a write of a kind its `NOTIFY` (sent at the commit and only
            // then), `lock` taken (an advisory lock to the transaction's end: the statements
            // after it see what the write that held it committed) and the transaction's id:
            // one round trip.
            let (_, _, _, xid): (String, bool, bool, i64) = sqlx::query_as(
                "SELECT set_config('drg.deadline',
                   (clock_timestamp() + $1::float8 * interval '1 millisecond')::text, true),
                 (CASE WHEN $2 <> '' THEN pg_notify('drg_revision', $2) END) IS NULL,
                 (CASE WHEN $3 <> '' THEN pg_advisory_xact_lock(hashtextextended($3, 0)) END)
                   IS NULL,
                 txid_current()",
            )
            .bind(ms)
            .bind(tell.unwrap_or(""))
            .bind(lock.unwrap_or(""))
            .fetch_one(&mut *tx)
            .await?;
            Ok((tx, Some(xid)))
        }
        Engine::Sqlite => Ok((pool.begin_with("BEGIN IMMEDIATE").await?, None)),
    }
}

/// What the database says of a write's transaction whose `COMMIT` answer is late or lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Committed; or committed here and waiting on a synchronous standby (it is shown once
    /// the standby answers or the wait is given up: it never rolls back).
    Committed,
    /// Aborted: it never commits.
    Aborted,
    /// Still open in session `pid`: its `COMMIT` not come, waiting on a lock (another
    /// commit's, such as the one `NOTIFY` takes while that commit waits on a standby), or being
    /// made durable. Ending the session settles it: a commit made durable stays committed, any
    /// other rolls back.
    Open { pid: i32 },
}

/// The [`Fate`] of transaction `xid` (as `txid_current()` gave it): its status, and while it
/// is in progress what its session waits on, since a `COMMIT` waiting on a standby is in
/// progress to `txid_status` although it is committed here.
pub async fn fate(pool: &AnyPool, xid: i64) -> Result<Fate, sqlx::Error> {
    let (status, pid, wait): (Option<String>, Option<i32>, Option<String>) = sqlx::query_as(
        "SELECT txid_status($1), a.pid, a.wait_event::text
         FROM (SELECT 1) AS one LEFT JOIN pg_stat_activity AS a
           ON a.backend_xid::text = ($1 % 4294967296)::text",
    )
    .bind(xid)
    .fetch_one(pool)
    .await?;
    Ok(match (status.as_deref(), pid, wait.as_deref()) {
        (Some("committed"), ..) => Fate::Committed,
        (Some("in progress"), Some(_), Some("SyncRep")) => Fate::Committed,
        (Some("in progress"), Some(pid), _) => Fate::Open { pid },
        // Ending between the two looks: asked again.
        (Some("in progress"), None, _) => Fate::Open { pid: 0 },
        // Aborted, or too old to tell (it then ended long ago).
        _ => Fate::Aborted,
    })
}

/// Ends the session `pid` (a write's, whose `COMMIT` did not come by its deadline): its
/// transaction rolls back.
pub async fn end_session(pool: &AnyPool, pid: i32) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(pool)
        .await?;
    Ok(())
}

/// Applies the migrations the database lacks, in one transaction, under the engine's lock.
pub async fn migrate(engine: Engine, pool: &AnyPool) -> Result<(), ControlError> {
    let sql = |e| ControlError::Sql(engine.name(), e);
    let (mut tx, _) = begin_write(engine, pool, std::time::Duration::from_secs(60), None, None)
        .await
        .map_err(sql)?;
    if engine == Engine::Postgres {
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(sql)?;
    }
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS drg_schema (
           version BIGINT PRIMARY KEY,
           applied_at BIGINT NOT NULL)",
    )
    .execute(&mut *tx)
    .await
    .map_err(sql)?;
    let at: Option<i64> = sqlx::query_scalar("SELECT max(version) FROM drg_schema")
        .fetch_one(&mut *tx)
        .await
        .map_err(sql)?;
    for (version, migration) in MIGRATIONS.iter().filter(|(v, _)| Some(*v) > at) {
        let extra = (POSTGRES_ONLY.iter())
            .filter(|(v, _)| v == version && engine == Engine::Postgres)
            .map(|(_, m)| *m);
        for migration in std::iter::once(*migration).chain(extra) {
            sqlx::raw_sql(AssertSqlSafe(migration))
                .execute(&mut *tx)
                .await
                .map_err(sql)?;
        }
        sqlx::query("INSERT INTO drg_schema (version, applied_at) VALUES ($1, $2)")
            .bind(version)
            .bind(chrono::Utc::now().timestamp())
            .execute(&mut *tx)
            .await
            .map_err(sql)?;
        log::info!(
            "control store ({}): schema version {version} applied",
            engine.name()
        );
    }
    tx.commit().await.map_err(sql)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order() {
        let versions: Vec<i64> = MIGRATIONS.iter().map(|(v, _)| *v).collect();
        assert!(versions.windows(2).all(|w| w[0] < w[1]) && versions[0] == 1);
    }
}
