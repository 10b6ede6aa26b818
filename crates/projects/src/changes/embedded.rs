//! The embedded change store: one SQLite file beside the quota state (`changes.sqlite3`),
//! opened at first use (after a daemon's fork), written with `synchronous=FULL` so that a
//! recorded change and a sent mark survive a crash. Gateways sharing the file (an upgrade)
//! share its rows, its compare-and-set and its sender lease. Ids are given as on Redis
//! (`store.rs`), by the gateway's clock: a file deleted and made again starts after every id
//! the old one gave.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::store::{
    covered, now_us, reversed, ChangeStore, ChangesError, Pending, Proposed, Recorded, ScanPage,
};
use super::{Change, Seen, Told};
use drg_base::infra::units::unix_rfc3339;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS watched (
  project TEXT NOT NULL, domain TEXT NOT NULL, reason TEXT NOT NULL, score INTEGER NOT NULL,
  seen_at INTEGER NOT NULL, told_ms INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (project, domain)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS changes (
  id INTEGER PRIMARY KEY AUTOINCREMENT, project TEXT NOT NULL, domain TEXT NOT NULL,
  from_reason TEXT NOT NULL, from_score INTEGER NOT NULL, to_reason TEXT NOT NULL,
  to_score INTEGER NOT NULL, rule TEXT NOT NULL, changed_at INTEGER NOT NULL,
  dataset TEXT NOT NULL, basis TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS changes_by_project ON changes (project, id);
CREATE TABLE IF NOT EXISTS sent (project TEXT PRIMARY KEY, upto INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS lease (project TEXT PRIMARY KEY, holder TEXT NOT NULL,
  until_ms INTEGER NOT NULL);
";

/// Since when (unix ms) a project was told what `watched` says, so that a lookup older than
/// that (another gateway's late tick) does not overwrite it. A file of an earlier build gets
/// the column, each row told at its last lookup.
const TOLD_AT: &str = "
ALTER TABLE watched ADD COLUMN told_ms INTEGER NOT NULL DEFAULT 0;
UPDATE watched SET told_ms = seen_at * 1000;
";

/// What a change rests on (`Change::basis`); an earlier build's rows get it from their rule.
const BASIS: &str = "ALTER TABLE changes ADD COLUMN basis TEXT NOT NULL DEFAULT '';";

/// A watched domain spelt backwards (`store::reversed`), indexed: the subdomains of a name are
/// a range of it. Filled at open for the rows that lack it (a file of an earlier build); a row
/// an earlier build sharing the file writes since has none (NULL) until the domain's next
/// lookup here or the next open, and is read apart ([`UNINDEXED`]).
const REV: &str = "
ALTER TABLE watched ADD COLUMN rev TEXT;
CREATE INDEX IF NOT EXISTS watched_by_rev ON watched (project, rev);
";

/// A project's watched domains under a name: the name itself (`?2`) and its subdomains (the
/// reversed names between `?3` and `?4`), each read by an index.
const UNDER: &str = "SELECT domain, reason, score FROM watched WHERE project = ?1 AND domain = ?2
 UNION ALL SELECT domain, reason, score FROM watched WHERE project = ?1 AND rev > ?3 AND rev < ?4";

/// A project's rows without a reversed name (written by an earlier build), by the index.
const UNINDEXED: &str =
    "SELECT domain, reason, score FROM watched WHERE project = ?1 AND rev IS NULL";

/// Creates the tables, and the columns earlier builds' files lack (looked for under the write
/// lock: two gateways opening one file add it once).
fn migrate(c: &mut Connection) -> rusqlite::Result<()> {
    c.execute_batch(SCHEMA)?;
    let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
    for (table, column, add) in [
        ("watched", "told_ms", TOLD_AT),
        ("changes", "basis", BASIS),
        ("watched", "rev", REV),
    ] {
        let has: bool = tx.query_row(
            "SELECT COUNT(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2",
            params![table, column],
            |r| r.get(0),
        )?;
        if !has {
            tx.execute_batch(add)?;
        }
    }
    let rows: Vec<(String, String)> = tx
        .prepare("SELECT project, domain FROM watched WHERE rev IS NULL")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (project, domain) in rows {
        tx.execute(
            "UPDATE watched SET rev = ?3 WHERE project = ?1 AND domain = ?2",
            params![project, domain, reversed(&domain)],
        )?;
    }
    tx.commit()
}

/// The SQLite change store.
pub struct EmbeddedChanges {
    path: PathBuf,
    conn: Arc<Mutex<Option<Connection>>>,
}

impl EmbeddedChanges {
    /// Makes the file's folder, and the file if missing (empty, mode 0600: it holds every
    /// project's lookups, and SQLite would create it with the umask's mode); SQLite opens it at
    /// first use.
    pub fn new(path: PathBuf) -> Result<Self, ChangesError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| ChangesError::Other(format!("{}: {e}", dir.display())))?;
        }
        drg_base::infra::fsutil::create_private(&path)
            .map_err(|e| ChangesError::Other(format!("{}: {e}", path.display())))?;
        Ok(EmbeddedChanges {
            path,
            conn: Arc::default(),
        })
    }

    /// Runs `f` on the connection (opened now if need be), off the async threads.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> Result<T, ChangesError> {
        let (conn, path) = (self.conn.clone(), self.path.clone());
        let shown = path.display().to_string();
        let err = move |source| ChangesError::Sqlite {
            path: shown.clone(),
            source,
        };
        tokio::task::spawn_blocking(move || {
            let mut guard = conn.lock().unwrap_or_else(|p| p.into_inner());
            if guard.is_none() {
                let sync = drg_base::infra::sqlite::Synchronous::Full;
                let mut c = drg_base::infra::sqlite::connect(&path, sync)?;
                migrate(&mut c)?;
                *guard = Some(c);
            }
            f(guard.as_mut().expect("opened above"))
        })
        .await
        .map_err(|e| ChangesError::Other(e.to_string()))?
        .map_err(err)
    }
}

