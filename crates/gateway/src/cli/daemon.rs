//! `serve --daemon`: the fork into the background comes first, before anything is opened, and
//! the parent returns only once the daemon's listeners accept (exit 0) or the daemon has failed
//! (exit 1). By then the daemon holds none of its caller's stdin, stdout or a stderr the caller
//! may read to its end (a pipe, a socket, a terminal): `$(...)`, ssh or Ansible would otherwise
//! wait for as long as the gateway runs. What the daemon writes to such a stderr before it
//! serves goes through the parent, so a failed start is still shown.
//!
//! Not Pingora's daemon mode: Pingora forks inside `Server::run`, after the gateway is built, so
//! the serving process held none of the POSIX locks SQLite took at open (they belong to the
//! process that took them and are not inherited), and another opener deleted the live `-wal`;
//! and Pingora releases its waiting parent before it has the listening sockets, so a take-over
//! that fails still exited 0.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pingora::server::configuration::ServerConf;

/// How long the parent waits without `daemon_ready_timeout_seconds` (Pingora's default).
const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(600);
/// The byte the daemon writes to its parent once it serves.
const READY: u8 = b'R';
/// The umask bits the daemon always adds (Pingora's daemon mode sets exactly these).
const DAEMON_UMASK: libc::mode_t = 0o007;

/// Why the daemon could not be started or could not say it is ready.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("daemon: {what}: {source}")]
    Os {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("daemon: `{0}` is not supported by `serve --daemon`: start it as that user instead (systemd's User= and Group=)")]
    Unsupported(&'static str),
    #[error("daemon: pid file {path}: {source}")]
    PidFile {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> DaemonError {
    move |source| DaemonError::Os { what, source }
}

/// Where the daemon's stderr goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stderr {
    /// `error_log`, from the fork on.
    Log,
    /// Kept: a regular file or systemd's journal, which nobody reads until it is closed (and
    /// where the operator sent the log).
    Kept,
    /// A pipe, a socket or a terminal: a caller (`$(...)`, ssh, Ansible) may read it until every
    /// process holding it has closed it. The daemon writes to a pipe of its own, which the
    /// parent copies there until the daemon serves (a failed start is shown to the caller);
    /// then the daemon's stderr is /dev/null and the parent returns.
    Relayed,
}

/// The daemon's end of the fork: tells the waiting parent that it serves.
#[derive(Debug)]
pub struct Daemon {
    ready: File,
    pid_file: PathBuf,
    stderr: Stderr,
}

impl Daemon {
    /// Writes the pid file (the previous one kept as `<pid_file>.old`), then releases the
    /// parent with exit 0. Called once the listeners accept: a service manager that reads the
    /// pid file when the parent exits finds the process that serves.
    pub fn ready(mut self) -> Result<(), DaemonError> {
        write_pid_file(&self.pid_file)?;
        if self.stderr == Stderr::Relayed {
            // Before the parent is told: it copies what came before this, then returns, and
            // nothing of ours is left writing to its caller.
            let null = null(true)?;
            redirect(&null, libc::STDERR_FILENO)?;
        }
        self.ready
            .write_all(&[READY])
            .map_err(os("telling the parent"))
    }
}

/// Forks. The parent waits for the daemon and exits (it never returns); the daemon returns, in
/// a new session, with stdin and stdout on /dev/null, stderr as [`Stderr`] says, and the
/// caller's umask narrowed as Pingora's daemon mode does. Call it while the process has one
/// thread, before anything is opened.
pub fn start(conf: &ServerConf) -> Result<Daemon, DaemonError> {
    if conf.user.is_some() {
        return Err(DaemonError::Unsupported("user"));
    }
    if conf.group.is_some() {
        return Err(DaemonError::Unsupported("group"));
    }
    let stderr = match &conf.error_log {
        Some(_) => Stderr::Log,
        None if stderr_is_kept() => Stderr::Kept,
        None => Stderr::Relayed,
    };
    let (read, write) = pipe()?;
    let relay = (stderr == Stderr::Relayed).then(pipe).transpose()?;
    // SAFETY: the process has one thread here (nothing is built yet), so the child inherits no
    // lock held by another thread.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(os("fork")(std::io::Error::last_os_error())),
        0 => {
            drop(read);
            detach(conf, relay.map(|(_, write)| write))?;
            Ok(Daemon {
                ready: write,
                pid_file: PathBuf::from(&conf.pid_file),
                stderr,
            })
        }
        child => {
            drop(write);
            let timeout = conf
                .daemon_ready_timeout_seconds
                .map_or(DEFAULT_READY_TIMEOUT, |s| Duration::from_secs(s.get()));
            let parent = Parent {
                ready: Some(read),
                relay: relay.map(|(read, _)| read),
                child,
                error_log: conf.error_log.clone(),
            };
            std::process::exit(parent.wait(timeout))
        }
    }
}

