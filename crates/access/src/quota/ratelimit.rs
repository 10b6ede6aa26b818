//! The `RateLimit-Policy` and `RateLimit` header values of a call (IETF httpapi draft), the one
//! place they are built: the month's from its [`Usage`], and with a plan's per-second rate the
//! draft's list form. Built without `format!` on the usual path, the parts that change once a
//! month kept per worker thread.

use std::cell::{Cell, RefCell};

use bytes::Bytes;
use http::{HeaderName, HeaderValue};

use super::{Month, Usage};
use crate::rate::{RateConfig, RateStanding};

const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// The `RateLimit-Policy` and `RateLimit` headers of a call that read the month (`usage`)
/// and, with a plan's per-second rate, the rate: pushed onto the answer's own list.
pub fn headers(
    usage: Option<&Usage>,
    rate: Option<&(RateConfig, RateStanding)>,
    out: &mut Vec<(HeaderName, HeaderValue)>,
) {
    match (usage, rate) {
        (Some(usage), None) => {
            out.push((RATELIMIT_POLICY, policy(usage)));
            if let Some(v) = remaining(usage) {
                out.push((RATELIMIT, v));
            }
        }
        (usage, Some((rate, standing))) => {
            if let Some((policy, now)) = with_rate(usage, rate, standing) {
                out.push((RATELIMIT_POLICY, policy));
                out.push((RATELIMIT, now));
            }
        }
        (None, None) => {}
    }
}

/// `RateLimit-Policy`: `"monthly";q=<limit>;w=<seconds in the month>`. The same for every call
/// of a plan in a month, so each worker thread keeps the last one it built and copies it (a
/// reference count).
pub fn policy(usage: &Usage) -> HeaderValue {
    thread_local! {
        static LAST: RefCell<Option<(u64, Month, HeaderValue)>> = const { RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((limit, month, value)) if *limit == usage.limit && *month == usage.month => {
            value.clone()
        }
        _ => {
            let mut s = Vec::with_capacity(48);
            s.extend_from_slice(b"\"monthly\";q=");
            s.extend_from_slice(itoa::Buffer::new().format(usage.limit).as_bytes());
            s.extend_from_slice(b";w=");
            s.extend_from_slice(itoa::Buffer::new().format(usage.month.seconds()).as_bytes());
            // Digits and ASCII punctuation only: always a valid value.
            let value = HeaderValue::from_maybe_shared(Bytes::from(s))
                .unwrap_or_else(|_| HeaderValue::from_static(""));
            *last = Some((usage.limit, usage.month, value.clone()));
            value
        }
    })
}

/// `RateLimit`: `"monthly";r=<remaining>;t=<seconds to the reset>`, written into a buffer on the
/// stack: the value's one allocation is its own (a `Vec` turned into `Bytes` would add one).
pub fn remaining(usage: &Usage) -> Option<HeaderValue> {
    // 12 + 3 bytes of text and two u64s of at most 20 digits each.
    let mut buf = [0u8; 64];
    let mut len = 0;
    for part in [
        b"\"monthly\";r=".as_slice(),
        itoa::Buffer::new().format(usage.remaining()).as_bytes(),
        b";t=",
        itoa::Buffer::new()
            .format(seconds_to_reset(usage))
            .as_bytes(),
    ] {
        buf[len..len + part.len()].copy_from_slice(part);
        len += part.len();
    }
    HeaderValue::from_bytes(&buf[..len]).ok()
}

