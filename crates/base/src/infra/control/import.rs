//! The one importer for what `migrate` brings into the control store, whatever its kind
//! (records, keys, the audit trail): a source is taken once (`drg_imports`), in one transaction
//! with that bookkeeping, and a kind gateways follow has its revision moved and told, so that
//! a record removed since a first run is never brought back by a second.

use std::time::{Duration, Instant};

use super::{move_revision, Control, ControlError, Touched, Tx, Write};

/// How long one source's import may take: `migrate` runs offline, and an earlier release's
/// audit trail or records may be many thousand rows, each its own statement.
const BUDGET: Duration = Duration::from_secs(300);

/// What one source brings into the store.
#[async_trait::async_trait]
pub trait Import: Send + Sync {
    /// The kind taken in (named in `drg_imports`, and the revision moved).
    fn kind(&self) -> &'static str;

    /// Whether gateways follow the kind's revision (records and keys do; the audit trail is
    /// read a page at a time, and has none).
    fn followed(&self) -> bool {
        true
    }

    /// What is done whether or not the source was taken before (keys: the revocations it
    /// carries, which a run before may have missed); whether it changed anything.
    async fn always(&self, _tx: &mut Tx) -> Result<bool, sqlx::Error> {
        Ok(false)
    }

    /// Takes the source in (each item only where nothing newer is held): how many it took.
    async fn take(&self, tx: &mut Tx) -> Result<usize, sqlx::Error>;
}

/// Takes `source` in through `what`, once: how many it took; `None` when `source` was taken
/// before (what [`Import::always`] does is done all the same).
pub async fn import(
    control: &Control,
    source: &str,
    what: &dyn Import,
) -> Result<Option<usize>, ControlError> {
    let sql = control.sql();
    let call = async {
        let tell = what.followed().then(|| what.kind());
        let until = Instant::now() + BUDGET;
        let Write { mut tx, .. } = control.write_telling(until, tell).await?;
        let changed = what.always(&mut tx).await.map_err(&sql)?;
        let taken = if taken_before(&mut tx, source).await.map_err(&sql)? {
            None
        } else {
            let n = what.take(&mut tx).await.map_err(&sql)?;
            note_taken(&mut tx, source, what.kind(), n)
                .await
                .map_err(&sql)?;
            Some(n)
        };
        if taken.is_none() && !changed {
            // Nothing written: the transaction rolls back as it drops.
            return Ok(None);
        }
        if tell.is_some() {
            move_revision(&mut tx, what.kind(), Touched::Kind)
                .await
                .map_err(&sql)?;
        }
        tx.commit().await.map_err(&sql)?;
        Ok(taken)
    };
    control.within_for(BUDGET, call).await
}

/// Whether `source` was taken in before.
async fn taken_before(tx: &mut Tx, source: &str) -> Result<bool, sqlx::Error> {
    let before: Option<i64> =
        sqlx::query_scalar("SELECT records FROM drg_imports WHERE source = $1")
            .bind(source.to_owned())
            .fetch_optional(&mut **tx)
            .await?;
    Ok(before.is_some())
}

/// Notes that `source` was taken in, `taken` of `kind` from it.
async fn note_taken(
    tx: &mut Tx,
    source: &str,
    kind: &'static str,
    taken: usize,
) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO drg_imports (source, kind, records, at) VALUES ($1, $2, $3, $4)")
        .bind(source.to_owned())
        .bind(kind)
        .bind(i64::try_from(taken).unwrap_or(i64::MAX))
        .bind(chrono::Utc::now().timestamp())
        .execute(&mut **tx)
        .await?;
    Ok(())
}
