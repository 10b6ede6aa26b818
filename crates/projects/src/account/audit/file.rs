//! The trail in `audit.jsonl` (mode 0600): one JSON entry a line, appended under the lock
//! beside it; the project's entries past its retention are dropped (the file replaced whole)
//! when an append finds the oldest line past it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{AuditError, AuditStore, Entry};

/// The file store.
#[derive(Clone)]
pub struct FileAudit {
    path: Arc<PathBuf>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> AuditError + '_ {
    move |source| AuditError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl FileAudit {
    pub fn new(path: PathBuf) -> FileAudit {
        FileAudit {
            path: Arc::new(path),
        }
    }

    /// Every entry (none while the file does not exist); a line that does not parse is skipped.
    fn read(&self) -> Result<Vec<Entry>, AuditError> {
        match std::fs::read_to_string(&*self.path) {
            Ok(text) => Ok(text
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(io(&self.path)(e)),
        }
    }

    fn append_now(&self, mut entry: Entry, keep_days: u32) -> Result<(), AuditError> {
        let _lock = drg_base::infra::fsutil::lock_beside(&self.path).map_err(|(p, e)| io(&p)(e))?;
        let all = self.read()?;
        // Ids increase in the file: the microsecond, past the last one given.
        let now_us = chrono::Utc::now().timestamp_micros();
        let last = (all.last())
            .and_then(|e| e.id.parse::<i64>().ok())
            .unwrap_or(0);
        entry.id = now_us.max(last + 1).to_string();
        let cutoff = (chrono::Utc::now() - chrono::Duration::days(i64::from(keep_days)))
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let stale = |e: &Entry| e.project == entry.project && e.at < cutoff;
        if all.iter().any(stale) {
            let mut text = String::new();
            for e in all.iter().filter(|e| !stale(e)).chain([&entry]) {
                text.push_str(&serde_json::to_string(e)?);
                text.push('\n');
            }
            return drg_base::infra::fsutil::write_atomic(&self.path, 0o600, text.as_bytes())
                .map_err(io(&self.path));
        }
        drg_base::infra::fsutil::create_private(&self.path).map_err(io(&self.path))?;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&*self.path)
            .map_err(io(&self.path))?;
        let mut line = serde_json::to_string(&entry)?;
        line.push('\n');
        f.write_all(line.as_bytes()).map_err(io(&self.path))
    }
}

#[async_trait::async_trait]
impl AuditStore for FileAudit {
    async fn append(&self, entry: Entry, keep_days: u32) -> Result<(), AuditError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.append_now(entry, keep_days))
            .await
            .unwrap_or_else(|e| Err(io(Path::new("audit"))(std::io::Error::other(e))))
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
        tokio::task::spawn_blocking(move || {
            Ok(me
                .read()?
                .into_iter()
                .rev()
                .filter(|e| e.project == project)
                .filter(|e| e.id.parse::<i64>().is_ok_and(|id| id < before))
                .take(limit)
                .collect())
        })
        .await
        .unwrap_or_else(|e| Err(io(Path::new("audit"))(std::io::Error::other(e))))
    }
}
