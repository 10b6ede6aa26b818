//! Who holds an outbox lease. Each deliverer process draws an id and, from its first lease on,
//! holds an exclusive `flock` on `<outbox>.holders/<id>.lock` for its whole life. A lease names
//! its holder: a lease whose holder's lock can be taken belongs to a process that is gone (a
//! `kill -9`, a crash), so its message is taken again at once rather than after the lease's
//! time; and only the lease's holder settles a message. Liveness by lock, never by pid: two
//! containers' gateways on one folder are both pid 1.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// This process's side: its id, and its lock once taken.
pub struct Holder {
    id: String,
    dir: PathBuf,
    lock: Option<File>,
}

impl Holder {
    /// A holder for the outbox at `outbox`, its id drawn now; nothing is locked yet (a host may
    /// fork into a daemon after opening the outbox: the serving process takes the lock).
    pub fn new(outbox: &Path) -> Holder {
        let mut dir = outbox.as_os_str().to_owned();
        dir.push(".holders");
        Holder {
            id: format!(
                "{:016x}{:016x}",
                getrandom::u64().unwrap_or_default(),
                getrandom::u64().unwrap_or_default()
            ),
            dir: PathBuf::from(dir),
            lock: None,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    fn path_of(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.lock"))
    }

    /// Takes this process's lock if it has not yet (before its first lease).
    pub fn ensure(&mut self) -> io::Result<()> {
        if self.lock.is_some() {
            return Ok(());
        }
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::create_dir_all(&self.dir)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(self.path_of(&self.id))?;
        drg_base::infra::fsutil::lock_exclusive(&file)?;
        self.lock = Some(file);
        Ok(())
    }

    /// Whether the holder `other` is gone: its lock file missing or its lock free (then the
    /// file is removed). A lease from before holders were recorded (`""`) is judged by its
    /// time alone (`false`).
    pub fn is_gone(&self, other: &str) -> bool {
        if other.is_empty() || other == self.id || other.contains(['/', '.']) {
            return false;
        }
        let path = self.path_of(other);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) => return e.kind() == io::ErrorKind::NotFound,
        };
        match file.try_lock() {
            Ok(()) => {
                let _ = std::fs::remove_file(&path);
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_alive_while_its_lock_is_held_and_gone_after() {
        let dir = tempfile::tempdir().unwrap();
        let outbox = dir.path().join("w.sqlite");
        let mut alive = Holder::new(&outbox);
        alive.ensure().unwrap();
        let other = Holder::new(&outbox);
        assert!(!other.is_gone(alive.id()), "its lock is held");
        assert!(
            !other.is_gone(""),
            "a lease from before holders: its time decides"
        );
        let id = alive.id().to_owned();
        drop(alive);
        assert!(other.is_gone(&id), "the lock was released with the process");
        assert!(other.is_gone(&id), "and its file removed");
        assert!(!other.is_gone("../x"));
    }
}