/// A pipe, both ends closed on exec.
fn pipe() -> Result<(File, File), DaemonError> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors on success; each is owned by one File below.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(os("pipe")(std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) })
}

/// Whether the caller's stderr may stay the daemon's: a regular file, or the journal stream
/// systemd gave the service (`$JOURNAL_STREAM`; a `Type=forking` unit's log goes there).
fn stderr_is_kept() -> bool {
    use std::os::unix::fs::MetadataExt;
    let meta = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map(File::from)
        .and_then(|f| f.metadata());
    let Ok(meta) = meta else {
        return false;
    };
    let journal = std::env::var("JOURNAL_STREAM")
        .ok()
        .and_then(|v| journal_stream(&v))
        .is_some_and(|(dev, ino)| (dev, ino) == (meta.dev(), meta.ino()));
    meta.is_file() || journal
}

/// `$JOURNAL_STREAM`'s device and inode (`"<device>:<inode>"`, both decimal).
fn journal_stream(value: &str) -> Option<(u64, u64)> {
    let (dev, ino) = value.split_once(':')?;
    Some((dev.parse().ok()?, ino.parse().ok()?))
}

fn null(write: bool) -> Result<File, DaemonError> {
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .open("/dev/null")
        .map_err(os("/dev/null"))
}

/// The daemon's side of the fork: a session of its own, no terminal input, nothing written to
/// the caller's stdout, stderr to `error_log` or to `relay` (or kept, with neither).
fn detach(conf: &ServerConf, relay: Option<File>) -> Result<(), DaemonError> {
    // SAFETY: plain system calls on this process.
    if unsafe { libc::setsid() } == -1 {
        return Err(os("setsid")(std::io::Error::last_os_error()));
    }
    // Only ever narrowed: systemd's UMask=0077 stays 0077. SAFETY: umask cannot fail.
    unsafe { libc::umask(libc::umask(DAEMON_UMASK) | DAEMON_UMASK) };
    redirect(&null(false)?, libc::STDIN_FILENO)?;
    redirect(&null(true)?, libc::STDOUT_FILENO)?;
    if let Some(path) = &conf.error_log {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .map_err(os("error_log"))?;
        redirect(&log, libc::STDERR_FILENO)?;
    }
    if let Some(relay) = relay {
        // The pipe's own descriptor is closed on return: the parent sees its end once the
        // daemon points stderr elsewhere.
        redirect(&relay, libc::STDERR_FILENO)?;
    }
    if let Some(dir) = &conf.working_directory {
        std::env::set_current_dir(dir).map_err(os("working_directory"))?;
    }
    Ok(())
}