fn told(reason: String, score: i64) -> Option<Told> {
    Some(Told {
        reason: reason.parse().ok()?,
        score: u8::try_from(score).ok()?,
    })
}

fn change_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<Option<Change>> {
    let from = told(r.get(2)?, r.get(3)?);
    let to = told(r.get(4)?, r.get(5)?);
    let (Some(from), Some(to)) = (from, to) else {
        return Ok(None);
    };
    Ok(Some(
        Change {
            id: u64::try_from(r.get::<_, i64>(0)?).unwrap_or(0),
            domain: r.get(1)?,
            from: from.reason,
            to: to.reason,
            score_from: from.score,
            score_to: to.score,
            rule: r.get(6)?,
            basis: r.get(9)?,
            changed_at: unix_rfc3339(r.get(7)?),
            dataset_version: r.get(8)?,
        }
        .with_basis(),
    ))
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[async_trait]
impl ChangeStore for EmbeddedChanges {
    async fn watch(&self, seen: Vec<Seen>, cap: u32) -> Result<u64, ChangesError> {
        self.with(move |c| {
            let tx = c.transaction()?;
            let mut refused = 0;
            {
                let mut known =
                    tx.prepare_cached("SELECT 1 FROM watched WHERE project = ?1 AND domain = ?2")?;
                let mut count =
                    tx.prepare_cached("SELECT COUNT(*) FROM watched WHERE project = ?1")?;
                // Forwards in time only: an older lookup leaves what the project was told since.
                let mut upsert = tx.prepare_cached(
                    "INSERT INTO watched (project, domain, reason, score, seen_at, told_ms, rev)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (project, domain) DO UPDATE SET
                     rev = excluded.rev,
                     reason = CASE WHEN excluded.told_ms >= told_ms THEN excluded.reason
                       ELSE reason END,
                     score = CASE WHEN excluded.told_ms >= told_ms THEN excluded.score
                       ELSE score END,
                     told_ms = MAX(told_ms, excluded.told_ms),
                     seen_at = MAX(seen_at, excluded.seen_at)",
                )?;
                let mut counts: std::collections::HashMap<Arc<str>, u32> = Default::default();
                for s in &seen {
                    let exists = known
                        .query_row(params![&*s.project, &*s.domain], |_| Ok(()))
                        .optional()?
                        .is_some();
                    if !exists {
                        let n = match counts.get_mut(&s.project) {
                            Some(n) => n,
                            None => {
                                let n: u32 = count.query_row(params![&*s.project], |r| r.get(0))?;
                                counts.entry(s.project.clone()).or_insert(n)
                            }
                        };
                        if *n >= cap {
                            refused += 1;
                            continue;
                        }
                        *n += 1;
                    }
                    upsert.execute(params![
                        &*s.project,
                        &*s.domain,
                        s.told.reason.as_str(),
                        s.told.score,
                        s.at(),
                        s.at_ms,
                        reversed(&s.domain)
                    ])?;
                }
            }
            tx.commit()?;
            Ok(refused)
        })
        .await
    }

    async fn projects(&self) -> Result<Vec<String>, ChangesError> {
        self.with(|c| {
            let mut q = c.prepare(
                "SELECT DISTINCT project FROM watched UNION SELECT DISTINCT project FROM changes",
            )?;
            let rows = q.query_map([], |r| r.get(0))?;
            rows.collect()
        })
        .await
    }

    async fn scan(&self, project: &str, cursor: &str, n: usize) -> Result<ScanPage, ChangesError> {
        let (project, cursor) = (project.to_owned(), cursor.to_owned());
        self.with(move |c| {
            let mut q = c.prepare_cached(
                "SELECT domain, reason, score FROM watched WHERE project = ?1 AND domain > ?2
                 ORDER BY domain LIMIT ?3",
            )?;
            let rows = q.query_map(params![project, cursor, n as i64], |r| {
                Ok((r.get::<_, String>(0)?, told(r.get(1)?, r.get(2)?)))
            })?;
            let mut page = Vec::new();
            for row in rows {
                let (domain, t) = row?;
                page.push((domain, t));
            }
            let next = (page.len() == n).then(|| page.last().map(|(d, _)| d.clone()));
            let page = page
                .into_iter()
                .filter_map(|(d, t)| Some((d, t?)))
                .collect();
            Ok((page, next.flatten()))
        })
        .await
    }

    async fn watched_under(
        &self,
        project: &str,
        names: &[String],
    ) -> Result<Vec<(String, Told)>, ChangesError> {
        let (project, names) = (project.to_owned(), names.to_vec());
        self.with(move |c| {
            let row =
                |r: &rusqlite::Row<'_>| Ok((r.get::<_, String>(0)?, told(r.get(1)?, r.get(2)?)));
            let mut found = std::collections::BTreeMap::new();
            let mut under = c.prepare_cached(UNDER)?;
            for n in &names {
                let rev = reversed(n);
                let (from, to) = (format!("{rev}."), format!("{rev}/"));
                for r in under.query_map(params![project, n, from, to], row)? {
                    let (d, t) = r?;
                    found.insert(d, t);
                }
            }
            let mut unindexed = c.prepare_cached(UNINDEXED)?;
            for r in unindexed.query_map(params![project], row)? {
                let (d, t) = r?;
                if covered(&names, &d) {
                    found.insert(d, t);
                }
            }
            Ok(found
                .into_iter()
                .filter_map(|(d, t)| Some((d, t?)))
                .collect())
        })
        .await
    }

    async fn record(&self, project: &str, change: &Proposed) -> Result<Recorded, ChangesError> {
        let (project, ch) = (project.to_owned(), change.clone());
        self.with(move |c| {
            let tx = c.transaction()?;
            let updated = tx.execute(
                "UPDATE watched SET reason = ?3, score = ?4, told_ms = MAX(told_ms, ?7)
                 WHERE project = ?1 AND domain = ?2 AND reason = ?5 AND score = ?6",
                params![
                    project,
                    ch.domain,
                    ch.to.reason.as_str(),
                    ch.to.score,
                    ch.from.reason.as_str(),
                    ch.from.score,
                    ch.at_ms
                ],
            )?;
            if updated == 0 {
                return Ok(Recorded::Stale);
            }
            // The time, or one past the largest id this file ever gave (`sqlite_sequence`
            // keeps it, also once its row is swept).
            let last: i64 = tx.query_row(
                "SELECT COALESCE(MAX(seq), 0) FROM sqlite_sequence WHERE name = 'changes'",
                [],
                |r| r.get(0),
            )?;
            let id = now_us().max(last.saturating_add(1));
            tx.execute(
                "INSERT INTO changes (id, project, domain, from_reason, from_score, to_reason,
                 to_score, rule, changed_at, dataset, basis)
                 VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11)",
                params![
                    id,
                    project,
                    ch.domain,
                    ch.from.reason.as_str(),
                    ch.from.score,
                    ch.to.reason.as_str(),
                    ch.to.score,
                    ch.rule,
                    ch.at(),
                    ch.dataset_version,
                    ch.basis
                ],
            )?;
            tx.commit()?;
            Ok(Recorded::New(u64::try_from(id).unwrap_or(0)))
        })
        .await
    }

    async fn list(
        &self,
        project: &str,
        after: u64,
        since: i64,
        n: usize,
    ) -> Result<Vec<Change>, ChangesError> {
        let project = project.to_owned();
        self.with(move |c| {
            let mut q = c.prepare_cached(
                "SELECT id, domain, from_reason, from_score, to_reason, to_score, rule,
                 changed_at, dataset, basis FROM changes WHERE project = ?1 AND id > ?2
                 AND changed_at >= ?3 ORDER BY id LIMIT ?4",
            )?;
            let after = i64::try_from(after).unwrap_or(i64::MAX);
            let rows = q.query_map(params![project, after, since, n as i64], change_of)?;
            let mut out = Vec::new();
            for row in rows {
                out.extend(row?);
            }
            Ok(out)
        })
        .await
    }

    async fn sent_upto(&self, project: &str) -> Result<u64, ChangesError> {
        let project = project.to_owned();
        self.with(move |c| {
            let upto: Option<i64> = c
                .query_row(
                    "SELECT upto FROM sent WHERE project = ?1",
                    params![project],
                    |r| r.get(0),
                )
                .optional()?;
            Ok(upto.and_then(|u| u64::try_from(u).ok()).unwrap_or(0))
        })
        .await
    }

    async fn pending(&self, project: &str, after: u64, upto: u64) -> Result<Pending, ChangesError> {
        let project = project.to_owned();
        self.with(move |c| {
            let mut q = c.prepare_cached(
                "SELECT from_reason, to_reason, COUNT(*), MAX(id) FROM changes
                 WHERE project = ?1 AND id > ?2 AND id <= ?3 GROUP BY from_reason, to_reason",
            )?;
            let after = i64::try_from(after).unwrap_or(i64::MAX);
            let upto = i64::try_from(upto).unwrap_or(i64::MAX);
            let rows = q.query_map(params![project, after, upto], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?,
                    r.get::<_, i64>(3)?,
                ))
            })?;
            let mut p = Pending::default();
            for row in rows {
                let (from, to, n, last) = row?;
                let n = u64::try_from(n).unwrap_or(0);
                p.total += n;
                p.last_id = p.last_id.max(u64::try_from(last).unwrap_or(0));
                *p.transitions.entry(format!("{from}->{to}")).or_default() += n;
            }
            Ok(p)
        })
        .await
    }

    async fn mark_sent(&self, project: &str, upto: u64) -> Result<(), ChangesError> {
        let project = project.to_owned();
        let upto = i64::try_from(upto).unwrap_or(i64::MAX);
        self.with(move |c| {
            c.execute(
                "INSERT INTO sent VALUES (?1, ?2) ON CONFLICT (project)
                 DO UPDATE SET upto = MAX(upto, excluded.upto)",
                params![project, upto],
            )?;
            Ok(())
        })
        .await
    }

    async fn lease(
        &self,
        project: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, ChangesError> {
        let (project, holder) = (project.to_owned(), holder.to_owned());
        let ttl = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        self.with(move |c| {
            let now = now_ms();
            let n = c.execute(
                "INSERT INTO lease VALUES (?1, ?2, ?3) ON CONFLICT (project) DO UPDATE
                 SET holder = excluded.holder, until_ms = excluded.until_ms
                 WHERE lease.holder = excluded.holder OR lease.until_ms < ?4",
                params![project, holder, now.saturating_add(ttl), now],
            )?;
            Ok(n == 1)
        })
        .await
    }

    async fn sweep(
        &self,
        cutoffs: &[(String, i64)],
        other: i64,
        changes_before: i64,
    ) -> Result<u64, ChangesError> {
        let cutoffs = cutoffs.to_vec();
        self.with(move |c| {
            let tx = c.transaction()?;
            let mut n = 0;
            for (project, cutoff) in &cutoffs {
                n += tx.execute(
                    "DELETE FROM watched WHERE project = ?1 AND seen_at < ?2",
                    params![project, cutoff],
                )?;
            }
            n += tx.execute("DELETE FROM watched WHERE seen_at < ?1", params![other])?;
            n += tx.execute(
                "DELETE FROM changes WHERE changed_at < ?1",
                params![changes_before],
            )?;
            tx.commit()?;
            Ok(n as u64)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drg_domain::Reason;

    fn seen(project: &str, domain: &str, reason: Reason, score: u8) -> Seen {
        Seen {
            project: project.into(),
            domain: domain.into(),
            told: Told { reason, score },
            at_ms: 1_000_000,
        }
    }

    fn proposed(domain: &str, from: Told, to: Told, at: i64) -> Proposed {
        Proposed {
            domain: domain.into(),
            from,
            to,
            rule: "blocklist".into(),
            basis: "table",
            at_ms: at * 1_000,
            dataset_version: "g2-abcdef".into(),
        }
    }

    #[tokio::test]
    async fn a_change_is_recorded_once_and_kept_when_reversed_and_watching_is_capped() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedChanges::new(dir.path().join("c.sqlite3")).unwrap();
        let safe = Told {
            reason: Reason::Safe,
            score: 10,
        };
        let dispo = Told {
            reason: Reason::Disposable,
            score: 100,
        };
        let refused = store
            .watch(
                vec![
                    seen("p", "a.com", Reason::Safe, 10),
                    seen("p", "b.com", Reason::Safe, 10),
                    seen("p", "c.com", Reason::Safe, 10),
                ],
                2,
            )
            .await
            .unwrap();
        assert_eq!(refused, 1, "the cap of 2");
        let (page, next) = store.scan("p", "", 10).await.unwrap();
        assert_eq!(page.len(), 2);
        assert_eq!(next, None);
        let before = u64::try_from(now_us()).unwrap();
        let first = store
            .record("p", &proposed("a.com", safe, dispo, 2_000))
            .await
            .unwrap();
        let Recorded::New(first) = first else {
            panic!("{first:?}")
        };
        assert!(
            first >= before,
            "an id is the time in microseconds: {first}"
        );
        // A second gateway's pass proposes the same change: stale.
        let again = store
            .record("p", &proposed("a.com", safe, dispo, 2_001))
            .await
            .unwrap();
        assert_eq!(again, Recorded::Stale);
        // Back, before it was sent: recorded too (a poller may have read the first; the
        // webhook leaves out what cancels out).
        let back = store
            .record("p", &proposed("a.com", dispo, safe, 3_000))
            .await
            .unwrap();
        assert!(matches!(back, Recorded::New(id) if id > first), "{back:?}");
        assert_eq!(store.list("p", 0, 0, 10).await.unwrap().len(), 2);
        let b = store
            .record("p", &proposed("b.com", safe, dispo, 4_000))
            .await
            .unwrap();
        let Recorded::New(id) = b else {
            panic!("{b:?}")
        };
        let pending = store.pending("p", 0, u64::MAX).await.unwrap();
        assert_eq!((pending.total, pending.last_id), (3, id));
        assert_eq!(pending.transitions["safe->disposable"], 2);
        let upto_first = store.pending("p", 0, first).await.unwrap();
        assert_eq!((upto_first.total, upto_first.last_id), (1, first));
        store.mark_sent("p", id).await.unwrap();
        store.mark_sent("p", 0).await.unwrap();
        assert_eq!(store.sent_upto("p").await.unwrap(), id, "never moves back");
        assert!(store
            .lease("p", "g1", Duration::from_secs(5))
            .await
            .unwrap());
        assert!(!store
            .lease("p", "g2", Duration::from_secs(5))
            .await
            .unwrap());
        assert!(store
            .lease("p", "g1", Duration::from_secs(5))
            .await
            .unwrap());
        assert_eq!(store.sweep(&[], 1_001, 0).await.unwrap(), 2);
    }

    #[tokio::test]
    async fn ids_go_on_after_the_file_is_lost_and_an_older_lookup_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sqlite3");
        let (safe, dispo) = (
            Told {
                reason: Reason::Safe,
                score: 10,
            },
            Told {
                reason: Reason::Disposable,
                score: 100,
            },
        );
        let store = EmbeddedChanges::new(path.clone()).unwrap();
        store
            .watch(vec![seen("p", "a.com", Reason::Safe, 10)], 10)
            .await
            .unwrap();
        let Ok(Recorded::New(old)) = store
            .record("p", &proposed("a.com", safe, dispo, 5_000))
            .await
        else {
            panic!("not recorded")
        };
        // A lookup answered before the change (another gateway's late tick) leaves it; a later
        // one is what the project was told last.
        let mut late = seen("p", "a.com", Reason::Safe, 10);
        late.at_ms = 4_999_000;
        store.watch(vec![late.clone()], 10).await.unwrap();
        assert_eq!(store.scan("p", "", 10).await.unwrap().0[0].1, dispo);
        late.at_ms = 5_001_000;
        store.watch(vec![late], 10).await.unwrap();
        assert_eq!(store.scan("p", "", 10).await.unwrap().0[0].1, safe);
        store.mark_sent("p", old).await.unwrap();
        drop(store);

        // The file is lost: a new one gives ids after the old ones, its sent mark is gone.
        for f in ["c.sqlite3", "c.sqlite3-wal", "c.sqlite3-shm"] {
            let _ = std::fs::remove_file(dir.path().join(f));
        }
        let store = EmbeddedChanges::new(path).unwrap();
        store
            .watch(vec![seen("p", "a.com", Reason::Safe, 10)], 10)
            .await
            .unwrap();
        let Ok(Recorded::New(new)) = store
            .record("p", &proposed("a.com", safe, dispo, 6_000))
            .await
        else {
            panic!("not recorded")
        };
        assert!(new > old, "{new} after {old}");
        assert_eq!(store.sent_upto("p").await.unwrap(), 0);
        assert_eq!(store.list("p", old, 0, 10).await.unwrap()[0].id, new);
    }

    /// The watched names under an override are read by name and by a range of the reversed
    /// names (no scan of the watch list), and a row an earlier build wrote without its reversed
    /// name is found too.
    #[tokio::test]
    async fn the_names_under_a_name_are_read_by_index_out_of_thousands() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedChanges::new(dir.path().join("c.sqlite3")).unwrap();
        let mut all: Vec<Seen> = (0..5_000)
            .map(|i| seen("p", &format!("n{i}.example"), Reason::Safe, 10))
            .collect();
        for d in [
            "shop.example",
            "eu.mail.shop.example",
            "othershop.example",
            "x-shop.example",
            "shop.example.org",
        ] {
            all.push(seen("p", d, Reason::Safe, 10));
        }
        all.push(seen("q", "mail.shop.example", Reason::Safe, 10));
        assert_eq!(store.watch(all, 10_000).await.unwrap(), 0);
        store
            .with(|c| {
                c.execute(
                    "INSERT INTO watched (project, domain, reason, score, seen_at)
                     VALUES ('p', 'old.shop.example', 'safe', 10, 1000)",
                    [],
                )
            })
            .await
            .unwrap();
        let names = ["shop.example".to_owned(), "n7.example".to_owned()];
        let under = store.watched_under("p", &names).await.unwrap();
        let domains: Vec<&str> = under.iter().map(|(d, _)| d.as_str()).collect();
        let want = [
            "eu.mail.shop.example",
            "n7.example",
            "old.shop.example",
            "shop.example",
        ];
        assert_eq!(domains, want);
        assert!(store.watched_under("p", &[]).await.unwrap().is_empty());
        // Every read is an index's, none a scan of the table.
        let plans = store
            .with(|c| {
                let mut plans = Vec::new();
                for sql in [UNDER, UNINDEXED] {
                    let mut q = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
                    let nulls = vec![rusqlite::types::Null; q.parameter_count()];
                    let rows = q.query_map(rusqlite::params_from_iter(nulls), |r| r.get(3))?;
                    plans.extend(rows.collect::<rusqlite::Result<Vec<String>>>()?);
                }
                Ok(plans)
            })
            .await
            .unwrap();
        assert!(plans.iter().all(|p| !p.contains("SCAN")), "{plans:?}");
        assert!(
            plans.iter().any(|p| p.contains("watched_by_rev")),
            "{plans:?}"
        );
    }

    /// A file an earlier build wrote (no `basis` column) opens, and its changes show the basis
    /// their rule implies.
    #[tokio::test]
    async fn an_earlier_builds_changes_get_their_basis_from_their_rule() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sqlite3");
        let c = Connection::open(&path).unwrap();
        c.execute_batch(&SCHEMA.replace(", basis TEXT NOT NULL DEFAULT ''", ""))
            .unwrap();
        c.execute_batch(
            "INSERT INTO changes (id, project, domain, from_reason, from_score, to_reason,
             to_score, rule, changed_at, dataset) VALUES
             (1, 'p', 'a.com', 'safe', 10, 'disposable', 100, 'blocklist', 5, 'g1-x'),
             (2, 'p', 'b.com', 'safe', 10, 'disposable', 80, 'mx_neighbourhood', 5, 'g1-x');",
        )
        .unwrap();
        drop(c);
        let store = EmbeddedChanges::new(path).unwrap();
        let listed = store.list("p", 0, 0, 10).await.unwrap();
        let basis: Vec<&str> = listed.iter().map(|c| c.basis.as_str()).collect();
        assert_eq!(basis, ["table", "evidence"]);
    }
}
