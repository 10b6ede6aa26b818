//! The outbox: every message handed to the engine, in one SQLite file (`webhooks.sqlite` in the
//! state folder), with where its delivery stands. Written with `synchronous=FULL`: a message
//! the outbox took survives a crash, and the next start delivers it. Its key makes a hand-over
//! idempotent (a producer that crashed before it recorded the hand-over hands it again).
//! Messages of one lane go in order, one at a time, across every gateway sharing the file (the
//! head of a lane is leased while it is tried). A lease names its holder (`holder.rs`): a gone
//! holder's lease is taken again at once, and only the holder settles its message. A producer may
//! also keep a record of a hand-over of its own there, held back from delivery until it says so
//! (`outbox/holds.rs`).

mod holds;

use std::path::{Path, PathBuf};
use std::time::Duration;

use drg_base::infra::sqlite;
use rusqlite::{params, Connection};

use crate::holder::Holder;
use crate::Message;

pub use holds::{Enqueued, HeldRow, Hold};

/// Where a message stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Its hold (`outbox/holds.rs`) is not released yet: kept, not delivered.
    Held,
    Pending,
    Sent,
    /// Given up: `max_attempts` failed, or the guard refused the receiver.
    Failed,
    /// Its destination is gone (a project's webhook removed) before it was sent.
    Dropped,
}

impl State {
    pub fn text(self) -> &'static str {
        match self {
            State::Held => "held",
            State::Pending => "pending",
            State::Sent => "sent",
            State::Failed => "failed",
            State::Dropped => "dropped",
        }
    }
}

