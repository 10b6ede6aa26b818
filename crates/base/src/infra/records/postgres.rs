//! Records in the control store on PostgreSQL (`infra::control`): a row a record in
//! `drg_records`, keyed by kind, project and key; a write is one transaction that takes the
//! kind's revision row first (writes of a kind go one at a time across every gateway, so the
//! bound a plan sets holds and the revision moves in commit order), checks last-writer-wins and
//! the project's bound, writes the row, drops the project's oldest removal markers past their
//! bound, and moves the revision. The poll's version is the revision: a database restored from
//! an older backup, or a failover to a replica that lagged, shows a lower one, and every
//! gateway reads the whole kind again and serves it; none writes its copy back.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use super::{tombstones_kept, Put, Record, RecordStore, RecordsError, Token};
use crate::infra::control::{Control, ControlError};

/// The PostgreSQL store of one kind of record.
pub struct PgRecords<R> {
    control: Arc<Control>,
    kind: &'static str,
    /// The revision last read (-1: none yet), to tell one that went back.
    last: AtomicI64,
    _records: PhantomData<fn() -> R>,
}

impl<R: Record> PgRecords<R> {
    pub fn new(control: Arc<Control>, kind: &'static str) -> PgRecords<R> {
        PgRecords {
            control,
            kind,
            last: AtomicI64::new(-1),
            _records: PhantomData,
        }
    }

    async fn put_now(&self, record: &R, max_live: u32) -> Result<Put, ControlError> {
        let pool = self.control.pool().await?;
        let mut tx = pool.begin().await?;
        // The kind's revision row, locked to the end of the transaction.
        sqlx::query("INSERT INTO drg_revision (kind, n) VALUES ($1, 0) ON CONFLICT DO NOTHING")
            .bind(self.kind)
            .execute(&mut *tx)
            .await?;
        sqlx::query("SELECT n FROM drg_revision WHERE kind = $1 FOR UPDATE")
            .bind(self.kind)
            .execute(&mut *tx)
            .await?;
        let held = held_row(&mut tx, self.kind, record).await?;
        if held.as_ref().is_some_and(|h| !record.newer_than(h)) {
            return Ok(Put::Stale);
        }
        let was_live = held.as_ref().is_some_and(|h| !h.removed());
        if !record.removed() && !was_live {
            let live: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM drg_records
                 WHERE kind = $1 AND project = $2 AND NOT removed",
            )
            .bind(self.kind)
            .bind(record.project())
            .fetch_one(&mut *tx)
            .await?;
            if live >= i64::from(max_live) {
                return Ok(Put::Full);
            }
        }
        upsert(&mut tx, self.kind, record).await?;
        if record.removed() {
            let keep = i64::try_from(tombstones_kept(max_live)).unwrap_or(i64::MAX);
            sqlx::query(
                "DELETE FROM drg_records WHERE kind = $1 AND project = $2 AND removed AND key IN (
                   SELECT key FROM drg_records WHERE kind = $1 AND project = $2 AND removed
                   ORDER BY stamp DESC OFFSET $3)",
            )
            .bind(self.kind)
            .bind(record.project())
            .bind(keep)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("UPDATE drg_revision SET n = n + 1 WHERE kind = $1")
            .bind(self.kind)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Put::Done { created: !was_live })
    }

    async fn revision(&self) -> Result<i64, ControlError> {
        let pool = self.control.pool().await?;
        let n: Option<i64> = sqlx::query_scalar("SELECT n FROM drg_revision WHERE kind = $1")
            .bind(self.kind)
            .fetch_optional(pool)
            .await?;
        Ok(n.unwrap_or(0))
    }

    async fn read_all(&self) -> Result<Vec<R>, ControlError> {
        let pool = self.control.pool().await?;
        let bodies: Vec<String> =
            sqlx::query_scalar("SELECT body FROM drg_records WHERE kind = $1")
                .bind(self.kind)
                .fetch_all(pool)
                .await?;
        // A row that does not parse (another release's) is left out.
        Ok(bodies
            .iter()
            .filter_map(|b| serde_json::from_str(b).ok())
            .collect())
    }

    async fn restore_now(&self, records: &[R]) -> Result<(), ControlError> {
        let pool = self.control.pool().await?;
        let mut tx = pool.begin().await?;
        for r in records {
            let held = held_row(&mut tx, self.kind, r).await?;
            if held.is_none_or(|h| r.newer_than(&h)) {
                upsert(&mut tx, self.kind, r).await?;
            }
        }
        sqlx::query(
            "INSERT INTO drg_revision (kind, n) VALUES ($1, 1)
             ON CONFLICT (kind) DO UPDATE SET n = drg_revision.n + 1",
        )
        .bind(self.kind)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}

/// The row held for `record`'s project and key, if one is and reads (another release's row
/// that does not is as none).
async fn held_row<R: Record>(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    kind: &str,
    record: &R,
) -> Result<Option<R>, ControlError> {
    let body: Option<String> = sqlx::query_scalar(
        "SELECT body FROM drg_records WHERE kind = $1 AND project = $2 AND key = $3",
    )
    .bind(kind)
    .bind(record.project())
    .bind(record.key())
    .fetch_optional(&mut **tx)
    .await?;
    Ok(body.and_then(|b| serde_json::from_str(&b).ok()))
}

/// Writes `record`'s row.
async fn upsert<R: Record>(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    kind: &str,
    record: &R,
) -> Result<(), ControlError> {
    let body = serde_json::to_string(record).unwrap_or_default();
    let stamp = i64::try_from(record.stamp()).unwrap_or(i64::MAX);
    sqlx::query(
        "INSERT INTO drg_records (kind, project, key, stamp, removed, body)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (kind, project, key)
         DO UPDATE SET stamp = EXCLUDED.stamp, removed = EXCLUDED.removed, body = EXCLUDED.body",
    )
    .bind(kind)
    .bind(record.project())
    .bind(record.key())
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
            ControlError::TimedOut(ms) => RecordsError::TimedOut(u128::from(ms)),
            other => RecordsError::Control(other.to_string()),
        }
    }
}

#[async_trait::async_trait]
impl<R: Record> RecordStore<R> for PgRecords<R> {
    async fn put(&self, record: &R, max_live: u32) -> Result<Put, RecordsError> {
        Ok(self.control.within(self.put_now(record, max_live)).await?)
    }

    async fn token(&self) -> Result<Token, RecordsError> {
        let n = self.control.within(self.revision()).await?;
        let last = self.last.swap(n, Ordering::Relaxed);
        if n < last {
            log::warn!(
                "{}: the control store's revision went back from {last} to {n} (restored from \
                 an older backup, or a replica that lagged): what it holds now is served",
                self.kind
            );
        }
        Ok(Token::At(format!("pg:{n}")))
    }

    async fn read(&self) -> Result<Vec<R>, RecordsError> {
        Ok(self.control.within(self.read_all()).await?)
    }

    async fn restore(&self, records: &[R]) -> Result<(), RecordsError> {
        Ok(self.control.within(self.restore_now(records)).await?)
    }
}
