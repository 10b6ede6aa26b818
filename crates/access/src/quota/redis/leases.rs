//! Batched counting: calls reserved in Redis ahead of use (a lease) and handed out locally, one
//! lease per key and month. Pure: callers pass the time in.
//!
//! A lease is counted in Redis when it is granted, so admitting from it never overshoots the
//! limit (and keeps working while Redis is down); what is not used within the sync interval is
//! given back. A killed gateway's unused part is given back by its successor from the
//! carried-calls file (`carried.rs`), which names only a part the lease can no longer serve
//! (`kept`): it never gives back a call that was served.

use std::time::{Duration, Instant};

/// This gateway's reserved, not yet used calls on one key and month.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lease {
    left: u64,
    /// Of `left`, the part the carried-calls file may name as unused (to give back after a
    /// kill): never served, so that the file never claims more unused calls than there are.
    kept: u64,
    /// A call was served from the lease, or calls were granted into it, since the sync last
    /// saved the carried-calls file: not idle for a whole sync, so that save names none of it.
    served: bool,
    /// When the last calls were added to it: unused calls are given back this long after.
    granted: Option<Instant>,
    /// A lease request is in flight (one per key at a time; meanwhile calls take the exact way).
    requesting: bool,
}

impl Lease {
    /// Takes one call; returns how many remain (kept ones too), or `None` when the lease is used
    /// up (but for its kept part).
    pub fn take(&mut self) -> Option<u64> {
        if self.left <= self.kept {
            return None;
        }
        self.left -= 1;
        self.served = true;
        Some(self.left)
    }

    /// Reserved calls not used yet (kept ones too).
    #[cfg(test)]
    pub fn left(&self) -> u64 {
        self.left
    }

    /// Reserved calls a call may still take: not the kept part.
    fn servable(&self) -> u64 {
        self.left - self.kept
    }

    /// The part of the unused calls the carried-calls file kept.
    pub fn kept(&self) -> u64 {
        self.kept
    }

    /// What the carried-calls file about to be written names as this lease's unused part: all
    /// of it when no call was served from it since the sync's last save (an idle lease, which
    /// serves none of it from now on, until a later save names less), else nothing (a busy
    /// lease, whose unused part changes with every call). Kept at once: no call can take what
    /// the file will name, whenever the write lands.
    pub fn keep_for_file(&mut self) -> u64 {
        let keep = if std::mem::take(&mut self.served) {
            0
        } else {
            self.left
        };
        self.kept = self.kept.max(keep);
        keep
    }

    /// The file naming `kept` of this lease is written: what is above it may be served.
    pub fn file_written(&mut self, kept: u64) {
        self.kept = self.kept.min(kept);
    }

    /// Whether a call taking from this lease should also ask for the next one: half of a `size`
    /// lease or less is left and no request is in flight. Asking before it runs dry keeps the
    /// other calls on the lease meanwhile, instead of each waiting for the next one: the round
    /// trip runs on another thread, which at full load on a shared core may wait its turn for
    /// longer than a quarter of a lease lasts (it did at 100,000 calls a second with leases of
    /// 100, one round in two).
    pub fn wants_refill(&self, size: u64) -> bool {
        size > 1 && !self.requesting && self.servable() <= size / 2
    }

    /// No reserved call left to take, and a request for more in flight: worth waiting for.
    pub fn awaited(&self) -> bool {
        self.servable() == 0 && self.requesting
    }

    /// No reserved call left and no request for more in flight.
    pub fn is_idle(&self) -> bool {
        self.left == 0 && !self.requesting
    }

    /// Marks a lease request as in flight, unless one already is: returns whether the caller
    /// may ask for one.
    pub fn start_request(&mut self) -> bool {
        !std::mem::replace(&mut self.requesting, true)
    }

    /// The request in flight ended (granted or not).
    pub fn end_request(&mut self) {
        self.requesting = false;
    }

    /// Redis granted `calls` more (the caller has already taken its own one out). A lease
    /// granted just before a save is not idle: the next call takes from it, not from a new
    /// lease (a sequential caller whose calls straddled a save used to hold two leases).
    pub fn grant(&mut self, calls: u64, now: Instant) {
        self.left += calls;
        self.granted = Some(now);
        self.served = true;
    }

