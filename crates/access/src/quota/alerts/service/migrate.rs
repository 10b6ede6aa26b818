//! The previous release's own alerts outbox (`quota_alerts.sqlite` beside the quota state file,
//! or `gateway.quota.alerts.outbox_file`), carried into the webhook engine's so that an upgrade
//! neither loses nor repeats an alert. Its alerts of the month are known to the request path from
//! the start ([`recorded_in`]); at the service's first pass each alert not carried yet becomes a
//! hold: one waiting for its Redis claim (`claiming`) a held hold with the same token, asked
//! again as before; one claimed and not yet handed over (`pending`) a hold with its messages,
//! the same id and body bytes (and the same message keys, so one the previous release handed
//! over already is not taken twice); one done with (`handed`, `sent`, `failed`, `elsewhere`) a
//! hold without messages, the record that its threshold is done. Then its rows are marked
//! `migrated` in that file, never read again: a crash before the mark carries them again, as
//! holds the outbox knows already. The file is left for the operator (and for a gateway of the
//! previous release still running beside this one during an upgrade, which reads it).

use std::path::{Path, PathBuf};

use drg_webhook::outbox::Hold;
use drg_webhook::Message;
use rusqlite::{params, Connection, OptionalExtension};

use super::{now_ms, AlertService, RunError, TOPIC};
use crate::quota::alerts::handover::Outgoing;

/// Why the previous outbox could not be read or marked.
#[derive(Debug, thiserror::Error)]
#[error("quota alerts: previous outbox {path}: {source}")]
pub struct MigrateError {
    path: PathBuf,
    source: rusqlite::Error,
}

/// One alert of the previous outbox not carried over yet.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OldRow {
    outgoing: Outgoing,
    state: String,
}

/// The previous outbox at `path`, if there is one with its table (it is never created).
fn open(path: &Path) -> Result<Option<Connection>, MigrateError> {
    let err = |source| MigrateError {
        path: path.to_owned(),
        source,
    };
    if !path.exists() {
        return Ok(None);
    }
    let conn = drg_base::infra::sqlite::connect(path, drg_base::infra::sqlite::Synchronous::Full)
        .map_err(err)?;
    let table = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alerts'",
            [],
            |_| Ok(()),
        )
        .optional()
        .map_err(err)?;
    Ok(table.map(|()| conn))
}

