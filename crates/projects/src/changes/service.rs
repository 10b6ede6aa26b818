//! The verdict-change service, one background loop: takes in the watched lookups the call
//! writer passed on, judges the watched domains again (a pass after every table reload and
//! every `pass_interval`, at most `reclassify_per_second`), records each change once, and
//! starts each project's delivery (one message per project and `send_interval`, under its
//! lease), which runs as a task of its own (`delivery.rs`): the loop never waits on a receiver.
//! A project's own override set or removed (on any gateway) is judged at the next tick for the
//! watched names it covers, and that project's delivery starts at once: its own change moves
//! its verdicts within a second, not at the next pass.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use drg_base::service::{Service, Shutdown};

use super::delivery::{Courier, Deliveries};
use super::judge::{Basis, Judge};
use super::store::{ChangeStore, Proposed, Recorded};
use super::{ChangesConfig, Counters, Seen, Told, Watch, CHANNEL};
use drg_access::keys::KeyStore;
use drg_domain::overrides::OverrideSet;
use drg_domain::table::DomainTable;
use drg_webhook::Subscribers;

/// How often the loop looks at its work.
const TICK: Duration = Duration::from_millis(100);
/// Evidence-based changes waiting to prove stable, at most (beyond, new ones wait for a pass
/// with room).
const MAX_CANDIDATES: usize = 100_000;
/// How often watched domains past their days and old changes are forgotten.
const SWEEP_EVERY: Duration = Duration::from_secs(3_600);
/// At shutdown, deliveries posting get this long to finish and record their sent marks.
const DRAIN: Duration = Duration::from_secs(2);

/// The service (a Pingora background service).
pub struct ChangesService {
    config: ChangesConfig,
    store: Arc<dyn ChangeStore>,
    judge: Judge,
    keys: Arc<ArcSwap<KeyStore>>,
    rx: Mutex<Option<tokio::sync::mpsc::Receiver<Vec<Seen>>>>,
    counters: Arc<Counters>,
    /// What the deliveries need (`None`: no webhook), handed to them at the start.
    courier: Mutex<Option<Courier>>,
}

/// Builds the call writer's side and the service; `webhooks`: the engine and who receives a
/// project's changes (`None`: nobody is told, the changes are read through `/v1/changes`).
pub fn build(
    config: &ChangesConfig,
    store: Arc<dyn ChangeStore>,
    judge: Judge,
    keys: Arc<ArcSwap<KeyStore>>,
    webhooks: Option<(drg_webhook::Sender, Arc<dyn Subscribers>)>,
    counters: Arc<Counters>,
) -> Result<(Watch, ChangesService), String> {
    let holder = format!(
        "{:016x}{:016x}",
        getrandom::u64().unwrap_or_default(),
        getrandom::u64().unwrap_or_default()
    );
    let courier = webhooks.map(|(sender, subscribers)| Courier {
        store: store.clone(),
        sender,
        subscribers,
        counters: counters.clone(),
        holder,
        send_interval: config.send_interval,
        max_per_message: config.max_per_message,
        quiet: i64::from(config.quiet_hours) * 3_600,
    });
    let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL);
    let watch = Watch {
        tx,
        counters: counters.clone(),
    };
    let service = ChangesService {
        config: config.clone(),
        store,
        judge,
        keys,
        rx: Mutex::new(Some(rx)),
        counters,
        courier: Mutex::new(courier),
    };
    Ok((watch, service))
}

/// A pass over every project's watched domains.
struct Pass {
    projects: Vec<String>,
    at: usize,
    cursor: String,
    /// The table this pass judges with, and the one the last finished pass judged with (what
    /// tells a delisting, `judge.rs`).
    table: Arc<DomainTable>,
    before: Option<Arc<DomainTable>>,
}

/// The loop's state.
#[derive(Default)]
struct Loop {
    pass: Option<Pass>,
    /// A reload came during a pass: another pass follows it.
    again: bool,
    generation: Option<u64>,
    /// The table the last finished pass judged with.
    judged: Option<Arc<DomainTable>>,
    last_pass: Option<Instant>,
    /// (project, domain) -> the evidence-based verdict found, and since when.
    candidates: HashMap<(String, String), (Told, Instant)>,
    /// Each project's delivery (`None`: no webhook).
    deliveries: Option<Deliveries>,
    last_send: Option<Instant>,
    last_sweep: Option<Instant>,
    /// The last store failure logged at WARN (a store that is down is logged every
    /// `WARN_EVERY`, counted every time).
    last_warn: Option<Instant>,
    /// What the store was last given per (project, domain), and in which hour: a lookup that
    /// tells the store nothing new (the same verdict, the same hour) is not written again.
    written: HashMap<(Arc<str>, Box<str>), (Told, i64)>,
    /// The overrides the last tick saw (what a change of them is told against).
    overrides: Option<Arc<OverrideSet>>,
}

