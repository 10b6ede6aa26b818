//! `serve` refuses to start on an address it could not listen on: Pingora would retry, then
//! lose that listener's thread and keep the process serving without it (and for a Unix socket
//! it removes whatever file is at the path before binding).

use std::io::ErrorKind;
use std::net::TcpListener;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use socket2::{Domain, SockAddr, Socket, Type};

use crate::config::GatewayConfig;

/// A listener's address that cannot be listened on.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {address} ({key}): {why}")]
pub struct AddressTaken {
    address: String,
    /// The config key the address comes from.
    key: &'static str,
    why: String,
}

/// Refuses the first listener that could not listen, naming the key it comes from and, when
/// another process holds it, the `serve` flag that moves it. The TCP addresses are held while
/// the next is tried, so that the gateway's own two listeners cannot overlap either.
pub fn refuse_taken(gateway: &GatewayConfig) -> Result<(), AddressTaken> {
    let public = ("gateway.listen", "--listen", gateway.listen.as_str());
    let admin = gateway.admin.listen.as_deref();
    let admin = admin.map(|a| ("gateway.admin.listen", "--admin-listen", a));
    let mut held = Vec::new();
    for (key, flag, address) in std::iter::once(public).chain(admin) {
        let refused = |why: String| AddressTaken {
            address: address.to_owned(),
            key,
            why,
        };
        let taken = |what: &str| {
            format!("{what}. Another gateway on this config? Give this one its own with {flag}")
        };
        match address.strip_prefix("unix:") {
            Some(path) => {
                unix_problem(Path::new(path), &taken).map_or(Ok(()), |w| Err(refused(w)))?
            }
            None => match TcpListener::bind(address) {
                Ok(listener) => held.push(listener),
                Err(e) if e.kind() == ErrorKind::AddrInUse => {
                    // Ours, or another process's: free ours and ask again.
                    let ours = !held.is_empty() && {
                        held.clear();
                        TcpListener::bind(address).is_ok()
                    };
                    return Err(refused(match ours {
                        true => "it overlaps gateway.listen".to_owned(),
                        false => taken(&e.to_string()),
                    }));
                }
                Err(e) => return Err(refused(e.to_string())),
            },
        }
    }
    Ok(())
}

/// Why Pingora could not take `path` for a Unix socket, if it could not: it removes the file
/// there first, so a file that is no socket, or a socket a process answers on, must stay.
fn unix_problem(path: &Path, taken: &dyn Fn(&str) -> String) -> Option<String> {
    // sun_path holds 108 bytes, the last a NUL.
    if path.as_os_str().len() > 107 {
        return Some("the path is longer than a Unix socket's 107 bytes".to_owned());
    }
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if dir.is_some_and(|d| !d.is_dir()) {
        return Some("its folder does not exist".to_owned());
    }
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => return None,
        Err(e) => return Some(e.to_string()),
        Ok(meta) if !meta.file_type().is_socket() => {
            return Some("a file that is not a socket is there (it would be removed)".to_owned());
        }
        Ok(_) => {}
    }
    // Without blocking: a live gateway with a full backlog answers EAGAIN, not a wait.
    let connect = || -> std::io::Result<()> {
        let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
        socket.set_nonblocking(true)?;
        socket.connect(&SockAddr::unix(path)?)
    };
    match connect() {
        Ok(()) => Some(taken("a process answers on this socket")),
        Err(e) if e.kind() == ErrorKind::WouldBlock => {
            Some(taken("a process listens on this socket"))
        }
        // A socket left by a process that ended: Pingora replaces it.
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => None,
        Err(e) => Some(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    fn problem(path: &Path) -> Option<String> {
        unix_problem(path, &|what: &str| format!("taken: {what}"))
    }

    #[test]
    fn a_unix_path_is_free_only_when_nothing_or_a_dead_socket_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("admin.sock");
        assert_eq!(problem(&sock), None);
        let live = UnixListener::bind(&sock).unwrap();
        assert!(problem(&sock).unwrap().starts_with("taken: "));
        // Its process gone, the file stays: Pingora replaces it.
        drop(live);
        assert!(sock.exists());
        assert_eq!(problem(&sock), None);
        let file = dir.path().join("gateway.yaml");
        std::fs::write(&file, "version: 1\n").unwrap();
        assert!(problem(&file).unwrap().contains("not a socket"));
        assert!(problem(&dir.path().join("no/such.sock"))
            .unwrap()
            .contains("folder"));
        let long = dir.path().join("x".repeat(120));
        assert!(problem(&long).unwrap().contains("107 bytes"));
    }

    #[test]
    fn the_two_listeners_may_not_overlap() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let gateway = GatewayConfig {
            listen: format!("0.0.0.0:{port}"),
            admin: drg_telemetry::config::AdminConfig {
                listen: Some(format!("127.0.0.1:{port}")),
                ..Default::default()
            },
            ..Default::default()
        };
        let e = refuse_taken(&gateway).unwrap_err().to_string();
        assert!(
            e.contains("(gateway.admin.listen): it overlaps gateway.listen"),
            "{e}"
        );
        let held = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let gateway = GatewayConfig {
            listen: held.local_addr().unwrap().to_string(),
            ..gateway
        };
        let e = refuse_taken(&gateway).unwrap_err().to_string();
        assert!(
            e.contains("(gateway.listen): ") && e.ends_with("its own with --listen"),
            "{e}"
        );
    }
}
