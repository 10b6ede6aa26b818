//! One GCRA: the per-project rate's Lua script on a real Redis and `access::rate::gcra_n` (the
//! embedded limiter's) give the same decisions, waits and next arrivals on the same sequences of
//! calls and batches.

use crate::redis_server;

use drg_access::quota::redis::rate::TAKE;
use drg_access::rate::{gcra_n, RateDecision};
use proptest::prelude::*;
use redis_server::RedisServer;

/// The script's two lines that read Redis's clock.
const CLOCK: &str =
    "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) * 1000000 + tonumber(t[2])";

/// The key's expiry: the time to the next conforming arrival, in Redis's real milliseconds.
const EXPIRY: &str = "'PX', math.floor((tat - now) / 1000) + 1";

/// `TAKE` with the clock given as the fourth argument instead of read from Redis: the same
/// arithmetic on times the test chooses. The key's expiry is an hour: Redis expires keys by
/// its own clock, and a test run slowly (CI under load) would otherwise see a key expire in
/// real time between two calls a few simulated microseconds apart (the script then starts
/// afresh where the Rust side does not: a failure of the test, not of the GCRA).
fn clocked_take() -> redis::Script {
    assert!(
        TAKE.contains(CLOCK) && TAKE.contains(EXPIRY),
        "TAKE no longer reads its clock or sets its expiry as this test expects"
    );
    redis::Script::new(
        &TAKE
            .replace(CLOCK, "local now = tonumber(ARGV[4])")
            .replace(EXPIRY, "'PX', 3600000"),
    )
}

/// A call or batch: microseconds after the previous one, and how many calls at once.
fn steps() -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec(
        (0u64..400_000, prop_oneof![4 => Just(1u64), 1 => 1u64..40]),
        1..40,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_redis_script_and_the_rust_gcra_agree(
        per_second in 1u64..200,
        burst in 1u32..50,
        steps in steps(),
    ) {
        let redis = SERVER.with(|s| s.client());
        let mut conn = redis.get_connection().unwrap();
        let script = clocked_take();
        let key = format!("gcra:{per_second}:{burst}:{}", steps.len());
        let _: () = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
        let interval = (1_000_000 / per_second).max(1);
        // Microseconds since the epoch, as the script's clock gives them.
        let mut now = 1_790_000_000_000_000u64;
        let mut tat = 0u64;
        for (advance, calls) in steps {
            now += advance;
            let (decision, next) = gcra_n(tat, now, interval, burst, calls);
            let (allowed, wait, ahead): (u8, u64, u64) = script
                .key(&key)
                .arg(interval)
                .arg(burst)
                .arg(calls)
                .arg(now)
                .invoke(&mut conn)
                .unwrap();
            match decision {
                RateDecision::Allowed => {
                    prop_assert_eq!((allowed, wait), (1, 0));
                    tat = next;
                }
                RateDecision::Limited { retry_after } => {
                    prop_assert_eq!(allowed, 0);
                    prop_assert_eq!(u128::from(wait), retry_after.as_nanos());
                }
            }
            // How far ahead the next conforming arrival is, after the call.
            prop_assert_eq!(ahead, tat.max(now) - now);
        }
    }
}

thread_local! {
    /// One Redis for the whole file (each case uses its own key).
    static SERVER: RedisServer = RedisServer::start(false);
}
