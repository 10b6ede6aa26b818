//! Records in the control store (`infra::control`, SQLite or PostgreSQL): a row a record in
//! `drg_records`, keyed by kind, project and key. A write is one transaction: it moves the
//! kind's revision row first (so writes of a kind go one at a time across every gateway, the
//! bound a plan sets holds, and the revision moves in commit order), checks last-writer-wins
//! and the project's bound, and writes the row; a removal drops it (a kind whose removals stay
//! records, reports, keeps them within a bound instead). A write refused rolls back, revision
//! included. What `migrate` brings in is taken once a source (`drg_imports`). The poll's version is the
//! revision: a database restored from an older backup, or a failover to a replica that lagged,
//! shows a lower one, and every gateway reads the whole kind again and serves it; none writes
//! its copy back.

use std::marker::PhantomData;
use std::sync::Arc;

use sqlx::Any;

use super::once::{self, Once, Outcome, Remembered};
use super::{tombstones_kept, Audited, Put, Record, RecordsError};
use crate::infra::control::{
    changes_since, move_revision, Changes, Control, ControlError, Owned, Revision, Touched, Write,
};

type Tx = sqlx::Transaction<'static, Any>;

/// The control store's records of one kind.
pub struct SqlRecords<R> {
    control: Arc<Control>,
    kind: &'static str,
    /// The revisions this gateway's writes made lately (its follower reads them not).
    own: Owned,
    _records: PhantomData<fn() -> R>,
}

impl<R: Record> SqlRecords<R> {
    pub fn new(control: Arc<Control>, kind: &'static str) -> SqlRecords<R> {
        SqlRecords {
            control,
            kind,
            own: Owned::default(),
            _records: PhantomData,
        }
    }

    /// Writes `record` as [`SqlRecords::put`] does; with `once`, a retry of a write that
    /// committed gets its first answer, and the first answer is kept with the write; with
    /// `audited`, the entry it records is written with it.
    pub async fn put_once(
        &self,
        record: &R,
        max_live: u32,
        once: Option<&Once<'_>>,
        audited: Option<&Audited<'_>>,
    ) -> Result<Outcome, RecordsError> {
        let until = self.control.deadline();
        Ok(self
            .control
            .within(self.put_now(record, max_live, until, once, audited))
            .await?)
    }

    /// What a write with `once`'s key in `project` came to before, if one did (a read: a
    /// retry of a removal finds the record gone before it reaches a write).
    pub async fn seen(
        &self,
        project: &str,
        once: &Once<'_>,
    ) -> Result<Option<Outcome>, RecordsError> {
        let sql = self.control.sql();
        let call = async {
            let mut tx = self.control.pool().await?.begin().await.map_err(&sql)?;
            let seen = remembered(&mut tx, project, once).await.map_err(&sql)?;
            tx.commit().await.map_err(&sql)?;
            Ok::<_, ControlError>(seen)
        };
        Ok(self.control.within(call).await?)
    }

    async fn put_now(
        &self,
        record: &R,
        max_live: u32,
        until: std::time::Instant,
        once: Option<&Once<'_>>,
        audited: Option<&Audited<'_>>,
    ) -> Result<Outcome, ControlError> {
        let sql = self.control.sql();
        let Write {
            mut tx,
            settled,
            xid,
        } = (self.control)
            .write_locked(
                until,
                Some(self.kind),
                Some(&lock_name(self.kind, record.project())),
            )
            .await?;
        // The project's lock first (above): its writes go one at a time (its bound holds),
        // while another project's write goes on beside it. The kind's revision moves last.
        if let Some(once) = once {
            if let Some(seen) = (remembered(&mut tx, record.project(), once).await).map_err(&sql)? {
                return Ok(seen);
            }
        }
        // The row it replaces and the project's rows in force, in one round trip.
        let (body, live): (Option<String>, i64) = sqlx::query_as(
            "SELECT (SELECT body FROM drg_records WHERE kind = $1 AND project = $2 AND key = $3),
                    (SELECT count(*) FROM drg_records
                     WHERE kind = $1 AND project = $2 AND NOT removed)",
        )
        .bind(self.kind)
        .bind(record.project().to_owned())
        .bind(record.key().to_owned())
        .fetch_one(&mut *tx)
        .await
        .map_err(&sql)?;
        // A row that does not read (another release's) is as none.
        let held: Option<R> = body.and_then(|b| serde_json::from_str(&b).ok());
        let was_live = held.as_ref().is_some_and(|h| !h.removed());
        if let Some(refused) = refusal(record, held.as_ref(), live >= i64::from(max_live)) {
            return Ok(Outcome::Put(refused));
        }
        let touched = write_row(&mut tx, self.kind, record, max_live)
            .await
            .map_err(&sql)?;
        let done = Put::Done { created: !was_live };
        // The kind's revision last, naming what changed: on PostgreSQL its row stays locked
        // to the end of the transaction, so revisions move in commit order while the writes
        // of two projects wait on each other only for their commits (as `NOTIFY` orders them
        // anyway); a refused write rolled back before it.
        let at = move_revision(&mut tx, self.kind, touched)
            .await
            .map_err(&sql)?;
        if let Some(answer) = once.and_then(|o| (o.remember)(&done).map(|a| (o, a))) {
            remember(&mut tx, record.project(), answer.0, &answer.1)
                .await
                .map_err(&sql)?;
        }
        if let Some((row, a)) = audited.and_then(|a| (a.entry)(&done).map(|row| (row, a))) {
            crate::infra::control::audit::append(&mut tx, &row, a.keep_days)
                .await
                .map_err(&sql)?;
        }
        let w = Write { tx, settled, xid };
        self.control.commit(w).await?;
        self.own.made(&at);
        Ok(Outcome::Put(done))
    }

