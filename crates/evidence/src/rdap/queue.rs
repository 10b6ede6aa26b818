//! The fetch queue: names waiting for an RDAP fetch, served project by project in turn and
//! paced per server. Pure: time is passed in.
//!
//! Fairness: each project has its own line, at most `per_project` names long, and the next
//! fetch goes to the next project in the rotation, so a project with 1,000 new names waits
//! behind itself, never in front of another; a name another project already queued moves to
//! the asking project's line, so nobody can plant names to delay someone else's. Pacing: a
//! server has at most one fetch in flight, is asked for names no answer waits for at most once
//! per `interval`, for names an answer waits for at most once per `waited_interval` (shorter:
//! an established company's first answer waits on it), and not at all while it backs off (a
//! 429's `Retry-After`, timeouts); a name whose server is not ready is passed over for one that
//! is, so a slow or backing-off registry holds one worker at most.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

/// One name to fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// The registrable domain.
    pub name: Box<str>,
    /// Its TLD (the bootstrap's key).
    pub tld: Box<str>,
    /// The base URL asked.
    pub server: Box<str>,
    pub project: Box<str>,
    /// Times a server asked to be asked again later (429, 503) for this name.
    pub attempts: u32,
    /// A lookup's answer waits for it (a verdict that its age could outweigh): fetched before
    /// the names of its project's line only the next lookups will read.
    pub waited: bool,
}

/// What became of an offered name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    Queued,
    /// Already waiting (now on the asking project's line when it had room) or being fetched.
    Already,
    /// The queue is full.
    Full,
    /// The project has its share of the queue waiting.
    ProjectFull,
}

/// What the next fetch is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    Fetch(Job),
    /// Nothing can be fetched before this instant.
    WaitUntil(Instant),
    Empty,
}

#[derive(Debug, Default, Clone, Copy)]
struct Pace {
    /// The last fetch began at this instant.
    asked_at: Option<Instant>,
    /// The last fetch of a name no answer waited for began at this instant: those keep their
    /// own pace, whatever answers wait for.
    asked_unwaited_at: Option<Instant>,
    /// Not asked before this instant (a back-off).
    held_until: Option<Instant>,
    /// Failures in a row (timeouts, errors): the back-off doubles with each.
    failures: u32,
    /// A fetch to the server is running.
    in_flight: bool,
    /// The server's last fetch ended in a failure that did not back off (a refusing status,
    /// an answer that is not RDAP): it is not known to answer.
    failed_last: bool,
}

impl Pace {
    /// From when the server may be asked for a name an answer waits for (`waited`) or not.
    fn ready_at(&self, waited: bool, pacing: Pacing) -> Option<Instant> {
        let after = |at: Option<Instant>, gap: Duration| at.map(|a| a + gap);
        let unwaited = (!waited)
            .then(|| after(self.asked_unwaited_at, pacing.interval))
            .flatten();
        [
            after(self.asked_at, pacing.waited_interval),
            unwaited,
            self.held_until,
        ]
        .into_iter()
        .flatten()
        .max()
    }
}

/// How often one server is asked: for names no answer waits for, and for those one does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    pub interval: Duration,
    pub waited_interval: Duration,
}

impl Pacing {
    /// Every name at one pace.
    pub fn every(interval: Duration) -> Self {
        Pacing {
            interval,
            waited_interval: interval,
        }
    }
}

/// Names of a project's line looked at for one whose server is ready (the default share of a
/// project is 64: all of a default line).
const SCAN: usize = 64;

/// The queue (see the module's documentation).
#[derive(Debug)]
pub struct Queue {
    lines: HashMap<Box<str>, VecDeque<Job>>,
    /// Projects with names waiting, in turn.
    rotation: VecDeque<Box<str>>,
    /// Names waiting or being fetched.
    busy: HashSet<Box<str>>,
    /// The project whose line holds each waiting name.
    waiting_in: HashMap<Box<str>, Box<str>>,
    waiting: usize,
    capacity: usize,
    per_project: usize,
    pacing: Pacing,
    servers: HashMap<Box<str>, Pace>,
}

