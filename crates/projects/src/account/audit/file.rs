//! The trail in `audit.sqlite` in the state folder (mode 0600, WAL; gateways sharing the folder
//! share it): one row an entry, keyed by project and id, so an append writes one row and trims
//! only its project, and a page reads only the rows it returns (the index's order). Each
//! project keeps at most [`MAX_ENTRIES`] entries and its plan's days. A trail an older release
//! kept in `audit.jsonl` is taken in once, at the first use, and the file renamed
//! `audit.jsonl.imported`.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use drg_base::infra::sqlite::{self, Synchronous};
use rusqlite::{params, Connection};

use super::{AuditError, AuditStore, Entry, MAX_ENTRIES};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS entries (
  project TEXT NOT NULL,
  id INTEGER NOT NULL,
  at TEXT NOT NULL,
  key_id TEXT NOT NULL,
  action TEXT NOT NULL,
  target TEXT NOT NULL,
  detail TEXT NOT NULL,
  PRIMARY KEY (project, id)
) WITHOUT ROWID;
";

/// The file store.
#[derive(Clone)]
pub struct FileAudit {
    path: Arc<PathBuf>,
    /// Opened at first use, in the process that serves (a host may fork after building).
    conn: Arc<Mutex<Option<Connection>>>,
}

fn sql(path: &Path) -> impl Fn(rusqlite::Error) -> AuditError + '_ {
    move |e| AuditError::Io {
        path: path.display().to_string(),
        source: std::io::Error::other(e),
    }
}

impl FileAudit {
    pub fn new(path: PathBuf) -> FileAudit {
        FileAudit {
            path: Arc::new(path),
            conn: Arc::default(),
        }
    }

    /// Runs `f` on the connection, opening it (and taking in a legacy file) the first time.
    fn with<T>(
        &self,
        f: impl FnOnce(&Connection, &Path) -> Result<T, AuditError>,
    ) -> Result<T, AuditError> {
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        if conn.is_none() {
            let opened =
                sqlite::open(&self.path, Synchronous::Normal).map_err(|e| AuditError::Io {
                    path: self.path.display().to_string(),
                    source: std::io::Error::other(e),
                })?;
            opened.execute_batch(SCHEMA).map_err(sql(&self.path))?;
            sqlite::keep_log_small(&opened).map_err(sql(&self.path))?;
            import_legacy(&opened, &self.path)?;
            *conn = Some(opened);
        }
        f(conn.as_ref().expect("opened above"), &self.path)
    }

    fn append_now(&self, entry: Entry, keep_days: u32) -> Result<(), AuditError> {
        self.with(|c, path| {
            let cutoff = drg_base::infra::units::rfc3339(
                chrono::Utc::now() - chrono::Duration::days(i64::from(keep_days)),
            );
            insert(c, path, &entry, chrono::Utc::now().timestamp_micros())?;
            // Only this project's rows past its bounds: the age, then the count.
            c.execute(
                "DELETE FROM entries WHERE project = ?1 AND at < ?2",
                params![entry.project, cutoff],
            )
            .map_err(sql(path))?;
            c.execute(
                "DELETE FROM entries WHERE project = ?1 AND id <= (
                   SELECT id FROM entries WHERE project = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
                params![entry.project, MAX_ENTRIES as i64],
            )
            .map_err(sql(path))?;
            Ok(())
        })
    }

    fn page_now(&self, project: &str, before: i64, limit: usize) -> Result<Vec<Entry>, AuditError> {
        self.with(|c, path| {
            let mut stmt = c
                .prepare_cached(
                    "SELECT id, at, key_id, action, target, detail FROM entries
                     WHERE project = ?1 AND id < ?2 ORDER BY id DESC LIMIT ?3",
                )
                .map_err(sql(path))?;
            let rows = stmt
                .query_map(params![project, before, limit as i64], |r| {
                    Ok(Entry {
                        id: r.get::<_, i64>(0)?.to_string(),
                        project: String::new(),
                        at: r.get(1)?,
                        key_id: r.get(2)?,
                        action: r.get(3)?,
                        target: r.get(4)?,
                        detail: r.get(5)?,
                    })
                })
                .map_err(sql(path))?;
            rows.collect::<Result<Vec<_>, _>>().map_err(sql(path))
        })
    }
}