    async fn revision_now(&self) -> Result<Revision, ControlError> {
        let pool = self.control.pool().await?;
        crate::infra::control::revision(pool, self.kind)
            .await
            .map_err(self.control.sql())
    }

    async fn read_now(&self) -> Result<(Revision, Vec<R>), ControlError> {
        let sql = self.control.sql();
        let pool = self.control.pool().await?;
        // The rows and the revision they are at, read in one transaction.
        let mut tx = pool.begin().await.map_err(&sql)?;
        let n = crate::infra::control::revision(&mut *tx, self.kind)
            .await
            .map_err(&sql)?;
        let bodies: Vec<String> =
            sqlx::query_scalar("SELECT body FROM drg_records WHERE kind = $1")
                .bind(self.kind)
                .fetch_all(&mut *tx)
                .await
                .map_err(&sql)?;
        tx.commit().await.map_err(&sql)?;
        // A row that does not parse (another release's) is left out.
        let records = (bodies.iter())
            .filter_map(|b| serde_json::from_str(b).ok())
            .collect();
        Ok((n, records))
    }

    /// What a gateway holding `held` (none: nothing read yet) reads next (see [`Step`]), on one
    /// connection: the revision, what the log says changed since `held`, and those rows. No
    /// transaction: revisions move in commit order, so the rows read after the revision hold
    /// every write up to it (a later one's too, perhaps: read again at the next round).
    async fn step_now(&self, held: Option<&Revision>) -> Result<Step<R>, ControlError> {
        let sql = self.control.sql();
        let mut conn = self.control.pool().await?.acquire().await.map_err(&sql)?;
        let now = crate::infra::control::revision(&mut *conn, self.kind)
            .await
            .map_err(&sql)?;
        let Some(held) = held else {
            return Ok(Step::Whole);
        };
        if *held == now {
            return Ok(Step::Unmoved);
        }
        let own = self.own.list();
        let changes = changes_since(&mut *conn, self.kind, held, &now, &own)
            .await
            .map_err(&sql)?;
        let Some(changes) = changes.filter(|c| c.len() <= MAX_READ) else {
            return Ok(Step::Whole);
        };
        let mut since = Since {
            at: now,
            projects: (changes.projects.iter())
                .map(|p| (p.clone(), Vec::new()))
                .collect(),
            records: (changes.records.iter())
                .map(|pk| (pk.clone(), None))
                .collect(),
        };
        if changes.is_empty() {
            return Ok(Step::Since(since));
        }
        let rows: Vec<(String, String, String)> = changed_rows(self.kind, &changes)
            .fetch_all(&mut *conn)
            .await
            .map_err(&sql)?;
        for (project, key, body) in rows {
            // A row that does not parse (another release's) is left out.
            let Ok(r) = serde_json::from_str::<R>(&body) else {
                continue;
            };
            if let Some(list) = since.projects.get_mut(&project) {
                list.push(r);
            } else if let Some(held) = since.records.get_mut(&(project, key)) {
                *held = Some(r);
            }
        }
        Ok(Step::Since(since))
    }
}