    /// The unused calls to give back: all of them with `all`, else only once the lease is
    /// `age` old. Empties the lease.
    pub fn give_back(&mut self, all: bool, age: Duration, now: Instant) -> u64 {
        let due = all
            || self
                .granted
                .is_some_and(|g| now.saturating_duration_since(g) >= age);
        if !due {
            return 0;
        }
        self.granted = None;
        self.kept = 0;
        std::mem::take(&mut self.left)
    }
}

/// Watches the share of leased calls that waited for their key's next lease, window by window,
/// to tell the operator when `batch_max` is too small for the keys' rates (a few per cent of
/// waits at high rates cost 5-10% of a worker's throughput and its tail, `benches/RESULTS.md`).
#[derive(Debug)]
pub struct WaitWatch {
    since: Instant,
    /// The running totals at `since`: calls that waited, the microseconds they waited, calls
    /// leased.
    at_since: (u64, u64, u64),
    warned: Option<Instant>,
}

/// A window in which too many leased calls waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyWaits {
    pub waits: u64,
    pub leased: u64,
    pub mean_wait_us: u64,
}

impl WaitWatch {
    /// At most one warning this often.
    pub const QUIET: Duration = Duration::from_secs(600);
    /// Fewer leased calls than this in a window say nothing.
    pub const MIN_CALLS: u64 = 100;

    pub fn new(now: Instant) -> Self {
        WaitWatch {
            since: now,
            at_since: (0, 0, 0),
            warned: None,
        }
    }