/// `RateLimit-Policy` and `RateLimit` of a plan with a per-second rate: the draft's list form,
/// the month first (when it was asked), then the rate as `"rate";q=<per second>;w=1` with its
/// `burst` as an extra parameter, and `r`/`t` the calls left at once and the seconds until the
/// whole burst is back.
pub fn with_rate(
    usage: Option<&Usage>,
    rate: &RateConfig,
    standing: &RateStanding,
) -> Option<(HeaderValue, HeaderValue)> {
    let rate_policy = format!("\"rate\";q={};w=1;burst={}", rate.per_second, rate.burst);
    let rate_now = format!(
        "\"rate\";r={};t={}",
        standing.remaining,
        standing.reset_secs()
    );
    let (policy, now) = match usage {
        Some(u) => (
            format!("{}, {rate_policy}", policy(u).to_str().ok()?),
            format!("{}, {rate_now}", remaining(u)?.to_str().ok()?),
        ),
        None => (rate_policy, rate_now),
    };
    // Digits, quotes and ASCII punctuation only: always valid values.
    Some((
        HeaderValue::from_str(&policy).ok()?,
        HeaderValue::from_str(&now).ok()?,
    ))
}

/// [`Usage::seconds_to_reset`], the month's reset instant kept per worker thread: the calendar
/// arithmetic that finds it is done once a month, not on every call.
fn seconds_to_reset(usage: &Usage) -> i64 {
    thread_local! {
        static RESET: Cell<Option<(Month, i64)>> = const { Cell::new(None) };
    }
    let reset = RESET.with(|last| match last.get() {
        Some((month, reset)) if month == usage.month => reset,
        _ => {
            let reset = usage.reset_at().timestamp();
            last.set(Some((usage.month, reset)));
            reset
        }
    });
    // Whole seconds, truncated as `Duration::num_seconds` does: a started second is not left.
    let started = i64::from(usage.now.timestamp_subsec_nanos() > 0);
    (reset - usage.now.timestamp() - started).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn usage(used: u64, limit: u64, now: chrono::DateTime<chrono::Utc>) -> Usage {
        Usage {
            used,
            limit,
            month: Month::containing(now),
            now,
        }
    }

    #[test]
    fn the_values_are_the_drafts_strings_from_the_cache_too() {
        let at = |y, m, d, h| chrono::Utc.with_ymd_and_hms(y, m, d, h, 59, 59).unwrap();
        for (used, limit, now) in [
            (1, 1_000, at(2026, 2, 10, 12)),
            (5, 5, at(2026, 3, 31, 23)),
            (0, u64::MAX, at(2024, 12, 1, 0)),
        ] {
            let usage = usage(used, limit, now);
            // Twice: built, then the thread's copy.
            for _ in 0..2 {
                let want = format!("\"monthly\";q={limit};w={}", usage.month.seconds());
                assert_eq!(policy(&usage), want.as_str());
                assert_eq!(seconds_to_reset(&usage), usage.seconds_to_reset());
            }
            // Within a second, and in the month's last second.
            for nanos in [1, 500_000_000, 999_999_999] {
                let now = now + chrono::Duration::nanoseconds(nanos);
                let usage = Usage { now, ..usage };
                assert_eq!(seconds_to_reset(&usage), usage.seconds_to_reset());
            }
            let want = format!(
                "\"monthly\";r={};t={}",
                usage.remaining(),
                usage.seconds_to_reset()
            );
            assert_eq!(remaining(&usage).unwrap(), want.as_str());
        }
    }

    #[test]
    fn a_rate_is_listed_after_the_month() {
        let now = chrono::Utc
            .with_ymd_and_hms(2026, 11, 30, 23, 0, 0)
            .unwrap();
        let u = usage(40, 100, now);
        let rate = RateConfig {
            per_second: 5,
            burst: 10,
        };
        let standing = RateStanding {
            decision: crate::rate::RateDecision::Allowed,
            remaining: 7,
            reset: std::time::Duration::from_millis(600),
        };
        let (policy, now) = with_rate(Some(&u), &rate, &standing).unwrap();
        assert_eq!(
            policy,
            "\"monthly\";q=100;w=2592000, \"rate\";q=5;w=1;burst=10"
        );
        assert_eq!(now, "\"monthly\";r=60;t=3600, \"rate\";r=7;t=1");
        let (policy, _) = with_rate(None, &rate, &standing).unwrap();
        assert_eq!(policy, "\"rate\";q=5;w=1;burst=10");
    }
}
