//! The outbox: every alert this host claimed, in a SQLite file beside the quota state file, with
//! where its delivery stands. Its primary key is (project, month, threshold), so an alert exists
//! once however many gateways on the host notice it; rows are written with `synchronous=FULL`,
//! so a claimed alert survives a crash and a restart delivers it. Gateways sharing the file
//! (a graceful upgrade, several on one host) take due rows under a lease, one deliverer each.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

/// Where an alert stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Recorded here; Redis has not confirmed the claim yet (shared quota store only).
    Claiming,
    /// Claimed; to hand to the webhook engine.
    Pending,
    /// In the webhook engine's outbox (which delivers it).
    Handed,
    /// Delivered or given up by a version that delivered alerts itself.
    Sent,
    Failed,
    /// Another gateway claimed it first.
    Elsewhere,
}

impl State {
    fn text(self) -> &'static str {
        match self {
            State::Claiming => "claiming",
            State::Pending => "pending",
            State::Handed => "handed",
            State::Sent => "sent",
            State::Failed => "failed",
            State::Elsewhere => "elsewhere",
        }
    }
}

/// One alert's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub project: String,
    pub month: String,
    pub threshold: u32,
    /// Random, fixed at the claim: the Redis claim's token and the `X-Alert-Id` of every attempt.
    pub id: String,
    /// The payload, fixed at the claim (every attempt signs and sends the same bytes).
    pub body: String,
    pub attempts: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("quota alerts outbox {path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("quota alerts outbox {0}")]
    Open(#[from] drg_base::infra::sqlite::OpenError),
}

/// A row of `SELECT project, month, threshold, id, body, attempts`.
fn row_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok(Row {
        project: r.get(0)?,
        month: r.get(1)?,
        threshold: r.get(2)?,
        id: r.get(3)?,
        body: r.get(4)?,
        attempts: r.get(5)?,
    })
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS alerts (
  project TEXT NOT NULL,
  month TEXT NOT NULL,
  threshold INTEGER NOT NULL,
  id TEXT NOT NULL,
  state TEXT NOT NULL,
  body TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  next_at INTEGER NOT NULL,
  lease_until INTEGER NOT NULL DEFAULT 0,
  last_error TEXT,
  PRIMARY KEY (project, month, threshold)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS alerts_due ON alerts (state, next_at);
";

/// The outbox file, open.
pub struct Outbox {
    conn: std::cell::OnceCell<Connection>,
    path: PathBuf,
}

impl Outbox {
    /// Opens (or creates, private to the owner) the outbox at `path`.
    pub fn open(path: &Path) -> Result<Outbox, OutboxError> {
        // Closed again: the process that serves opens its own at first use (see `conn`).
        let sync = drg_base::infra::sqlite::Synchronous::Full;
        drg_base::infra::sqlite::prepare(path, sync, SCHEMA)?;
        Ok(Outbox {
            conn: std::cell::OnceCell::new(),
            path: path.to_owned(),
        })
    }

    /// Closes the connection (the next use opens one): what a process reads before it forks
    /// into a daemon is not carried across the fork.
    pub fn close(&mut self) {
        self.conn.take();
    }

    /// The connection, opened at first use: a host's Pingora daemon mode forks after the
    /// outbox is opened, and a connection carried across a fork holds none of its POSIX locks
    /// in the child (another opener then deletes the live `-wal`).
    fn conn(&self) -> Result<&Connection, OutboxError> {
        if let Some(conn) = self.conn.get() {
            return Ok(conn);
        }
        let conn = connect(&self.path).map_err(|e| self.sql(e))?;
        Ok(self.conn.get_or_init(|| conn))
    }

    fn sql(&self, source: rusqlite::Error) -> OutboxError {
        OutboxError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Alerts not yet delivered or given up (claiming or pending).
    pub fn waiting(&self) -> Result<u64, OutboxError> {
        self.conn()?
            .query_row(
                "SELECT COUNT(*) FROM alerts WHERE state IN ('claiming', 'pending')",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n.max(0) as u64)
            .map_err(|e| self.sql(e))
    }

    /// Records `row` in `state` unless its (project, month, threshold) is there already;
    /// returns whether it was recorded.
    pub fn insert(&self, row: &Row, state: State, now_ms: i64) -> Result<bool, OutboxError> {
        self.conn()?
            .execute(
                "INSERT OR IGNORE INTO alerts (project, month, threshold, id, state, body, next_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    row.project,
                    row.month,
                    row.threshold,
                    row.id,
                    state.text(),
                    row.body,
                    now_ms
                ],
            )
            .map(|n| n == 1)
            .map_err(|e| self.sql(e))
    }

    /// The state of an alert, if recorded.
    pub fn state_of(
        &self,
        project: &str,
        month: &str,
        threshold: u32,
    ) -> Result<Option<String>, OutboxError> {
        self.conn()?
            .query_row(
                "SELECT state FROM alerts WHERE project = ?1 AND month = ?2 AND threshold = ?3",
                params![project, month, threshold],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.sql(e))
    }

    /// The (project, threshold) of every alert of `month` (`YYYY-MM`) recorded here, whatever
    /// its state: what no call needs to offer again.
    pub fn recorded_in(&self, month: &str) -> Result<Vec<(String, u32)>, OutboxError> {
        let mut stmt = self
            .conn()?
            .prepare_cached("SELECT project, threshold FROM alerts WHERE month = ?1")
            .map_err(|e| self.sql(e))?;
        let rows = stmt
            .query_map(params![month], |r| Ok((r.get(0)?, r.get(1)?)))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>());
        rows.map_err(|e| self.sql(e))
    }

    /// Moves an alert to `state` (from any), clearing its lease.
    pub fn set_state(&self, row: &Row, state: State) -> Result<(), OutboxError> {
        self.conn()?
            .execute(
                "UPDATE alerts SET state = ?4, lease_until = 0
                 WHERE project = ?1 AND month = ?2 AND threshold = ?3",
                params![row.project, row.month, row.threshold, state.text()],
            )
            .map(drop)
            .map_err(|e| self.sql(e))
    }

    /// Alerts whose Redis claim is still to be confirmed.
    pub fn claiming(&self, limit: usize) -> Result<Vec<Row>, OutboxError> {
        self.rows(
            "SELECT project, month, threshold, id, body, attempts FROM alerts
             WHERE state = 'claiming' LIMIT ?1",
            params![limit as i64],
        )
    }

    fn rows(&self, sql: &str, args: impl rusqlite::Params) -> Result<Vec<Row>, OutboxError> {
        let mut stmt = self.conn()?.prepare_cached(sql).map_err(|e| self.sql(e))?;
        let rows = stmt
            .query_map(args, row_of)
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>());
        rows.map_err(|e| self.sql(e))
    }

    /// Takes up to `limit` pending alerts that are due and not leased by another deliverer,
    /// leasing them for `lease` (an attempt's budget and some): a deliverer that dies mid-way
    /// leaves them to the next after that.
    pub fn take_due(
        &mut self,
        now_ms: i64,
        lease: Duration,
        limit: usize,
    ) -> Result<Vec<Row>, OutboxError> {
        let until = now_ms + i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2);
        let path = self.path.clone();
        let sql = |source| OutboxError::Sqlite {
            path: path.clone(),
            source,
        };
        self.conn()?;
        let conn = self
            .conn
            .get_mut()
            .ok_or_else(|| sql(rusqlite::Error::InvalidQuery))?;
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql)?;
        let rows = {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT project, month, threshold, id, body, attempts FROM alerts
                     WHERE state = 'pending' AND next_at <= ?1 AND lease_until <= ?1
                     ORDER BY next_at LIMIT ?2",
                )
                .map_err(sql)?;
            let rows = stmt
                .query_map(params![now_ms, limit as i64], row_of)
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(sql)?;
            rows
        };
        for row in &rows {
            tx.execute(
                "UPDATE alerts SET lease_until = ?4
                 WHERE project = ?1 AND month = ?2 AND threshold = ?3",
                params![row.project, row.month, row.threshold, until],
            )
            .map_err(sql)?;
        }
        tx.commit().map_err(sql)?;
        Ok(rows)
    }

    /// Books a failed attempt: due again at `next_at_ms`, or given up (`State::Failed`) when
    /// `give_up`.
    pub fn attempt_failed(
        &self,
        row: &Row,
        next_at_ms: i64,
        give_up: bool,
        error: &str,
    ) -> Result<(), OutboxError> {
        let state = if give_up {
            State::Failed
        } else {
            State::Pending
        };
        self.conn()?
            .execute(
                "UPDATE alerts SET attempts = attempts + 1, next_at = ?4, lease_until = 0,
                 last_error = ?5, state = ?6
                 WHERE project = ?1 AND month = ?2 AND threshold = ?3",
                params![
                    row.project,
                    row.month,
                    row.threshold,
                    next_at_ms,
                    error,
                    state.text()
                ],
            )
            .map(drop)
            .map_err(|e| self.sql(e))
    }

    /// Forgets settled alerts of months before `month` (`YYYY-MM`): an alert is only ever
    /// claimed in its own month, so they can never be asked for again.
    pub fn prune(&self, month: &str) -> Result<usize, OutboxError> {
        self.conn()?
            .execute(
                "DELETE FROM alerts WHERE month < ?1 AND state IN ('handed', 'sent', 'failed', 'elsewhere')",
                params![month],
            )
            .map_err(|e| self.sql(e))
    }
}

