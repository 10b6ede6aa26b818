//! Rate limits: the generic cell rate algorithm (GCRA), one "theoretical arrival time" per key,
//! so a key's state is one number and a check is a compare and a store.
//!
//! Used per key for the account routes (`/v1/usage`, `/v1/logs`, `/v1/stats`, `/v1/keys`), which
//! are not counted in the month but each cost a store read or a keys-file rewrite, and per
//! project for a plan's `rate_per_second` (in this process with the embedded quota store; on
//! Redis the same arithmetic runs as a script, `quota/redis/rate.rs`). Written here rather than
//! taken from a crate so that both agree; time is passed in, so the algorithm is tested without
//! clocks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// A rate: `per_second` calls a second on average, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateConfig {
    /// Average calls per second allowed; 0 turns the limit off.
    pub per_second: u32,
    /// Calls allowed at once after a quiet spell (at least 1).
    pub burst: u32,
}

impl RateConfig {
    /// What is wrong with the rate, if anything, for config validation (`at` names the key).
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut out = Vec::new();
        if self.per_second > 1_000_000 {
            out.push(format!(
                "{at}.per_second: {} is outside 0..=1000000 (0: off)",
                self.per_second
            ));
        }
        if !(1..=1_000_000).contains(&self.burst) {
            out.push(format!("{at}.burst: {} is outside 1..=1000000", self.burst));
        }
        out
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateDecision {
    Allowed,
    /// Over the rate: the call would conform after this long.
    Limited {
        retry_after: Duration,
    },
}

impl RateDecision {
    /// `Retry-After` in whole seconds, rounded up (a client told 0 would retry at once).
    pub fn retry_after_secs(&self) -> u64 {
        match self {
            RateDecision::Allowed => 0,
            RateDecision::Limited { retry_after } => {
                retry_after.as_nanos().div_ceil(1_000_000_000).max(1) as u64
            }
        }
    }
}

/// GCRA for one key: `tat` is the theoretical arrival time of the next conforming call, in
/// nanoseconds since an origin. Pure: returns the decision and the new `tat`.
pub fn gcra(tat: u64, now: u64, interval: u64, burst: u32) -> (RateDecision, u64) {
    gcra_n(tat, now, interval, burst, 1)
}

/// GCRA for `calls` calls at once (a batch): they conform when the first `min(calls, burst)` of
/// them would, one after another, and all of them are taken. A batch larger than the burst so
/// needs a whole burst and leaves the key that much in debt: the average rate still holds, and no
/// batch size is refused for ever. `calls` 0 counts as 1.
pub fn gcra_n(tat: u64, now: u64, interval: u64, burst: u32, calls: u64) -> (RateDecision, u64) {
    let burst = u64::from(burst.max(1));
    let need = calls.clamp(1, burst);
    // The last of `need` calls conforms while `tat` is at most `(burst - need) * interval`
    // ahead of now; for one call, `(burst - 1) * interval`.
    let tolerance = interval.saturating_mul(burst - need);
    let tat = tat.max(now);
    let allow_at = tat.saturating_sub(tolerance);
    if allow_at > now {
        let retry_after = Duration::from_nanos(allow_at - now);
        return (RateDecision::Limited { retry_after }, tat);
    }
    (
        RateDecision::Allowed,
        tat.saturating_add(interval.saturating_mul(calls.max(1))),
    )
}

/// Where a rate stands after one check: the decision, and what the `RateLimit` header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateStanding {
    pub decision: RateDecision,
    /// Calls that would pass at once after this one.
    pub remaining: u32,
    /// Until the whole burst is back.
    pub reset: Duration,
}

impl RateStanding {
    /// The standing of a key whose next conforming arrival is `ahead` past now (the GCRA's
    /// `tat - now` after the check), for a rate of one call per `interval` and `burst`.
    pub fn from_ahead(decision: RateDecision, ahead: u64, interval: u64, burst: u32) -> Self {
        let tolerance = interval.saturating_mul(u64::from(burst.max(1)) - 1);
        let remaining = match tolerance.checked_sub(ahead) {
            Some(room) if interval > 0 => (room / interval + 1).min(u64::from(burst)),
            _ => 0,
        };
        RateStanding {
            decision,
            remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
            reset: Duration::from_nanos(ahead),
        }
    }

    /// `reset` in whole seconds, rounded up.
    pub fn reset_secs(&self) -> u64 {
        self.reset.as_nanos().div_ceil(1_000_000_000) as u64
    }
}

/// Nanoseconds between conforming calls of `rate` (`None`: off).
pub fn interval_nanos(rate: RateConfig) -> Option<u64> {
    (rate.per_second > 0).then(|| 1_000_000_000 / u64::from(rate.per_second))
}

/// Keys past this many tracked entries trigger a sweep of the idle ones.
const SWEEP_AT: usize = 4096;

