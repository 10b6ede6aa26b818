//! The gateway's own look at every listed name: where each one's mail goes, at start and then
//! every `look.every_secs`, from `look.rate` names a second up to `look.max_rate` as the
//! resolver keeps up (`pace::Adaptive`). It is the baseline a listed
//! name re-pointed later is measured against (`History` in the index): a lapsed name someone
//! registers again and points at a company's host counts for nobody until it has held that
//! host `hold_days`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use drg_base::service::Shutdown;
use drg_domain::neighbour_index::{keys_of, History, HostNetworks, Learned, Teach, Teachers};
use tokio::sync::Semaphore;

use super::pace::{Adaptive, Pace};
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
    /// The look saw `domain` with no mail now, or its DNS did not answer: the entry it knows is
    /// kept, seen today, so it does not age out with its history (an expired entry is a name
    /// never seen, which counts at first sight). A name that moved to its hosts and had not
    /// held them `hold_days` yet has not held them: its hold starts again today. Holding means
    /// the look seeing it there pass after pass: re-registered names pointed at a company's
    /// host for a day, then let go (or their DNS left silent, which their holder chooses as
    /// well), would otherwise stay on that host and count there once the days had passed.
    fn refresh(&self, domain: &str) {
        let Some(known) = self.read().learned_of(domain) else {
            return;
        };
        let day = today();
        let broken = known
            .since
            .filter(|since| day < since.saturating_add(self.config.hold_days()))
            .map(|_| History::new(day, true));
        let how = Teach {
            history: broken,
            no_mail: true,
            ..Teach::default()
        };
        let table = self.table.load();
        let learned = Learned::new(domain, known.keys, day, how);
        self.teach_how(&table, &learned, how);
        if broken.is_some() {
            if let Some(l) = self.read().learned_of(domain) {
                self.share(&l);
            }
        }
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
                let mut retry = Retry::default();
                retry.add(done.unanswered, 0);
                retry
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
            let due = unanswered.due();
            if !due.is_empty() {
                let names = due.iter().map(|(n, _)| n.clone()).collect();
                match pass(&resolver, &nb, &mut shutdown, names).await {
                    Some(done) => unanswered.tried(&due, done.unanswered),
                    None if *shutdown.borrow() => return,
                    // Stopped: the same names at the next poll.
                    None => unanswered.back(due),
                }
            }
            let now = nb.table.load().version().generation;
            if now == generation {
                continue;
            }
            match look_new(&resolver, &nb, &mut shutdown).await {
                Some(missed) => {
                    generation = now;
                    unanswered.add(missed, 0);
                }
                None if *shutdown.borrow() => return,
                // Stopped: tried again at the next poll.
                None => {}
            }
        }
    }
}

/// Looks at the names a reload added (those the index does not know yet): those DNS did not
/// answer, or `None` when it stopped (shutdown, or an untrusted resolver).
async fn look_new(
    resolver: &Arc<MxResolver>,
    nb: &Arc<Neighbourhood>,
    shutdown: &mut Shutdown,
) -> Option<Vec<String>> {
    let mut names = nb.table.load().listed_registrable();
    {
        let index = nb.read();
        names.retain(|n| !index.knows(n));
    }
    let done = pass(resolver, nb, shutdown, names).await?;
    if done.names > 0 {
        log::info!(
            "MX neighbourhood: looked at {} listed names a reload added",
            done.names
        );
    }
    Some(done.unanswered)
}

/// Waits before a name DNS did not answer is asked again, after each try that got none; after
/// the last, it waits for the next pass.
const RETRIES: [Duration; 4] = [
    Duration::from_secs(5),
    Duration::from_secs(60),
    Duration::from_secs(600),
    Duration::from_secs(3_600),
];

/// Names asked again at one poll at most: a reload's new names are looked at between two such
/// batches, however many silent names wait (each can hold a slot for its whole deadline).
const RETRY_BATCH: usize = 256;

/// The names DNS did not answer, each with the retries made and when it is asked again.
#[derive(Default)]
struct Retry {
    names: Vec<(String, usize, Instant)>,
}

impl Retry {
    /// `unanswered` after `made` retries: asked again after the next wait, if one is left.
    fn add(&mut self, unanswered: Vec<String>, made: usize) {
        let Some(wait) = RETRIES.get(made) else {
            return;
        };
        let at = Instant::now() + *wait;
        self.names
            .extend(unanswered.into_iter().map(|n| (n, made, at)));
    }

