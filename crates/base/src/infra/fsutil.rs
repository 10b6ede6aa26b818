//! Replacing a file in one step, creating one private, and locking one: the single home of the
//! temp-file, fsync, rename, fsync-the-folder sequence every state and config file the gateway
//! writes goes through, and of the 0600 creation of the files SQLite fills.
//!
//! A reader (a reloader, another gateway, a successor during an upgrade) sees the old file or
//! the new one, never half of one, and a crash or power loss leaves one of the two whole: the
//! data is synced before the rename, and the folder after it (the rename itself is otherwise
//! only in memory).

use std::fs::{File, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The folder of `path` (`.` for a bare file name).
fn folder(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Why a file could not be replaced.
#[derive(Debug, thiserror::Error)]
pub enum ReplaceError<E> {
    /// Writing the new content failed.
    #[error(transparent)]
    Fill(E),
    /// The temporary file, its sync, the rename or the folder's sync failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Replaces `path` with `content`, mode `mode` (exactly: not narrowed by the umask).
pub fn write_atomic(path: &Path, mode: u32, content: &[u8]) -> io::Result<()> {
    replace_with(path, mode, |mut f| f.write_all(content)).map_err(|e| match e {
        ReplaceError::Fill(e) | ReplaceError::Io(e) => e,
    })
}

/// Replaces `path` with a file `fill` writes, mode `mode` (exactly: not narrowed by the umask).
/// The temporary file sits in the same folder (a rename does not cross file systems), under a
/// name starting with `.` and unique per call (a gateway and its successor never share one);
/// it is removed when `fill` or a later step fails.
pub fn replace_with<E>(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&File) -> Result<(), E>,
) -> Result<(), ReplaceError<E>> {
    let dir = folder(path);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(Permissions::from_mode(mode))
        .tempfile_in(dir)?;
    // The mode given at creation is narrowed by the umask; set it again, exactly.
    tmp.as_file()
        .set_permissions(Permissions::from_mode(mode))?;
    keep_owner(path, tmp.as_file());
    fill(tmp.as_file()).map_err(ReplaceError::Fill)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Gives `tmp` the owner of the file it replaces: root replacing the keys file of a packaged
/// gateway (`key new --append`) must leave it to the service's user, who alone reads it. Best
/// effort: only root may give a file away, and anyone else's replacement is theirs anyway.
fn keep_owner(path: &Path, tmp: &File) {
    use std::os::unix::fs::MetadataExt;
    let (Ok(old), Ok(new)) = (std::fs::metadata(path), tmp.metadata()) else {
        return;
    };
    if (old.uid(), old.gid()) != (new.uid(), new.gid()) {
        let _ = std::os::unix::fs::fchown(tmp, Some(old.uid()), Some(old.gid()));
    }
}

/// Creates `path` empty, mode 0600 exactly (not narrowed by the umask), unless something is
/// there already (left as it is). For a file another library then opens and fills in its own way
/// (SQLite): made here first, it is private from its first byte, whatever the umask; SQLite
/// gives a database's `-wal` and `-shm` files the database file's mode.
pub fn create_private(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(file) => file.set_permissions(Permissions::from_mode(0o600)),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

/// The permission bits of `path`, `None` when it does not exist (or cannot be read).
pub fn mode_of(path: &Path) -> Option<u32> {
    std::fs::metadata(path)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777)
}

/// Opens `<path>.lock` (created 0600 when missing) and takes its exclusive lock, waiting for
/// it: held while the returned file is open. Gateways sharing a state folder serialise their
/// read-modify-writes of `path` with it. On failure, the lock file's path with the error.
pub fn lock_beside(path: &Path) -> Result<File, (std::path::PathBuf, io::Error)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = std::path::PathBuf::from(name);
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&lock_path);
    match opened.and_then(|f| lock_exclusive(&f).map(|()| f)) {
        Ok(f) => Ok(f),
        Err(e) => Err((lock_path, e)),
    }
}

/// Takes an exclusive lock on `file`, waiting for it (`flock`: released when the file is
/// closed, and by the kernel if the process dies holding it). Retried when a signal
/// interrupts the wait.
pub fn lock_exclusive(file: &File) -> io::Result<()> {
    loop {
        match file.lock() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_whole_with_the_exact_mode_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.yaml");
        std::fs::write(&path, "old").unwrap();
        // The usual umask (022) would make it 0644.
        write_atomic(&path, 0o666, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(mode_of(&path), Some(0o666));
        write_atomic(&path, 0o600, b"newer").unwrap();
        assert_eq!(mode_of(&path), Some(0o600));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["f.yaml"]);
        assert_eq!(mode_of(&dir.path().join("none")), None);
    }

    #[test]
    fn a_failed_fill_keeps_the_old_file_and_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "old").unwrap();
        let e = replace_with(&path, 0o600, |_| Err("no")).unwrap_err();
        assert!(matches!(e, ReplaceError::Fill("no")));
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn create_private_makes_a_0600_file_and_leaves_an_existing_one_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        create_private(&path).unwrap();
        assert_eq!(mode_of(&path), Some(0o600));
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        std::fs::write(&path, "kept").unwrap();
        std::fs::set_permissions(&path, Permissions::from_mode(0o640)).unwrap();
        create_private(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "kept");
        assert_eq!(mode_of(&path), Some(0o640));
        assert!(create_private(&dir.path().join("none/db")).is_err());
    }

    #[test]
    fn a_second_lock_waits_for_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l");
        let a = File::create(&path).unwrap();
        lock_exclusive(&a).unwrap();
        let b = File::open(&path).unwrap();
        assert!(matches!(
            b.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        drop(a);
        lock_exclusive(&b).unwrap();
    }
}