/// A connection to the outbox at `path`: WAL, and every write on disk before it returns.
/// A claim is a promise to deliver: on disk before it counts.
fn connect(path: &Path) -> rusqlite::Result<Connection> {
    drg_base::infra::sqlite::connect(path, drg_base::infra::sqlite::Synchronous::Full)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(threshold: u32) -> Row {
        Row {
            project: "acme".into(),
            month: "2026-11".into(),
            threshold,
            id: format!("id{threshold}"),
            body: "{}".into(),
            attempts: 0,
        }
    }

    #[test]
    fn an_alert_is_recorded_once_and_leased_to_one_deliverer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("o.sqlite");
        let mut a = Outbox::open(&path).unwrap();
        let b = Outbox::open(&path).unwrap();
        assert!(a.insert(&row(80), State::Pending, 0).unwrap());
        assert!(!b.insert(&row(80), State::Pending, 0).unwrap(), "once");
        assert_eq!(a.waiting().unwrap(), 1);
        let lease = Duration::from_secs(10);
        let taken = a.take_due(5, lease, 10).unwrap();
        assert_eq!(taken.len(), 1);
        let mut b = b;
        assert!(b.take_due(6, lease, 10).unwrap().is_empty(), "leased");
        // A failed attempt: due again later, whoever delivers.
        a.attempt_failed(&taken[0], 1_000, false, "500").unwrap();
        assert!(b.take_due(999, lease, 10).unwrap().is_empty());
        let again = b.take_due(1_000, lease, 10).unwrap();
        assert_eq!(again[0].attempts, 1);
        b.set_state(&again[0], State::Sent).unwrap();
        assert_eq!(a.waiting().unwrap(), 0);
        assert_eq!(a.prune("2026-12").unwrap(), 1);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn what_a_month_holds_is_listed_whatever_its_state() {
        let dir = tempfile::tempdir().unwrap();
        let o = Outbox::open(&dir.path().join("o.sqlite")).unwrap();
        o.insert(&row(80), State::Pending, 0).unwrap();
        o.insert(&row(90), State::Claiming, 0).unwrap();
        o.set_state(&row(80), State::Sent).unwrap();
        let december = Row {
            month: "2026-12".into(),
            ..row(100)
        };
        o.insert(&december, State::Pending, 0).unwrap();
        let mut got = o.recorded_in("2026-11").unwrap();
        got.sort();
        assert_eq!(got, [("acme".into(), 80), ("acme".into(), 90)]);
        assert!(o.recorded_in("2026-10").unwrap().is_empty());
    }

    #[test]
    fn a_lease_of_a_dead_deliverer_runs_out() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = Outbox::open(&dir.path().join("o.sqlite")).unwrap();
        o.insert(&row(90), State::Pending, 0).unwrap();
        assert_eq!(
            o.take_due(0, Duration::from_millis(100), 5).unwrap().len(),
            1
        );
        assert!(o
            .take_due(50, Duration::from_millis(100), 5)
            .unwrap()
            .is_empty());
        assert_eq!(
            o.take_due(100, Duration::from_millis(100), 5)
                .unwrap()
                .len(),
            1
        );
    }
}