/// Entries of [`Loop::written`] at most; full, it starts over (a write more per name).
const MAX_WRITTEN: usize = 200_000;

/// A failing store is logged at WARN at most this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

impl Loop {
    /// Counts a store failure and logs it, at WARN at most every [`WARN_EVERY`].
    fn failed(&mut self, counters: &Counters, e: &dyn std::fmt::Display, what: &str) {
        Counters::add(&counters.store_errors, 1);
        if self.last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            self.last_warn = Some(Instant::now());
            log::warn!("verdict changes: {e} ({what})");
        } else {
            log::debug!("verdict changes: {e} ({what})");
        }
    }
}

impl ChangesService {
    async fn intake(&self, st: &mut Loop, rx: &mut tokio::sync::mpsc::Receiver<Vec<Seen>>) {
        // Most ticks bring nothing: no key map is made for them.
        let Ok(first) = rx.try_recv() else {
            return;
        };
        let keys = self.keys.load();
        let plans: HashMap<&str, &str> = keys.entries().map(|k| (&*k.project, &*k.plan)).collect();
        let mut batch = Vec::new();
        if st.written.len() > MAX_WRITTEN {
            st.written.clear();
        }
        for seen in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            for s in seen {
                let watched = plans
                    .get(&*s.project)
                    .is_some_and(|plan| self.config.watch_for(plan).is_some());
                let hour = s.at() / 3_600;
                let key = (s.project.clone(), s.domain.clone());
                if watched && st.written.insert(key, (s.told, hour)) != Some((s.told, hour)) {
                    batch.push(s);
                }
            }
        }
        if batch.is_empty() {
            return;
        }
        let n = batch.len() as u64;
        // Forgotten again if the write fails: the next lookup of each name writes it.
        let keys: Vec<(Arc<str>, Box<str>)> = batch
            .iter()
            .map(|s| (s.project.clone(), s.domain.clone()))
            .collect();
        match self
            .store
            .watch(batch, self.config.max_watched_per_project)
            .await
        {
            Ok(refused) => {
                Counters::add(&self.counters.watched, n - refused);
                Counters::add(&self.counters.not_watched_full, refused);
            }
            Err(e) => {
                for k in &keys {
                    st.written.remove(k);
                }
                st.failed(&self.counters, &e, &format!("{n} lookups not watched"));
            }
        }
    }

    /// Starts a pass when the table was reloaded or the interval is up.
    async fn maybe_start_pass(&self, st: &mut Loop) {
        let generation = self.judge.table.load().version().generation;
        let reloaded = st.generation.is_some_and(|g| g != generation);
        st.generation = Some(generation);
        if st.pass.is_some() {
            st.again |= reloaded;
            return;
        }
        let due = st
            .last_pass
            .is_none_or(|t| t.elapsed() >= self.config.pass_interval);
        if !(reloaded || st.again || due) {
            return;
        }
        match self.store.projects().await {
            Ok(projects) => {
                st.again = false;
                st.last_pass = Some(Instant::now());
                st.pass = Some(Pass {
                    projects,
                    at: 0,
                    cursor: String::new(),
                    table: self.judge.table.load_full(),
                    before: st.judged.clone(),
                });
            }
            Err(e) => {
                // Tried again in a few seconds, not at every tick.
                let retry = self
                    .config
                    .pass_interval
                    .saturating_sub(Duration::from_secs(5));
                st.last_pass = Instant::now().checked_sub(retry);
                st.failed(&self.counters, &e, "pass put off");
            }
        }
    }

    /// Judges up to one tick's share of watched domains.
    async fn step_pass(&self, st: &mut Loop) {
        let per_tick = (u64::from(self.config.reclassify_per_second) * TICK.as_millis() as u64
            / 1_000)
            .max(1) as usize;
        let mut left = per_tick;
        while left > 0 {
            let Some(pass) = st.pass.as_mut() else { return };
            let Some(project) = pass.projects.get(pass.at).cloned() else {
                st.judged = st.pass.take().map(|p| p.table);
                Counters::add(&self.counters.passes, 1);
                return;
            };
            let (page, next) = match self.store.scan(&project, &pass.cursor, left).await {
                Ok(p) => p,
                Err(e) => {
                    st.failed(&self.counters, &e, "pass stopped; the next one starts over");
                    st.pass = None;
                    return;
                }
            };
            left = left.saturating_sub(page.len().max(1));
            match next {
                Some(c) => pass.cursor = c,
                None => {
                    pass.at += 1;
                    pass.cursor.clear();
                }
            }
            let before = pass.before.clone();
            for (domain, told) in page {
                self.judge_one(st, &project, domain, told, (before.as_deref(), false))
                    .await;
            }
        }
    }

    /// Judges `domain` again for `project`; whether a change was recorded. `at_once`: the
    /// project's own override moved it, so an evidence-based verdict is not held back to prove
    /// stable (the evidence did not change; the project's word did).
    async fn judge_one(
        &self,
        st: &mut Loop,
        project: &str,
        domain: String,
        told: Told,
        (before, at_once): (Option<&DomainTable>, bool),
    ) -> bool {
        Counters::add(&self.counters.judged, 1);
        let Some(now) = self.judge.judge(&domain, project, before) else {
            return false;
        };
        let key = (project.to_owned(), domain);
        if !now.told.differs(told) {
            st.candidates.remove(&key);
            return false;
        }
        if now.basis == Basis::Evidence && !self.config.stable.is_zero() && !at_once {
            match st.candidates.get(&key) {
                Some((to, since)) if *to == now.told && since.elapsed() >= self.config.stable => {}
                Some((to, _)) if *to == now.told => return false,
                _ => {
                    if st.candidates.len() < MAX_CANDIDATES || st.candidates.contains_key(&key) {
                        st.candidates.insert(key, (now.told, Instant::now()));
                    }
                    return false;
                }
            }
        }
        st.candidates.remove(&key);
        let proposed = Proposed {
            domain: key.1,
            from: told,
            to: now.told,
            rule: now.rule.to_owned(),
            basis: now.basis.as_str(),
            at_ms: chrono::Utc::now().timestamp_millis(),
            dataset_version: now.dataset_version,
        };
        match self.store.record(project, &proposed).await {
            Ok(Recorded::New(_)) => {
                Counters::add(&self.counters.recorded, 1);
                true
            }
            Ok(Recorded::Stale) => false,
            Err(e) => {
                st.failed(
                    &self.counters,
                    &e,
                    "a change not recorded; the next pass finds it",
                );
                false
            }
        }
    }

    /// The overrides moved since the last tick (a project set or removed one, here or on
    /// another gateway): each project's watched names under a moved one are judged now, and
    /// the projects with a change recorded have their delivery started without waiting for
    /// the send interval (whichever gateway holds a project's lease sends it). A write costs
    /// its project's overrides (the others' maps are shared: [`OverrideSet::moved`]) and the
    /// watched names under what moved ([`ChangesService::rejudge_under`]).
    async fn overrides_moved(&self, st: &mut Loop) {
        let now = self.judge.overrides.load_full();
        let Some(before) = st.overrides.replace(now.clone()) else {
            return;
        };
        if Arc::ptr_eq(&before, &now) {
            return;
        }
        let mut by_project: HashMap<String, Vec<String>> = HashMap::new();
        for (project, name) in before.moved(&now) {
            by_project.entry(project).or_default().push(name);
        }
        let mut told = Vec::new();
        for (project, names) in by_project {
            if self.rejudge_under(st, &project, &names).await {
                told.push(project);
            }
        }
        if let (Some(d), false) = (st.deliveries.as_mut(), told.is_empty()) {
            d.start_now(told);
        }
    }

    /// Judges `project`'s watched names that `names` cover (each itself and its subdomains);
    /// whether a change was recorded. The store reads those names alone, by name and by a
    /// range of the reversed names ([`ChangeStore::watched_under`]), not the watch list.
    async fn rejudge_under(&self, st: &mut Loop, project: &str, names: &[String]) -> bool {
        let under = match self.store.watched_under(project, names).await {
            Ok(under) => under,
            Err(e) => {
                let what = "an override's change waits for the next pass";
                st.failed(&self.counters, &e, what);
                return false;
            }
        };
        let mut recorded = false;
        for (domain, told) in under {
            recorded |= self
                .judge_one(st, project, domain, told, (None, true))
                .await;
        }
        recorded
    }
}