/// Records `migrate` brings in from one source.
struct Imported<'a, R> {
    kind: &'static str,
    records: &'a [R],
}

#[async_trait::async_trait]
impl<R: Record> crate::infra::control::import::Import for Imported<'_, R> {
    fn kind(&self) -> &'static str {
        self.kind
    }

    async fn take(&self, tx: &mut Tx) -> Result<usize, sqlx::Error> {
        let mut taken = 0;
        for r in self.records {
            let held = held_row(tx, self.kind, r).await?;
            let newer = held.as_ref().is_none_or(|h| r.newer_than(h));
            match (r.removed() && !R::KEEPS_REMOVED, held) {
                (_, _) if !newer => {}
                // A removal of nothing held: nothing to take.
                (true, None) => {}
                (true, Some(_)) => {
                    drop_row(tx, self.kind, r).await?;
                    taken += 1;
                }
                (false, _) => {
                    upsert(tx, self.kind, r).await?;
                    taken += 1;
                }
            }
        }
        Ok(taken)
    }
}

/// Projects and records read at most one by one after the revision held: past it the kind is
/// read whole.
const MAX_READ: usize = 200;

/// What a gateway holding a revision reads next.
pub enum Step<R> {
    /// Nothing: the store is at the revision held.
    Unmoved,
    /// What changed since (nothing but this gateway's own writes, perhaps).
    Since(Since<R>),
    /// The kind whole: nothing read yet, or the log cannot tell what changed.
    Whole,
}

/// What changed since a revision held, at revision `at`: every record (removals a kind keeps
/// included) of each project changed whole, and each record changed alone (`None`: its row is
/// gone, or does not read).
pub struct Since<R> {
    pub at: Revision,
    pub projects: std::collections::BTreeMap<String, Vec<R>>,
    pub records: std::collections::BTreeMap<(String, String), Option<R>>,
}

/// The query reading `changes`' rows of `kind`: `project, key, body`.
fn changed_rows<'q>(
    kind: &'static str,
    changes: &Changes,
) -> sqlx::query::QueryAs<'q, sqlx::Any, (String, String, String), sqlx::any::AnyArguments> {
    let mut next = 2..;
    let mut mark = || format!("${}", next.next().unwrap_or_default());
    let mut whole: Vec<String> = Vec::new();
    for _ in &changes.projects {
        whole.push(mark());
    }
    let mut alone: Vec<String> = Vec::new();
    for _ in &changes.records {
        alone.push(format!("({}, {})", mark(), mark()));
    }
    let mut which = Vec::new();
    if !whole.is_empty() {
        which.push(format!("project IN ({})", whole.join(", ")));
    }
    if !alone.is_empty() {
        which.push(format!("(project, key) IN ({})", alone.join(", ")));
    }
    let query = format!(
        "SELECT project, key, body FROM drg_records WHERE kind = $1 AND ({})",
        which.join(" OR ")
    );
    let mut q = sqlx::query_as(sqlx::AssertSqlSafe(query)).bind(kind);
    for p in &changes.projects {
        q = q.bind(p.clone());
    }
    for (p, k) in &changes.records {
        q = q.bind(p.clone()).bind(k.clone());
    }
    q
}

/// The lock a write of `project`'s records of `kind` takes (see [`Control::write_locked`]).
fn lock_name(kind: &str, project: &str) -> String {
    format!("{kind}\n{project}")
}

/// Why `record` is not written over `held` (the store's row), if it is not: a removal of
/// nothing in force (`Absent`: the database says so, whatever a gateway's copy held; nothing
/// written, no audit entry), a newer row held (`Stale`), or a new record in force past the
/// project's bound (`Full`, when `full`).
fn refusal<R: Record>(record: &R, held: Option<&R>, full: bool) -> Option<Put> {
    let was_live = held.is_some_and(|h| !h.removed());
    if record.removed() && !was_live {
        return Some(Put::Absent);
    }
    if held.is_some_and(|h| !record.newer_than(h)) {
        return Some(Put::Stale);
    }
    (!record.removed() && !was_live && full).then_some(Put::Full)
}

