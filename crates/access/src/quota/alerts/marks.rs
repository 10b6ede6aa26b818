//! One project's alerts in its month, as two words the request path reads without a lock: the
//! thresholds the outbox has (the service confirmed them) and those offered and not yet answered.
//! Each word packs the month (its index, high half) with one bit per threshold (low half), so a
//! new month clears a word by the same compare-and-swap that sets its first bit.

use std::cmp::Ordering as Cmp;
use std::sync::atomic::{AtomicU64, Ordering};

/// Thresholds a configuration may have at most: one bit each in a word's low half.
pub const MAX_THRESHOLDS: usize = 32;

/// Bits 0..n set: the first `n` thresholds (`n` at most [`MAX_THRESHOLDS`]).
pub fn first(n: usize) -> u32 {
    match n {
        0 => 0,
        n if n >= MAX_THRESHOLDS => u32::MAX,
        n => (1 << n) - 1,
    }
}

fn pack(month: u32, bits: u32) -> u64 {
    (u64::from(month) << 32) | u64::from(bits)
}

/// The bits of `word` as of `month`: its own when it is of that month, none when it is of an
/// earlier one; `None` when it is of a later month (the caller's month is over for this project).
fn bits_in(word: u64, month: u32) -> Option<u32> {
    let (of, bits) = ((word >> 32) as u32, word as u32);
    match of.cmp(&month) {
        Cmp::Equal => Some(bits),
        Cmp::Less => Some(0),
        Cmp::Greater => None,
    }
}

/// Sets `word` to `f` of its bits of `month`; a word of a later month is left alone.
fn update(word: &AtomicU64, month: u32, f: impl Fn(u32) -> u32) {
    let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
        bits_in(w, month).map(|bits| pack(month, f(bits)))
    });
}

/// One project's marks (see the module documentation).
#[derive(Debug, Default)]
pub struct Marks {
    recorded: AtomicU64,
    offered: AtomicU64,
}

impl Marks {
    /// The thresholds of `reached` (bits) in `month` this call is to offer: neither recorded nor
    /// offered before. They are marked offered: the caller hands them over, or gives them back
    /// with [`Marks::release`].
    pub fn claim(&self, month: u32, reached: u32) -> u32 {
        // The usual call above a threshold: everything reached is recorded, one load.
        match bits_in(self.recorded.load(Ordering::Acquire), month) {
            Some(recorded) if reached & !recorded != 0 => {}
            _ => return 0,
        }
        let mut offered = self.offered.load(Ordering::Acquire);
        loop {
            let Some(busy) = bits_in(offered, month) else {
                return 0;
            };
            // Read after `offered`: a bit the service cleared there it set here first
            // ([`Marks::record`]), so a just-recorded alert is not offered again.
            let Some(recorded) = bits_in(self.recorded.load(Ordering::Acquire), month) else {
                return 0;
            };
            let free = reached & !recorded & !busy;
            if free == 0 {
                return 0;
            }
            match self.offered.compare_exchange_weak(
                offered,
                pack(month, busy | free),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return free,
                Err(now) => offered = now,
            }
        }
    }

    /// The outbox has `bits` of `month`: never offered again in that month.
    pub fn record(&self, month: u32, bits: u32) {
        update(&self.recorded, month, |b| b | bits);
        update(&self.offered, month, |b| b & !bits);
    }

    /// `bits` of `month` were offered and are not in the outbox: the next call offers them again.
    pub fn release(&self, month: u32, bits: u32) {
        update(&self.offered, month, |b| b & !bits);
    }

    /// Whether the marks say anything of `month` or later (else they may be forgotten).
    pub fn current(&self, month: u32) -> bool {
        let of = |w: &AtomicU64| (w.load(Ordering::Acquire) >> 32) as u32;
        of(&self.recorded) >= month || of(&self.offered) >= month
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offer_is_made_once_until_it_is_answered() {
        let m = Marks::default();
        assert_eq!(m.claim(5, first(1)), 0b1);
        assert_eq!(m.claim(5, first(2)), 0b10, "only what is new");
        assert_eq!(m.claim(5, first(2)), 0, "both in flight");
        // The outbox could not take the second: the next call offers it again.
        m.record(5, 0b1);
        m.release(5, 0b10);
        assert_eq!(m.claim(5, first(2)), 0b10);
        m.record(5, 0b10);
        assert_eq!(m.claim(5, first(3)), 0b100);
        m.record(5, 0b100);
        assert_eq!(m.claim(5, first(3)), 0, "all recorded");
    }

    #[test]
    fn a_new_month_starts_over_and_a_past_one_changes_nothing() {
        let m = Marks::default();
        assert_eq!(m.claim(5, first(2)), 0b11);
        m.record(5, 0b11);
        assert_eq!(m.claim(6, first(1)), 0b1, "June starts over");
        // A late answer for May: June's marks stay as they are.
        m.record(5, 0b10);
        m.release(5, 0b1);
        assert_eq!(m.claim(6, first(1)), 0, "still offered in June");
        // A call still counted in May (the month turned mid-way) offers nothing.
        assert_eq!(m.claim(5, first(3)), 0);
        assert!(m.current(6) && !m.current(7));
    }

    #[test]
    fn thirty_two_thresholds_fit() {
        assert_eq!(first(0), 0);
        assert_eq!(first(MAX_THRESHOLDS), u32::MAX);
        let m = Marks::default();
        assert_eq!(m.claim(u32::MAX, first(32)), u32::MAX);
        m.record(u32::MAX, u32::MAX);
        assert_eq!(m.claim(u32::MAX, first(32)), 0);
    }

    #[test]
    fn racing_calls_offer_each_threshold_once() {
        let m = std::sync::Arc::new(Marks::default());
        let claimed: u32 = std::thread::scope(|s| {
            let hands: Vec<_> = (0..4)
                .map(|_| {
                    let m = m.clone();
                    s.spawn(move || (0..1_000).fold(0, |acc, i| acc ^ m.claim(1, first(i % 9))))
                })
                .collect();
            hands.into_iter().fold(0, |acc, h| {
                let got = h.join().unwrap();
                assert_eq!(acc & got, 0, "a threshold offered twice");
                acc | got
            })
        });
        assert_eq!(claimed, first(8));
    }
}
