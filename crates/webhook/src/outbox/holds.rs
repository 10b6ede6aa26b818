//! Holds: a producer's own record of one hand-over in the outbox, found again by its key whatever
//! became of its messages (one per destination, maybe none), and kept until the producer's
//! `keep_until` even once they are settled and forgotten. A hold may start **held**: on disk, its
//! messages not delivered until the producer releases it, or dropped with them. That is what a
//! producer that must first win a claim elsewhere (on a store other processes share) writes
//! before it asks: a crash between its question and its answer leaves the held record with the
//! claim's token, and the restart asks again with it. The engine knows nothing of what a hold
//! stands for: the producer chooses its key, its scope (what it lists its holds by) and its token.

use rusqlite::{params, OptionalExtension};

use super::{insert, Outbox, OutboxError, State};
use crate::Message;

/// A producer's record of one hand-over (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// Unique in the outbox: a hand-over of a key it has already is not taken again.
    pub key: String,
    /// What the producer lists its holds by (its topic, say).
    pub scope: String,
    /// The producer's token, read back with the held ones ([`Outbox::held_rows`]).
    pub token: String,
    /// Its messages wait for [`Outbox::release`] (or go with [`Outbox::drop_held`]).
    pub held: bool,
    /// The record is forgotten after this (ms since the epoch), once no longer held.
    pub keep_until_ms: i64,
}

/// What the outbox made of a hand-over with a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// Taken, with its messages.
    New,
    /// Its key was here already (taken before, by this process or another on the file): left
    /// as it was.
    Known,
    /// `max_waiting` holds of its scope wait already: not taken.
    Full,
}

/// A hold still held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldRow {
    pub key: String,
    pub token: String,
}

/// Holds of a scope held, or with a message not yet settled. Read by the indexes of held holds
/// and of pending messages (few, unless receivers are down), never by every hold kept.
const WAITING: &str = "
SELECT (SELECT COUNT(*) FROM holds WHERE scope = ?1 AND state = 'held')
  + (SELECT COUNT(DISTINCT m.hold) FROM messages m JOIN holds h ON h.key = m.hold
     WHERE m.state = 'pending' AND h.scope = ?1)
";