impl Queue {
    pub fn new(capacity: usize, per_project: usize, pacing: Pacing) -> Self {
        Queue {
            lines: HashMap::new(),
            rotation: VecDeque::new(),
            busy: HashSet::new(),
            waiting_in: HashMap::new(),
            waiting: 0,
            capacity: capacity.max(1),
            per_project: per_project.max(1),
            pacing,
            servers: HashMap::new(),
        }
    }

    /// Names waiting (not those being fetched).
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Whether `name` is waiting or being fetched.
    pub fn is_busy(&self, name: &str) -> bool {
        self.busy.contains(name)
    }

    /// Queues `job` unless its name is busy or a bound is reached. A name waiting on another
    /// project's line moves to this project's (when it has room); a name an answer now waits
    /// for moves to the front of its line.
    pub fn offer(&mut self, job: Job) -> Offer {
        if self.busy.contains(&job.name) {
            let Some(other) = self.waiting_in.get(&job.name).cloned() else {
                // Being fetched.
                return Offer::Already;
            };
            let moves = other != job.project && self.line_len(&job.project) < self.per_project;
            let line = if moves { &job.project } else { &other };
            // Already waited for, it keeps its place.
            let waited = job.waited && !self.is_waited(&other, &job.name);
            if moves || waited {
                if let Some(taken) = self.take_waiting(&other, &job.name) {
                    self.push(Job {
                        project: line.clone(),
                        waited: taken.waited || waited,
                        ..taken
                    });
                }
            }
            return Offer::Already;
        }
        let full = self.waiting >= self.capacity;
        if full || self.line_len(&job.project) >= self.per_project {
            // A name an answer waits for takes the place of its own project's last name no
            // answer waits for (asked again at its next lookup); never another project's.
            if !(job.waited && self.let_go_unwaited(&job.project)) {
                return if full {
                    Offer::Full
                } else {
                    Offer::ProjectFull
                };
            }
        }
        self.busy.insert(job.name.clone());
        self.push(job);
        Offer::Queued
    }

    /// Lets the last name of `project`'s line no answer waits for go; false when there is none.
    fn let_go_unwaited(&mut self, project: &str) -> bool {
        let Some(line) = self.lines.get(project) else {
            return false;
        };
        let Some(i) = line.iter().rposition(|j| !j.waited) else {
            return false;
        };
        let name = line[i].name.clone();
        let gone = self.take_waiting(project, &name).is_some();
        self.busy.remove(&name);
        gone
    }

    fn is_waited(&self, project: &str, name: &str) -> bool {
        self.lines
            .get(project)
            .and_then(|line| line.iter().find(|j| &*j.name == name))
            .is_some_and(|j| j.waited)
    }

    fn line_len(&self, project: &str) -> usize {
        self.lines.get(project).map_or(0, VecDeque::len)
    }

    /// `job` at the end of its project's line; one an answer waits for, at its front: the
    /// newest first. An answer waits `neighbourhood_budget_ms` at most, so under a burst the
    /// registry's pace cannot keep up with, the names at the back of a first-come line belong
    /// to answers that have already left (`safe`, the age pending) while every new one waits
    /// behind them and misses too: measured, 100 new throwaways of one TLD asked at once had
    /// 3-8% of their first answers decided, 100% ten seconds on. Newest first, the names of
    /// answers still waiting go first; the others are fetched after them, for the next lookups.
    fn push(&mut self, job: Job) {
        let line = self.lines.entry(job.project.clone()).or_default();
        if line.is_empty() {
            self.rotation.push_back(job.project.clone());
        }
        self.waiting_in
            .insert(job.name.clone(), job.project.clone());
        if job.waited {
            line.push_front(job);
        } else {
            line.push_back(job);
        }
        self.waiting += 1;
    }

