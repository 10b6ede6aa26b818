//! The trail in the control store (`drg_audit`, SQLite or PostgreSQL: every gateway of a
//! deployment reads one trail): a row an entry, keyed by project and id, so an append writes
//! one row and trims only its project, and a page reads only the rows it returns. An id is the
//! microsecond of the append, or one past the project's last: increasing within the project,
//! the paging cursor. Each project keeps at most [`MAX_ENTRIES`] entries and its plan's days.

use std::sync::Arc;

use drg_base::infra::control::{Control, ControlError};

use super::{AuditError, AuditStore, Entry, MAX_ENTRIES};

/// The control store's trail.
pub struct SqlAudit {
    control: Arc<Control>,
}

/// Tries of an append whose id another gateway took at the same moment.
const TRIES: usize = 4;

impl SqlAudit {
    pub fn new(control: Arc<Control>) -> SqlAudit {
        SqlAudit { control }
    }

    async fn append_now(&self, entry: &Entry, keep_days: u32) -> Result<(), ControlError> {
        let sql = self.control.sql();
        let mut w = self.control.write(self.control.deadline()).await?;
        append_in(&mut w.tx, entry, keep_days).await.map_err(&sql)?;
        w.tx.commit().await.map_err(&sql)?;
        Ok(())
    }

    async fn page_now(
        &self,
        project: &str,
        before: i64,
        limit: usize,
    ) -> Result<Vec<Entry>, ControlError> {
        let pool = self.control.pool().await?;
        let rows: Vec<(i64, String, String, String, String, String)> = sqlx::query_as(
            "SELECT id, at, key_id, action, target, detail FROM drg_audit
             WHERE project = $1 AND id < $2 ORDER BY id DESC LIMIT $3",
        )
        .bind(project.to_owned())
        .bind(before)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(pool)
        .await
        .map_err(self.control.sql())?;
        Ok(rows
            .into_iter()
            .map(|(id, at, key_id, action, target, detail)| Entry {
                id: id.to_string(),
                project: String::new(),
                at,
                key_id,
                action,
                target,
                detail,
            })
            .collect())
    }
}

/// Appends `entry` in `tx` (the transaction of the change it records, when there is one: the
/// two commit together or not at all), and trims its project to its bounds: `keep_days`, then
/// [`MAX_ENTRIES`].
pub(crate) async fn append_in(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    entry: &Entry,
    keep_days: u32,
) -> Result<(), sqlx::Error> {
    let now = chrono::Utc::now();
    let cutoff =
        drg_base::infra::units::rfc3339(now - chrono::Duration::days(i64::from(keep_days)));
    let mut added = false;
    for _ in 0..TRIES {
        // Another gateway's append took the id: the next try reads the new last.
        if insert(tx, entry, now.timestamp_micros()).await? {
            added = true;
            break;
        }
    }
    if !added {
        return Err(sqlx::Error::Protocol(
            "the audit entry's id was taken at every try".into(),
        ));
    }
    sqlx::query("DELETE FROM drg_audit WHERE project = $1 AND at < $2")
        .bind(entry.project.clone())
        .bind(cutoff)
        .execute(&mut **tx)
        .await?;
    sqlx::query(
        "DELETE FROM drg_audit WHERE project = $1 AND id <= (
           SELECT id FROM drg_audit WHERE project = $1 ORDER BY id DESC LIMIT 1 OFFSET $2)",
    )
    .bind(entry.project.clone())
    .bind(MAX_ENTRIES as i64)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Inserts `entry` under an id past the project's last (the microsecond `now_us`, or one
/// more); whether it went in (not: another append took that id first). Its own `id`, when it
/// has one (an earlier release's entry being moved), is kept.
pub(crate) async fn insert(
    tx: &mut sqlx::Transaction<'static, sqlx::Any>,
    entry: &Entry,
    now_us: i64,
) -> Result<bool, sqlx::Error> {
    let own: Option<i64> = entry.id.parse().ok();
    let done = sqlx::query(
        "INSERT INTO drg_audit (project, id, at, key_id, action, target, detail)
         SELECT $1, CASE WHEN $8 >= 0 THEN $8
                         WHEN MAX(id) IS NULL OR MAX(id) < $2 THEN $2 ELSE MAX(id) + 1 END,
                $3, $4, $5, $6, $7
         FROM drg_audit WHERE project = $1
         ON CONFLICT (project, id) DO NOTHING",
    )
    .bind(entry.project.clone())
    .bind(now_us)
    .bind(entry.at.clone())
    .bind(entry.key_id.clone())
    .bind(entry.action.clone())
    .bind(entry.target.clone())
    .bind(entry.detail.clone())
    .bind(own.unwrap_or(-1))
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

impl From<ControlError> for AuditError {
    fn from(e: ControlError) -> Self {
        AuditError::Control(e.to_string())
    }
}

#[async_trait::async_trait]
impl AuditStore for SqlAudit {
    async fn append(&self, entry: Entry, keep_days: u32) -> Result<(), AuditError> {
        Ok(self
            .control
            .within(self.append_now(&entry, keep_days))
            .await?)
    }

    async fn page(
        &self,
        project: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Entry>, AuditError> {
        // A cursor is an id this store gave; anything else starts from the newest.
        let before = cursor
            .and_then(|c| c.parse::<i64>().ok())
            .unwrap_or(i64::MAX);
        Ok(self
            .control
            .within(self.page_now(project, before, limit))
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(project: &str, n: usize) -> Entry {
        Entry {
            id: String::new(),
            project: project.into(),
            at: drg_base::infra::units::now_rfc3339(),
            key_id: "k".into(),
            action: "override.set".into(),
            target: format!("d{n}.example"),
            detail: String::new(),
        }
    }

    #[tokio::test]
    async fn a_project_keeps_its_newest_entries_and_pages_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let control = Control::sqlite(&dir.path().join("control.sqlite")).unwrap();
        let audit = SqlAudit::new(control);
        for n in 0..MAX_ENTRIES + 5 {
            audit.append(entry("p", n), 3_650).await.unwrap();
        }
        audit.append(entry("q", 0), 3_650).await.unwrap();
        let page = audit.page("p", None, 3).await.unwrap();
        let last = MAX_ENTRIES + 4;
        assert_eq!(page[0].target, format!("d{last}.example"));
        let ids: Vec<i64> = page.iter().map(|e| e.id.parse().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[0] > w[1]), "{ids:?}");
        let next = audit.page("p", Some(&page[2].id), 2).await.unwrap();
        assert_eq!(next[0].target, format!("d{}.example", last - 3));
        let all = audit.page("p", None, MAX_ENTRIES * 2).await.unwrap();
        assert_eq!(all.len(), MAX_ENTRIES, "the count bound");
        assert_eq!(
            all.last().unwrap().target,
            "d5.example",
            "the oldest went first"
        );
        assert_eq!(
            audit.page("q", None, 10).await.unwrap().len(),
            1,
            "per project"
        );
    }
}
