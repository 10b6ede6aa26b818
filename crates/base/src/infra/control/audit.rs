//! The audit trail's rows (`drg_audit`), appended in the transaction of the change they record,
//! so that a change and its entry commit together or not at all; each append trims only its
//! project, to its plan's days and [`MAX_ENTRIES`]. An id is the microsecond of the append, or one
//! past the project's last: increasing within the project (the paging cursor).

/// Entries a project's trail keeps at most (the oldest go first), besides its plan's days.
pub const MAX_ENTRIES: usize = 1_000;

/// Tries of an append whose id another gateway took at the same moment.
const TRIES: usize = 4;

/// One entry as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    pub project: String,
    /// Its own id (an earlier release's entry being moved); `None`: one is drawn.
    pub id: Option<i64>,
    /// RFC 3339, UTC, seconds.
    pub at: String,
    pub key_id: String,
    pub action: String,
    pub target: String,
    pub detail: String,
}

type Tx = sqlx::Transaction<'static, sqlx::Any>;

/// Appends `row` in `tx` and trims its project to its bounds: `keep_days`, then
/// [`MAX_ENTRIES`].
pub async fn append(tx: &mut Tx, row: &AuditRow, keep_days: u32) -> Result<(), sqlx::Error> {
    let now = chrono::Utc::now();
    let cutoff = crate::infra::units::rfc3339(now - chrono::Duration::days(i64::from(keep_days)));
    let mut added = false;
    for _ in 0..TRIES {
        // Another gateway's append took the id: the next try reads the new last.
        if insert(tx, row, now.timestamp_micros()).await? {
            added = true;
            break;
        }
    }
    if !added {
        return Err(sqlx::Error::Protocol(
            "the audit entry's id was taken at every try".into(),
        ));
    }
    // Both bounds in one statement: one round trip.
    sqlx::query(
        "DELETE FROM drg_audit WHERE project = $1 AND (at < $3 OR id <= (
           SELECT id FROM drg_audit WHERE project = $1 ORDER BY id DESC LIMIT 1 OFFSET $2))",
    )
    .bind(row.project.clone())
    .bind(MAX_ENTRIES as i64)
    .bind(cutoff)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Inserts `row` under its own id, or one past the project's last (the microsecond `now_us`, or
/// one more); whether it went in (not: another append took that id first).
pub async fn insert(tx: &mut Tx, row: &AuditRow, now_us: i64) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "INSERT INTO drg_audit (project, id, at, key_id, action, target, detail)
         SELECT $1, CASE WHEN $8 >= 0 THEN $8
                         WHEN MAX(id) IS NULL OR MAX(id) < $2 THEN $2 ELSE MAX(id) + 1 END,
                $3, $4, $5, $6, $7
         FROM drg_audit WHERE project = $1
         ON CONFLICT (project, id) DO NOTHING",
    )
    .bind(row.project.clone())
    .bind(now_us)
    .bind(row.at.clone())
    .bind(row.key_id.clone())
    .bind(row.action.clone())
    .bind(row.target.clone())
    .bind(row.detail.clone())
    .bind(row.id.unwrap_or(-1))
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}
