//! `serve --daemon`: the fork into the background comes first, before anything is opened, and
//! the parent returns only once the daemon's listeners accept (exit 0) or the daemon has failed
//! (exit 1).
//!
//! Not Pingora's daemon mode: Pingora forks inside `Server::run`, after the gateway is built, so
//! the serving process held none of the POSIX locks SQLite took at open (they belong to the
//! process that took them and are not inherited), and another opener deleted the live `-wal`;
//! and Pingora releases its waiting parent before it has the listening sockets, so a take-over
//! that fails still exited 0.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use pingora::server::configuration::ServerConf;

/// How long the parent waits without `daemon_ready_timeout_seconds` (Pingora's default).
const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(600);
/// The byte the daemon writes to its parent once it serves.
const READY: u8 = b'R';

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

/// The daemon's end of the fork: tells the waiting parent that it serves.
#[derive(Debug)]
pub struct Daemon {
    ready: File,
    pid_file: PathBuf,
}

impl Daemon {
    /// Writes the pid file (the previous one kept as `<pid_file>.old`), then releases the
    /// parent with exit 0. Called once the listeners accept: a service manager that reads the
    /// pid file when the parent exits finds the process that serves.
    pub fn ready(mut self) -> Result<(), DaemonError> {
        write_pid_file(&self.pid_file)?;
        self.ready
            .write_all(&[READY])
            .map_err(os("telling the parent"))
    }
}

/// Forks. The parent waits for the daemon and exits (it never returns); the daemon returns, in
/// a new session, with stdin on /dev/null, stderr on `error_log` if set, and the umask Pingora's
/// daemon mode sets. Call it while the process has one thread, before anything is opened.
pub fn start(conf: &ServerConf) -> Result<Daemon, DaemonError> {
    if conf.user.is_some() {
        return Err(DaemonError::Unsupported("user"));
    }
    if conf.group.is_some() {
        return Err(DaemonError::Unsupported("group"));
    }
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors on success; each is owned by one File below.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(os("pipe")(std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    let (read, write) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    // SAFETY: the process has one thread here (nothing is built yet), so the child inherits no
    // lock held by another thread.
    let pid = unsafe { libc::fork() };
    match pid {
        -1 => Err(os("fork")(std::io::Error::last_os_error())),
        0 => {
            drop(read);
            detach(conf)?;
            Ok(Daemon {
                ready: write,
                pid_file: PathBuf::from(&conf.pid_file),
            })
        }
        child => {
            drop(write);
            let timeout = conf
                .daemon_ready_timeout_seconds
                .map_or(DEFAULT_READY_TIMEOUT, |s| Duration::from_secs(s.get()));
            std::process::exit(wait_for_daemon(read, child, timeout))
        }
    }
}

/// The daemon's side of the fork: a session of its own, no terminal input, its stderr.
fn detach(conf: &ServerConf) -> Result<(), DaemonError> {
    // SAFETY: plain system calls on this process.
    if unsafe { libc::setsid() } == -1 {
        return Err(os("setsid")(std::io::Error::last_os_error()));
    }
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(0o007) };
    let null = File::open("/dev/null").map_err(os("/dev/null"))?;
    redirect(&null, libc::STDIN_FILENO)?;
    if let Some(path) = &conf.error_log {
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .map_err(os("error_log"))?;
        redirect(&log, libc::STDERR_FILENO)?;
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

/// The parent: the exit code once the daemon said it serves (0), or exited or closed its end
/// first, or `timeout` passed (1).
fn wait_for_daemon(mut read: File, child: libc::pid_t, timeout: Duration) -> i32 {
    let mut pollfd = libc::pollfd {
        fd: read.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd.
        match unsafe { libc::poll(&mut pollfd, 1, ms) } {
            0 => {
                log::error!("the daemon (pid {child}) did not serve within {timeout:?}");
                return 1;
            }
            -1 if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
            -1 => {
                log::error!(
                    "waiting for the daemon: {}",
                    std::io::Error::last_os_error()
                );
                return 1;
            }
            _ => break,
        }
    }
    let mut byte = [0u8; 1];
    if matches!(read.read(&mut byte), Ok(1)) && byte[0] == READY {
        return 0;
    }
    let mut status = 0;
    // SAFETY: `child` is this process's own child.
    let waited = unsafe { libc::waitpid(child, &mut status, 0) } == child;
    match waited && libc::WIFEXITED(status) {
        true => log::error!(
            "the daemon (pid {child}) stopped before serving: exit status {}",
            libc::WEXITSTATUS(status)
        ),
        false => log::error!("the daemon (pid {child}) stopped before serving"),
    }
    1
}

/// Writes this process's pid to `path` (write and rename), the previous file kept as
/// `<path>.old` (as Pingora's daemon mode does).
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
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, format!("{}\n", std::process::id())).map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
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