/// The answer kept for `once`'s key in `project`: its first answer when the request is the
/// same, [`Outcome::Reused`] when it is not, `None` when the key is new.
async fn remembered(
    tx: &mut Tx,
    project: &str,
    once: &Once<'_>,
) -> Result<Option<Outcome>, sqlx::Error> {
    let row: Option<(String, i64, String)> = sqlx::query_as(
        "SELECT fingerprint, status, body FROM drg_idempotency WHERE project = $1 AND key = $2",
    )
    .bind(project.to_owned())
    .bind(once.key.to_owned())
    .fetch_optional(&mut **tx)
    .await?;
    Ok(row.map(|(fingerprint, status, body)| {
        if fingerprint == once.fingerprint {
            Outcome::Replay(Remembered {
                status: u16::try_from(status).unwrap_or(500),
                body,
            })
        } else {
            Outcome::Reused
        }
    }))
}

/// Keeps `answer` for `once`'s key in `project`, and lets the project's oldest keys go (past
/// their day, past the newest [`once::KEPT_PER_PROJECT`]).
async fn remember(
    tx: &mut Tx,
    project: &str,
    once: &Once<'_>,
    answer: &Remembered,
) -> Result<(), sqlx::Error> {
    let now = chrono::Utc::now().timestamp();
    sqlx::query(
        "INSERT INTO drg_idempotency (project, key, fingerprint, status, body, at)
         VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(project.to_owned())
    .bind(once.key.to_owned())
    .bind(once.fingerprint.clone())
    .bind(i64::from(answer.status))
    .bind(answer.body.clone())
    .bind(now)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "DELETE FROM drg_idempotency WHERE project = $1 AND (at < $2 OR key IN (
           SELECT key FROM drg_idempotency WHERE project = $1
           ORDER BY at DESC LIMIT $4 OFFSET $3))",
    )
    .bind(project.to_owned())
    .bind(now - once::KEPT_SECONDS)
    .bind(once::KEPT_PER_PROJECT)
    .bind(i64::MAX)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Writes `record`'s row (drops it, a removal of a kind that keeps none), and lets the
/// project's oldest removal markers go past the bound; what the revision log names: the
/// record, or its whole project once markers were trimmed.
async fn write_row<'r, R: Record>(
    tx: &mut Tx,
    kind: &str,
    record: &'r R,
    max_live: u32,
) -> Result<Touched<'r>, sqlx::Error> {
    if record.removed() && !R::KEEPS_REMOVED {
        drop_row(tx, kind, record).await?;
    } else {
        upsert(tx, kind, record).await?;
    }
    if record.removed() && R::KEEPS_REMOVED {
        trim_removed(tx, kind, record.project(), max_live).await?;
        return Ok(Touched::Project(record.project()));
    }
    Ok(Touched::Record {
        project: record.project(),
        key: record.key(),
    })
}

/// Lets `project`'s oldest removal markers go past [`tombstones_kept`] for `max_live` (a kind
/// whose removals stay records).
async fn trim_removed(
    tx: &mut Tx,
    kind: &str,
    project: &str,
    max_live: u32,
) -> Result<(), sqlx::Error> {
    let keep = i64::try_from(tombstones_kept(max_live)).unwrap_or(i64::MAX);
    sqlx::query(
        "DELETE FROM drg_records WHERE kind = $1 AND project = $2 AND removed AND key IN (
           SELECT key FROM drg_records WHERE kind = $1 AND project = $2 AND removed
           ORDER BY stamp DESC LIMIT $4 OFFSET $3)",
    )
    .bind(kind.to_owned())
    .bind(project.to_owned())
    .bind(keep)
    .bind(i64::MAX)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Drops `record`'s row (a removal of a kind that keeps none).
async fn drop_row<R: Record>(tx: &mut Tx, kind: &str, record: &R) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM drg_records WHERE kind = $1 AND project = $2 AND key = $3")
        .bind(kind.to_owned())
        .bind(record.project().to_owned())
        .bind(record.key().to_owned())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The row held for `record`'s project and key, if one is and reads (another release's row
/// that does not is as none).
async fn held_row<R: Record>(
    conn: &mut sqlx::AnyConnection,
    kind: &str,
    record: &R,
) -> Result<Option<R>, sqlx::Error> {
    let body: Option<String> = sqlx::query_scalar(
        "SELECT body FROM drg_records WHERE kind = $1 AND project = $2 AND key = $3",
    )
    .bind(kind.to_owned())
    .bind(record.project().to_owned())
    .bind(record.key().to_owned())
    .fetch_optional(conn)
    .await?;
    Ok(body.and_then(|b| serde_json::from_str(&b).ok()))
}