impl ChangesService {
    /// Every `send_interval`: each project's delivery is started (one message if it has unsent
    /// changes, this gateway holds its lease and its backoff is over), unless one still runs.
    async fn send_due(&self, st: &mut Loop) {
        let Some(deliveries) = st.deliveries.as_mut() else {
            return;
        };
        let failed = deliveries.reap();
        let interval = deliveries.send_interval();
        for (project, e) in failed {
            st.failed(&self.counters, &e, &format!("sending project {project}'s"));
        }
        if st.last_send.is_some_and(|t| t.elapsed() < interval) {
            return;
        }
        st.last_send = Some(Instant::now());
        match self.store.projects().await {
            Ok(projects) => {
                if let Some(d) = st.deliveries.as_mut() {
                    d.start(projects);
                }
            }
            Err(e) => st.failed(&self.counters, &e, "sending put off"),
        }
    }

    async fn sweep(&self, st: &mut Loop) {
        if st.last_sweep.is_some_and(|t| t.elapsed() < SWEEP_EVERY) {
            return;
        }
        st.last_sweep = Some(Instant::now());
        let now = chrono::Utc::now().timestamp();
        let keys = self.keys.load();
        let mut cutoffs: Vec<(String, i64)> = Vec::new();
        for k in keys.entries() {
            let days = self.config.watch_for(&k.plan).unwrap_or_default();
            let cutoff = now - i64::try_from(days.as_secs()).unwrap_or(0);
            if !cutoffs.iter().any(|(p, _)| **p == *k.project) {
                cutoffs.push((k.project.to_string(), cutoff));
            }
        }
        let longest = self.config.watch_days.values().max().copied().unwrap_or(0);
        let other = now - i64::from(longest) * 86_400;
        let before = now - i64::from(self.config.keep_days) * 86_400;
        if let Err(e) = self.store.sweep(&cutoffs, other, before).await {
            st.failed(&self.counters, &e, "sweep");
        }
        st.candidates
            .retain(|_, (_, since)| since.elapsed() < Duration::from_secs(7 * 86_400));
    }
}

