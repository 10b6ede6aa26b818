//! The MX neighbourhood index at work: taught by every MX lookup (and, in the background, by
//! the listed names the table answers), asked for each unlisted domain, kept in a state file
//! and shared over Redis. The rule itself is pure, in [`drg_domain::neighbour_index`].

pub mod holds;
pub mod look;
pub mod mirror;
mod pace;
mod pending;
pub mod service;
pub mod share;
pub mod store;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use arc_swap::ArcSwap;
use tokio::sync::mpsc;

use crate::mx::config::NeighbourhoodConfig;
use drg_domain::neighbour_index::{
    keys_of, project_id, Finding, HostNetworks, KeyKind, KeyReport, Learned, NeighbourhoodIndex,
    NeighbourhoodRule, ProjectId, Teach, Teachers,
};
use drg_domain::{DomainName, DomainTable, Reason, TableRule};
use drg_telemetry::metrics::NeighbourhoodStats;
use mirror::{Change, Mirror};

/// What the gateway learned and has yet to send to the other gateways, at most (the oldest
/// are dropped past it: sharing is best effort, every gateway also learns on its own).
const OUTBOX_MAX: usize = 50_000;

/// Days since the Unix epoch, now.
pub fn today() -> u32 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    u32::try_from(secs / 86_400).unwrap_or(u32::MAX)
}

/// The index, its inputs and its counters (see the module documentation).
pub struct Neighbourhood {
    index: RwLock<NeighbourhoodIndex>,
    table: Arc<ArcSwap<DomainTable>>,
    pub config: NeighbourhoodConfig,
    /// Listed names queued or being resolved (deduplicates the queue), with the projects
    /// whose traffic asked for them meanwhile (they teach what the lookup finds), and those
    /// resolved lately with nothing to teach, left alone for a while.
    pending: Mutex<pending::Pending>,
    queue: mpsc::Sender<Box<str>>,
    queue_rx: Mutex<Option<mpsc::Receiver<Box<str>>>>,
    /// Learned here, not yet shared (only when sharing).
    outbox: Mutex<VecDeque<Learned>>,
    sharing: bool,
    dirty: AtomicBool,
    verdicts: [AtomicU64; 3],
    taught: AtomicU64,
    dropped: AtomicU64,
    /// Listed names the gateway's own look saw, and its passes done (`look.rs`).
    looked: AtomicU64,
    look_passes: AtomicU64,
    /// The look's rate now, names a second (`f64` bits; 0 before the first window).
    look_rate: AtomicU64,
    /// Verdicts reached, kept until their instant (see `verdict_hold_seconds`), per domain:
    /// one for every project (`None`), and a project's own (a finding on its own lookups is
    /// its alone).
    held: quick_cache::sync::Cache<(Box<str>, Option<ProjectId>), Holding>,
    /// The verdicts every gateway on the shared Redis holds (`holds.rs`; unset: this gateway's
    /// own only).
    shared_holds: std::sync::OnceLock<Arc<holds::SharedHolds>>,
    /// Changes to the index not yet applied to the mirror (a short lock per teach).
    journal: Mutex<Vec<Change>>,
    /// The journal passed its bound: the mirror is rebuilt from the index once.
    overflow: AtomicBool,
    /// What the state file, ageing and eviction are worked out from, off the index's lock.
    mirror: Mutex<Mirror>,
}

/// A verdict held here: until when, and whether another gateway reached it (its copy is kept
/// [`ADOPTED_FOR`] at most, and no margin of this index's counts drops it).
#[derive(Clone)]
struct Holding {
    finding: Finding,
    until: Instant,
    adopted: bool,
}

/// What this index says of a name (see [`Neighbourhood::scoped`]).
struct Scoped {
    /// The finding, and whether it is every project's (`false`: the asking project's own).
    finding: Option<(Finding, bool)>,
    /// It is a verdict held here.
    held: bool,
    /// A verdict this gateway reached was dropped now.
    dropped: bool,
}

/// How long a verdict another gateway holds is answered from here before Redis is asked again:
/// the most two gateways can disagree after the one that reached it gave it up.
const ADOPTED_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// Changes the journal holds at most between two ticks of the MX service.
const JOURNAL_MAX: usize = 500_000;
/// Domains handled under one hold of the index's lock when ageing or evicting.
const CHUNK: usize = 1_024;

