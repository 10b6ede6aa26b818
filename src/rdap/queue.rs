//! The fetch queue: names waiting for an RDAP fetch, served project by project in turn and
//! paced per server. Pure: time is passed in.
//!
//! Fairness: each project has its own line, at most `per_project` names long, and the next
//! fetch goes to the next project in the rotation, so a project with 1,000 new names waits
//! behind itself, never in front of another. Pacing: a server is asked at most once per
//! `interval`, and not at all while it backs off (a 429's `Retry-After`, timeouts); a name
//! whose server is not ready is passed over for one that is.

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
}

/// What became of an offered name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    Queued,
    /// Already waiting or being fetched.
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
    /// The server may be asked again from this instant.
    ready_at: Option<Instant>,
    /// Failures in a row (timeouts, errors): the back-off doubles with each.
    failures: u32,
}

/// Names a project may have passed over in one look for a ready server.
const SCAN: usize = 16;

/// The queue (see the module's documentation).
#[derive(Debug)]
pub struct Queue {
    lines: HashMap<Box<str>, VecDeque<Job>>,
    /// Projects with names waiting, in turn.
    rotation: VecDeque<Box<str>>,
    /// Names waiting or being fetched.
    busy: HashSet<Box<str>>,
    waiting: usize,
    capacity: usize,
    per_project: usize,
    interval: Duration,
    servers: HashMap<Box<str>, Pace>,
}

impl Queue {
    pub fn new(capacity: usize, per_project: usize, interval: Duration) -> Self {
        Queue {
            lines: HashMap::new(),
            rotation: VecDeque::new(),
            busy: HashSet::new(),
            waiting: 0,
            capacity: capacity.max(1),
            per_project: per_project.max(1),
            interval,
            servers: HashMap::new(),
        }
    }

    /// Names waiting (not those being fetched).
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Queues `job` unless its name is busy or a bound is reached.
    pub fn offer(&mut self, job: Job) -> Offer {
        if self.busy.contains(&job.name) {
            return Offer::Already;
        }
        if self.waiting >= self.capacity {
            return Offer::Full;
        }
        let line = self.lines.entry(job.project.clone()).or_default();
        if line.len() >= self.per_project {
            return Offer::ProjectFull;
        }
        if line.is_empty() {
            self.rotation.push_back(job.project.clone());
        }
        self.busy.insert(job.name.clone());
        line.push_back(job);
        self.waiting += 1;
        Offer::Queued
    }

    /// The next name to fetch at `now` (its server's turn taken), or when to look again.
    pub fn next(&mut self, now: Instant) -> Next {
        let mut soonest: Option<Instant> = None;
        for _ in 0..self.rotation.len() {
            let Some(project) = self.rotation.pop_front() else {
                break;
            };
            let line = self
                .lines
                .get_mut(&project)
                .expect("a project in turn has a line");
            let ready = line.iter().take(SCAN).position(|job| {
                let at = self.servers.get(&job.server).and_then(|p| p.ready_at);
                match at {
                    Some(at) if at > now => {
                        soonest = Some(soonest.map_or(at, |s| s.min(at)));
                        false
                    }
                    _ => true,
                }
            });
            let Some(i) = ready else {
                self.rotation.push_back(project);
                continue;
            };
            let job = line.remove(i).expect("the position is in the line");
            self.waiting -= 1;
            if line.is_empty() {
                self.lines.remove(&project);
            } else {
                self.rotation.push_back(project);
            }
            let pace = self.servers.entry(job.server.clone()).or_default();
            pace.ready_at = Some(now + self.interval);
            return Next::Fetch(job);
        }
        match soonest {
            Some(at) => Next::WaitUntil(at),
            None if self.waiting == 0 => Next::Empty,
            // Names whose servers were all beyond the scan: look again after one interval.
            None => Next::WaitUntil(now + self.interval),
        }
    }

    /// A fetch of `job` ended (answered, or given up): its name may be offered again.
    pub fn done(&mut self, job: &Job, answered: bool) {
        self.busy.remove(&job.name);
        if answered {
            if let Some(p) = self.servers.get_mut(&job.server) {
                p.failures = 0;
            }
        }
    }

