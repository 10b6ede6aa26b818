//! The loop every follower of a kind runs (records' snapshots, API-made keys): a round when the
//! kind is told moved (`NOTIFY`, `listen.rs`; the poll's word, `watch.rs`) and this gateway
//! holds another revision, at each poll while the last round failed, and when the follower's
//! own work asks for one.

use std::sync::Arc;

use super::{Control, Revision};
use crate::service::{Service, Shutdown};

/// One kind a gateway follows.
#[async_trait::async_trait]
pub trait Follower: Send + Sync + 'static {
    fn kind(&self) -> &'static str;
    fn control(&self) -> &Control;
    /// The revision last read (none yet).
    fn held(&self) -> Option<Arc<Revision>>;
    /// One round: whether the store answered (`false`: what is held stays, and a round is
    /// tried again at each poll until one answers).
    async fn sync(&self) -> bool;
    /// Waits for work of the follower's own that asks for a round (taken in by `sync`); never,
    /// by default. Cancel-safe: it is raced against the store's news.
    async fn asked(&self) {
        std::future::pending::<()>().await;
    }
}

/// Whether what was told moved, `said`, asks `kind` to be read, this gateway holding `held`
/// (`behind`: its last round failed): the kind's name (a notification) always does; the
/// poll's word of the kind (see `watch.rs`) when it tells another revision than the one
/// held, or the gateway is behind; another kind's word never does.
pub fn asks_read(said: &str, kind: &str, held: Option<&Revision>, behind: bool) -> bool {
    if said == kind || said == "*" {
        return true;
    }
    Revision::told(said, kind).is_some_and(|told| behind || held != Some(&told))
}

/// A follower run as a background service.
pub struct Following<F>(pub Arc<F>);

#[async_trait::async_trait]
impl<F: Follower> Service for Following<F> {
    async fn run(&self, mut shutdown: Shutdown) {
        let f = &self.0;
        let mut moved = f.control().moved();
        // A round that failed is tried again at each poll until one answers: the store's
        // revisions may not move again for a long while, and nothing else would tell.
        let mut behind = !f.sync().await;
        f.control().snapshot_read();
        let mut retry = tokio::time::interval(f.control().poll());
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                told = moved.recv() => match told {
                    // The poll's word: read only when another revision is held here.
                    Ok(said) => {
                        if !asks_read(&said, f.kind(), f.held().as_deref(), behind) {
                            continue;
                        }
                    }
                    // Behind on what moved: read anyway.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                () = f.asked() => {}
                _ = retry.tick() => if !behind { continue },
                _ = shutdown.changed() => return,
            }
            behind = !f.sync().await;
        }
    }
}