#[async_trait]
impl Service for ChangesService {
    async fn run(&self, mut shutdown: Shutdown) {
        let Some(mut rx) = self.rx.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        let courier = self
            .courier
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let mut st = Loop {
            deliveries: courier.map(Deliveries::new),
            ..Loop::default()
        };
        let mut ticks = drg_base::periodic::Ticks::new(TICK);
        while ticks.next(&mut shutdown).await.is_some() {
            self.intake(&mut st, &mut rx).await;
            self.overrides_moved(&mut st).await;
            self.maybe_start_pass(&mut st).await;
            self.step_pass(&mut st).await;
            self.send_due(&mut st).await;
            self.sweep(&mut st).await;
        }
        self.intake(&mut st, &mut rx).await;
        if let Some(mut deliveries) = st.deliveries.take() {
            for (project, e) in deliveries.finish(DRAIN).await {
                st.failed(&self.counters, &e, &format!("sending project {project}'s"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drg_domain::overrides::{Override, OverrideVerdict};
    use drg_domain::Reason;

    /// An override of project `a` judges again `a`'s watched names it covers, out of thousands,
    /// and none of project `b`'s (which watches the same name).
    #[tokio::test]
    async fn an_override_judges_the_names_it_covers_in_its_project_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.sqlite3");
        let store = Arc::new(super::super::embedded::EmbeddedChanges::new(path).unwrap());
        let safe = Told {
            reason: Reason::Safe,
            score: 10,
        };
        let seen = |project: &str, domain: &str| Seen {
            project: project.into(),
            domain: domain.into(),
            told: safe,
            at_ms: 1_000,
        };
        let mut all: Vec<Seen> = (0..3_000)
            .map(|i| seen("a", &format!("n{i}.example")))
            .collect();
        for d in ["shop.example", "mail.shop.example", "othershop.example"] {
            all.push(seen("a", d));
        }
        all.push(seen("b", "shop.example"));
        store.watch(all, 10_000).await.unwrap();
        let overrides = Arc::new(ArcSwap::from_pointee(OverrideSet::default()));
        let judge = Judge {
            overrides: overrides.clone(),
            accepted: Default::default(),
            table: Arc::new(ArcSwap::from_pointee(
                DomainTable::empty(Default::default()),
            )),
            mx: None,
            rdap: None,
        };
        let counters = Arc::new(Counters::unregistered());
        let config = ChangesConfig::default();
        let keys = Default::default();
        let (_watch, service) =
            build(&config, store.clone(), judge, keys, None, counters.clone()).unwrap();
        let mut st = Loop::default();
        service.overrides_moved(&mut st).await;
        let mut block = Override {
            project: "a".into(),
            domain: "shop.example".into(),
            verdict: OverrideVerdict::Block,
            note: String::new(),
            set_by: "k1".into(),
            set_at: 0,
            stamp: 1,
            removed: false,
        };
        overrides.store(Arc::new(overrides.load().next([block.clone()])));
        service.overrides_moved(&mut st).await;
        assert_eq!((counters.judged.get(), counters.recorded.get()), (2, 2));
        let mut told: Vec<String> = (store.list("a", 0, 0, 10).await.unwrap())
            .into_iter()
            .map(|c| c.domain)
            .collect();
        told.sort();
        assert_eq!(told, ["mail.shop.example", "shop.example"]);
        assert!(store.list("b", 0, 0, 10).await.unwrap().is_empty());
        // Nothing moved: nothing judged. Removed: the same two judged again.
        service.overrides_moved(&mut st).await;
        assert_eq!(counters.judged.get(), 2);
        (block.stamp, block.removed) = (2, true);
        overrides.store(Arc::new(overrides.load().next([block])));
        service.overrides_moved(&mut st).await;
        assert_eq!(counters.judged.get(), 4);
    }
}