/// One theoretical arrival time per key, in this process; the rate is given per check.
#[derive(Debug)]
pub struct Limiter {
    origin: Instant,
    tats: Mutex<HashMap<Arc<str>, u64>>,
}

impl Default for Limiter {
    fn default() -> Self {
        Limiter {
            origin: Instant::now(),
            tats: Mutex::new(HashMap::new()),
        }
    }
}

impl Limiter {
    /// Checks (and, when allowed, takes) one call for `key` at `rate`.
    pub fn check(&self, key: &Arc<str>, rate: RateConfig) -> RateStanding {
        self.check_n(key, rate, 1)
    }

    /// Checks (and, when allowed, takes) `calls` calls for `key` at `rate`, all or none
    /// ([`gcra_n`]).
    pub fn check_n(&self, key: &Arc<str>, rate: RateConfig, calls: u64) -> RateStanding {
        let Some(interval) = interval_nanos(rate) else {
            return RateStanding::from_ahead(RateDecision::Allowed, 0, 1, rate.burst);
        };
        let burst = rate.burst.max(1);
        let now = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // A poisoned lock only means another thread panicked mid-update of one number.
        let mut tats = self.tats.lock().unwrap_or_else(|e| e.into_inner());
        if tats.len() >= SWEEP_AT && !tats.contains_key(key) {
            // Entries whose arrival time has passed hold no state worth keeping.
            tats.retain(|_, tat| *tat > now);
        }
        let tat = tats.get(key).copied().unwrap_or(0);
        let (decision, next) = gcra_n(tat, now, interval, burst, calls);
        if decision == RateDecision::Allowed {
            match tats.get_mut(key) {
                Some(t) => *t = next,
                None => {
                    tats.insert(key.clone(), next);
                }
            }
        }
        RateStanding::from_ahead(decision, next.saturating_sub(now), interval, burst)
    }
}

impl Limiter {
    /// Gives back `calls` calls taken for `key` at `rate` (a call the month then refused spends
    /// nothing): its arrival time moves back as if they had not been taken, whatever was taken
    /// since. Atomic with [`check_n`](Self::check_n) (one lock).
    pub fn give_back_n(&self, key: &Arc<str>, rate: RateConfig, calls: u64) -> RateStanding {
        let Some(interval) = interval_nanos(rate) else {
            return RateStanding::from_ahead(RateDecision::Allowed, 0, 1, rate.burst);
        };
        let now = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let mut tats = self.tats.lock().unwrap_or_else(|e| e.into_inner());
        let ahead = match tats.get_mut(key) {
            Some(tat) => {
                *tat = give_back(*tat, interval, calls);
                tat.saturating_sub(now)
            }
            None => 0,
        };
        RateStanding::from_ahead(RateDecision::Allowed, ahead, interval, rate.burst.max(1))
    }
}

/// The arrival time `tat` with `calls` calls of `interval` given back ([`gcra_n`] took
/// `interval * calls.max(1)`).
pub fn give_back(tat: u64, interval: u64, calls: u64) -> u64 {
    tat.saturating_sub(interval.saturating_mul(calls.max(1)))
}

/// A rate limit per key id, in this process, one rate for all keys.
#[derive(Debug)]
pub struct KeyedLimiter {
    rate: RateConfig,
    limiter: Limiter,
}

impl KeyedLimiter {
    pub fn new(rate: RateConfig) -> KeyedLimiter {
        KeyedLimiter {
            rate,
            limiter: Limiter::default(),
        }
    }