    /// Takes `name` out of `project`'s line (still busy).
    fn take_waiting(&mut self, project: &str, name: &str) -> Option<Job> {
        let line = self.lines.get_mut(project)?;
        let i = line.iter().position(|j| &*j.name == name)?;
        let job = line.remove(i)?;
        if line.is_empty() {
            self.lines.remove(project);
            self.rotation.retain(|p| &**p != project);
        }
        self.waiting_in.remove(name);
        self.waiting -= 1;
        Some(job)
    }

    /// The next name to fetch at `now` (its server's turn taken), or when to look again: the
    /// first name whose server is ready from the first project in turn that has one (which
    /// then goes to the end of the rotation). Names an answer waits for lead their project's
    /// line (the newest first), and only their project's: no project's names go before another's turn.
    pub fn next(&mut self, now: Instant) -> Next {
        let mut soonest: Option<Instant> = None;
        let (servers, pacing) = (&self.servers, self.pacing);
        let mut ready = |job: &Job| {
            let Some(pace) = servers.get(&job.server) else {
                return true;
            };
            // A fetch in flight wakes the workers when it ends.
            if pace.in_flight {
                return false;
            }
            match pace.ready_at(job.waited, pacing) {
                Some(at) if at > now => {
                    // A pace, at its time.
                    soonest = Some(soonest.map_or(at, |s| s.min(at)));
                    false
                }
                _ => true,
            }
        };
        let found = self
            .rotation
            .iter()
            .enumerate()
            .find_map(|(turn, project)| {
                let line = self
                    .lines
                    .get(project)
                    .expect("a project in turn has a line");
                line.iter()
                    .take(SCAN)
                    .position(&mut ready)
                    .map(|i| (turn, i))
            });
        let Some((turn, i)) = found else {
            return match soonest {
                Some(at) => Next::WaitUntil(at),
                None if self.waiting == 0 => Next::Empty,
                // Names whose servers are busy, or beyond the scan: look again after an
                // interval (a fetch ending wakes the workers sooner).
                None => Next::WaitUntil(now + self.pacing.interval.max(Duration::from_millis(100))),
            };
        };
        let project = self
            .rotation
            .remove(turn)
            .expect("the turn is in the rotation");
        let line = self
            .lines
            .get_mut(&project)
            .expect("a project in turn has a line");
        let job = line.remove(i).expect("the position is in the line");
        self.waiting -= 1;
        self.waiting_in.remove(&job.name);
        if line.is_empty() {
            self.lines.remove(&project);
        } else {
            self.rotation.push_back(project);
        }
        let pace = self.servers.entry(job.server.clone()).or_default();
        pace.asked_at = Some(now);
        if !job.waited {
            pace.asked_unwaited_at = Some(now);
        }
        pace.in_flight = true;
        Next::Fetch(job)
    }

    /// A fetch of `job` ended (answered, or given up): its name may be offered again.
    pub fn done(&mut self, job: &Job, answered: bool) {
        self.busy.remove(&job.name);
        if let Some(p) = self.servers.get_mut(&job.server) {
            p.in_flight = false;
            if answered {
                p.failures = 0;
            }
            p.failed_last = !answered;
        }
    }

    /// Whether `server`'s last fetch failed (timed out, broke, refused, backed off): a
    /// registry known to fail, whose answer is not waited for. A server never asked is not.
    pub fn failing(&self, server: &str) -> bool {
        self.servers
            .get(server)
            .is_some_and(|p| p.failures > 0 || p.failed_last)
    }

    /// `job`'s server asked to slow down (429, 503) or failed: it is not asked before `now`
    /// plus `retry_after` (when it said one) or a back-off doubling with its failures in a
    /// row, from one second, at most `max`. A job given back goes to the end of its project's
    /// line when the line and the queue have room; else its name is let go. Returns the wait and
    /// whether the job was kept.
    pub fn back_off(
        &mut self,
        job: Job,
        now: Instant,
        retry_after: Option<Duration>,
        max: Duration,
        give_back: bool,
    ) -> (Duration, bool) {
        let pace = self.servers.entry(job.server.clone()).or_default();
        pace.in_flight = false;
        pace.failures = pace.failures.saturating_add(1);
        let doubling = Duration::from_secs(1u64 << (pace.failures - 1).min(20));
        let wait = retry_after
            .unwrap_or(doubling)
            .max(self.pacing.interval)
            .min(max);
        pace.held_until = Some(pace.held_until.map_or(now + wait, |at| at.max(now + wait)));
        let keep = give_back
            && self.line_len(&job.project) < self.per_project
            && self.waiting < self.capacity;
        if keep {
            self.push(job);
        } else {
            self.busy.remove(&job.name);
        }
        (wait, keep)
    }

