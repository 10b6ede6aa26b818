//! The flag counts on disk (`gateway.top_domains.state_file`): written atomically (a private
//! temporary file, synced, renamed over the old one), read once at start. A file that cannot be
//! read or parsed is logged and ignored: the counts start empty, the gateway starts anyway.

use std::path::Path;

use serde::{Deserialize, Serialize};

use drg_domain::heavy_hitters::{Day, Snapshot};

/// Bumped when the layout changes; another version is ignored like a corrupt file.
const FORMAT: u32 = 1;

/// Everything the keeper holds (see [`super::keeper`] for what each part means).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct StateFile {
    pub format: u32,
    /// The flags this gateway counted: all of them with the embedded quota store; with Redis,
    /// those not sent yet.
    pub own: Vec<(Day, Snapshot)>,
    /// A batch sent to Redis without an answer yet: resent under the same id, so Redis adds
    /// it once.
    pub sending: Option<(String, Vec<(Day, Snapshot)>)>,
    /// Batches Redis took that the last read of Redis does not show yet.
    pub acked: Vec<(Day, Snapshot)>,
    /// The window as last read from Redis.
    pub shared: Vec<(Day, Snapshot)>,
}

/// Why the state could not be saved.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    #[error("top-domains state {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

impl StateFile {
    pub fn new() -> Self {
        StateFile {
            format: FORMAT,
            ..StateFile::default()
        }
    }

    /// The stored state, or `None` (logged unless the file is simply absent).
    pub fn load(path: &Path) -> Option<StateFile> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                log::error!(
                    "top-domains state {}: cannot read it ({e}); counts start empty",
                    path.display()
                );
                return None;
            }
        };
        match serde_json::from_slice::<StateFile>(&bytes) {
            Ok(state) if state.format == FORMAT => Some(state),
            Ok(state) => {
                log::error!(
                    "top-domains state {}: format {} is not {FORMAT}; ignored, counts start empty",
                    path.display(),
                    state.format
                );
                None
            }
            Err(e) => {
                log::error!(
                    "top-domains state {}: corrupt ({e}); ignored, counts start empty",
                    path.display()
                );
                None
            }
        }
    }

    /// Replaces the file at `path` with this state, atomically (blocking: call it off the
    /// request threads).
    pub fn save(&self, path: &Path) -> Result<(), SaveError> {
        let err = |source| SaveError::Io {
            path: path.display().to_string(),
            source,
        };
        let bytes = serde_json::to_vec(self).map_err(|e| err(std::io::Error::other(e)))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(err)?;
        }
        drg_base::infra::fsutil::write_atomic(path, 0o600, &bytes).map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drg_domain::heavy_hitters::Label;
    use drg_domain::Reason;

    #[test]
    fn saves_atomically_and_loads_back_and_ignores_a_corrupt_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/top.json");
        assert!(StateFile::load(&path).is_none());
        let mut state = StateFile::new();
        let label = Label {
            reason: Reason::Disposable,
            score: 100,
        };
        state.own.push((
            20_000,
            Snapshot {
                total: 3,
                counters: vec![("a.com".into(), 3, 0, label)],
            },
        ));
        state.save(&path).unwrap();
        let back = StateFile::load(&path).unwrap();
        assert_eq!(back.own, state.own);
        assert_eq!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count(),
            1
        );
        std::fs::write(&path, b"{\"format\":1,\"own\":[[1,").unwrap();
        assert!(StateFile::load(&path).is_none());
        std::fs::write(&path, br#"{"format":99}"#).unwrap();
        assert!(StateFile::load(&path).is_none());
    }
}