/// Writes `record`'s row.
async fn upsert<R: Record>(tx: &mut Tx, kind: &str, record: &R) -> Result<(), sqlx::Error> {
    let body = serde_json::to_string(record).unwrap_or_default();
    let stamp = i64::try_from(record.stamp()).unwrap_or(i64::MAX);
    sqlx::query(
        "INSERT INTO drg_records (kind, project, key, stamp, removed, body)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (kind, project, key)
         DO UPDATE SET stamp = excluded.stamp, removed = excluded.removed, body = excluded.body",
    )
    .bind(kind.to_owned())
    .bind(record.project().to_owned())
    .bind(record.key().to_owned())
    .bind(stamp)
    .bind(record.removed())
    .bind(body)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl From<ControlError> for RecordsError {
    fn from(e: ControlError) -> Self {
        match e {
            ControlError::TimedOut(_, ms) => RecordsError::TimedOut(u128::from(ms)),
            other => RecordsError::Control(other.to_string()),
        }
    }
}

impl<R: Record> SqlRecords<R> {
    /// Writes `record` unless a newer one is held; a new record in force needs room under
    /// `max_live` for its project.
    pub async fn put(&self, record: &R, max_live: u32) -> Result<Put, RecordsError> {
        match self.put_once(record, max_live, None, None).await? {
            Outcome::Put(put) => Ok(put),
            // Only a write with a key is answered from before.
            Outcome::Replay(_) | Outcome::Reused => Err(RecordsError::Control(
                "a write without a key was replayed".into(),
            )),
        }
    }

    /// The revision of what is held: moved by every write (see [`Revision`]).
    pub async fn revision(&self) -> Result<Revision, RecordsError> {
        Ok(self.control.within(self.revision_now()).await?)
    }

    /// Every record held, removals included, and the revision they are at.
    pub async fn read(&self) -> Result<(Revision, Vec<R>), RecordsError> {
        Ok(self.control.within(self.read_now()).await?)
    }

    /// What a gateway holding `held` reads next (see [`Step`]).
    pub async fn step(&self, held: Option<&Revision>) -> Result<Step<R>, RecordsError> {
        Ok(self.control.within(self.step_now(held)).await?)
    }

    /// Takes `records` from `source` in (each kept only where nothing newer is held; no bound),
    /// once a source: how many were taken, `None` when `source` was taken before.
    pub async fn import(&self, source: &str, records: &[R]) -> Result<Option<usize>, RecordsError> {
        let what = Imported {
            kind: self.kind,
            records,
        };
        Ok(crate::infra::control::import::import(&self.control, source, &what).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::records::tests::over;
    use drg_domain::overrides::Override;

    #[tokio::test]
    async fn writes_merge_by_stamp_a_project_is_bounded_and_the_revision_moves_per_commit() {
        let dir = tempfile::tempdir().unwrap();
        let control = Control::sqlite(&dir.path().join("control.sqlite")).unwrap();
        let store = SqlRecords::<Override>::new(control, "overrides");
        assert_eq!(store.revision().await.unwrap().n, 0);
        let put = |d: &'static str, stamp, removed| {
            let s = &store;
            async move { s.put(&over(d, stamp, removed), 2).await.unwrap() }
        };
        assert_eq!(
            put("a.example", 10, false).await,
            Put::Done { created: true }
        );
        assert_eq!(
            put("b.example", 11, false).await,
            Put::Done { created: true }
        );
        assert_eq!(put("c.example", 12, false).await, Put::Full);
        assert_eq!(put("a.example", 9, true).await, Put::Stale);
        assert_eq!(
            store.revision().await.unwrap().n,
            2,
            "refused writes move nothing"
        );
        assert_eq!(
            put("a.example", 13, true).await,
            Put::Done { created: false }
        );
        assert_eq!(
            put("c.example", 14, false).await,
            Put::Done { created: true }
        );
        let (n, held) = store.read().await.unwrap();
        assert_eq!(n.n, 4);
        let mut names: Vec<&str> = held.iter().map(|o| o.domain.as_str()).collect();
        names.sort();
        assert_eq!(names, ["b.example", "c.example"], "a removal leaves no row");
        // What an import brings is kept only where nothing newer is held, once a source.
        let old = [over("b.example", 5, false), over("d.example", 1, false)];
        assert_eq!(store.import("file:x", &old).await.unwrap(), Some(1));
        assert_eq!(store.import("file:x", &old).await.unwrap(), None);
        let removal = [over("d.example", 2, true)];
        assert_eq!(store.import("file:y", &removal).await.unwrap(), Some(1));
        assert_eq!(store.read().await.unwrap().1.len(), 2);
    }
}
