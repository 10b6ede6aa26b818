//! Where the SQLite control store lives: its folder resolved as the system resolves it, so that
//! the file SQLite opens is the one made private and named in the log; and the file an earlier
//! release opened by mistake for a state folder written with `..`, moved there once.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sqlx::any::AnyConnectOptions;
use sqlx::sqlite::SqliteConnectOptions;

use super::ControlError;

/// The files SQLite keeps beside a database in WAL mode.
const SIDE_FILES: [&str; 2] = ["-wal", "-shm"];

/// `path` with its folder made (if missing) and resolved (`..`, `.` and links, as every other
/// state file's path is): a URL's path would be cleaned of dot segments by the URL rules instead
/// (`conf/../state/x` read as the host `conf` and the path `/state/x`, so `conf/state/x`).
pub(super) fn resolve(path: &Path) -> Result<PathBuf, ControlError> {
    let failed = |source| ControlError::File {
        path: path.to_path_buf(),
        source,
    };
    let name = path.file_name().ok_or_else(|| {
        failed(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "names no file",
        ))
    })?;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(folder).map_err(failed)?;
    Ok(std::fs::canonicalize(folder).map_err(failed)?.join(name))
}

/// The file an earlier release opened for `path` (the URL of `url` read back by sqlx, as it was),
/// when that is not `file`.
fn misplaced(url: &str, file: &Path) -> Option<PathBuf> {
    let any = url.parse::<AnyConnectOptions>().ok()?;
    let opened = SqliteConnectOptions::try_from(&any).ok()?;
    let opened = opened.get_filename();
    let same = opened == file || std::fs::canonicalize(opened).is_ok_and(|p| p == file);
    (!same).then(|| opened.to_path_buf())
}

/// Moves the store an earlier release kept at the wrong place (`url`, the URL it built from the
/// configured path) to `file`, with its WAL, made private again. Only into an empty place: when
/// `file` holds a store too, which one is the truth is the operator's call, so the gateway
/// refuses to start rather than pick.
pub(super) fn adopt_misplaced(url: &str, file: &Path) -> Result<(), ControlError> {
    let Some(old) = misplaced(url, file) else {
        return Ok(());
    };
    if !holds_data(&old) {
        return Ok(());
    }
    if holds_data(file) {
        return Err(ControlError::TwoStores {
            misplaced: old,
            file: file.to_path_buf(),
        });
    }
    let moved = |from: &Path, to: &Path| -> Result<(), ControlError> {
        let failed = |source| ControlError::File {
            path: from.to_path_buf(),
            source,
        };
        std::fs::rename(from, to).map_err(failed)?;
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o600)).map_err(failed)
    };
    // The WAL first: a crash between the two leaves the database file where it was, and the
    // next start moves it (SQLite reads a WAL only beside its own database).
    for side in SIDE_FILES {
        let (from, to) = (with_suffix(&old, side), with_suffix(file, side));
        if from.exists() {
            moved(&from, &to)?;
        } else if to.exists() {
            // Left by an empty store at the right place: not this database's.
            let _ = std::fs::remove_file(&to);
        }
    }
    moved(&old, file)?;
    log::warn!(
        "control store: moved {} to {} (an earlier release kept it there for a state folder \
         written with '..'; the log named the right place)",
        old.display(),
        file.display()
    );
    Ok(())
}

/// Whether `path` is a database with something in it (or its WAL is).
fn holds_data(path: &Path) -> bool {
    let size = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
    size(path) > 0 || size(&with_suffix(path, "-wal")) > 0
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_written_with_dot_dot_is_resolved_as_the_system_does() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("conf")).unwrap();
        let path = dir.path().join("conf/../state/control.sqlite");
        let file = resolve(&path).unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        assert_eq!(file, root.join("state/control.sqlite"));
        assert!(root.join("state").is_dir());
    }

    #[test]
    fn a_relative_folder_with_dot_dot_was_read_elsewhere_by_the_url() {
        // What the earlier release opened: the URL's first segment taken as a host.
        let any = "sqlite://conf/../state/control.sqlite?mode=rwc"
            .parse::<AnyConnectOptions>()
            .unwrap();
        let opened = SqliteConnectOptions::try_from(&any).unwrap();
        assert_eq!(
            opened.get_filename(),
            Path::new("conf/state/control.sqlite")
        );
    }

    #[test]
    fn a_misplaced_store_is_moved_once_with_its_wal_and_made_private() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let old = root.join("conf/state/control.sqlite");
        std::fs::create_dir_all(old.parent().unwrap()).unwrap();
        std::fs::write(&old, b"database").unwrap();
        std::fs::write(with_suffix(&old, "-wal"), b"wal").unwrap();
        let file = resolve(&root.join("state/control.sqlite")).unwrap();
        // An empty file the earlier release made private at the right place.
        std::fs::write(&file, b"").unwrap();
        // The URL that led an earlier release there.
        let url = format!("sqlite://{}?mode=rwc", old.display());
        adopt_misplaced(&url, &file).unwrap();
        // Once: nothing is left there to move.
        adopt_misplaced(&url, &file).unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"database");
        assert_eq!(std::fs::read(with_suffix(&file, "-wal")).unwrap(), b"wal");
        assert!(!old.exists());
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn two_stores_are_refused_not_chosen_between() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let old = root.join("a/state/control.sqlite");
        std::fs::create_dir_all(old.parent().unwrap()).unwrap();
        std::fs::write(&old, b"old").unwrap();
        let file = resolve(&root.join("state/control.sqlite")).unwrap();
        std::fs::write(&file, b"new").unwrap();
        let url = format!("sqlite://{}?mode=rwc", old.display());
        let err = adopt_misplaced(&url, &file).unwrap_err().to_string();
        assert!(err.contains("holds one too"), "{err}");
        assert_eq!(std::fs::read(&old).unwrap(), b"old");
        assert_eq!(std::fs::read(&file).unwrap(), b"new");
    }
}