    /// The names due now (at most [`RETRY_BATCH`]), with the retries made.
    fn due(&mut self) -> Vec<(String, usize)> {
        let now = Instant::now();
        let mut due = Vec::new();
        self.names.retain(|(n, made, at)| {
            let take = *at <= now && due.len() < RETRY_BATCH;
            if take {
                due.push((n.clone(), *made));
            }
            !take
        });
        due
    }

    /// `due` was asked: those still `unanswered` wait for their next retry.
    fn tried(&mut self, due: &[(String, usize)], unanswered: Vec<String>) {
        let made: std::collections::HashMap<&str, usize> =
            due.iter().map(|(n, m)| (n.as_str(), *m)).collect();
        for name in unanswered {
            let m = made.get(name.as_str()).copied().unwrap_or(0);
            self.add(vec![name], m + 1);
        }
    }

    /// `due` was not asked (the look stopped): due again at the next poll.
    fn back(&mut self, due: Vec<(String, usize)>) {
        let now = Instant::now();
        (self.names).extend(due.into_iter().map(|(n, m)| (n, m, now)));
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
    let slots = Arc::new(Semaphore::new(nb.config.look.concurrency.max(1)));
    let look = &nb.config.look;
    let last = f64::from_bits(nb.look_rate.load(Ordering::Relaxed));
    let mut progress = Progress {
        unanswered: Vec::new(),
        adaptive: Adaptive::new(look.rate, look.max_rate, started).resume(last),
        pace: Pace::new(look.rate, look.rate as usize),
        nb: nb.clone(),
    };
    progress.pace.set_rate(progress.adaptive.rate());
    let mut tasks = tokio::task::JoinSet::new();
    for name in &names {
        if let Some(wait) = progress.pace.take(Instant::now()) {
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
            let asked = Instant::now();
            let seen = resolver.observe(&name).await;
            let took = asked.elapsed();
            drop(slot);
            if resolver.evidence_off() {
                // Not evidence: asked again like a name DNS did not answer.
                return (Some(name), took, false);
            }
            match seen {
                // Hosts and parent taught; a network whose reverse DNS did not answer, or a
                // host whose addresses did not, is asked again, as an unanswered name is (and
                // weighs on the pace as one: its wait is DNS's timeout, not the resolver's
                // speed).
                Some(seen) => {
                    nb.looked(&name, &seen.hosts);
                    (seen.networks_open.then_some(name), took, !seen.silent_host)
                }
                None => {
                    nb.refresh(&name);
                    (Some(name), took, false)
                }
            }
        });
        while let Some(r) = tasks.try_join_next() {
            progress.collect(r);
        }
    }
    while let Some(r) = tasks.join_next().await {
        progress.collect(r);
    }
    Some(Done {
        names: names.len(),
        took: started.elapsed(),
        unanswered: progress.unanswered,
    })
}

/// A pass's names as they end: those to ask again, and the pace weighed on how the resolver
/// answered them ([`Adaptive`]).
struct Progress {
    unanswered: Vec<String>,
    adaptive: Adaptive,
    pace: Pace,
    nb: Arc<Neighbourhood>,
}

impl Progress {
    fn collect(&mut self, r: Result<(Option<String>, Duration, bool), tokio::task::JoinError>) {
        let Ok((again, took, answered)) = r else {
            return;
        };
        self.unanswered.extend(again);
        self.adaptive.done(took, answered);
        if let Some(rate) = self.adaptive.adjust(Instant::now()) {
            self.pace.set_rate(rate);
            (self.nb.look_rate).store(rate.to_bits(), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unanswered_name_is_asked_again_at_most_once_a_wait_and_a_batch_at_a_time() {
        let mut r = Retry::default();
        r.add(vec!["later.example".into()], 0);
        assert!(r.due().is_empty(), "the first wait is not over");
        // Due now (a stopped look put them back): asked, and those still unanswered wait for
        // their next retry; a name past the last retry waits for the next pass.
        r.back(vec![("a.example".into(), 0), ("b.example".into(), 3)]);
        let due = r.due();
        assert_eq!(due.len(), 2);
        r.tried(&due, vec!["a.example".into(), "b.example".into()]);
        let waiting: Vec<(&str, usize)> =
            (r.names.iter()).map(|(n, m, _)| (n.as_str(), *m)).collect();
        assert_eq!(waiting, [("later.example", 0), ("a.example", 1)]);
        assert!(r.due().is_empty());
        // However many are due, one batch a poll.
        r.back((0..300).map(|i| (format!("n{i}.example"), 0)).collect());
        assert_eq!(r.due().len(), RETRY_BATCH);
        assert_eq!(r.due().len(), 300 - RETRY_BATCH);
    }
}
