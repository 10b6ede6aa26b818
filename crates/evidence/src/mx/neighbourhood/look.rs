//! The gateway's own look at every listed name: where each one's mail goes, at start and then
//! every `look.every_secs`, at most `look.rate` names a second. It is the baseline a listed
//! name re-pointed later is measured against (`History` in the index): a lapsed name someone
//! registers again and points at a company's host counts for nobody until it has held that
//! host `hold_days`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drg_base::service::Shutdown;
use drg_domain::neighbour_index::{keys_of, HostNetworks, Learned, Teach, Teachers};
use tokio::sync::Semaphore;

use super::service::Pace;
use super::{today, Neighbourhood};
use crate::mx::resolver::MxResolver;

/// How long a pass waits for a resolver the canaries do not trust before it looks again.
const UNTRUSTED_WAIT: Duration = Duration::from_secs(30);
/// How often, between passes, the look checks whether a reload changed the lists.
const NEW_NAMES_POLL: Duration = Duration::from_secs(5);

impl Neighbourhood {
    /// Teaches what the look saw of the listed `domain`: its MX hosts (none: no mail, NXDOMAIN
    /// included). A name the index knows with hosts keeps them when the look finds none: a
    /// name that lapsed still says where its throwaway service was, and a resolver that lied
    /// for a moment must not make names look lapsed and then "revived".
    pub fn looked(&self, domain: &str, hosts: &[HostNetworks]) {
        let table = self.table.load();
        let keys = keys_of(domain, hosts, table.providers());
        self.looked.fetch_add(1, Ordering::Relaxed);
        if keys.is_empty() && self.read().has_keys(domain) {
            self.refresh(domain);
            return;
        }
        let how = Teach {
            teachers: Teachers::LOOKED,
            ..Teach::default()
        };
        let learned = Learned::new(domain, keys, today(), how);
        self.teach_how(&table, &learned, how);
        if let Some(l) = self.read().learned_of(domain) {
            self.share(&l);
        }
    }
}

impl Neighbourhood {
    /// The look saw `domain` and learned nothing new of it (no mail now, or DNS did not
    /// answer): the entry it knows is kept as it is, seen today, so it does not age out with
    /// its history (an expired entry is a name never seen, which counts at first sight), and
    /// whether it has held its hosts long enough is weighed again.
    fn refresh(&self, domain: &str) {
        let Some(known) = self.read().learned_of(domain) else {
            return;
        };
        let table = self.table.load();
        let learned = Learned::new(domain, known.keys, today(), Teach::default());
        self.teach_how(&table, &learned, Teach::default());
    }
}

/// Runs passes until shutdown: one at start, then one every `look.every_secs` after the last
/// began. Each pass looks at the listed names of the table in force when it starts; between
/// passes, names a reload of the lists added are looked at within [`NEW_NAMES_POLL`], so a name
/// a list adds has its baseline before anyone can re-point it.
pub(super) async fn run(resolver: Arc<MxResolver>, nb: Arc<Neighbourhood>, mut shutdown: Shutdown) {
    let every = nb.config.look.every;
    loop {
        let began = Instant::now();
        let mut generation = nb.table.load().version().generation;
        match pass(&resolver, &nb, &mut shutdown, false).await {
            Some((n, took)) => {
                nb.look_passes.fetch_add(1, Ordering::Relaxed);
                log::info!(
                    "MX neighbourhood: looked at {n} listed names in {:.1} s",
                    took.as_secs_f64()
                );
            }
            None if *shutdown.borrow() => return,
            // Stopped (an untrusted resolver): a whole pass again once it is trusted, not a
            // day later.
            None => continue,
        }
        let next = began + every;
        while Instant::now() < next {
            let wait = NEW_NAMES_POLL.min(next.saturating_duration_since(Instant::now()));
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => return,
            }
            let now = nb.table.load().version().generation;
            if now == generation || Instant::now() >= next {
                continue;
            }
            match pass(&resolver, &nb, &mut shutdown, true).await {
                Some((n, _)) => {
                    generation = now;
                    if n > 0 {
                        log::info!("MX neighbourhood: looked at {n} listed names a reload added");
                    }
                }
                None if *shutdown.borrow() => return,
                // Stopped: tried again at the next poll.
                None => {}
            }
        }
    }
}

/// One pass over every listed name (`only_new`: those the index does not know yet); `None`
/// when it stopped early (shutdown, or a resolver the canaries stopped trusting: what it says
/// then is not evidence).
async fn pass(
    resolver: &Arc<MxResolver>,
    nb: &Arc<Neighbourhood>,
    shutdown: &mut Shutdown,
    only_new: bool,
) -> Option<(usize, Duration)> {
    // Wait for a resolver the canaries trust (the first check runs at start).
    while resolver.evidence_off() {
        tokio::select! {
            () = tokio::time::sleep(UNTRUSTED_WAIT) => {}
            _ = shutdown.changed() => return None,
        }
    }
    let started = Instant::now();
    let mut names = nb.table.load().listed_registrable();
    if only_new {
        let index = nb.read();
        names.retain(|n| !index.knows(n));
    }
    let slots = Arc::new(Semaphore::new(nb.config.concurrency.max(1)));
    let rate = nb.config.look.rate;
    let mut pace = Pace::new(rate, rate as usize);
    let mut tasks = tokio::task::JoinSet::new();
    for name in &names {
        if let Some(wait) = pace.take(Instant::now()) {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => return None,
            }
        }
        if resolver.evidence_off() {
            log::warn!("MX neighbourhood: the look stopped: the resolver is not trusted");
            return None;
        }
        let slot = slots.clone().acquire_owned().await.ok()?;
        let (resolver, nb, name) = (resolver.clone(), nb.clone(), name.clone());
        tasks.spawn(async move {
            // Not answered (timeout, SERVFAIL): nothing learned, what is known kept (seen
            // today); the next pass asks again.
            let seen = resolver.observe(&name).await;
            if !resolver.evidence_off() {
                match seen {
                    Some(hosts) => nb.looked(&name, &hosts),
                    None => nb.refresh(&name),
                }
            }
            drop(slot);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    Some((names.len(), started.elapsed()))
}