    /// Servers backing off at `now`.
    pub fn backing_off(&self, now: Instant) -> usize {
        self.servers
            .values()
            .filter(|p| p.failures > 0 && p.held_until.is_some_and(|at| at > now))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, project: &str, server: &str) -> Job {
        Job {
            name: name.into(),
            tld: Box::<str>::from("com"),
            server: server.into(),
            project: project.into(),
            attempts: 0,
            waited: false,
        }
    }

    fn fetch(q: &mut Queue, now: Instant) -> Option<Job> {
        match q.next(now) {
            Next::Fetch(j) => Some(j),
            _ => None,
        }
    }

    #[test]
    fn a_server_is_failing_from_a_failed_fetch_until_one_is_answered() {
        let now = Instant::now();
        let mut q = Queue::new(10, 10, Pacing::every(Duration::ZERO));
        assert!(!q.failing("s"), "never asked");
        q.offer(job("a.com", "p", "s"));
        let a = fetch(&mut q, now).unwrap();
        assert!(!q.failing("s"), "in flight");
        q.done(&a, false);
        assert!(q.failing("s"), "refused");
        q.offer(job("b.com", "p", "s"));
        let b = fetch(&mut q, now).unwrap();
        q.done(&b, true);
        assert!(!q.failing("s"), "answered");
        q.offer(job("c.com", "p", "s"));
        let c = fetch(&mut q, now).unwrap();
        q.back_off(c, now, None, Duration::from_secs(60), false);
        assert!(q.failing("s"), "timed out, backing off");
        assert!(!q.failing("other"));
    }

    #[test]
    fn projects_are_served_in_turn_and_one_cannot_take_the_queue() {
        let mut q = Queue::new(100, 3, Pacing::every(Duration::ZERO));
        for i in 0..10 {
            let offer = q.offer(job(&format!("a{i}.com"), "flood", "s"));
            assert_eq!(
                offer,
                if i < 3 {
                    Offer::Queued
                } else {
                    Offer::ProjectFull
                }
            );
        }
        assert_eq!(q.offer(job("b.com", "quiet", "s")), Offer::Queued);
        // Asked by another project too: it moves to that project's line.
        assert_eq!(q.offer(job("b.com", "other", "s")), Offer::Already);
        let now = Instant::now();
        let order: Vec<_> = std::iter::from_fn(|| {
            let j = fetch(&mut q, now)?;
            q.done(&j, true);
            Some((j.name, j.project))
        })
        .collect();
        assert_eq!(order[0].0, Box::<str>::from("a0.com"));
        assert_eq!(
            order[1],
            (Box::<str>::from("b.com"), Box::<str>::from("other"))
        );
        assert_eq!(order.len(), 4);
        assert_eq!(q.next(now), Next::Empty);
        assert_eq!(q.waiting(), 0);
    }

    #[test]
    fn a_name_an_answer_waits_for_leads_its_projects_line_and_no_other() {
        let now = Instant::now();
        let mut q = Queue::new(100, 100, Pacing::every(Duration::ZERO));
        let waited = |name: &str, project: &str| Job {
            waited: true,
            ..job(name, project, "s")
        };
        for i in 0..3 {
            q.offer(job(&format!("bg{i}.com"), "p", "s"));
        }
        q.offer(job("other.com", "o", "s"));
        q.offer(waited("w0.com", "p"));
        // Queued for the next lookups first, then waited for: it moves up.
        q.offer(job("late.com", "p", "s"));
        assert_eq!(q.offer(waited("late.com", "p")), Offer::Already);
        // Asked again while it waits: it keeps its place.
        assert_eq!(q.offer(waited("w0.com", "p")), Offer::Already);
        let mut order = Vec::new();
        while let Some(j) = fetch(&mut q, now) {
            order.push(j.name.to_string());
            q.done(&j, true);
        }
        // `p`'s waited-for names first in its turns, the newest first; `o` keeps its turn
        // between them.
        assert_eq!(
            order,
            [
                "late.com",
                "other.com",
                "w0.com",
                "bg0.com",
                "bg1.com",
                "bg2.com"
            ]
        );
    }