    /// Given the running totals (calls that waited, microseconds waited, calls leased): once
    /// `window` has passed, whether more than 5% of the window's leased calls waited (and no
    /// warning was given within [`Self::QUIET`]); then a new window starts.
    pub fn check(
        &mut self,
        now: Instant,
        totals: (u64, u64, u64),
        window: Duration,
    ) -> Option<TooManyWaits> {
        if now.saturating_duration_since(self.since) < window {
            return None;
        }
        let (waits, waited_us, leased) = (
            totals.0.saturating_sub(self.at_since.0),
            totals.1.saturating_sub(self.at_since.1),
            totals.2.saturating_sub(self.at_since.2),
        );
        self.since = now;
        self.at_since = totals;
        let quiet = self
            .warned
            .is_some_and(|w| now.saturating_duration_since(w) < Self::QUIET);
        if leased < Self::MIN_CALLS || waits * 20 <= leased || quiet {
            return None;
        }
        self.warned = Some(now);
        Some(TooManyWaits {
            waits,
            leased,
            mean_wait_us: waited_us / waits.max(1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refill_is_asked_at_half_left_once() {
        let mut l = Lease::default();
        l.grant(100, Instant::now());
        assert!(!l.wants_refill(100));
        for _ in 0..49 {
            l.take();
        }
        assert!(!l.wants_refill(100));
        l.take();
        assert!(l.wants_refill(100));
        assert!(l.start_request());
        assert!(!l.wants_refill(100), "one request at a time");
        assert!(!Lease::default().wants_refill(1));
    }

    #[test]
    fn too_many_waits_are_told_once_a_window_at_most_every_ten_minutes() {
        let t0 = Instant::now();
        let w = Duration::from_secs(1);
        let mut watch = WaitWatch::new(t0);
        // Within the window: nothing yet.
        assert_eq!(watch.check(t0 + w / 2, (500, 50_000, 1_000), w), None);
        // 50% of 1,000 waited, 100 us each.
        let told = watch.check(t0 + w, (500, 50_000, 1_000), w);
        assert_eq!(
            told,
            Some(TooManyWaits {
                waits: 500,
                leased: 1_000,
                mean_wait_us: 100
            })
        );
        // The same again in the next window: quiet for ten minutes.
        assert_eq!(watch.check(t0 + 2 * w, (1_000, 100_000, 2_000), w), None);
        // 5% exactly, or too few calls: nothing to say.
        let later = t0 + WaitWatch::QUIET + 3 * w;
        assert_eq!(watch.check(later, (1_050, 100_000, 3_000), w), None);
        assert_eq!(watch.check(later + w, (1_099, 100_000, 3_090), w), None);
        // Ten minutes on, 10% of a window's calls: told again.
        assert!(watch
            .check(later + 2 * w, (1_199, 110_000, 4_090), w)
            .is_some());
    }

    #[test]
    fn a_lease_hands_out_what_was_granted_then_runs_dry() {
        let t0 = Instant::now();
        let mut l = Lease::default();
        assert_eq!(l.take(), None);
        l.grant(2, t0);
        assert_eq!(l.take(), Some(1));
        assert_eq!(l.take(), Some(0));
        assert_eq!(l.take(), None);
        assert_eq!(l.left(), 0);
    }

    #[test]
    fn the_part_kept_for_the_carried_file_is_never_served() {
        let t0 = Instant::now();
        let mut l = Lease::default();
        l.grant(10, t0);
        assert_eq!(l.take(), Some(9));
        // Served since the last save: the file names nothing of it, and it serves on.
        assert_eq!(l.keep_for_file(), 0);
        l.file_written(0);
        assert_eq!(l.take(), Some(8));
        assert_eq!(l.keep_for_file(), 0);
        l.file_written(0);
        // Idle since: the file names the 8 left, which serve no more.
        assert_eq!(l.keep_for_file(), 8);
        assert_eq!(l.take(), None);
        assert!(l.wants_refill(10));
        l.file_written(8);
        assert_eq!(l.take(), None);
        // A new grant serves; the next save names nothing, and once it is written all of it
        // serves again.
        l.grant(4, t0);
        assert_eq!(l.take(), Some(11));
        assert_eq!(l.keep_for_file(), 0);
        assert_eq!((l.kept(), l.left()), (8, 11));
        for _ in 0..3 {
            l.take();
        }
        assert_eq!(l.take(), None, "not before the file says so");
        l.file_written(0);
        assert_eq!(l.take(), Some(7));
        // Given back whole, kept part and all.
        l.keep_for_file();
        assert_eq!(l.give_back(true, Duration::ZERO, t0), 7);
        assert_eq!((l.kept(), l.left()), (0, 0));
    }

    #[test]
    fn a_lease_granted_since_the_last_save_is_not_idle() {
        let t0 = Instant::now();
        let mut l = Lease::default();
        l.grant(49, t0);
        // The save right after the grant names nothing: the next call still takes from it.
        assert_eq!(l.keep_for_file(), 0);
        l.file_written(0);
        assert_eq!(l.take(), Some(48));
        l.file_written(0);
        assert_eq!(l.keep_for_file(), 0);
        // A whole sync without a call: named, and served no more.
        assert_eq!(l.keep_for_file(), 48);
        assert_eq!(l.take(), None);
    }

    #[test]
    fn one_request_at_a_time() {
        let mut l = Lease::default();
        assert!(l.start_request());
        assert!(!l.start_request());
        l.end_request();
        assert!(l.start_request());
    }

    #[test]
    fn unused_calls_go_back_after_the_interval_or_at_once_when_asked() {
        let t0 = Instant::now();
        let age = Duration::from_millis(100);
        let mut l = Lease::default();
        l.grant(9, t0);
        l.take();
        assert_eq!(l.give_back(false, age, t0 + Duration::from_millis(99)), 0);
        assert_eq!(l.left(), 8);
        // A new grant restarts the interval.
        l.grant(5, t0 + Duration::from_millis(50));
        assert_eq!(l.give_back(false, age, t0 + Duration::from_millis(120)), 0);
        assert_eq!(l.give_back(false, age, t0 + Duration::from_millis(150)), 13);
        assert_eq!(l.left(), 0);
        assert_eq!(l.give_back(false, age, t0 + Duration::from_secs(9)), 0);
        l.grant(3, t0);
        assert_eq!(l.give_back(true, age, t0), 3, "at shutdown, all of it");
    }
}