/// The (project, threshold) of every alert of `month` (`YYYY-MM`) the previous outbox at `path`
/// holds, whatever its state: what no call needs to offer again. Read at start, the file closed
/// again (the process that serves may be a fork of this one).
pub fn recorded_in(path: &Path, month: &str) -> Result<Vec<(String, u32)>, MigrateError> {
    let Some(conn) = open(path)? else {
        return Ok(Vec::new());
    };
    let rows = conn
        .prepare("SELECT project, threshold FROM alerts WHERE month = ?1")
        .and_then(|mut stmt| {
            let rows = stmt.query_map(params![month], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<Result<Vec<_>, _>>()
        });
    rows.map_err(|source| MigrateError {
        path: path.to_owned(),
        source,
    })
}

/// The alerts of the previous outbox at `path` not carried over yet.
fn unmigrated(path: &Path) -> Result<Vec<OldRow>, MigrateError> {
    let Some(conn) = open(path)? else {
        return Ok(Vec::new());
    };
    let rows = conn
        .prepare(
            "SELECT project, month, threshold, id, body, state FROM alerts
             WHERE state != 'migrated'",
        )
        .and_then(|mut stmt| {
            let rows = stmt.query_map([], |r| {
                let outgoing = Outgoing {
                    project: r.get(0)?,
                    month: r.get(1)?,
                    threshold: r.get(2)?,
                    id: r.get(3)?,
                    body: r.get(4)?,
                };
                Ok(OldRow {
                    outgoing,
                    state: r.get(5)?,
                })
            })?;
            rows.collect::<Result<Vec<_>, _>>()
        });
    rows.map_err(|source| MigrateError {
        path: path.to_owned(),
        source,
    })
}

/// Marks `rows` carried over, in one transaction.
fn mark(path: &Path, rows: &[OldRow]) -> Result<(), MigrateError> {
    let Some(mut conn) = open(path)? else {
        return Ok(());
    };
    let mut run = || {
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        for row in rows {
            let o = &row.outgoing;
            tx.execute(
                "UPDATE alerts SET state = 'migrated'
                 WHERE project = ?1 AND month = ?2 AND threshold = ?3",
                params![o.project, o.month, o.threshold],
            )?;
        }
        tx.commit()
    };
    run().map_err(|source| MigrateError {
        path: path.to_owned(),
        source,
    })
}

impl AlertService {
    /// What `row` becomes in the webhook outbox (see the module documentation); `None` for a
    /// state no release wrote.
    fn carried(&self, row: &OldRow, now_ms: i64) -> Option<(Hold, Vec<Message>)> {
        let o = &row.outgoing;
        let (held, messages) = match row.state.as_str() {
            "claiming" => (true, true),
            "pending" => (false, true),
            "handed" | "sent" | "failed" | "elsewhere" => (false, false),
            _ => return None,
        };
        let messages = match messages {
            true => o.messages(self.subscribers.destinations(&o.project, TOPIC)),
            false => Vec::new(),
        };
        Some((o.hold(held, now_ms), messages))
    }

    /// Carries the previous outbox's alerts not carried yet into the webhook outbox, then marks
    /// them (see the module documentation); returns how many.
    pub(super) async fn carry_over(&self) -> Result<usize, RunError> {
        let path = self.previous.clone();
        let rows = tokio::task::spawn_blocking(move || unmigrated(&path)).await??;
        if rows.is_empty() {
            return Ok(0);
        }
        let now = now_ms();
        let holds: Vec<_> = rows.iter().filter_map(|r| self.carried(r, now)).collect();
        // Never full: these alerts were taken in already, by the previous release.
        self.sender.send_held(holds, u64::MAX).await?;
        let n = rows.len();
        let path = self.previous.clone();
        tokio::task::spawn_blocking(move || mark(&path, &rows)).await??;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::keys::KeyEntry;
    use crate::quota::alerts::config::AlertsConfig;
    use crate::quota::alerts::handover::hold_key;
    use crate::quota::alerts::service::build;
    use crate::quota::{Month, Usage};

    /// An engine's producers' handle on the outbox at `path` (its deliverer never runs).
    fn engine(path: &Path) -> drg_webhook::Sender {
        let gone: Arc<dyn drg_webhook::Directory> = Arc::new(Gone);
        let observer = Arc::new(drg_webhook::Unobserved);
        drg_webhook::engine::open(path, gone, observer).unwrap().1
    }

    /// When the tests run, for the quota clock: November 2026.
    fn now() -> chrono::DateTime<chrono::Utc> {
        "2026-11-23T12:00:00Z".parse().unwrap()
    }

    /// The previous release's schema, as it wrote it.
    const OLD_SCHEMA: &str = "
    CREATE TABLE alerts (
      project TEXT NOT NULL, month TEXT NOT NULL, threshold INTEGER NOT NULL, id TEXT NOT NULL,
      state TEXT NOT NULL, body TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
      next_at INTEGER NOT NULL, lease_until INTEGER NOT NULL DEFAULT 0, last_error TEXT,
      PRIMARY KEY (project, month, threshold)
    ) WITHOUT ROWID;";

    struct Operator;

    impl drg_webhook::Subscribers for Operator {
        fn destinations(&self, _: &str, _: &str) -> Vec<String> {
            vec!["operator:quota.threshold".into()]
        }
    }

    /// The previous outbox at `path`, one alert of acme in November per (threshold, state).
    fn previous(path: &Path, rows: &[(u32, &str)]) {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(OLD_SCHEMA).unwrap();
        for (threshold, state) in rows {
            conn.execute(
                "INSERT INTO alerts (project, month, threshold, id, state, body, next_at)
                 VALUES ('acme', '2026-11', ?1, ?2, ?3, ?4, 0)",
                params![
                    threshold,
                    format!("id{threshold}"),
                    state,
                    format!("body{threshold}")
                ],
            )
            .unwrap();
        }
    }

    fn config(thresholds: Vec<u32>) -> AlertsConfig {
        AlertsConfig {
            thresholds,
            ..AlertsConfig::default()
        }
    }

    /// The webhook outbox's messages: (key, state, id, body, hold), by key.
    fn messages(path: &Path) -> Vec<(String, String, String, String, Option<String>)> {
        let conn = Connection::open(path).unwrap();
        let mut stmt = conn
            .prepare("SELECT key, state, id, body, hold FROM messages ORDER BY key")
            .unwrap();
        let rows = stmt.query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        });
        rows.unwrap().map(Result::unwrap).collect()
    }

    #[tokio::test]
    async fn the_previous_outbox_is_carried_over_once_losing_and_repeating_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("quota_alerts.sqlite");
        let states = [
            (50, "claiming"),
            (60, "pending"),
            (70, "handed"),
            (80, "sent"),
        ];
        previous(
            &old,
            &[
                states[0],
                states[1],
                states[2],
                states[3],
                (90, "elsewhere"),
            ],
        );
        let webhooks = dir.path().join("webhooks.sqlite");
        let (sender, now) = (engine(&webhooks), now());
        let thresholds = vec![50, 60, 70, 80, 90, 100];
        let producer = (
            sender.clone(),
            Arc::new(Operator) as Arc<dyn drg_webhook::Subscribers>,
        );
        let (alerts, service) =
            build(&config(thresholds), old.clone(), None, producer, now).unwrap();
        // Known from the start: none of the five is offered again, 100% is.
        let mut rx = service.rx.lock().await;
        let usage = Usage {
            used: 10,
            limit: 10,
            month: Month::containing(now),
            now,
        };
        alerts.observe(&KeyEntry::for_tests("k", "acme"), &usage);
        let offered: Vec<u32> =
            std::iter::from_fn(|| rx.try_recv().ok().map(|a| a.threshold)).collect();
        assert_eq!(offered, [100]);
        drop(rx);
        assert_eq!(service.carry_over().await.unwrap(), 5);
        // The claiming one held with its token; the pending one to deliver, same id and bytes.
        let held = sender.held_rows(TOPIC, 10).await.unwrap();
        assert_eq!(held.len(), 1);
        assert_eq!(
            (held[0].key.clone(), held[0].token.as_str()),
            (hold_key("acme", "2026-11", 50), "id50")
        );
        let key = |t: u32| format!("quota.threshold:acme:2026-11:{t}:operator:quota.threshold");
        let hold = |t: u32| Some(hold_key("acme", "2026-11", t));
        let s = String::from;
        assert_eq!(
            messages(&webhooks),
            [
                (key(50), s("held"), s("id50"), s("body50"), hold(50)),
                (key(60), s("pending"), s("id60"), s("body60"), hold(60)),
            ]
        );
        // Every threshold done is known to the outbox: a restart knows them without the file.
        let mut keys = sender.at_start(|o| o.hold_keys(TOPIC)).unwrap();
        keys.sort();
        let expected: Vec<String> = [50, 60, 70, 80, 90]
            .iter()
            .map(|t| hold_key("acme", "2026-11", *t))
            .collect();
        assert_eq!(keys, expected);
        // Marked: never carried again.
        assert_eq!(service.carry_over().await.unwrap(), 0);
        assert!(unmigrated(&old).unwrap().is_empty());
        assert_eq!(
            recorded_in(&old, "2026-11").unwrap().len(),
            5,
            "still known"
        );
    }

    #[tokio::test]
    async fn a_crash_before_the_mark_carries_them_again_without_a_second_message() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("quota_alerts.sqlite");
        previous(&old, &[(60, "pending")]);
        let webhooks = dir.path().join("webhooks.sqlite");
        let (sender, now) = (engine(&webhooks), now());
        let producer = || {
            (
                sender.clone(),
                Arc::new(Operator) as Arc<dyn drg_webhook::Subscribers>,
            )
        };
        let (_, first) = build(&config(vec![60]), old.clone(), None, producer(), now).unwrap();
        // The first start handed them over and died before marking them.
        let rows = unmigrated(&old).unwrap();
        let holds: Vec<_> = rows.iter().filter_map(|r| first.carried(r, 0)).collect();
        sender.send_held(holds, u64::MAX).await.unwrap();
        let (_, second) = build(&config(vec![60]), old.clone(), None, producer(), now).unwrap();
        assert_eq!(second.carry_over().await.unwrap(), 1);
        assert_eq!(messages(&webhooks).len(), 1, "one message");
        assert!(unmigrated(&old).unwrap().is_empty());
        // No previous outbox at all: nothing to carry, nothing created.
        let none = dir.path().join("none.sqlite");
        let (_, third) = build(&config(vec![60]), none.clone(), None, producer(), now).unwrap();
        assert_eq!(third.carry_over().await.unwrap(), 0);
        assert!(!none.exists());
    }

    /// A directory where every destination is gone (nothing is delivered in these tests).
    struct Gone;

    impl drg_webhook::Directory for Gone {
        fn target(&self, _: &str) -> drg_webhook::Found {
            drg_webhook::Found::Gone
        }
    }
}
