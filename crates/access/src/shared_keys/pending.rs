//! Revocations made while the shared store was away, kept in a file of this gateway's state
//! folder until Redis has them (`keys.redis-pending.json`, JSON, mode 0600): a revocation is
//! never lost, also across a restart during the outage. Until then this gateway leaves the
//! revoked keys (and what they made) out of its keys in service, whatever Redis says.
//!
//! One gateway writes its file (its own state folder), under the keys API's publishing lock.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::managed::{without_descendants, ManagedFile};

/// The file format's version.
const VERSION: u32 = 1;

/// The whole file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub version: u32,
    pub revocations: Vec<Revocation>,
}

impl Default for Pending {
    fn default() -> Self {
        Pending {
            version: VERSION,
            revocations: Vec::new(),
        }
    }
}

/// One revocation Redis does not have yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    pub project: String,
    pub id: String,
    /// When it was asked for (RFC 3339 UTC), for the operator reading the file.
    pub at: String,
}

/// Why the file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PendingError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a pending revocations file: {message}")]
    Format { path: PathBuf, message: String },
}

/// Reads the file; a missing one holds nothing. A file that cannot be read is an error, never
/// an empty list: the revocations in it must not be dropped.
pub fn read(path: &Path) -> Result<Pending, PendingError> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Pending::default()),
        Err(source) => {
            return Err(PendingError::Io {
                path: path.to_owned(),
                source,
            })
        }
    };
    let format = |message: String| PendingError::Format {
        path: path.to_owned(),
        message,
    };
    let file: Pending = serde_json::from_slice(&text).map_err(|e| format(e.to_string()))?;
    if file.version != VERSION {
        return Err(format(format!(
            "version {} (this gateway reads {VERSION})",
            file.version
        )));
    }
    Ok(file)
}

/// Writes the file atomically; an empty list removes it.
pub fn write(path: &Path, file: &Pending) -> Result<(), PendingError> {
    let io = |source| PendingError::Io {
        path: path.to_owned(),
        source,
    };
    if file.revocations.is_empty() {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(e)),
            _ => Ok(()),
        };
    }
    let mut body = serde_json::to_vec_pretty(file).map_err(|e| PendingError::Format {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    body.push(b'\n');
    drg_base::infra::fsutil::write_atomic(path, 0o600, &body).map_err(io)
}

/// Queues the revocation of `revoked` keys of `file` (keys whose maker is gone, found by
/// [`crate::managed::merge`]): Redis still counts them in `max_keys` until it has it.
pub fn queue_revoked(
    path: &Path,
    file: &ManagedFile,
    revoked: &[String],
    now: &str,
) -> Result<(), PendingError> {
    if revoked.is_empty() {
        return Ok(());
    }
    let mut p = read(path)?;
    for id in revoked {
        if let Some(k) = file.keys.iter().find(|k| k.id == *id) {
            p.add(&k.project, id, now);
        }
    }
    write(path, &p)
}

impl Pending {
    /// Adds a revocation (once).
    pub fn add(&mut self, project: &str, id: &str, at: &str) {
        if !self.holds(project, id) {
            self.revocations.push(Revocation {
                project: project.to_owned(),
                id: id.to_owned(),
                at: at.to_owned(),
            });
        }
    }

    fn holds(&self, project: &str, id: &str) -> bool {
        self.revocations
            .iter()
            .any(|r| r.project == project && r.id == id)
    }

    /// Drops a revocation Redis now has.
    pub fn remove(&mut self, project: &str, id: &str) {
        self.revocations
            .retain(|r| !(r.project == project && r.id == id));
    }

    /// Takes the pending revocations out of rows read from Redis (with what each key made,
    /// recursively); how many rows went.
    pub fn strip(&self, file: &mut ManagedFile) -> usize {
        let ids: Vec<String> = self
            .revocations
            .iter()
            .filter(|r| {
                file.keys
                    .iter()
                    .any(|k| k.id == r.id && k.project == r.project)
            })
            .map(|r| r.id.clone())
            .collect();
        if ids.is_empty() {
            0
        } else {
            without_descendants(file, &ids)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::managed::test_key as key;

    #[test]
    fn a_pending_revocation_takes_its_key_and_what_it_made_and_only_in_its_project() {
        let mut file = ManagedFile {
            keys: vec![
                key("a", "acme", Some("server")),
                key("b", "acme", Some("a")),
                key("c", "acme", Some("b")),
                key("d", "acme", Some("server")),
                key("e", "other", Some("x")),
            ],
            ..ManagedFile::default()
        };
        let mut p = Pending::default();
        p.add("acme", "a", "t");
        p.add("acme", "a", "t");
        p.add("acme", "e", "t");
        assert_eq!(p.revocations.len(), 2, "added once");
        assert_eq!(p.strip(&mut file), 3);
        let left: Vec<_> = file.keys.iter().map(|k| k.id.as_str()).collect();
        assert_eq!(left, ["d", "e"], "e is another project's");
        p.remove("acme", "a");
        assert_eq!(p.revocations.len(), 1);
    }

    #[test]
    fn the_file_round_trips_an_empty_one_is_removed_and_a_bad_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pending.json");
        assert_eq!(read(&path).unwrap(), Pending::default());
        let mut p = Pending::default();
        p.add("acme", "key_1", "2026-01-01T00:00:00Z");
        write(&path, &p).unwrap();
        assert_eq!(read(&path).unwrap(), p);
        write(&path, &Pending::default()).unwrap();
        assert!(!path.exists());
        std::fs::write(&path, "{").unwrap();
        assert!(matches!(read(&path), Err(PendingError::Format { .. })));
        std::fs::write(&path, r#"{"version":9,"revocations":[]}"#).unwrap();
        assert!(read(&path).is_err());
    }
}
