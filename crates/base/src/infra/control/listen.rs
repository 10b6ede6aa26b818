//! PostgreSQL tells each gateway a change as it commits: every write sends `NOTIFY
//! drg_revision, '<kind>'` in its transaction, and this service holds one connection that
//! `LISTEN`s and passes each kind on to the snapshots ([`Control::moved`]), which read it at
//! once instead of at their next poll. The poll stays behind it: a notification sent while
//! this connection was down is lost, so after each reconnect every kind is read again (`*`).

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;

use super::Control;
use crate::service::{Service, Shutdown};

/// The channel writes notify on.
pub const CHANNEL: &str = "drg_revision";

/// Waited before a new connection after one failed.
const RETRY: Duration = Duration::from_secs(1);

/// A failing connection is logged at WARN at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The listening service of a PostgreSQL control store.
pub struct Listen(pub Arc<Control>);

impl Listen {
    /// Listens until the connection fails (`Err`: why) or the server shuts down (`Ok`).
    async fn listen(&self, url: &str, shutdown: &mut Shutdown) -> Result<(), sqlx::Error> {
        let mut listener = PgListener::connect(url).await?;
        listener.listen(CHANNEL).await?;
        // What moved while this connection was not there: everything, read again.
        let _ = self.0.moved.send("*".to_owned());
        loop {
            tokio::select! {
                told = listener.recv() => {
                    let told = told?;
                    let _ = self.0.moved.send(told.payload().to_owned());
                }
                _ = shutdown.changed() => return Ok(()),
            }
        }
    }
}

#[async_trait::async_trait]
impl Service for Listen {
    async fn run(&self, mut shutdown: Shutdown) {
        let Some(url) = self.0.url.clone() else {
            return;
        };
        let mut warned: Option<std::time::Instant> = None;
        while !*shutdown.borrow() {
            match self.listen(&url, &mut shutdown).await {
                Ok(()) => return,
                Err(e) => {
                    if warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                        warned = Some(std::time::Instant::now());
                        log::warn!(
                            "control store: not listening for changes ({e}); the poll tells \
                             them meanwhile"
                        );
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(RETRY) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}
