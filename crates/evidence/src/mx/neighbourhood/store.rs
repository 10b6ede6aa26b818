//! The index on disk: the state file (kept across restarts) and the `mx-snapshot` file share
//! one format, JSON lines: a header line, then one learned domain per line
//! (`{"domain":"x.io","keys":["host:mx.x.io","parent:x.io","network:192.0.2.0/24"],"seen":20415}`).
//!
//! The state file is replaced atomically (temporary file, fsync, rename): a crash leaves the
//! previous file or the new one, never half of one; at most one save interval of learning is
//! lost. Which names are listed is not stored: it is read from the table in service at load.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use drg_base::infra::fsutil::replace_with;
use drg_domain::neighbour_index::{KeyKind, Learned};

/// The header's `format`.
pub const FORMAT: &str = "drg-mx-neighbourhood";
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct Header {
    format: String,
    version: u32,
}

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: not an MX neighbourhood file (the first line must be {{\"format\":\"{FORMAT}\",\"version\":{VERSION}}})")]
    Header { path: String },
}

/// The header line.
pub fn header() -> String {
    let h = Header {
        format: FORMAT.into(),
        version: VERSION,
    };
    serde_json::to_string(&h).unwrap_or_default()
}

/// One line for `learned`.
pub fn line(learned: &Learned) -> String {
    serde_json::to_string(learned).unwrap_or_default()
}

/// Reads a file: the learned domains, and how many lines were skipped as unreadable (a line
/// torn by a crash of `mx-snapshot`, a key of an unknown kind). `Ok(None)` when there is no
/// file.
pub fn read(path: &Path) -> Result<Option<(Vec<Learned>, usize)>, StoreError> {
    let io = |source| StoreError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let mut lines = BufReader::new(file).lines();
    let first = lines.next().transpose().map_err(io)?.unwrap_or_default();
    match serde_json::from_str::<Header>(&first) {
        Ok(h) if h.format == FORMAT && h.version == VERSION => {}
        _ => {
            return Err(StoreError::Header {
                path: path.display().to_string(),
            })
        }
    }
    let (mut out, mut bad) = (Vec::new(), 0);
    for l in lines {
        let l = l.map_err(io)?;
        if l.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Learned>(&l) {
            Ok(learned) if valid(&learned) => out.push(learned),
            _ => bad += 1,
        }
    }
    Ok(Some((out, bad)))
}

/// A line from a file is hostile until checked: a domain and keys of a known kind, bounded.
pub(crate) fn valid(l: &Learned) -> bool {
    !l.domain.is_empty()
        && l.domain.len() <= 253
        && l.keys.len() <= 16
        && l.keys
            .iter()
            .all(|k| k.len() <= 300 && KeyKind::split(k).is_some())
}

/// Replaces the state file at `path` with `learned` (mode 0600: what the gateway's users look
/// up is no one else's business).
pub fn write(path: &Path, learned: &[Learned]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    replace_with(path, 0o600, |f| {
        let mut w = std::io::BufWriter::new(f);
        writeln!(w, "{}", header())?;
        for l in learned {
            writeln!(w, "{}", line(l))?;
        }
        w.flush()
    })
    .map_err(|e| match e {
        drg_base::infra::fsutil::ReplaceError::Fill(e)
        | drg_base::infra::fsutil::ReplaceError::Io(e) => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_file_reads_back_and_bad_lines_are_counted_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nb.jsonl");
        let mut l = Learned::new(
            "x.io",
            vec!["host:mx.x.io".into(), "network:192.0.2.0/24".into()],
            20_000,
            Default::default(),
        );
        // What a listed domain's teachers and an unlisted one's owner evidence read back as.
        l.taught_by = vec![7, 9];
        l.vouched = true;
        write(&path, std::slice::from_ref(&l)).unwrap();
        assert_eq!(read(&path).unwrap(), Some((vec![l.clone()], 0)));
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"domain\":\"y.io\",\"keys\":[\"colour:red\"],\"seen\":1}\n{\"dom");
        std::fs::write(&path, text).unwrap();
        assert_eq!(read(&path).unwrap(), Some((vec![l], 2)));
        std::fs::write(&path, "hello\n").unwrap();
        assert!(matches!(read(&path), Err(StoreError::Header { .. })));
        assert!(read(&dir.path().join("none")).unwrap().is_none());
    }
}