/// Inserts `entry` under an id past the project's last (the microsecond `now_us`, or one more).
fn insert(c: &Connection, path: &Path, entry: &Entry, now_us: i64) -> Result<(), AuditError> {
    c.execute(
        "INSERT INTO entries (project, id, at, key_id, action, target, detail)
         VALUES (?1, MAX(?2, COALESCE((SELECT MAX(id) + 1 FROM entries WHERE project = ?1), 0)),
                 ?3, ?4, ?5, ?6, ?7)",
        params![
            entry.project,
            now_us,
            entry.at,
            entry.key_id,
            entry.action,
            entry.target,
            entry.detail
        ],
    )
    .map(drop)
    .map_err(sql(path))
}

/// Takes in `audit.jsonl` beside `path` (an older release's trail), once: its entries keep
/// their ids, and the file is renamed so it is not read again.
fn import_legacy(c: &Connection, path: &Path) -> Result<(), AuditError> {
    let legacy = path.with_file_name("audit.jsonl");
    let text = match std::fs::read_to_string(&legacy) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(AuditError::Io {
                path: legacy.display().to_string(),
                source,
            })
        }
    };
    // One transaction: a commit a line would take minutes for a large trail.
    c.execute_batch("BEGIN").map_err(sql(path))?;
    for e in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Entry>(l).ok())
    {
        let id = e.id.parse::<i64>().unwrap_or(0);
        c.execute(
            "INSERT OR IGNORE INTO entries (project, id, at, key_id, action, target, detail)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![e.project, id, e.at, e.key_id, e.action, e.target, e.detail],
        )
        .map_err(sql(path))?;
    }
    c.execute_batch("COMMIT").map_err(sql(path))?;
    std::fs::rename(&legacy, legacy.with_extension("jsonl.imported")).map_err(|source| {
        AuditError::Io {
            path: legacy.display().to_string(),
            source,
        }
    })
}

fn task_failed(e: tokio::task::JoinError) -> AuditError {
    AuditError::Io {
        path: "audit".into(),
        source: std::io::Error::other(e),
    }
}

#[async_trait::async_trait]
impl AuditStore for FileAudit {
    async fn append(&self, entry: Entry, keep_days: u32) -> Result<(), AuditError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.append_now(entry, keep_days))
            .await
            .unwrap_or_else(|e| Err(task_failed(e)))
    }

    async fn page(
        &self,
        project: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Entry>, AuditError> {
        let (me, project) = (self.clone(), project.to_owned());
        let before = cursor
            .and_then(|c| c.parse::<i64>().ok())
            .unwrap_or(i64::MAX);
        tokio::task::spawn_blocking(move || me.page_now(&project, before, limit))
            .await
            .unwrap_or_else(|e| Err(task_failed(e)))
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

    #[test]
    fn a_project_keeps_its_newest_entries_and_pages_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let legacy = serde_json::json!({"id": "5", "project": "p", "at": "2026-01-01T00:00:00Z",
            "key_id": "k", "action": "key.created", "target": "key_1", "detail": ""});
        std::fs::write(dir.path().join("audit.jsonl"), format!("{legacy}\n")).unwrap();
        let audit = FileAudit::new(dir.path().join("audit.sqlite"));
        for n in 0..MAX_ENTRIES + 5 {
            audit.append_now(entry("p", n), 3_650).unwrap();
        }
        audit.append_now(entry("q", 0), 3_650).unwrap();
        let page = audit.page_now("p", i64::MAX, 3).unwrap();
        let last = MAX_ENTRIES + 4;
        assert_eq!(page[0].target, format!("d{last}.example"));
        let ids: Vec<i64> = page.iter().map(|e| e.id.parse().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[0] > w[1]), "{ids:?}");
        let all = audit.page_now("p", i64::MAX, MAX_ENTRIES * 2).unwrap();
        assert_eq!(all.len(), MAX_ENTRIES, "the count bound");
        assert_eq!(
            all.last().unwrap().target,
            "d5.example",
            "the oldest went first"
        );
        assert_eq!(
            audit.page_now("q", i64::MAX, 10).unwrap().len(),
            1,
            "per project"
        );
        assert!(dir.path().join("audit.jsonl.imported").exists());
    }
}