/// One message taken for an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub message: Message,
    /// Attempts made before this one.
    pub attempts: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("webhook outbox {path}: {source}")]
    Sqlite {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("webhook outbox {0}")]
    Open(#[from] sqlite::OpenError),
    #[error("webhook outbox {path}: the lease holder's lock: {source}")]
    Holder {
        path: PathBuf,
        source: std::io::Error,
    },
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS messages (
  key TEXT PRIMARY KEY,
  topic TEXT NOT NULL,
  label TEXT NOT NULL,
  destination TEXT NOT NULL,
  lane TEXT NOT NULL,
  id_header TEXT NOT NULL,
  id TEXT NOT NULL,
  body TEXT NOT NULL,
  seq INTEGER NOT NULL,
  state TEXT NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  next_at INTEGER NOT NULL,
  lease_until INTEGER NOT NULL DEFAULT 0,
  settled_at INTEGER,
  last_error TEXT,
  holder TEXT NOT NULL DEFAULT '',
  hold TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS messages_lane ON messages (state, lane, seq);
CREATE INDEX IF NOT EXISTS messages_settled ON messages (state, settled_at);
CREATE TABLE IF NOT EXISTS holds (
  key TEXT PRIMARY KEY,
  scope TEXT NOT NULL,
  token TEXT NOT NULL,
  state TEXT NOT NULL,
  keep_until INTEGER NOT NULL,
  made_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS holds_scope ON holds (scope, state);
";

/// Columns an outbox made by an earlier release lacks, added at open: their name and type.
const ADDED_COLUMNS: [(&str, &str); 2] = [("holder", "TEXT NOT NULL DEFAULT ''"), ("hold", "TEXT")];

/// What needs an added column (see [`ADDED_COLUMNS`]): made once they are all there.
const AFTER_COLUMNS: &str = "CREATE INDEX IF NOT EXISTS messages_hold ON messages (hold);";

/// The head of every lane with pending messages: due, and not leased by another deliverer.
const HEADS: &str = "
SELECT key, topic, destination, lane, id_header, id, body, attempts, next_at, lease_until, label,
  holder
FROM messages m
WHERE state = 'pending' AND seq = (
  SELECT MIN(seq) FROM messages o WHERE o.state = 'pending' AND o.lane = m.lane)
";

/// The outbox file, open.
pub struct Outbox {
    conn: std::cell::OnceCell<Connection>,
    path: PathBuf,
    holder: Holder,
}

/// A message handed over is a promise to deliver: on disk before the producer counts it.
fn connect(path: &Path) -> rusqlite::Result<Connection> {
    sqlite::connect(path, sqlite::Synchronous::Full)
}

impl Outbox {
    /// Opens (or creates, private to the owner) the outbox at `path`, then closes the
    /// connection: the process that serves opens its own at first use (a host may fork into a
    /// daemon after this, and a connection carried across a fork holds none of its locks).
    pub fn open(path: &Path) -> Result<Outbox, OutboxError> {
        sqlite::prepare(path, sqlite::Synchronous::Full, SCHEMA)?;
        let outbox = Outbox {
            conn: std::cell::OnceCell::new(),
            path: path.to_owned(),
            holder: Holder::new(path),
        };
        outbox.add_columns()?;
        Ok(outbox)
    }

    /// An outbox made by an earlier release gets the columns it lacks: before leases named their
    /// holder (its leases are then judged by their time alone), before holds (its messages
    /// belong to none).
    fn add_columns(&self) -> Result<(), OutboxError> {
        let conn = connect(&self.path).map_err(|e| self.sql(e))?;
        for (name, kind) in ADDED_COLUMNS {
            let has: bool = conn
                .query_row(
                    "SELECT COUNT(*) FROM pragma_table_info('messages') WHERE name = ?1",
                    [name],
                    |r| r.get::<_, i64>(0),
                )
                .map(|n| n > 0)
                .map_err(|e| self.sql(e))?;
            if !has {
                conn.execute_batch(&format!("ALTER TABLE messages ADD COLUMN {name} {kind}"))
                    .map_err(|e| self.sql(e))?;
            }
        }
        conn.execute_batch(AFTER_COLUMNS).map_err(|e| self.sql(e))
    }

    /// Another handle on the same file, with a connection of its own (opened at first use):
    /// the producers' writes then never wait behind the deliverer's, which may be waiting out
    /// another writer's lock.
    pub fn sibling(&self) -> Outbox {
        Outbox {
            conn: std::cell::OnceCell::new(),
            path: self.path.clone(),
            holder: Holder::new(&self.path),
        }
    }

    /// Closes the connection (the next use opens one): what a process reads before it forks
    /// into a daemon is not carried across the fork.
    pub fn close(&mut self) {
        self.conn.take();
    }

    /// This deliverer's id in the leases.
    pub fn holder(&self) -> &str {
        self.holder.id()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

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

    /// Takes `messages` in one transaction, due at `now_ms`; a key already here (pending or
    /// settled) is left as it is. Returns how many were new.
    pub fn enqueue(&mut self, messages: &[Message], now_ms: i64) -> Result<usize, OutboxError> {
        self.write(|tx| insert(tx, messages, State::Pending, None, now_ms))
    }

    /// Runs `f` in one write transaction (taken at once: two writers never deadlock upgrading a
    /// read), committed when it returns `Ok`.
    fn write<T>(
        &mut self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, OutboxError> {
        self.conn()?;
        let path = self.path.clone();
        let sql = |source| OutboxError::Sqlite { path, source };
        let conn = self.conn.get_mut().expect("opened above");
        let run = || {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        };
        run().map_err(sql)
    }

    /// Takes up to `limit` lane heads that are due and not leased (or leased by a holder that
    /// is gone), each only if `admit` lets it (the deliverer's lanes tried already, its slots),
    /// leasing each to this holder until `now_ms + lease`: a deliverer that dies mid-way leaves
    /// its message to the next, at once where the next can tell it is gone.
    pub fn take_due(
        &mut self,
        now_ms: i64,
        lease: Duration,
        limit: usize,
        admit: &mut dyn FnMut(&Message) -> bool,
    ) -> Result<Vec<Row>, OutboxError> {
        let until = now_ms + i64::try_from(lease.as_millis()).unwrap_or(i64::MAX / 2);
        self.holder.ensure().map_err(|source| OutboxError::Holder {
            path: self.path.clone(),
            source,
        })?;
        self.conn()?;
        let holder = &self.holder;
        let path = self.path.clone();
        let sql = |source| OutboxError::Sqlite {
            path: path.clone(),
            source,
        };
        let conn = self.conn.get_mut().expect("opened above");
        let tx = conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql)?;
        let mut taken = Vec::new();
        {
            let mut stmt = tx.prepare_cached(HEADS).map_err(sql)?;
            let mut rows = stmt.query([]).map_err(sql)?;
            while let Some(r) = rows.next().map_err(sql)? {
                let (next_at, lease_until): (i64, i64) =
                    (r.get(8).map_err(sql)?, r.get(9).map_err(sql)?);
                let leased_by: String = r.get(11).map_err(sql)?;
                if next_at > now_ms || (lease_until > now_ms && !holder.is_gone(&leased_by)) {
                    continue;
                }
                let message = Message {
                    key: r.get(0).map_err(sql)?,
                    topic: r.get(1).map_err(sql)?,
                    label: r.get(10).map_err(sql)?,
                    destination: r.get(2).map_err(sql)?,
                    lane: r.get(3).map_err(sql)?,
                    id_header: r.get(4).map_err(sql)?,
                    id: r.get(5).map_err(sql)?,
                    body: r.get(6).map_err(sql)?,
                };
                if !admit(&message) {
                    continue;
                }
                taken.push(Row {
                    message,
                    attempts: r.get(7).map_err(sql)?,
                });
                if taken.len() == limit {
                    break;
                }
            }
        }
        for row in &taken {
            tx.execute(
                "UPDATE messages SET lease_until = ?2, holder = ?3 WHERE key = ?1",
                params![row.message.key, until, holder.id()],
            )
            .map_err(sql)?;
        }
        tx.commit().map_err(sql)?;
        Ok(taken)
    }

    /// Settles a message (sent, given up or dropped) if this deliverer still holds its lease:
    /// whether it did (another took it over: that one settles it).
    pub fn settle(
        &self,
        key: &str,
        state: State,
        now_ms: i64,
        error: Option<&str>,
    ) -> Result<bool, OutboxError> {
        self.conn()?
            .execute(
                "UPDATE messages SET state = ?2, settled_at = ?3, lease_until = 0,
                 attempts = attempts + (?2 != 'dropped'), last_error = COALESCE(?4, last_error)
                 WHERE key = ?1 AND holder = ?5 AND state = 'pending'",
                params![key, state.text(), now_ms, error, self.holder.id()],
            )
            .map(|n| n > 0)
            .map_err(|e| self.sql(e))
    }

    /// Books a failed attempt if this deliverer still holds its lease: the message is due
    /// again at `next_at_ms`. Whether it did.
    pub fn retry_at(&self, key: &str, next_at_ms: i64, error: &str) -> Result<bool, OutboxError> {
        self.conn()?
            .execute(
                "UPDATE messages SET attempts = attempts + 1, next_at = ?2, lease_until = 0,
                 last_error = ?3 WHERE key = ?1 AND holder = ?4 AND state = 'pending'",
                params![key, next_at_ms, error, self.holder.id()],
            )
            .map(|n| n > 0)
            .map_err(|e| self.sql(e))
    }

    /// Messages of `topic` not yet settled (held ones too).
    pub fn waiting(&self, topic: &str) -> Result<u64, OutboxError> {
        self.conn()?
            .query_row(
                "SELECT COUNT(*) FROM messages WHERE state IN ('pending', 'held') AND topic = ?1",
                [topic],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n.max(0) as u64)
            .map_err(|e| self.sql(e))
    }

    /// Forgets messages settled before `before_ms`; returns how many.
    pub fn prune(&self, before_ms: i64) -> Result<usize, OutboxError> {
        self.execute(
            "DELETE FROM messages WHERE state NOT IN ('pending', 'held') AND settled_at < ?1",
            before_ms,
        )
    }

    /// Runs `sql` with its one parameter; returns how many rows it changed.
    fn execute(&self, sql: &str, arg: impl rusqlite::ToSql) -> Result<usize, OutboxError> {
        self.conn()?.execute(sql, [arg]).map_err(|e| self.sql(e))
    }
}

/// Inserts `messages` in `state`, belonging to `hold` if any, each after the file's last in its
/// order; a key already here is left as it is. Returns how many were new.
fn insert(
    tx: &rusqlite::Transaction<'_>,
    messages: &[Message],
    state: State,
    hold: Option<&str>,
    now_ms: i64,
) -> rusqlite::Result<usize> {
    let mut seq: i64 = tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM messages", [], |r| {
        r.get(0)
    })?;
    let mut new = 0;
    for m in messages {
        seq += 1;
        new += tx.execute(
            "INSERT OR IGNORE INTO messages
             (key, topic, destination, lane, id_header, id, body, seq, state, next_at, label, hold)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            params![
                m.key,
                m.topic,
                m.destination,
                m.lane,
                m.id_header,
                m.id,
                m.body,
                seq,
                state.text(),
                now_ms,
                m.label,
                hold
            ],
        )?;
    }
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(key: &str, lane: &str) -> Message {
        Message {
            key: key.into(),
            topic: "t".into(),
            label: "test message".into(),
            destination: "d".into(),
            lane: lane.into(),
            id_header: "X-Id".into(),
            id: key.into(),
            body: "{}".into(),
        }
    }

    fn keys(rows: &[Row]) -> Vec<&str> {
        rows.iter().map(|r| &*r.message.key).collect()
    }

    #[test]
    fn lanes_go_in_order_one_at_a_time_and_a_hand_over_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = Outbox::open(&dir.path().join("w.sqlite")).unwrap();
        let all = [message("a1", "a"), message("a2", "a"), message("b1", "b")];
        assert_eq!(o.enqueue(&all, 0).unwrap(), 3);
        assert_eq!(o.enqueue(&all[..1], 0).unwrap(), 0, "a key is taken once");
        let lease = Duration::from_secs(60);
        let mut all_in = |_: &Message| true;
        let first = o.take_due(10, lease, 10, &mut all_in).unwrap();
        assert_eq!(keys(&first), ["a1", "b1"]);
        // Leased: nothing more until they settle (a2 waits behind a1).
        assert!(o.take_due(20, lease, 10, &mut all_in).unwrap().is_empty());
        o.retry_at("a1", 1_000, "503").unwrap();
        o.settle("b1", State::Sent, 30, None).unwrap();
        // a1 backs off, and a2 waits behind it: order within a lane.
        assert!(o.take_due(40, lease, 10, &mut all_in).unwrap().is_empty());
        let again = o.take_due(1_000, lease, 10, &mut all_in).unwrap();
        assert_eq!(keys(&again), ["a1"]);
        assert_eq!(again[0].attempts, 1);
        o.settle("a1", State::Sent, 1_001, None).unwrap();
        let mut not_a = |m: &Message| m.lane != "a";
        assert!(o.take_due(1_002, lease, 10, &mut not_a).unwrap().is_empty());
        assert_eq!(
            keys(&o.take_due(1_002, lease, 10, &mut all_in).unwrap()),
            ["a2"]
        );
        assert_eq!(o.waiting("t").unwrap(), 1);
        assert_eq!(o.prune(1_001).unwrap(), 1, "b1 only");
    }

    #[test]
    fn a_gone_holders_lease_is_taken_at_once_and_only_the_holder_settles() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.sqlite");
        let lease = Duration::from_secs(60);
        let mut first = Outbox::open(&path).unwrap();
        first.enqueue(&[message("m1", "a")], 0).unwrap();
        let mut all_in = |_: &Message| true;
        assert_eq!(
            keys(&first.take_due(10, lease, 10, &mut all_in).unwrap()),
            ["m1"]
        );
        // Another deliverer on the file: the lease is alive while its holder is.
        let mut second = Outbox::open(&path).unwrap();
        assert!(second
            .take_due(20, lease, 10, &mut all_in)
            .unwrap()
            .is_empty());
        // The first dies (its connection and lock go with it): taken again at once.
        drop(first);
        let again = second.take_due(30, lease, 10, &mut all_in).unwrap();
        assert_eq!(keys(&again), ["m1"]);
        assert_eq!(again[0].message.id, "m1", "the same id");
        // A third that took it over settles; the second, no longer holding it, cannot.
        let mut third = Outbox::open(&path).unwrap();
        let (id, _) = (second.holder().to_owned(), ());
        drop(second);
        assert_eq!(
            keys(&third.take_due(40, lease, 10, &mut all_in).unwrap()),
            ["m1"]
        );
        assert!(third.settle("m1", State::Sent, 50, None).unwrap());
        assert!(
            !third.settle("m1", State::Failed, 60, None).unwrap(),
            "settled once"
        );
        assert_ne!(id, third.holder());
        assert_eq!(third.waiting("t").unwrap(), 0);
    }
}
