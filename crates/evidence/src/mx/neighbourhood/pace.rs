//! Pacing the background DNS work: a token bucket (the teacher's and the look's names a
//! second), and the look's rate adapted to what the resolver sustains.

use std::time::{Duration, Instant};

/// How long the teacher (and the look) waits at least once it is short of a token: the names it then lets
/// through start together, and their DNS answers, due at about the same time, share this
/// service's wakeups. One name every 1/rate s woke the thread ~8 times a name (the pace's timer,
/// then each stage's answer: 770 wakeups a second at 100 names a second), each wakeup taking
/// the workers' core from them for a context switch.
const GROUP: Duration = Duration::from_millis(100);

/// A token bucket: `rate` a second, `burst` at once; a rate of 0 never waits. Short of a token,
/// it waits for a [`GROUP`]'s worth, so the rate holds on average and the names come in groups.
pub(super) struct Pace {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Pace {
    pub(super) fn new(rate: u32, burst: usize) -> Self {
        let burst = burst.max(1) as f64;
        Pace {
            rate: f64::from(rate),
            burst,
            tokens: burst,
            at: Instant::now(),
        }
    }

    /// From now on, `rate` a second with a burst of one second's worth (the look's
    /// [`Adaptive`] rate).
    pub(super) fn set_rate(&mut self, rate: f64) {
        self.rate = rate;
        self.burst = rate.max(1.0);
        self.tokens = self.tokens.min(self.burst);
    }

    /// Takes one token: how long to wait for it first, if at all.
    pub(super) fn take(&mut self, now: Instant) -> Option<Duration> {
        if self.rate <= 0.0 {
            return None;
        }
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst) - 1.0;
        if self.tokens >= 0.0 {
            return None;
        }
        // In debt for this name: wait until the debt is paid and a group's other names are in
        // hand too (they then pass without a wait).
        let group = (self.rate * GROUP.as_secs_f64()).clamp(1.0, self.burst);
        Some(Duration::from_secs_f64(
            (group - 1.0 - self.tokens) / self.rate,
        ))
    }
}

/// How often the look's rate is weighed again.
const WINDOW: Duration = Duration::from_secs(1);
/// Names a window must have finished to be weighed (fewer say nothing of the resolver).
const MIN_SAMPLE: u32 = 5;
/// An answer this slow (the mean of a window's answered names) is slow whatever the best seen.
const SLOW: Duration = Duration::from_millis(500);
/// A window whose answered names took this many times the fastest window's mean is the
/// resolver slowing down under the look's load.
const SLOWER: u32 = 4;
/// Above this share of unanswered names (timeouts, SERVFAIL) the resolver is failing; at or
/// below the growth share the rate may grow (lapsed listed names' nameservers are often silent:
/// some unanswered names are the lists', not the resolver's).
const FAILING: f64 = 0.5;
const GROWS: f64 = 0.25;

/// The look's rate, weighed every [`WINDOW`] against what the resolver sustains (issue 94: a
/// fixed 20 names a second made the first pass over the shipped lists take seven minutes, and
/// until it reaches a name only the project that asked it learns from it). It starts at
/// `look.rate`, grows by half each window whose names were answered as fast as the resolver
/// answers unloaded and mostly answered, and halves on a window whose answers slowed (over
/// [`SLOWER`] times the fastest window's, or over [`SLOW`]) or mostly failed; never above
/// `look.max_rate`, nor below a quarter of `look.rate`. Multiplicative both ways: from 20 it
/// reaches a ceiling of 200 in six windows, and gives a struggling resolver half its load back
/// at once.
#[derive(Debug)]
pub(super) struct Adaptive {
    rate: f64,
    floor: f64,
    ceiling: f64,
    /// The fastest window's mean answer time so far: the resolver unloaded.
    best: Option<Duration>,
    answered: u32,
    unanswered: u32,
    took: Duration,
    since: Instant,
}

impl Adaptive {
    pub(super) fn new(start: u32, ceiling: u32, now: Instant) -> Self {
        let start = f64::from(start.max(1));
        Adaptive {
            rate: start,
            floor: (start / 4.0).max(1.0),
            ceiling: f64::from(ceiling).max(start),
            best: None,
            answered: 0,
            unanswered: 0,
            took: Duration::ZERO,
            since: now,
        }
    }

    /// Resumes at `rate` (the last pass's), within the bounds.
    pub(super) fn resume(mut self, rate: f64) -> Self {
        if rate > 0.0 {
            self.rate = rate.clamp(self.floor, self.ceiling);
        }
        self
    }

    /// Names started per second now.
    pub(super) fn rate(&self) -> f64 {
        self.rate
    }

    /// A name's look ended: how long it took, and whether DNS answered it.
    pub(super) fn done(&mut self, took: Duration, answered: bool) {
        if answered {
            self.answered += 1;
            self.took += took;
        } else {
            self.unanswered += 1;
        }
    }

