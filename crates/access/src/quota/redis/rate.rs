//! The per-project rate on Redis: the GCRA of `access::rate` as one script on
//! `q:{<project>}:rate` (the project's hash tag, so it lives beside its counts on a cluster),
//! timed by Redis's own clock so that gateways with skewed clocks share one rate.

use redis::Script;

use crate::rate::{RateConfig, RateDecision, RateStanding};

/// KEYS: the rate key. ARGV: the interval between calls, the burst, the calls taken at once
/// (a batch; `access::rate::gcra_n`), in microseconds and calls. Returns {allowed (0/1), microseconds until the call would conform, microseconds the
/// next conforming arrival is ahead of now}. Microseconds since the epoch (~1.8e15) are exact in
/// Lua's doubles; the stored value is written with `%d`, as `tostring` would round it to 14
/// digits. `TIME` before a write is fine with effects replication (Redis 5 and later, the default
/// from 7).
pub const TAKE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local calls = math.max(tonumber(ARGV[3] or '1'), 1)
local need = math.min(calls, burst)
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local allow_at = tat - interval * (burst - need)
if allow_at > now then return {0, allow_at - now, tat - now} end
tat = tat + interval * calls
redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.floor((tat - now) / 1000) + 1)
return {1, 0, tat - now}
"#;

/// KEYS: the rate key. ARGV: as [`TAKE`]'s. Gives back calls `TAKE` took (the month refused
/// them): the next conforming arrival moves back by their intervals, whatever was taken since;
/// the key goes once that is past. Returns what `TAKE` returns for an allowed call.
const GIVE_BACK: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local calls = math.max(tonumber(ARGV[3] or '1'), 1)
local stored = redis.call('GET', KEYS[1])
if not stored then return {1, 0, 0} end
local tat = tonumber(stored) - interval * calls
if tat <= now then
  redis.call('DEL', KEYS[1])
  return {1, 0, 0}
end
redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.floor((tat - now) / 1000) + 1)
return {1, 0, tat - now}
"#;

pub fn script() -> Script {
    Script::new(TAKE)
}

/// The give-back script (`GIVE_BACK`).
pub fn give_back_script() -> Script {
    Script::new(GIVE_BACK)
}

/// The key holding `project`'s next conforming arrival.
pub fn key(project: &str) -> String {
    format!("q:{{{project}}}:rate")
}

/// Microseconds between conforming calls of `rate` (at least 1).
pub fn interval_micros(rate: RateConfig) -> u64 {
    (1_000_000 / u64::from(rate.per_second.max(1))).max(1)
}

/// The script's reply as a standing.
pub fn standing(reply: (u8, u64, u64), rate: RateConfig) -> RateStanding {
    let (allowed, wait, ahead) = reply;
    let decision = if allowed == 1 {
        RateDecision::Allowed
    } else {
        RateDecision::Limited {
            retry_after: std::time::Duration::from_micros(wait),
        }
    };
    RateStanding::from_ahead(
        decision,
        ahead.saturating_mul(1_000),
        interval_micros(rate) * 1_000,
        rate.burst,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_read_as_the_embedded_limiter_would_say() {
        let rate = RateConfig {
            per_second: 2,
            burst: 3,
        };
        assert_eq!(interval_micros(rate), 500_000);
        let first = standing((1, 0, 500_000), rate);
        assert_eq!((first.remaining, first.reset_secs()), (2, 1));
        let refused = standing((0, 250_000, 1_500_000), rate);
        assert_eq!(refused.decision.retry_after_secs(), 1);
        assert_eq!(refused.remaining, 0);
        assert_eq!(key("acme"), "q:{acme}:rate");
    }
}
