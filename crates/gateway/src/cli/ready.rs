//! The daemon's readiness: once the listening sockets are this process's (after the bootstrap,
//! which takes them over in an upgrade) and every listener accepts a connection, the waiting
//! parent of `serve --daemon` is released.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;

use super::daemon::Daemon;

/// How often a listener that does not accept yet is tried again.
const RETRY: Duration = Duration::from_millis(5);
/// How long one connection attempt may take.
const ATTEMPT: Duration = Duration::from_secs(1);

/// A background service that releases the daemon's parent once every address in `listens`
/// (`ip:port`, or `unix:/path`) accepts. Add it after the bootstrap service.
pub struct Ready {
    pub daemon: Mutex<Option<Daemon>>,
    pub listens: Vec<String>,
}

#[async_trait]
impl BackgroundService for Ready {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        for listen in &self.listens {
            while !accepts(listen).await {
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep(RETRY) => {}
                }
            }
        }
        let daemon = self.daemon.lock().ok().and_then(|mut d| d.take());
        if let Some(daemon) = daemon {
            match daemon.ready() {
                Ok(()) => log::info!("serving: the daemon's parent is released"),
                Err(e) => log::error!("{e}"),
            }
        }
    }
}

/// Whether a connection to `listen` is accepted (an unspecified address is tried on the
/// loopback of its family).
async fn accepts(listen: &str) -> bool {
    if let Some(path) = listen.strip_prefix("unix:") {
        let connect = tokio::net::UnixStream::connect(path);
        return matches!(tokio::time::timeout(ATTEMPT, connect).await, Ok(Ok(_)));
    }
    let Ok(addrs) = tokio::net::lookup_host(listen).await else {
        return false;
    };
    for mut addr in addrs {
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let connect = tokio::net::TcpStream::connect(addr);
        if matches!(tokio::time::timeout(ATTEMPT, connect).await, Ok(Ok(_))) {
            return true;
        }
    }
    false
}