    /// Weighs the window ending at `now` once it is [`WINDOW`] long: the new rate, when it
    /// changed.
    pub(super) fn adjust(&mut self, now: Instant) -> Option<f64> {
        if now.saturating_duration_since(self.since) < WINDOW {
            return None;
        }
        let (answered, unanswered, took) = (self.answered, self.unanswered, self.took);
        (self.answered, self.unanswered, self.took, self.since) = (0, 0, Duration::ZERO, now);
        let finished = answered + unanswered;
        if finished < MIN_SAMPLE {
            return None;
        }
        let failed = f64::from(unanswered) / f64::from(finished);
        let mean = (answered > 0).then(|| took / answered);
        if let Some(mean) = mean {
            self.best = Some(self.best.map_or(mean, |b| b.min(mean)));
        }
        let slowed = mean.is_some_and(|m| {
            m > SLOW
                || self
                    .best
                    .is_some_and(|b| m > (b * SLOWER).max(Duration::from_millis(20)))
        });
        let before = self.rate;
        if slowed || failed > FAILING {
            self.rate = (self.rate / 2.0).max(self.floor);
        } else if failed <= GROWS {
            self.rate = (self.rate * 1.5).min(self.ceiling);
        }
        (self.rate != before).then_some(self.rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pace of `rate` a second whose burst of `burst` was just spent at `start`: what the
    /// next name waits.
    fn past_the_burst(rate: u32, burst: usize, start: Instant) -> (Pace, Duration) {
        let mut pace = Pace::new(rate, burst);
        for _ in 0..burst {
            assert_eq!(pace.take(start), None);
        }
        let wait = pace.take(start).unwrap();
        (pace, wait)
    }

    #[test]
    fn the_pace_lets_a_burst_through_then_the_rate() {
        let start = Instant::now();
        let (mut pace, wait) = past_the_burst(10, 3, start);
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // A second later: ten more.
        let later = start + Duration::from_secs(1);
        assert_eq!(pace.take(later), None);
        assert!(Pace::new(0, 1).take(start).is_none());
    }

    #[test]
    fn past_the_burst_names_pass_in_groups_at_the_rate() {
        let start = Instant::now();
        // Short of a token: wait for a group of ten (100 a second, 100 ms), take the first...
        let (mut pace, wait) = past_the_burst(100, 50, start);
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // ...and the other nine pass at once, then the next waits a group's time again.
        let now = start + wait;
        for _ in 0..9 {
            assert_eq!(pace.take(now), None);
        }
        let wait = pace.take(now).unwrap();
        assert!((wait.as_secs_f64() - 0.1).abs() < 1e-6, "{wait:?}");
        // Over ten seconds of steady demand, 100 a second: the rate holds.
        let (mut now, mut started) = (now + wait, 1);
        let end = now + Duration::from_secs(10);
        while now < end {
            match pace.take(now) {
                None => started += 1,
                Some(w) => {
                    now += w;
                    started += 1;
                }
            }
        }
        assert!((1000..=1011).contains(&started), "{started} in 10 s");
    }

    /// `n` names finished in a window of `took` each (answered) or unanswered, then weighed.
    fn window(a: &mut Adaptive, at: &mut Instant, n: u32, took: Duration, answered: bool) {
        for _ in 0..n {
            a.done(took, answered);
        }
        *at += WINDOW;
        a.adjust(*at);
    }

    #[test]
    fn the_looks_rate_grows_to_its_ceiling_while_the_resolver_keeps_up_and_halves_when_not() {
        let mut at = Instant::now();
        let mut a = Adaptive::new(20, 200, at);
        let fast = Duration::from_millis(2);
        // Answered fast: 20, 30, 45, ... 200 in six windows, and no further.
        for _ in 0..6 {
            window(&mut a, &mut at, 20, fast, true);
        }
        assert_eq!(a.rate(), 200.0);
        window(&mut a, &mut at, 200, fast, true);
        assert_eq!(a.rate(), 200.0);
        // Some names unanswered (silent lapsed names): still fine.
        for _ in 0..40 {
            a.done(fast, false);
        }
        window(&mut a, &mut at, 150, fast, true);
        assert_eq!(a.rate(), 200.0);
        // The resolver slows under the load: half.
        window(&mut a, &mut at, 100, Duration::from_millis(30), true);
        assert_eq!(a.rate(), 100.0);
        // Or mostly fails: half again, never below a quarter of the start.
        for _ in 0..10 {
            window(&mut a, &mut at, 20, fast, false);
        }
        assert_eq!(a.rate(), 5.0);
        // Too few names to weigh, or a window not over: nothing changes.
        window(&mut a, &mut at, 2, fast, true);
        assert_eq!(a.rate(), 5.0);
        a.done(fast, true);
        assert_eq!(a.adjust(at), None);
        // A slow resolver from the start (a 600 ms mean): never grows.
        let mut b = Adaptive::new(20, 200, at);
        window(&mut b, &mut at, 20, Duration::from_millis(600), true);
        assert_eq!(b.rate(), 10.0);
    }

    #[test]
    fn a_new_rate_keeps_the_buckets_debt_and_bounds_its_burst() {
        let start = Instant::now();
        let (mut pace, _) = past_the_burst(20, 20, start);
        pace.set_rate(200.0);
        // In debt: the next name still waits, for a group at the new rate (20 names, 100 ms).
        let wait = pace.take(start).unwrap();
        assert!(wait <= Duration::from_millis(110), "{wait:?}");
        // A second later: the burst is a second's worth at the new rate.
        let later = start + Duration::from_secs(1);
        let through = (0..400).take_while(|_| pace.take(later).is_none()).count();
        assert!((197..=200).contains(&through), "{through}");
    }
}