fn redirect(file: &File, to: libc::c_int) -> Result<(), DaemonError> {
    // SAFETY: dup2 onto a standard descriptor this process owns.
    if unsafe { libc::dup2(file.as_raw_fd(), to) } == -1 {
        return Err(os("dup2")(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// The parent's side: the readiness pipe, the daemon's stderr to copy to its own (when
/// relayed), the daemon's pid.
struct Parent {
    ready: Option<File>,
    relay: Option<File>,
    child: libc::pid_t,
    error_log: Option<String>,
}

/// What the parent saw of the daemon before its deadline.
enum Seen {
    /// The daemon serves.
    Serving,
    /// The daemon closed its end of the readiness pipe without saying it serves.
    Closed,
    TimedOut,
    Failed(std::io::Error),
}

impl Parent {
    /// The exit code: 0 once the daemon said it serves, 1 if it exited or closed its end
    /// first, or the deadline passed.
    fn wait(mut self, timeout: Duration) -> i32 {
        let deadline = Instant::now() + timeout;
        match self.watch(deadline) {
            Seen::Serving => {
                self.drain();
                0
            }
            Seen::TimedOut => {
                log::error!(
                    "the daemon (pid {}) did not serve within {timeout:?}",
                    self.child
                );
                1
            }
            Seen::Failed(e) => {
                log::error!("waiting for the daemon: {e}");
                1
            }
            Seen::Closed => {
                self.report_exit(deadline);
                1
            }
        }
    }

    /// Polls the readiness pipe and the relay, copying the relay to stderr, until the daemon
    /// says it serves, or has closed both, or `deadline`.
    fn watch(&mut self, deadline: Instant) -> Seen {
        let fd = |f: &Option<File>| f.as_ref().map_or(-1, |f| f.as_raw_fd());
        loop {
            if self.ready.is_none() && self.relay.is_none() {
                return Seen::Closed;
            }
            let mut fds = [fd(&self.ready), fd(&self.relay)].map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
            // SAFETY: two valid pollfds (poll skips a negative fd).
            match unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) } {
                0 if self.ready.is_none() => return Seen::Closed,
                0 => return Seen::TimedOut,
                -1 => match std::io::Error::last_os_error() {
                    e if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    e => return Seen::Failed(e),
                },
                _ => {}
            }
            if fds[1].revents != 0 && !self.copy() {
                self.relay = None;
            }
            if fds[0].revents != 0 {
                let mut byte = [0u8; 1];
                let read = self.ready.as_mut().map(|r| r.read(&mut byte));
                if matches!(read, Some(Ok(1))) && byte[0] == READY {
                    return Seen::Serving;
                }
                self.ready = None;
            }
        }
    }

    /// Copies what the relay holds to stderr; false at its end (or on an error).
    fn copy(&mut self) -> bool {
        let Some(relay) = self.relay.as_mut() else {
            return false;
        };
        let mut buf = [0u8; 4096];
        match relay.read(&mut buf) {
            Ok(0) => false,
            Ok(n) => {
                // The caller's stderr may be gone: the daemon is waited for all the same.
                let _ = std::io::stderr().write_all(&buf[..n]);
                true
            }
            Err(e) => e.kind() == std::io::ErrorKind::Interrupted,
        }
    }

    /// Copies what the daemon wrote before it said it serves: it had pointed its stderr
    /// elsewhere first, so the relay holds all of it and ends (not waited for: a descriptor
    /// inherited elsewhere would keep it open).
    fn drain(&mut self) {
        let Some(relay) = &self.relay else { return };
        // SAFETY: fcntl on a descriptor this process owns.
        unsafe { libc::fcntl(relay.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        while self.copy() {}
    }

    /// Says how the daemon ended (it is waited for until `deadline`).
    fn report_exit(&self, deadline: Instant) {
        let child = self.child;
        let mut status = 0;
        // SAFETY: `child` is this process's own child.
        while unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } == 0 {
            if Instant::now() >= deadline {
                log::error!("the daemon (pid {child}) closed its pipe without serving");
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let hint = match &self.error_log {
            Some(path) => format!("; its messages are in {path}"),
            None => String::new(),
        };
        match libc::WIFEXITED(status) {
            true => log::error!(
                "the daemon (pid {child}) stopped before serving: exit status {}{hint}",
                libc::WEXITSTATUS(status)
            ),
            false => log::error!("the daemon (pid {child}) stopped before serving{hint}"),
        }
    }
}

/// Writes this process's pid to `path` (replaced whole, mode 0600 like every file the gateway
/// writes in its folders), the previous file kept as `<path>.old` (as Pingora's daemon mode
/// does).
fn write_pid_file(path: &Path) -> Result<(), DaemonError> {
    let err = |source| DaemonError::PidFile {
        path: path.to_owned(),
        source,
    };
    let mut old = path.as_os_str().to_owned();
    old.push(".old");
    match std::fs::rename(path, &old) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(err(e)),
        _ => {}
    }
    let pid = format!("{}\n", std::process::id());
    drg_base::infra::fsutil::write_atomic(path, 0o600, pid.as_bytes()).map_err(err)
}

/// `serve --upgrade --daemon`: asks the gateway named by `pid_file` to hand its sockets over
/// (SIGQUIT), once this process is built and about to take them. Nothing is signalled when the
/// file names no running gateway (a stale or reused pid): the take-over then waits for a
/// SIGQUIT sent by hand, and fails after Pingora's retries.
pub fn quit_running(pid_file: &str) {
    let Some(pid) = running_gateway(pid_file) else {
        log::warn!(
            "upgrade: {pid_file} names no running gateway; waiting for one to be sent SIGQUIT"
        );
        return;
    };
    // SAFETY: kill(2) to a process checked just above to be a gateway of this binary.
    if unsafe { libc::kill(pid, libc::SIGQUIT) } == 0 {
        log::info!("upgrade: asked the running gateway (pid {pid}) to hand its sockets over");
    } else {
        let e = std::io::Error::last_os_error();
        log::warn!("upgrade: SIGQUIT to pid {pid}: {e}");
    }
}

/// The pid in `pid_file` if it is another running `serve` of a binary of this name.
fn running_gateway(pid_file: &str) -> Option<libc::pid_t> {
    let pid: libc::pid_t = std::fs::read_to_string(pid_file)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    if pid <= 0 || pid as u32 == std::process::id() {
        return None;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args = cmdline.split(|b| *b == 0);
    let name = |arg: &[u8]| {
        use std::os::unix::ffi::OsStrExt;
        Path::new(std::ffi::OsStr::from_bytes(arg))
            .file_name()
            .map(|n| n.to_owned())
    };
    let theirs = name(args.next()?);
    let ours = std::env::args_os()
        .next()
        .and_then(|a| Path::new(&a).file_name().map(|n| n.to_owned()));
    (theirs.is_some() && theirs == ours && args.any(|a| a == b"serve")).then_some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_is_a_device_and_an_inode() {
        assert_eq!(journal_stream("8:123456"), Some((8, 123456)));
        assert_eq!(journal_stream("8"), None);
        assert_eq!(journal_stream("8:x"), None);
        assert_eq!(journal_stream(""), None);
    }
}