    #[test]
    fn a_name_an_answer_waits_for_takes_the_place_of_its_own_projects_other_names() {
        let mut q = Queue::new(4, 2, Pacing::every(Duration::ZERO));
        let waited = |name: &str, project: &str| Job {
            waited: true,
            ..job(name, project, "s")
        };
        q.offer(job("a.com", "p", "s"));
        q.offer(job("b.com", "p", "s"));
        assert_eq!(q.offer(job("c.com", "p", "s")), Offer::ProjectFull);
        assert_eq!(q.offer(waited("w.com", "p")), Offer::Queued);
        assert!(
            !q.is_busy("b.com"),
            "let go, asked again at its next lookup"
        );
        assert_eq!(q.offer(waited("v.com", "p")), Offer::Queued);
        // Nothing of its own left to let go.
        assert_eq!(q.offer(waited("x.com", "p")), Offer::ProjectFull);
        // The queue full: another project's names are never let go for it.
        q.offer(job("o1.com", "o", "s"));
        q.offer(job("o2.com", "o", "s"));
        assert_eq!(q.offer(waited("y.com", "z")), Offer::Full);
        assert_eq!(q.waiting(), 4);
        assert!(q.is_busy("o1.com") && q.is_busy("o2.com"));
    }

    #[test]
    fn names_an_answer_waits_for_keep_their_own_pace_beside_the_others() {
        let second = Duration::from_secs(1);
        let fifth = Duration::from_millis(200);
        let pacing = Pacing {
            interval: second,
            waited_interval: fifth,
        };
        let mut q = Queue::new(100, 100, pacing);
        let waited = |name: &str| Job {
            waited: true,
            ..job(name, "p", "s")
        };
        for i in 0..3 {
            q.offer(waited(&format!("w{i}.com")));
        }
        q.offer(job("bg.com", "p", "s"));
        let t = Instant::now();
        let next = |q: &mut Queue, at: Instant| {
            let j = fetch(q, at)?;
            q.done(&j, true);
            Some(j.name.to_string())
        };
        // The newest first: its answer is the likeliest to be waiting still.
        assert_eq!(next(&mut q, t).as_deref(), Some("w2.com"));
        // A fifth of a second between waited-for names, whatever the second says.
        assert_eq!(next(&mut q, t + fifth / 2), None);
        assert_eq!(next(&mut q, t + fifth).as_deref(), Some("w1.com"));
        assert_eq!(next(&mut q, t + fifth * 2).as_deref(), Some("w0.com"));
        // The others keep one a second, and waited-for names do not spend it.
        assert_eq!(next(&mut q, t + fifth * 3).as_deref(), Some("bg.com"));
        q.offer(job("bg2.com", "p", "s"));
        assert_eq!(next(&mut q, t + fifth * 4), None);
        assert_eq!(
            next(&mut q, t + fifth * 3 + second).as_deref(),
            Some("bg2.com")
        );
    }

    #[test]
    fn a_server_is_paced_and_a_busy_one_is_passed_over() {
        let interval = Duration::from_millis(100);
        let mut q = Queue::new(100, 100, Pacing::every(interval));
        q.offer(job("a.com", "p", "slow"));
        q.offer(job("b.com", "p", "slow"));
        q.offer(job("c.net", "p", "other"));
        let now = Instant::now();
        assert_eq!(fetch(&mut q, now).unwrap().name, Box::<str>::from("a.com"));
        // `slow` was just asked: `c.net` on another server goes first.
        assert_eq!(fetch(&mut q, now).unwrap().name, Box::<str>::from("c.net"));
        // `slow` has a fetch in flight: not asked again before it ends, even past its interval.
        assert!(fetch(&mut q, now + interval).is_none());
        q.done(&job("a.com", "p", "slow"), true);
        assert!(
            fetch(&mut q, now).is_none(),
            "paced: one interval from the last fetch"
        );
        assert_eq!(
            fetch(&mut q, now + interval).unwrap().name,
            Box::<str>::from("b.com")
        );
    }

