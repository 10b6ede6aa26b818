//! The MX background service: checks the resolver against the canaries at start and every
//! `probe_interval_seconds`; resolves the listed names the index asked for; runs the look at
//! every listed name (`look.rs`); shares what was learned over Redis; ages the index out and
//! saves it to its state file.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use drg_base::service::{Service, Shutdown};
use tokio::sync::Semaphore;

use super::pace::Pace;
use super::share::SharedIndex;
use super::{store, Neighbourhood};
use crate::mx::resolver::MxResolver;
use drg_base::periodic::Ticks;

/// Pages of other gateways' batches read per share interval (bounds one round's work).
const PULL_PAGES: usize = 20;

/// The service (see the module documentation).
pub struct MxService {
    resolver: Arc<MxResolver>,
    probe_interval: Duration,
    shared: Option<SharedIndex>,
}

impl MxService {
    pub fn new(
        resolver: Arc<MxResolver>,
        probe_interval: Duration,
        shared: Option<SharedIndex>,
    ) -> Self {
        MxService {
            resolver,
            probe_interval,
            shared,
        }
    }

    /// Resolves queued listed names, `concurrency` at once and at most `learn_per_second`
    /// (after a first `queue` at once), until shutdown.
    fn start_teacher(&self, nb: &Arc<Neighbourhood>, mut shutdown: Shutdown) {
        let Some(mut rx) = nb.take_queue() else {
            return;
        };
        let slots = Arc::new(Semaphore::new(nb.config.concurrency.max(1)));
        let mut pace = Pace::new(nb.config.learn_per_second, nb.config.queue);
        let (resolver, nb) = (self.resolver.clone(), nb.clone());
        tokio::spawn(async move {
            loop {
                let name = tokio::select! {
                    n = rx.recv() => n,
                    _ = shutdown.changed() => None,
                };
                let Some(name) = name else { break };
                if let Some(wait) = pace.take(Instant::now()) {
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        _ = shutdown.changed() => break,
                    }
                }
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    break;
                };
                let (resolver, nb) = (resolver.clone(), nb.clone());
                tokio::spawn(async move {
                    let quiet = resolver.learn(&name).await;
                    nb.resolved(&name, quiet);
                    drop(slot);
                });
            }
        });
    }

    async fn share(&self, nb: &Neighbourhood, shared: &SharedIndex) {
        let out = nb.take_outbox();
        if let Err(e) = shared.push(&out).await {
            log::warn!(
                "MX neighbourhood: sharing {} domains over Redis failed: {e}",
                out.len()
            );
        }
        match shared.pull(PULL_PAGES).await {
            Ok(learned) if !learned.is_empty() => {
                let n = nb.teach_all(learned, false);
                log::debug!("MX neighbourhood: {n} domains learned from other gateways");
            }
            Ok(_) => {}
            Err(e) => log::warn!("MX neighbourhood: reading other gateways' batches failed: {e}"),
        }
    }

    /// Ages the index out and writes the state file if anything changed, on a blocking
    /// thread: the sort of a big index must not hold this service's runtime, where the DNS
    /// client's sockets are driven (lookups stalled 150-250 ms before each save of a
    /// 200,000-domain index when it ran here).
    async fn save(nb: &Arc<Neighbourhood>) {
        let index = nb.clone();
        let written = tokio::task::spawn_blocking(move || {
            index.expire();
            let Some(learned) = index.changed() else {
                return Ok(None);
            };
            let path = index.config.state_path();
            store::write(&path, &learned).map(|()| Some(learned.len()))
        })
        .await;
        match written {
            Ok(Ok(Some(n))) => log::debug!("MX neighbourhood: {n} domains saved"),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => log::warn!(
                "MX neighbourhood: state file {}: {e}",
                nb.config.state_path().display()
            ),
            Err(e) => log::warn!("MX neighbourhood: saving failed: {e}"),
        }
    }

    /// Evicts past the bound, on a blocking thread for the same reason as [`Self::save`].
    async fn evict(nb: &Arc<Neighbourhood>) {
        if !nb.over_bound() {
            return;
        }
        let index = nb.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || index.evict()).await {
            log::warn!("MX neighbourhood: eviction failed: {e}");
        }
    }
}

#[async_trait]
impl Service for MxService {
    async fn run(&self, mut shutdown: Shutdown) {
        let nb = self.resolver.neighbourhood().cloned();
        if let Some(nb) = &nb {
            self.start_teacher(nb, shutdown.clone());
        }
        self.resolver.check_canaries().await;
        if let Some(nb) = nb.as_ref().filter(|nb| nb.config.look.enabled) {
            let (resolver, nb) = (self.resolver.clone(), nb.clone());
            tokio::spawn(super::look::run(resolver, nb, shutdown.clone()));
        }
        let mut ticks = Ticks::new(Duration::from_millis(250));
        let (mut last_probe, mut last_share, mut last_save) =
            (Instant::now(), None::<Instant>, Instant::now());
        while ticks.next(&mut shutdown).await.is_some() {
            // The canaries are asked every interval, trusted or not (a resolver can start
            // lying at any time), and at once after a streak of unanswered lookups.
            let early = last_probe.elapsed() >= self.resolver.recheck_spacing()
                && self.resolver.take_recheck();
            if early || last_probe.elapsed() >= self.probe_interval {
                self.resolver.check_canaries().await;
                last_probe = Instant::now();
            }
            let Some(nb) = &nb else { continue };
            if let Some(shared) = &self.shared {
                if last_share.is_none_or(|t| t.elapsed() >= nb.config.share_interval) {
                    self.share(nb, shared).await;
                    last_share = Some(Instant::now());
                }
            }
            // Past the bound: evicted here, off the request path, a chunk per lock.
            Self::evict(nb).await;
            if last_save.elapsed() >= nb.config.save_interval {
                Self::save(nb).await;
                last_save = Instant::now();
            }
        }
        if let Some(nb) = &nb {
            if let Some(shared) = &self.shared {
                let _ = shared.push(&nb.take_outbox()).await;
            }
            Self::save(nb).await;
        }
    }
}