    /// Checks (and, when allowed, takes) one call for `key`.
    pub fn check(&self, key: &Arc<str>) -> RateDecision {
        self.limiter.check(key, self.rate).decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_given_back_is_as_if_it_had_not_been_taken() {
        let rate = RateConfig {
            per_second: 10,
            burst: 5,
        };
        let l = Limiter::default();
        let k: Arc<str> = "p".into();
        assert_eq!(l.check_n(&k, rate, 5).remaining, 0);
        assert_eq!(l.give_back_n(&k, rate, 5).remaining, 5);
        // Given back with others' calls taken in between: theirs stay taken.
        l.check_n(&k, rate, 3);
        l.check_n(&k, rate, 1);
        assert_eq!(l.give_back_n(&k, rate, 3).remaining, 4);
        // Never below empty: giving back more than was taken is a full bucket, not credit.
        assert_eq!(l.give_back_n(&k, rate, 100).remaining, 5);
        assert_eq!(give_back(10, 3, 5), 0);
        assert_eq!(give_back(100, 3, 0), 97);
    }

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn a_burst_passes_then_the_rate_holds() {
        // 2 a second, burst 3: three at once, then one every 500 ms.
        let interval = SECOND / 2;
        let mut tat = 0;
        for _ in 0..3 {
            let (d, next) = gcra(tat, 0, interval, 3);
            assert_eq!(d, RateDecision::Allowed);
            tat = next;
        }
        let (d, same) = gcra(tat, 0, interval, 3);
        assert_eq!(
            d,
            RateDecision::Limited {
                retry_after: Duration::from_millis(500)
            }
        );
        assert_eq!(same, tat, "a refused call takes nothing");
        assert_eq!(d.retry_after_secs(), 1);
        let (d, _) = gcra(tat, interval, interval, 3);
        assert_eq!(d, RateDecision::Allowed);
    }

    #[test]
    fn a_quiet_spell_refills_the_burst_but_never_beyond() {
        let interval = SECOND;
        let (_, tat) = gcra(0, 0, interval, 2);
        // An hour later: the old arrival time is in the past, the burst is whole again (2).
        let now = 3600 * SECOND;
        let (a, tat) = gcra(tat, now, interval, 2);
        let (b, tat) = gcra(tat, now, interval, 2);
        let (c, _) = gcra(tat, now, interval, 2);
        assert_eq!(
            (a, b),
            (RateDecision::Allowed, RateDecision::Allowed),
            "burst refilled"
        );
        assert!(matches!(c, RateDecision::Limited { .. }), "but not beyond");
    }

    #[test]
    fn keys_are_limited_apart_and_zero_means_off() {
        let limiter = KeyedLimiter::new(RateConfig {
            per_second: 1,
            burst: 2,
        });
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        assert_eq!(limiter.check(&a), RateDecision::Allowed);
        assert_eq!(limiter.check(&a), RateDecision::Allowed);
        let refused = limiter.check(&a);
        assert_eq!(refused.retry_after_secs(), 1, "{refused:?}");
        assert_eq!(limiter.check(&b), RateDecision::Allowed, "b has its own");
        let off = KeyedLimiter::new(RateConfig {
            per_second: 0,
            burst: 1,
        });
        assert!((0..100).all(|_| off.check(&a) == RateDecision::Allowed));
    }

    #[test]
    fn the_standing_counts_what_is_left_of_the_burst() {
        let rate = RateConfig {
            per_second: 2,
            burst: 3,
        };
        let limiter = Limiter::default();
        let key: Arc<str> = "p".into();
        let first = limiter.check(&key, rate);
        assert_eq!(first.decision, RateDecision::Allowed);
        assert_eq!(first.remaining, 2);
        assert_eq!(first.reset_secs(), 1, "{first:?}");
        limiter.check(&key, rate);
        let third = limiter.check(&key, rate);
        assert_eq!(third.remaining, 0);
        assert_eq!(
            third.reset_secs(),
            2,
            "three calls at 2/s: whole again in 1.5 s"
        );
        let fourth = limiter.check(&key, rate);
        assert!(matches!(fourth.decision, RateDecision::Limited { .. }));
        assert_eq!(fourth.decision.retry_after_secs(), 1);
        assert_eq!(fourth.remaining, 0);
        // Pure arithmetic: one interval ahead of a burst of 3 leaves 2.
        let s = RateStanding::from_ahead(RateDecision::Allowed, SECOND, SECOND, 3);
        assert_eq!((s.remaining, s.reset_secs()), (2, 1));
    }

    #[test]
    fn a_batch_takes_its_calls_at_once_or_none() {
        let interval = SECOND;
        // Burst 5: a batch of 3 fits a full bucket, leaving 2; a second batch of 3 does not
        // fit, and takes nothing.
        let (a, tat) = gcra_n(0, 0, interval, 5, 3);
        assert_eq!(a, RateDecision::Allowed);
        assert_eq!(tat, 3 * SECOND);
        let (b, same) = gcra_n(tat, 0, interval, 5, 3);
        assert_eq!(
            b,
            RateDecision::Limited {
                retry_after: Duration::from_secs(1)
            }
        );
        assert_eq!(same, tat);
        // A batch larger than the burst needs a full bucket, then owes the rest.
        let (c, debt) = gcra_n(0, 0, interval, 5, 50);
        assert_eq!(c, RateDecision::Allowed);
        assert_eq!(debt, 50 * SECOND);
        let (d, _) = gcra_n(debt, 10 * SECOND, interval, 5, 1);
        assert_eq!(
            d,
            RateDecision::Limited {
                retry_after: Duration::from_secs(36)
            }
        );
        // One call is the plain GCRA.
        assert_eq!(gcra_n(7, 3, interval, 2, 1), gcra(7, 3, interval, 2));
    }

    #[test]
    fn bad_rates_are_named() {
        let bad = RateConfig {
            per_second: 2_000_000,
            burst: 0,
        };
        assert_eq!(bad.problems("gateway.access.account_rate").len(), 2);
        assert!(RateConfig {
            per_second: 5,
            burst: 20
        }
        .problems("x")
        .is_empty());
    }
}