    /// `job`'s server asked to slow down (429, 503) or failed: it is not asked before `now`
    /// plus `retry_after` (when it said one) or a back-off doubling with its failures in a
    /// row, from one second, at most `max`. Returns the wait. A job given back is queued at the
    /// head of its project's line.
    pub fn back_off(
        &mut self,
        job: Job,
        now: Instant,
        retry_after: Option<Duration>,
        max: Duration,
        give_back: bool,
    ) -> Duration {
        let pace = self.servers.entry(job.server.clone()).or_default();
        pace.failures = pace.failures.saturating_add(1);
        let doubling = Duration::from_secs(1u64 << (pace.failures - 1).min(20));
        let wait = retry_after.unwrap_or(doubling).max(self.interval).min(max);
        pace.ready_at = Some(pace.ready_at.map_or(now + wait, |at| at.max(now + wait)));
        if give_back {
            let line = self.lines.entry(job.project.clone()).or_default();
            if line.is_empty() {
                self.rotation.push_back(job.project.clone());
            }
            line.push_front(job);
            self.waiting += 1;
        } else {
            self.busy.remove(&job.name);
        }
        wait
    }

    /// Servers backing off at `now`.
    pub fn backing_off(&self, now: Instant) -> usize {
        self.servers
            .values()
            .filter(|p| p.failures > 0 && p.ready_at.is_some_and(|at| at > now))
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
        }
    }

    fn fetch(q: &mut Queue, now: Instant) -> Option<Job> {
        match q.next(now) {
            Next::Fetch(j) => Some(j),
            _ => None,
        }
    }

    #[test]
    fn projects_are_served_in_turn_and_one_cannot_take_the_queue() {
        let mut q = Queue::new(100, 3, Duration::ZERO);
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
        assert_eq!(q.offer(job("b.com", "other", "s")), Offer::Already);
        let now = Instant::now();
        let order: Vec<_> = std::iter::from_fn(|| fetch(&mut q, now))
            .map(|j| j.name)
            .collect();
        assert_eq!(
            order[..2],
            [Box::<str>::from("a0.com"), Box::<str>::from("b.com")]
        );
        assert_eq!(order.len(), 4);
        assert_eq!(q.next(now), Next::Empty);
    }

    #[test]
    fn a_server_is_paced_and_a_busy_one_is_passed_over() {
        let interval = Duration::from_millis(100);
        let mut q = Queue::new(100, 100, interval);
        q.offer(job("a.com", "p", "slow"));
        q.offer(job("b.com", "p", "slow"));
        q.offer(job("c.net", "p", "other"));
        let now = Instant::now();
        assert_eq!(fetch(&mut q, now).unwrap().name, Box::<str>::from("a.com"));
        // `slow` was just asked: `c.net` on another server goes first.
        assert_eq!(fetch(&mut q, now).unwrap().name, Box::<str>::from("c.net"));
        assert_eq!(q.next(now), Next::WaitUntil(now + interval));
        assert_eq!(
            fetch(&mut q, now + interval).unwrap().name,
            Box::<str>::from("b.com")
        );
    }

    #[test]
    fn retry_after_is_honoured_and_failures_double_the_wait() {
        let mut q = Queue::new(100, 100, Duration::from_millis(10));
        let max = Duration::from_secs(600);
        q.offer(job("a.com", "p", "s"));
        let now = Instant::now();
        let a = fetch(&mut q, now).unwrap();
        let wait = q.back_off(a, now, Some(Duration::from_secs(30)), max, true);
        assert_eq!(wait, Duration::from_secs(30));
        assert_eq!(q.backing_off(now), 1);
        assert_eq!(q.next(now), Next::WaitUntil(now + wait));
        let a = fetch(&mut q, now + wait).unwrap();
        assert_eq!(
            q.back_off(a.clone(), now, None, max, false),
            Duration::from_secs(2)
        );
        // Given up: the name may be offered again; an answer clears the failures.
        assert_eq!(q.offer(a.clone()), Offer::Queued);
        let later = now + Duration::from_secs(60);
        let a = fetch(&mut q, later).unwrap();
        q.done(&a, true);
        assert_eq!(
            q.back_off(a, later, None, max, false),
            Duration::from_secs(1)
        );
    }
}