/// Verdicts held at most (a bound, not a target: judged domains are few).
const HELD_MAX: usize = 20_000;

impl Neighbourhood {
    /// An empty index for `config`; `sharing` when gateways exchange what they learn (Redis).
    pub fn new(
        config: &NeighbourhoodConfig,
        table: Arc<ArcSwap<DomainTable>>,
        sharing: bool,
    ) -> Self {
        let rule = NeighbourhoodRule {
            min_listed: config.min_listed,
            min_share: config.min_share.0,
            min_hosts: config.min_hosts,
            hold_days: config.hold_days(),
        };
        let (queue, rx) = mpsc::channel(config.queue.max(1));
        Neighbourhood {
            index: RwLock::new(NeighbourhoodIndex::new(rule, config.max_entries)),
            table,
            config: config.clone(),
            pending: Mutex::new(pending::Pending::default()),
            queue,
            queue_rx: Mutex::new(Some(rx)),
            outbox: Mutex::new(VecDeque::new()),
            sharing,
            dirty: AtomicBool::new(false),
            verdicts: Default::default(),
            taught: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            looked: AtomicU64::new(0),
            look_passes: AtomicU64::new(0),
            look_rate: AtomicU64::new(0),
            held: quick_cache::sync::Cache::new(HELD_MAX),
            journal: Mutex::new(Vec::new()),
            overflow: AtomicBool::new(false),
            mirror: Mutex::new(Mirror::default()),
            shared_holds: std::sync::OnceLock::new(),
        }
    }

    /// Shares held verdicts with the other gateways through `holds` (once; later calls are
    /// ignored).
    pub fn set_shared_holds(&self, holds: Arc<holds::SharedHolds>) {
        let _ = self.shared_holds.set(holds);
    }

