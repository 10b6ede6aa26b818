//! The trail in the control store (`drg_audit`, SQLite or PostgreSQL: every gateway of a
//! deployment reads one trail): a row an entry, keyed by project and id (the rows are
//! `drg_base::infra::control::audit`'s), so a page reads only the rows it returns.

use std::sync::Arc;

use drg_base::infra::control::audit::AuditRow;
use drg_base::infra::control::{Control, ControlError};

use super::{AuditError, Entry};

/// The control store's trail.
pub struct SqlAudit {
    control: Arc<Control>,
}

impl SqlAudit {
    pub fn new(control: Arc<Control>) -> SqlAudit {
        SqlAudit { control }
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

/// `entry` as the control store writes it.
pub(crate) fn row_of(entry: &Entry) -> AuditRow {
    AuditRow {
        project: entry.project.clone(),
        id: entry.id.parse().ok(),
        at: entry.at.clone(),
        key_id: entry.key_id.clone(),
        action: entry.action.clone(),
        target: entry.target.clone(),
        detail: entry.detail.clone(),
    }
}

impl From<ControlError> for AuditError {
    fn from(e: ControlError) -> Self {
        AuditError::Control(e.to_string())
    }
}

impl SqlAudit {
    /// The project's entries before `cursor` (an id; `None`: the newest), newest first.
    pub async fn page(
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
    use crate::account::audit::MAX_ENTRIES;

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
        let audit = SqlAudit::new(control.clone());
        // As a change writes its entry: in its own transaction.
        let append = |e: Entry| {
            let control = control.clone();
            async move {
                let mut w = control.write(control.deadline()).await.unwrap();
                drg_base::infra::control::audit::append(&mut w.tx, &row_of(&e), 3_650)
                    .await
                    .unwrap();
                w.tx.commit().await.unwrap();
            }
        };
        for n in 0..MAX_ENTRIES + 5 {
            append(entry("p", n)).await;
        }
        append(entry("q", 0)).await;
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
