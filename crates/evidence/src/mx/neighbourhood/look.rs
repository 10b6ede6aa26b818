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
/// a list adds has its baseline before anyone can re-point it, and names DNS did not answer are
/// asked again after each of [`RETRIES`] (what only lookups taught counts for their projects
/// alone, so a name the look missed is a name most projects do not know).
pub(super) async fn run(resolver: Arc<MxResolver>, nb: Arc<Neighbourhood>, mut shutdown: Shutdown) {
    let every = nb.config.look.every;
    loop {
        let began = Instant::now();
        let mut generation = nb.table.load().version().generation;
        let names = nb.table.load().listed_registrable();
        let mut unanswered = match pass(&resolver, &nb, &mut shutdown, names).await {
            Some(done) => {
                nb.look_passes.fetch_add(1, Ordering::Relaxed);
                log::info!(
                    "MX neighbourhood: looked at {} listed names in {:.1} s ({} not answered)",
                    done.names,
                    done.took.as_secs_f64(),
                    done.unanswered.len()
                );
                Retry::new(done.unanswered)
            }
            None if *shutdown.borrow() => return,
            // Stopped (an untrusted resolver): a whole pass again once it is trusted, not a
            // day later.
            None => continue,
        };
        let next = began + every;
        while Instant::now() < next {
            let wait = NEW_NAMES_POLL.min(next.saturating_duration_since(Instant::now()));
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => return,
            }
            if Instant::now() >= next {
                break;
            }
            if let Some(names) = unanswered.due() {
                match pass(&resolver, &nb, &mut shutdown, names.clone()).await {
                    Some(done) => unanswered.answered(done.unanswered),
                    None if *shutdown.borrow() => return,
                    // Stopped: the same names at the next poll.
                    None => unanswered.again(names),
                }
            }
            let now = nb.table.load().version().generation;
            if now == generation {
                continue;
            }
            match look_new(&resolver, &nb, &mut shutdown).await {
                Some(true) => generation = now,
                Some(false) => {}
                None => return,
            }
        }
    }
}

/// Looks at the names a reload added (those the index does not know yet); `Some(false)` when
/// stopped by an untrusted resolver (tried again at the next poll), `None` at shutdown.
async fn look_new(
    resolver: &Arc<MxResolver>,
    nb: &Arc<Neighbourhood>,
    shutdown: &mut Shutdown,
) -> Option<bool> {
    let mut names = nb.table.load().listed_registrable();
    {
        let index = nb.read();
        names.retain(|n| !index.knows(n));
    }
    match pass(resolver, nb, shutdown, names).await {
        Some(done) => {
            if done.names > 0 {
                log::info!(
                    "MX neighbourhood: looked at {} listed names a reload added",
                    done.names
                );
            }
            Some(true)
        }
        None if *shutdown.borrow() => None,
        None => Some(false),
    }
}

/// Waits before a name DNS did not answer at a pass is asked again, one after the other; after
/// the last, it waits for the next pass.
const RETRIES: [Duration; 4] = [
    Duration::from_secs(5),
    Duration::from_secs(60),
    Duration::from_secs(600),
    Duration::from_secs(3_600),
];

/// The names a pass got no answer for, and when they are asked again.
struct Retry {
    names: Vec<String>,
    round: usize,
    at: Instant,
}

impl Retry {
    fn new(names: Vec<String>) -> Retry {
        Retry {
            names,
            round: 0,
            at: Instant::now() + RETRIES[0],
        }
    }

    /// The names to ask now, if it is time.
    fn due(&mut self) -> Option<Vec<String>> {
        if self.names.is_empty() || self.round >= RETRIES.len() || Instant::now() < self.at {
            return None;
        }
        self.round += 1;
        Some(std::mem::take(&mut self.names))
    }

    /// Asked: those still unanswered wait for the next round.
    fn answered(&mut self, unanswered: Vec<String>) {
        self.names = unanswered;
        if let Some(wait) = RETRIES.get(self.round) {
            self.at = Instant::now() + *wait;
        }
    }

    /// Not asked (the look stopped): the same round again at the next poll.
    fn again(&mut self, names: Vec<String>) {
        self.names = names;
        self.round -= 1;
    }
}

/// What a pass did.
struct Done {
    names: usize,
    took: Duration,
    /// Names DNS did not answer (timeout, SERVFAIL).
    unanswered: Vec<String>,
}

/// One pass over `names`; `None` when it stopped early (shutdown, or a resolver the canaries
/// stopped trusting: what it says then is not evidence).
async fn pass(
    resolver: &Arc<MxResolver>,
    nb: &Arc<Neighbourhood>,
    shutdown: &mut Shutdown,
    names: Vec<String>,
) -> Option<Done> {
    // Wait for a resolver the canaries trust (the first check runs at start).
    while resolver.evidence_off() {
        tokio::select! {
            () = tokio::time::sleep(UNTRUSTED_WAIT) => {}
            _ = shutdown.changed() => return None,
        }
    }
    let started = Instant::now();
    let slots = Arc::new(Semaphore::new(nb.config.concurrency.max(1)));
    let rate = nb.config.look.rate;
    let mut pace = Pace::new(rate, rate as usize);
    let mut tasks = tokio::task::JoinSet::new();
    let mut unanswered = Vec::new();
    let mut collect = |r: Result<Option<String>, _>| unanswered.extend(r.ok().flatten());
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
            // today); asked again after a while.
            let seen = resolver.observe(&name).await;
            drop(slot);
            if resolver.evidence_off() {
                return None;
            }
            match seen {
                Some(hosts) => nb.looked(&name, &hosts),
                None => {
                    nb.refresh(&name);
                    return Some(name);
                }
            }
            None
        });
        while let Some(r) = tasks.try_join_next() {
            collect(r);
        }
    }
    while let Some(r) = tasks.join_next().await {
        collect(r);
    }
    Some(Done {
        names: names.len(),
        took: started.elapsed(),
        unanswered,
    })
}