    /// Whether verdicts are agreed with other gateways ([`Self::agreed_finding`]); without,
    /// [`Self::finding`] is the same answer, with no future to poll.
    pub fn shares_holds(&self) -> bool {
        self.shared_holds.get().is_some()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, NeighbourhoodIndex> {
        self.index.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, NeighbourhoodIndex> {
        self.index.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The key that judges `name` (by its registrable domain) for `project`'s answer, if one
    /// does. One read lock and a few hash lookups; allocates only for a finding. A verdict once
    /// reached is kept for `verdict_hold_seconds` with the counts it was reached on (users see
    /// no "disposable the first time, not the second") while its key stays within the hold
    /// margin of the rule ([`NeighbourhoodIndex::holds`]); a list or the allowlist still
    /// overrules it, as the table is asked first.
    pub fn finding(&self, name: &DomainName, project: &str) -> Option<Finding> {
        self.scoped_finding(name, project).map(|(f, _)| f)
    }

    /// [`finding`](Self::finding), with whose verdict it is: every project's (`true`), or the
    /// asking project's own (on its own lookups).
    fn scoped_finding(&self, name: &DomainName, project: &str) -> Option<(Finding, bool)> {
        self.scoped(name, project).finding
    }

    /// [`scoped_finding`](Self::scoped_finding), whether it is a verdict held here, and whether
    /// a verdict this gateway reached was dropped now (its key went well past the hold's
    /// margin: the shared hold is given up).
    fn scoped(&self, name: &DomainName, project: &str) -> Scoped {
        let mut out = Scoped {
            finding: None,
            held: false,
            dropped: false,
        };
        let Some(domain) = name.registrable() else {
            return out;
        };
        // Most names asked (a company's own hosts, a shared host with no throwaway on it) have
        // no listed neighbour: no key can judge them and no verdict held here can stand
        // (`holds` wants `min_listed` listed ones), so nothing else is looked at. With shared
        // holds a verdict held here may still have to be given up on Redis: the full path.
        let own = {
            let index = self.read();
            if self.shared_holds.get().is_none() && !index.near_listed(domain) {
                return out;
            }
            let id = project_id(project);
            // A project whose own lookups taught no listed domain the index counts sees what
            // every project sees: one look, not two (most projects, once the look has passed).
            index.has_own(id).then_some(id)
        };
        let hold = self.config.verdict_hold;
        if !hold.is_zero() {
            // Every project's verdict first: what the lists and the look taught.
            let mut held_key = (Box::<str>::from(domain), None);
            for scope in [None, own].into_iter().take(1 + usize::from(own.is_some())) {
                held_key.1 = scope;
                if let Some(h) = self.held.get(&held_key) {
                    let live = h.until > Instant::now();
                    // Weighed by the counts of whose verdict it is: every project's by what
                    // every project sees, a project's own with its own lookups.
                    if live && (h.adopted || self.read().holds(domain, &h.finding, scope)) {
                        out.finding = Some((h.finding, scope.is_none()));
                        out.held = true;
                        return out;
                    }
                    out.dropped |= live && !h.adopted && scope.is_none();
                    self.held.remove(&held_key);
                }
            }
        }
        // Every project's verdict, with the same evidence for all, where the lists and the look
        // hold one; else one on the asking project's own lookups too, its alone.
        let (shared, finding) = {
            let index = self.read();
            match (index.finding_for(domain, None), own) {
                (Some(f), _) => (true, Some(f)),
                (None, Some(id)) => (false, index.finding_for(domain, Some(id))),
                (None, None) => (false, None),
            }
        };
        let Some(mut finding) = finding else {
            return out;
        };
        if !hold.is_zero() {
            finding.since = Some(drg_base::infra::units::now_rfc3339());
            let scope = if shared { None } else { own };
            let held_key = (Box::<str>::from(domain), scope);
            let holding = Holding {
                finding: finding.clone(),
                until: Instant::now() + hold,
                adopted: false,
            };
            self.held.insert(held_key, holding);
        }
        out.finding = Some((finding, shared));
        out
    }

    /// [`finding`](Self::finding), agreed with the other gateways on the shared Redis: a
    /// verdict every project gets is claimed for the hold, and one another gateway holds is
    /// answered when this index judges nothing (it has not pulled that evidence yet, or its
    /// counts moved since the verdict). One verdict for a name on every gateway, as on one
    /// (`holds.rs`). Redis failing answers from this index alone.
    pub async fn agreed_finding(&self, name: &DomainName, project: &str) -> Option<Finding> {
        let Scoped {
            finding: local,
            held,
            dropped,
        } = self.scoped(name, project);
        let hold = self.config.verdict_hold;
        let (Some(shared), Some(domain)) = (self.shared_holds.get(), name.registrable()) else {
            return local.map(|(f, _)| f);
        };
        if hold.is_zero() {
            return local.map(|(f, _)| f);
        }
        if dropped {
            if let Err(e) = shared.release(domain).await {
                log::debug!("mx neighbourhood: a held verdict not given up ({e})");
            }
        }
        let answer = match &local {
            // Held here (claimed by this gateway, or another's answered for a second), or a
            // project's verdict on its own lookups: no round trip.
            Some((finding, _)) if held => return Some(finding.clone()),
            Some((finding, false)) => return Some(finding.clone()),
            // Claimed: this one, or the verdict another gateway reached first.
            Some((finding, true)) => shared.claim(domain, finding, hold).await.map(Some),
            // No key of any gateway can judge a name with none (mainstream providers only).
            None if !self.read().has_keys(domain) => return None,
            None => shared.held(domain).await,
        };
        match answer {
            Ok(Some((finding, left))) => {
                let mine = local.as_ref().is_some_and(|(f, _)| *f == finding);
                if !mine {
                    let holding = Holding {
                        finding: finding.clone(),
                        until: Instant::now() + left.min(ADOPTED_FOR),
                        adopted: true,
                    };
                    self.held.insert((Box::<str>::from(domain), None), holding);
                }
                Some(finding)
            }
            Ok(None) => None,
            Err(e) => {
                log::debug!("mx neighbourhood: shared holds unavailable ({e}); this index answers");
                local.map(|(f, _)| f)
            }
        }
    }

    /// Whether any key of `name`'s registrable domain has a listed neighbour: only then can
    /// its owner's evidence (SPF, DMARC) change an answer or a count.
    pub fn near_listed(&self, name: &str) -> bool {
        DomainName::parse(name)
            .ok()
            .and_then(|n| n.registrable().map(|d| self.read().near_listed(d)))
            .unwrap_or(false)
    }

    /// Records how the gateway answered `name` (MX hosts known, the table leaving it open):
    /// `inferred` when its neighbours made it `disposable`, which neither dilutes nor feeds its
    /// keys ([`Standing::Inferred`](drg_domain::neighbour_index::Standing)); one answered
    /// otherwise counts as `vouched` says (an established age: it dilutes; `None`: the last
    /// word stands). A read lock when nothing changes (the usual case).
    pub fn judged(&self, name: &DomainName, inferred: bool, vouched: Option<bool>) {
        let Some(domain) = name.registrable() else {
            return;
        };
        {
            let index = self.read();
            let same_vouch = vouched.is_none_or(|v| index.is_vouched(domain) == v);
            if index.is_inferred(domain) == inferred && same_vouch {
                return;
            }
        }
        let learned = {
            let mut index = self.write();
            if !index.judged(domain, inferred, vouched) {
                return;
            }
            index.learned_of(domain)
        };
        if let Some(learned) = learned {
            self.changed_entry(learned, false);
        }
    }

    /// An entry changed in place (its standing, its teachers): saved, shared, mirrored.
    fn changed_entry(&self, learned: Learned, listed: bool) {
        self.dirty.store(true, Ordering::Relaxed);
        self.share(&learned);
        let mut journal = self.journal.lock().unwrap_or_else(|p| p.into_inner());
        if !self.overflow.load(Ordering::Relaxed) {
            journal.push(Change::Put { learned, listed });
        }
    }

    /// A few of the listed domains counted on `finding`'s key, by name (see
    /// [`NeighbourhoodIndex::listed_sample`]).
    pub fn listed_sample(&self, finding: &Finding) -> Vec<Box<str>> {
        self.read().listed_sample(finding)
    }

    /// The same names with the day the gateway first saw each on its current hosts (see
    /// [`NeighbourhoodIndex::listed_watched`]).
    pub fn listed_watched(&self, finding: &Finding) -> Vec<(Box<str>, Option<u32>)> {
        self.read().listed_watched(finding)
    }

    /// Counts a verdict the index decided (for metrics).
    pub fn count_verdict(&self, kind: KeyKind) {
        self.verdicts[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A listed name the table answered for `project`: queue its registrable domain for a
    /// background MX lookup if the index does not know it yet, or add the project to those
    /// that taught it. Never waits: a full queue drops it (it is queued again the next time
    /// it is asked).
    pub fn consider_listed(&self, name: &DomainName, project: &str) {
        let Some(domain) = name.registrable() else {
            return;
        };
        let project = project_id(project);
        let learned = {
            let index = self.read();
            if !index.knows(domain) {
                drop(index);
                self.enqueue(domain, Teachers::project(project));
                return;
            }
            // Nothing to add: the lists or the look taught it (it counts for everyone), or this
            // teacher cannot change its counts.
            let known = index.learned_of(domain);
            if known.is_none_or(|l| l.global || l.looked || !l.teach().teachers.add(project)) {
                return;
            }
            drop(index);
            let mut index = self.write();
            if !index.add_teacher(domain, project) {
                return;
            }
            index.learned_of(domain)
        };
        if let Some(learned) = learned {
            self.changed_entry(learned, true);
        }
    }

    /// Queues `name` for the teacher unless it is queued or being resolved (then `teachers`
    /// join the queued ones) or was resolved lately with nothing to teach; a full queue drops
    /// it (counted).
    fn enqueue(&self, name: &str, teachers: Teachers) {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if !pending.needs_queue(name, teachers, Instant::now) {
            return;
        }
        match self.queue.try_send(name.into()) {
            Ok(()) => {
                pending.queued(name, teachers);
            }
            Err(_) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Whether the index knows `name`'s registrable domain.
    pub fn knows_name(&self, name: &str) -> bool {
        DomainName::parse(name)
            .ok()
            .and_then(|n| n.registrable().map(|d| self.read().knows(d)))
            .unwrap_or(false)
    }

    /// Whether the network key `net` (`192.0.2.0/24`) has a listed neighbour: only then can it
    /// judge, and is a request's reverse DNS for it worth waiting for.
    pub fn network_has_listed(&self, net: &str) -> bool {
        self.read()
            .has_listed(&format!("{}:{net}", KeyKind::Network.as_str()))
    }

    /// `name` was answered without the networks whose key could not judge yet: queue it for
    /// a background lookup that vouches for them all and teaches them (the teacher's pace and
    /// queue bound apply; a full queue drops it, the next miss queues it again).
    pub fn complete_later(&self, name: &str) {
        self.enqueue(name, Teachers::default());
    }

    /// The background resolution of `domain` ended; `quiet`: it taught nothing, and is not
    /// queued again for that long.
    pub(crate) fn resolved(&self, domain: &str, quiet: Option<std::time::Duration>) {
        let now = Instant::now();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .resolved(domain, quiet.map(|q| now + q), now);
    }

    /// The projects whose traffic asked for `domain` while it waited to be resolved.
    fn askers(&self, domain: &str) -> Teachers {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .askers(domain)
    }

    /// The queue's receiving end (taken once, by the MX service).
    pub(crate) fn take_queue(&self) -> Option<mpsc::Receiver<Box<str>>> {
        self.queue_rx
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    /// What an MX lookup of `name` found: its hosts and their networks. Taught under the
    /// registrable domain, listed or not as the table in service says; a listed one as taught
    /// by the projects that asked for it.
    pub fn learn(&self, name: &str, hosts: &[HostNetworks]) {
        let Ok(parsed) = DomainName::parse(name) else {
            return;
        };
        let Some(domain) = parsed.registrable() else {
            return;
        };
        let table = self.table.load();
        let keys = keys_of(domain, hosts, table.providers());
        let how = Teach {
            inferred: false,
            vouched: None,
            teachers: self.askers(domain),
            ..Teach::default()
        };
        let learned = Learned::new(domain, keys, today(), how);
        self.teach_how(&table, &learned, how);
        if let Some(l) = self.read().learned_of(domain) {
            self.share(&l);
        }
    }

    /// Teaches one learned domain, its standing from `table` (a state file, a snapshot or
    /// another gateway may have learned it under other lists).
    #[cfg(test)]
    pub(crate) fn teach(&self, table: &DomainTable, learned: &Learned) {
        self.teach_how(table, learned, learned.teach());
    }

    fn teach_how(&self, table: &DomainTable, learned: &Learned, how: Teach) {
        let source = listed_source(table, &learned.domain);
        let (evicted, now) = {
            let mut index = self.write();
            let evicted = index.teach(
                &learned.domain,
                &learned.keys,
                source.as_deref(),
                how,
                learned.seen,
            );
            // What the index made of it (teachers merged, its history): what the state keeps.
            (evicted, index.learned_of(&learned.domain))
        };
        let learned = now.as_ref().unwrap_or(learned);
        self.taught.fetch_add(1, Ordering::Relaxed);
        self.dirty.store(true, Ordering::Relaxed);
        let mut journal = self.journal.lock().unwrap_or_else(|p| p.into_inner());
        if journal.len() >= JOURNAL_MAX {
            self.overflow.store(true, Ordering::Relaxed);
            journal.clear();
        }
        if !self.overflow.load(Ordering::Relaxed) {
            journal.push(Change::Put {
                learned: learned.clone(),
                listed: source.is_some(),
            });
            journal.extend(evicted.into_iter().map(Change::Gone));
        }
    }

    /// Teaches many (a file, another gateway's batch): listed ones first, so they judge the
    /// unlisted ones among them. Skips those older than `max_age_days`. `restore`: the
    /// gateway's own files at start (their histories taken as kept: see `Teach::restore`).
    pub(crate) fn teach_all(&self, mut learned: Vec<Learned>, restore: bool) -> usize {
        let table = self.table.load();
        let oldest = today().saturating_sub(self.config.max_age_days);
        learned.retain(|l| l.seen >= oldest);
        learned.sort_by_key(|l| listed_source(&table, &l.domain).is_none());
        for l in &learned {
            let how = if restore { l.restore() } else { l.teach() };
            self.teach_how(&table, l, how);
        }
        learned.len()
    }

    /// Queues `learned` for the other gateways (when sharing); past `OUTBOX_MAX` the oldest goes.
    fn share(&self, learned: &Learned) {
        if !self.sharing {
            return;
        }
        let mut outbox = self.outbox.lock().unwrap_or_else(|p| p.into_inner());
        if outbox.len() >= OUTBOX_MAX {
            outbox.pop_front();
        }
        outbox.push_back(learned.clone());
    }

    /// Takes what is waiting to be shared.
    pub(crate) fn take_outbox(&self) -> Vec<Learned> {
        std::mem::take(&mut *self.outbox.lock().unwrap_or_else(|p| p.into_inner())).into()
    }

    fn mirror(&self) -> std::sync::MutexGuard<'_, Mirror> {
        self.mirror.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Brings the mirror up to date with the journal (after an overflow, with one pass over
    /// the index under its read lock).
    pub(crate) fn sync(&self) {
        let changes = std::mem::take(&mut *self.journal.lock().unwrap_or_else(|p| p.into_inner()));
        if self.overflow.swap(false, Ordering::Relaxed) {
            let all = self.read().learned_unsorted();
            self.mirror().reset(all);
        } else {
            self.mirror().apply(changes);
        }
    }

    /// Everything learned, for the state file, if anything changed since the last call:
    /// sorted from the mirror, the index's lock not taken.
    pub(crate) fn changed(&self) -> Option<Vec<Learned>> {
        self.sync();
        self.dirty
            .swap(false, Ordering::Relaxed)
            .then(|| self.mirror().learned())
    }

    /// Forgets what was not seen for `max_age_days`: found in the mirror, forgotten a chunk at
    /// a time under the write lock (a domain taught again meanwhile stays).
    pub(crate) fn expire(&self) {
        self.sync();
        let oldest = today().saturating_sub(self.config.max_age_days);
        let old = self.mirror().older_than(oldest);
        self.forget(old.into_iter().map(|(d, _)| d).collect(), Some(oldest - 1));
    }

    /// The index holds more than `max_entries` domains.
    pub(crate) fn over_bound(&self) -> bool {
        self.read().excess() > 0
    }

    /// Past `max_entries`, down to nine tenths: the least useful, then the oldest, first (as
    /// [`NeighbourhoodIndex`] ranks them), worked out from the mirror with short read locks
    /// and forgotten a chunk at a time. Run by the MX service, off the request path.
    pub(crate) fn evict(&self) {
        let excess = self.read().excess();
        if excess == 0 {
            return;
        }
        self.sync();
        let all = self.mirror().all();
        let mut ranked: Vec<(u8, u32, Box<str>)> = Vec::with_capacity(all.len());
        for chunk in all.chunks(CHUNK) {
            let index = self.read();
            for (domain, _, seen) in chunk {
                if let Some(u) = index.usefulness_of(domain) {
                    ranked.push((u, *seen, domain.clone()));
                }
            }
        }
        let excess = excess.min(ranked.len());
        if excess == 0 {
            return;
        }
        ranked.select_nth_unstable(excess - 1);
        ranked.truncate(excess);
        self.forget(ranked.into_iter().map(|(_, _, d)| d).collect(), None);
    }

    /// Forgets `domains` (those taught after `seen_after` excepted) a chunk per write lock.
    fn forget(&self, domains: Vec<Box<str>>, seen_after: Option<u32>) {
        let mut gone: Vec<Box<str>> = Vec::new();
        for chunk in domains.chunks(CHUNK) {
            let mut index = self.write();
            gone.extend(
                chunk
                    .iter()
                    .filter(|d| index.forget(d, seen_after))
                    .cloned(),
            );
        }
        if !gone.is_empty() {
            self.dirty.store(true, Ordering::Relaxed);
            // Through the journal, in order with the teaches around it.
            let mut journal = self.journal.lock().unwrap_or_else(|p| p.into_inner());
            if !self.overflow.load(Ordering::Relaxed) {
                journal.extend(gone.into_iter().map(Change::Gone));
            }
        }
    }

    /// The `limit` keys with the most listed neighbours (the admin listing).
    pub fn top(&self, limit: usize) -> Vec<KeyReport> {
        self.read().top(limit)
    }

    pub fn stats(&self) -> NeighbourhoodStats {
        let index = self.read();
        let by_kind = index.keys_by_kind();
        NeighbourhoodStats {
            domains: index.domains() as u64,
            keys: [
                by_kind[0].1 as u64,
                by_kind[1].1 as u64,
                by_kind[2].1 as u64,
            ],
            verdicts: std::array::from_fn(|i| self.verdicts[i].load(Ordering::Relaxed)),
            taught: self.taught.load(Ordering::Relaxed),
            queue_dropped: self.dropped.load(Ordering::Relaxed),
            moved: index.moves(),
            repointed: index.repoints(),
            looked: self.looked.load(Ordering::Relaxed),
            look_passes: self.look_passes.load(Ordering::Relaxed),
            look_rate: f64::from_bits(self.look_rate.load(Ordering::Relaxed)).round() as u64,
        }
    }
}

/// The list that names `domain` (a blocklist, or the operator's records marking it
/// disposable), if one does.
fn listed_source(table: &DomainTable, domain: &str) -> Option<String> {
    let name = DomainName::parse(domain).ok()?;
    let found = table.lookup(&name);
    match found.rule {
        TableRule::Blocklist { .. } => Some(
            table
                .provenance(&name, &found.rule)
                .and_then(|p| p.source)
                .unwrap_or("blocklist")
                .to_owned(),
        ),
        TableRule::Record(r) if r.reason == Reason::Disposable => Some("records".to_owned()),
        _ => None,
    }
}

impl Neighbourhood {
    /// Loads a snapshot or state file at start; a missing one is nothing, a bad one is logged
    /// and ignored (it never stops the start).
    /// A snapshot (`global`) is the lists' own: every listed domain in it is taught by the
    /// lists, whoever made the file.
    pub fn load(&self, path: &std::path::Path, what: &str, global: bool) {
        match store::read(path) {
            Ok(Some((mut learned, bad))) => {
                if global {
                    for l in &mut learned {
                        l.global = true;
                    }
                }
                let n = self.teach_all(learned, true);
                log::info!(
                    "MX neighbourhood: {n} domains loaded from the {what} {}{}",
                    path.display(),
                    if bad > 0 {
                        format!(" ({bad} unreadable lines skipped)")
                    } else {
                        String::new()
                    }
                );
            }
            Ok(None) => {}
            Err(e) => log::warn!("MX neighbourhood: {what} ignored: {e}"),
        }
        // What was loaded is already on disk.
        self.dirty.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drg_domain::scores::Scores;
    use drg_domain::{table::ListKind, TableBuilder};

    fn neighbourhood(max_entries: usize, listed: &[&str]) -> Neighbourhood {
        let mut b = TableBuilder::new();
        for name in listed {
            b.add(&DomainName::parse(name).unwrap(), ListKind::Disposable);
        }
        let table = Arc::new(ArcSwap::from_pointee(b.build(Scores::default())));
        let config = NeighbourhoodConfig {
            max_entries,
            ..NeighbourhoodConfig::default()
        };
        Neighbourhood::new(&config, table, false)
    }

    fn learned(domain: &str, key: &str) -> Learned {
        Learned::new(domain, vec![key.into()], today(), Teach::default())
    }

    #[test]
    fn the_service_evicts_and_saves_from_the_mirror_what_the_index_holds() {
        let listed: Vec<String> = (0..10).map(|i| format!("l{i}.com")).collect();
        let names: Vec<&str> = listed.iter().map(String::as_str).collect();
        let nb = neighbourhood(100, &names);
        let table = nb.table.load_full();
        for d in &listed {
            nb.teach(&table, &learned(d, "host:mx.throw.io"));
        }
        for i in 0..95 {
            nb.teach(
                &table,
                &learned(&format!("lone{i}.com"), &format!("host:h{i}.io")),
            );
        }
        // Over the bound, but short of a tenth over: left to the service.
        assert_eq!(nb.stats().domains, 105);
        nb.evict();
        assert_eq!(nb.stats().domains, 90);
        assert!(
            listed.iter().all(|d| nb.read().knows(d)),
            "listed ones teach: kept"
        );
        // The state file is what the index holds, listed first, without a pass under its lock.
        let saved = nb.changed().unwrap();
        assert_eq!(saved, nb.read().learned());
        assert_eq!(saved[0].domain.as_ref(), "l0.com");
        assert!(nb.changed().is_none(), "nothing changed since");
        // Ageing works from the mirror too.
        let mut old = learned("old.com", "host:h0.io");
        old.seen = today() - nb.config.max_age_days - 1;
        nb.teach(&table, &old);
        nb.expire();
        assert!(!nb.read().knows("old.com"));
        assert_eq!(nb.changed().unwrap(), nb.read().learned());
    }
}