impl Outbox {
    /// Takes each hold with its messages (due at `now_ms`), in one transaction: a hold whose key
    /// is here already is [`Enqueued::Known`] and left as it was, one past `max_waiting` holds
    /// of its scope waiting is [`Enqueued::Full`]. A message whose key is here already is left
    /// as it is (a producer of an earlier release handed it over without a hold).
    pub fn enqueue_holds(
        &mut self,
        holds: &[(Hold, Vec<Message>)],
        max_waiting: u64,
        now_ms: i64,
    ) -> Result<Vec<Enqueued>, OutboxError> {
        self.write(|tx| {
            let mut out = Vec::with_capacity(holds.len());
            for (hold, messages) in holds {
                let known = tx
                    .query_row(
                        "SELECT 1 FROM holds WHERE key = ?1",
                        [&hold.key],
                        |_| Ok(()),
                    )
                    .optional()?;
                if known.is_some() {
                    out.push(Enqueued::Known);
                    continue;
                }
                let waiting: i64 = tx.query_row(WAITING, [&hold.scope], |r| r.get(0))?;
                if u64::try_from(waiting).unwrap_or(0) >= max_waiting {
                    out.push(Enqueued::Full);
                    continue;
                }
                let (hold_state, state) = match hold.held {
                    true => ("held", State::Held),
                    false => ("released", State::Pending),
                };
                tx.execute(
                    "INSERT INTO holds (key, scope, token, state, keep_until, made_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![
                        hold.key,
                        hold.scope,
                        hold.token,
                        hold_state,
                        hold.keep_until_ms,
                        now_ms
                    ],
                )?;
                insert(tx, messages, state, Some(&hold.key), now_ms)?;
                out.push(Enqueued::New);
            }
            Ok(out)
        })
    }

    /// Releases a held hold: its messages are delivered from now on. Whether it was held
    /// (released already, by this process or another on the file: nothing changes).
    pub fn release(&mut self, key: &str) -> Result<bool, OutboxError> {
        self.resolve(key, "released", "UPDATE messages SET state = 'pending'")
    }

    /// Drops a held hold: its messages are never delivered and forgotten now; the record stays
    /// (its key is known until its `keep_until`). Whether it was held.
    pub fn drop_held(&mut self, key: &str) -> Result<bool, OutboxError> {
        self.resolve(key, "dropped", "DELETE FROM messages")
    }

    /// Moves a held hold to `state` and runs `messages` (a statement without its `WHERE`) on
    /// its held messages.
    fn resolve(&mut self, key: &str, state: &str, messages: &str) -> Result<bool, OutboxError> {
        self.write(|tx| {
            let n = tx.execute(
                "UPDATE holds SET state = ?2 WHERE key = ?1 AND state = 'held'",
                params![key, state],
            )?;
            tx.execute(
                &format!("{messages} WHERE hold = ?1 AND state = 'held'"),
                [key],
            )?;
            Ok(n > 0)
        })
    }

    /// Up to `limit` holds of `scope` still held, oldest first.
    pub fn held_rows(&self, scope: &str, limit: usize) -> Result<Vec<HeldRow>, OutboxError> {
        let mut stmt = self
            .conn()?
            .prepare_cached(
                "SELECT key, token FROM holds WHERE scope = ?1 AND state = 'held'
                 ORDER BY made_at, key LIMIT ?2",
            )
            .map_err(|e| self.sql(e))?;
        let rows = stmt
            .query_map(params![scope, limit as i64], |r| {
                Ok(HeldRow {
                    key: r.get(0)?,
                    token: r.get(1)?,
                })
            })
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>());
        rows.map_err(|e| self.sql(e))
    }

    /// The key of every hold of `scope` kept, whatever its state.
    pub fn hold_keys(&self, scope: &str) -> Result<Vec<String>, OutboxError> {
        let mut stmt = self
            .conn()?
            .prepare_cached("SELECT key FROM holds WHERE scope = ?1")
            .map_err(|e| self.sql(e))?;
        let rows = stmt
            .query_map([scope], |r| r.get(0))
            .and_then(|rows| rows.collect::<Result<Vec<_>, _>>());
        rows.map_err(|e| self.sql(e))
    }

    /// Forgets the holds kept past their `keep_until` that are no longer held; returns how many.
    pub fn prune_holds(&self, now_ms: i64) -> Result<usize, OutboxError> {
        self.execute(
            "DELETE FROM holds WHERE keep_until < ?1 AND state != 'held'",
            now_ms,
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn message(key: &str) -> Message {
        Message {
            key: key.into(),
            topic: "t".into(),
            label: "test message".into(),
            destination: "d".into(),
            lane: format!("lane-{key}"),
            id_header: "X-Id".into(),
            id: "id".into(),
            body: "{}".into(),
        }
    }

    fn hold(key: &str, held: bool) -> Hold {
        Hold {
            key: key.into(),
            scope: "s".into(),
            token: format!("token-{key}"),
            held,
            keep_until_ms: 1_000,
        }
    }

    fn due(o: &mut Outbox, now_ms: i64) -> Vec<String> {
        let rows = o.take_due(now_ms, Duration::from_secs(60), 10, &mut |_| true);
        let keys = rows.unwrap().into_iter().map(|r| r.message.key);
        keys.collect()
    }

    #[test]
    fn a_held_hold_is_kept_undelivered_until_released_or_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = Outbox::open(&dir.path().join("w.sqlite")).unwrap();
        let holds = [
            (hold("a", true), vec![message("a1"), message("a2")]),
            (hold("b", true), vec![message("b1")]),
            (hold("c", false), vec![message("c1")]),
            (hold("none", true), vec![]),
        ];
        let got = o.enqueue_holds(&holds, 10, 0).unwrap();
        assert_eq!(got, [Enqueued::New; 4]);
        assert_eq!(due(&mut o, 1), ["c1"], "only the released hold's");
        assert_eq!(o.waiting("t").unwrap(), 4, "held messages wait too");
        let held: Vec<_> = o.held_rows("s", 10).unwrap();
        assert_eq!(held.len(), 3);
        assert_eq!((&*held[0].key, &*held[0].token), ("a", "token-a"));
        // Again (a restart, another process on the file): known, left as it was.
        assert_eq!(
            o.enqueue_holds(&holds[..1], 10, 2).unwrap(),
            [Enqueued::Known]
        );
        assert!(o.release("a").unwrap());
        assert!(!o.release("a").unwrap(), "released once");
        assert!(o.drop_held("b").unwrap());
        assert!(!o.release("b").unwrap(), "dropped stays dropped");
        let mut released = due(&mut o, 3);
        released.sort();
        assert_eq!(released, ["a1", "a2"]);
        assert_eq!(o.waiting("t").unwrap(), 3, "b1 is gone");
        let mut keys = o.hold_keys("s").unwrap();
        keys.sort();
        assert_eq!(
            keys,
            ["a", "b", "c", "none"],
            "every record, whatever its state"
        );
        assert!(o.hold_keys("other").unwrap().is_empty());
    }

    #[test]
    fn holds_past_max_waiting_are_refused_and_kept_ones_forgotten_after_their_time() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = Outbox::open(&dir.path().join("w.sqlite")).unwrap();
        let first = [(hold("a", false), vec![message("a1")])];
        assert_eq!(o.enqueue_holds(&first, 1, 0).unwrap(), [Enqueued::New]);
        let second = [(hold("b", true), vec![message("b1")])];
        assert_eq!(o.enqueue_holds(&second, 1, 0).unwrap(), [Enqueued::Full]);
        // a1 delivered: a no longer waits, and b finds room.
        assert_eq!(due(&mut o, 1), ["a1"]);
        assert!(o.settle("a1", State::Sent, 2, None).unwrap());
        assert_eq!(o.enqueue_holds(&second, 1, 3).unwrap(), [Enqueued::New]);
        // b is held: it waits (for its release), and takes the one place.
        let third = [(hold("c", false), vec![])];
        assert_eq!(o.enqueue_holds(&third, 1, 4).unwrap(), [Enqueued::Full]);
        // Past its time a settled hold is forgotten; a held one is kept.
        assert_eq!(o.prune_holds(1_001).unwrap(), 1);
        assert_eq!(o.hold_keys("s").unwrap(), ["b"]);
        // The message outlives its hold's record (forgotten on its own schedule).
        assert_eq!(o.prune(3).unwrap(), 1);
    }

    #[test]
    fn an_outbox_of_an_earlier_release_gets_the_hold_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.sqlite");
        let old = rusqlite::Connection::open(&path).unwrap();
        old.execute_batch(
            "CREATE TABLE messages (key TEXT PRIMARY KEY, topic TEXT NOT NULL,
               label TEXT NOT NULL, destination TEXT NOT NULL, lane TEXT NOT NULL,
               id_header TEXT NOT NULL, id TEXT NOT NULL, body TEXT NOT NULL,
               seq INTEGER NOT NULL, state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
               next_at INTEGER NOT NULL, lease_until INTEGER NOT NULL DEFAULT 0,
               settled_at INTEGER, last_error TEXT) WITHOUT ROWID;
             INSERT INTO messages (key, topic, label, destination, lane, id_header, id, body,
               seq, state, next_at) VALUES ('old', 't', 'l', 'd', 'x', 'X-Id', 'i', '{}', 1,
               'pending', 0);",
        )
        .unwrap();
        drop(old);
        let mut o = Outbox::open(&path).unwrap();
        let holds = [(hold("a", false), vec![message("a1")])];
        assert_eq!(o.enqueue_holds(&holds, 10, 0).unwrap(), [Enqueued::New]);
        let mut keys = due(&mut o, 1);
        keys.sort();
        assert_eq!(keys, ["a1", "old"]);
    }
}
