//! Records in a file of the state folder (mode 0600), for gateways that share a folder: every
//! write is a read-merge-write under an exclusive `flock` on `<file>.lock`, replaced in one
//! step, so two gateways never lose each other's writes and a reader never sees half a file.

use std::marker::PhantomData;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Merged, Put, Record, RecordStore, RecordsError, Token};

/// The file format's version.
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(bound = "R: Record")]
struct RecordsFile<R> {
    version: u32,
    entries: Vec<R>,
}

/// The file store.
pub struct FileRecords<R> {
    path: Arc<PathBuf>,
    _records: PhantomData<fn() -> R>,
}

impl<R> Clone for FileRecords<R> {
    fn clone(&self) -> Self {
        FileRecords {
            path: self.path.clone(),
            _records: PhantomData,
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RecordsError + '_ {
    move |source| RecordsError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl<R: Record> FileRecords<R> {
    pub fn new(path: PathBuf) -> FileRecords<R> {
        FileRecords {
            path: Arc::new(path),
            _records: PhantomData,
        }
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The records of the file, read now (blocking; none while it does not exist).
    pub fn read_now(&self) -> Result<Vec<R>, RecordsError> {
        let bytes = match std::fs::read(&*self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&self.path)(e)),
        };
        let file: RecordsFile<R> =
            serde_json::from_slice(&bytes).map_err(|source| RecordsError::Format {
                path: self.path.display().to_string(),
                source,
            })?;
        Ok(file.entries)
    }

    /// Replaces the file's records with `records` (blocking): the copy of a shared store.
    pub fn replace_now(&self, records: &[R]) -> Result<(), RecordsError> {
        self.update(|m| {
            *m = Merged::of(records.iter().cloned());
            ((), true)
        })
    }

    /// Reads, changes with `change` and writes the file under its lock (when `change` says so).
    fn update<T>(
        &self,
        change: impl FnOnce(&mut Merged<R>) -> (T, bool),
    ) -> Result<T, RecordsError> {
        let _lock = self.lock()?;
        let mut m = Merged::of(self.read_now()?);
        let (out, write) = change(&mut m);
        if write {
            let body = serde_json::to_vec_pretty(&RecordsFile {
                version: VERSION,
                entries: m.sorted(),
            })?;
            crate::infra::fsutil::write_atomic(&self.path, 0o600, &body).map_err(io(&self.path))?;
        }
        Ok(out)
    }

    fn lock(&self) -> Result<std::fs::File, RecordsError> {
        crate::infra::fsutil::lock_beside(&self.path).map_err(|(p, e)| io(&p)(e))
    }
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RecordsError> + Send + 'static,
) -> Result<T, RecordsError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(io(Path::new("records"))(std::io::Error::other(e))))
}

#[async_trait::async_trait]
impl<R: Record> RecordStore<R> for FileRecords<R> {
    async fn put(&self, record: &R, max_live: u32) -> Result<Put, RecordsError> {
        let (me, record) = (self.clone(), record.clone());
        blocking(move || {
            me.update(|m| {
                let put = m.put(&record, max_live);
                (put, matches!(put, Put::Done { .. }))
            })
        })
        .await
    }

    async fn token(&self) -> Result<Token, RecordsError> {
        Ok(Token::At(match std::fs::metadata(&*self.path) {
            Ok(m) => format!("{}.{}.{}.{}", m.ino(), m.mtime(), m.mtime_nsec(), m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "absent".to_owned(),
            Err(e) => return Err(io(&self.path)(e)),
        }))
    }

    async fn read(&self) -> Result<Vec<R>, RecordsError> {
        let me = self.clone();
        blocking(move || me.read_now()).await
    }

    async fn restore(&self, records: &[R]) -> Result<(), RecordsError> {
        let (me, records) = (self.clone(), records.to_vec());
        blocking(move || {
            me.update(|m| {
                let changed = records.into_iter().fold(false, |c, r| m.merge(r) | c);
                ((), changed)
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::{Deserialize, Serialize};

    #[derive(Clone, Debug, Serialize, Deserialize)]
    struct Note {
        project: String,
        key: String,
        stamp: u64,
        #[serde(default)]
        removed: bool,
    }

    impl Record for Note {
        fn project(&self) -> &str {
            &self.project
        }
        fn key(&self) -> &str {
            &self.key
        }
        fn stamp(&self) -> u64 {
            self.stamp
        }
        fn removed(&self) -> bool {
            self.removed
        }
        fn writer(&self) -> &str {
            ""
        }
    }

    fn note(key: &str, stamp: u64, removed: bool) -> Note {
        Note {
            project: "p".into(),
            key: key.into(),
            stamp,
            removed,
        }
    }

    #[tokio::test]
    async fn writes_merge_by_stamp_a_project_is_bounded_and_removals_are_not_revived() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileRecords::<Note>::new(dir.path().join("notes.json"));
        assert_eq!(store.token().await.unwrap(), Token::At("absent".into()));
        let put = |n| {
            let s = store.clone();
            async move { s.put(&n, 2).await.unwrap() }
        };
        assert_eq!(put(note("a", 5, false)).await, Put::Done { created: true });
        assert_eq!(put(note("a", 6, false)).await, Put::Done { created: false });
        assert_eq!(put(note("a", 4, false)).await, Put::Stale);
        assert_eq!(put(note("b", 5, false)).await, Put::Done { created: true });
        assert_eq!(put(note("c", 5, false)).await, Put::Full);
        assert_eq!(put(note("b", 7, true)).await, Put::Done { created: false });
        assert_eq!(put(note("c", 8, false)).await, Put::Done { created: true });
        // An older copy put back (a store's restore) changes nothing it holds newer.
        store
            .restore(&[note("b", 6, false), note("d", 1, false)])
            .await
            .unwrap();
        let held = Merged::of(store.read().await.unwrap());
        assert!(held.get("p", "b").unwrap().removed);
        let mut live: Vec<&str> = held.live("p").map(|n| n.key.as_str()).collect();
        live.sort();
        assert_eq!(live, ["a", "c", "d"]);
        assert_eq!(
            crate::infra::fsutil::mode_of(&dir.path().join("notes.json")),
            Some(0o600)
        );
    }
}