    #[test]
    fn retry_after_is_honoured_and_failures_double_the_wait() {
        let mut q = Queue::new(100, 100, Pacing::every(Duration::from_millis(10)));
        let max = Duration::from_secs(600);
        q.offer(job("a.com", "p", "s"));
        let now = Instant::now();
        let a = fetch(&mut q, now).unwrap();
        let (wait, kept) = q.back_off(a, now, Some(Duration::from_secs(30)), max, true);
        assert!(kept);
        assert_eq!(wait, Duration::from_secs(30));
        assert_eq!(q.backing_off(now), 1);
        assert_eq!(q.next(now), Next::WaitUntil(now + wait));
        let a = fetch(&mut q, now + wait).unwrap();
        assert_eq!(
            q.back_off(a.clone(), now, None, max, false),
            (Duration::from_secs(2), false)
        );
        // Given up: the name may be offered again; an answer clears the failures.
        assert_eq!(q.offer(a.clone()), Offer::Queued);
        let later = now + Duration::from_secs(60);
        let a = fetch(&mut q, later).unwrap();
        q.done(&a, true);
        assert_eq!(
            q.back_off(a, later, None, max, false),
            (Duration::from_secs(1), false)
        );
    }

    impl Queue {
        /// The bookkeeping agrees with the lines.
        fn check(&self) {
            let queued: usize = self.lines.values().map(VecDeque::len).sum();
            assert_eq!(queued, self.waiting);
            assert_eq!(self.waiting_in.len(), self.waiting);
            for (project, line) in &self.lines {
                assert!(!line.is_empty());
                assert_eq!(self.rotation.iter().filter(|p| *p == project).count(), 1);
                for job in line {
                    assert!(self.busy.contains(&job.name));
                    assert_eq!(self.waiting_in.get(&job.name), Some(&job.project));
                }
            }
            assert_eq!(self.rotation.len(), self.lines.len());
            assert!(self.lines.values().all(|l| l.len() <= self.per_project));
        }
    }

    proptest::proptest! {
        #[test]
        fn any_sequence_keeps_the_books_and_loses_no_name(
            ops in proptest::collection::vec((0u8..4, 0u8..12, 0u8..3, 0u8..3), 1..200)
        ) {
            let mut q = Queue::new(8, 3, Pacing::every(Duration::from_millis(5)));
            let mut now = Instant::now();
            let mut running: Vec<Job> = Vec::new();
            for (op, name, project, server) in ops {
                match op {
                    0 | 1 => {
                        let j = job(&format!("n{name}.com"), &format!("p{project}"), &format!("s{server}"));
                        q.offer(j);
                    }
                    2 => {
                        if let Next::Fetch(j) = q.next(now) {
                            proptest::prop_assert!(!running.iter().any(|r| r.server == j.server));
                            running.push(j);
                        }
                    }
                    _ => {
                        if !running.is_empty() {
                            let j = running.remove(usize::from(name) % running.len());
                            match project {
                                0 => q.done(&j, true),
                                1 => { q.back_off(j, now, None, Duration::from_secs(1), true); }
                                _ => { q.back_off(j, now, Some(Duration::ZERO), Duration::from_secs(1), false); }
                            }
                        }
                    }
                }
                now += Duration::from_millis(3);
                q.check();
                // A busy name is waiting or running: none is lost.
                for name in &q.busy {
                    proptest::prop_assert!(q.waiting_in.contains_key(name) || running.iter().any(|r| &r.name == name));
                }
            }
        }
    }
}
