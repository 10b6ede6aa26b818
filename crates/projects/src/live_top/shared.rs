//! Flag counts shared by all gateways through Redis (`quota.store: redis`).
//!
//! Per UTC day, `drg:top:{YYYY-MM-DD}` is a sorted set (name -> flags) kept as a Space-Saving
//! summary of `capacity` members, `drg:top:{YYYY-MM-DD}:labels` a hash (name -> latest reason
//! and score). A gateway adds its local deltas with one Lua script call per day and chunk: an
//! existing member gets `ZINCRBY`; a new one a free place, or, when the set is full, the place of
//! the smallest member, starting from its count (the same error bound as the local summaries).
//! Each call carries the batch id and marks `drg:top:{YYYY-MM-DD}:op:<id>:<chunk>`: resending a
//! batch whose answer was lost adds nothing twice. Every key of a call shares the `{day}` hash
//! tag (cluster-safe); all of them expire when the day leaves the window.

use std::collections::BTreeMap;

use redis::Script;

use drg_base::infra::redis::config::RedisConfig;
use drg_base::infra::redis::RedisLink;
use drg_domain::heavy_hitters::{Day, Label, Snapshot, SpaceSaving};
use drg_domain::Reason;

/// Names sent per script call: bounds how long one call holds Redis.
const CHUNK: usize = 500;

const ADD: &str = r"
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
local cap = tonumber(ARGV[1])
for i = 3, #ARGV, 3 do
  local name, by = ARGV[i], tonumber(ARGV[i + 1])
  if redis.call('ZSCORE', KEYS[1], name) then
    redis.call('ZINCRBY', KEYS[1], by, name)
  elseif redis.call('ZCARD', KEYS[1]) < cap then
    redis.call('ZADD', KEYS[1], by, name)
  else
    local low = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    redis.call('ZREM', KEYS[1], low[1])
    redis.call('HDEL', KEYS[2], low[1])
    redis.call('ZADD', KEYS[1], tonumber(low[2]) + by, name)
  end
  redis.call('HSET', KEYS[2], name, ARGV[i + 2])
end
redis.call('EXPIREAT', KEYS[1], ARGV[2])
redis.call('EXPIREAT', KEYS[2], ARGV[2])
redis.call('SET', KEYS[3], '1')
redis.call('EXPIREAT', KEYS[3], ARGV[2])
return 1
";

/// One day's local deltas: name, flags, latest label.
pub type DayDeltas = (Day, Vec<(String, u64, Label)>);

/// The Redis side of the flag counts.
pub struct SharedCounts {
    link: tokio::sync::OnceCell<RedisLink>,
    config: RedisConfig,
    script: Script,
    window_days: u32,
    capacity: usize,
}

impl SharedCounts {
    /// `config` is the quota store's; its call budget is raised to `budget` (a sync reads up to
    /// `window_days x capacity` members, more than one counted call's worth).
    pub fn new(
        config: &RedisConfig,
        budget: std::time::Duration,
        window_days: u32,
        capacity: usize,
    ) -> Self {
        let mut config = config.clone();
        config.call_timeout = config.call_timeout.max(budget);
        SharedCounts {
            link: tokio::sync::OnceCell::new(),
            config,
            script: Script::new(ADD),
            window_days,
            capacity,
        }
    }

    async fn link(&self) -> redis::RedisResult<RedisLink> {
        self.link
            .get_or_try_init(|| async { RedisLink::connect_lazy(&self.config) })
            .await
            .cloned()
    }

    /// Adds a batch of local counts (idempotent under its `id`).
    pub async fn add(&self, id: &str, days: &[DayDeltas]) -> redis::RedisResult<()> {
        let mut conn = self.link().await?;
        for (day, names) in days {
            let date = date(*day);
            let expire_at = (i64::from(*day) + i64::from(self.window_days) + 1) * 86_400;
            for (chunk, part) in names.chunks(CHUNK).enumerate() {
                let mut call = self.script.prepare_invoke();
                call.key(counts_key(&date))
                    .key(format!("drg:top:{{{date}}}:labels"))
                    .key(format!("drg:top:{{{date}}}:op:{id}:{chunk}"))
                    .arg(self.capacity)
                    .arg(expire_at);
                for (name, by, label) in part {
                    call.arg(name.as_str())
                        .arg(*by)
                        .arg(format!("{} {}", label.reason, label.score));
                }
                call.invoke_async::<i64>(&mut conn).await?;
            }
        }
        Ok(())
    }

    /// The shared summaries of the window's days, from `first` to `last`.
    pub async fn read(
        &self,
        first: Day,
        last: Day,
    ) -> redis::RedisResult<BTreeMap<Day, SpaceSaving>> {
        let mut conn = self.link().await?;
        let mut out = BTreeMap::new();
        for day in first..=last {
            let date = date(day);
            let members: Vec<(String, f64)> = redis::cmd("ZREVRANGE")
                .arg(counts_key(&date))
                .arg(0)
                .arg(self.capacity.saturating_sub(1))
                .arg("WITHSCORES")
                .query_async(&mut conn)
                .await?;
            if members.is_empty() {
                continue;
            }
            let labels: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
                .arg(format!("drg:top:{{{date}}}:labels"))
                .query_async(&mut conn)
                .await?;
            let counters = members
                .into_iter()
                .filter_map(|(name, score)| {
                    let label = labels.get(&name).and_then(|l| parse_label(l))?;
                    Some((name, score.max(0.0) as u64, 0, label))
                })
                .collect::<Vec<_>>();
            let total = counters.iter().map(|c| c.1).sum();
            out.insert(
                day,
                SpaceSaving::from_snapshot(self.capacity, Snapshot { total, counters }),
            );
        }
        Ok(out)
    }
}

fn counts_key(date: &str) -> String {
    format!("drg:top:{{{date}}}")
}

/// `YYYY-MM-DD` of a day number.
pub fn date(day: Day) -> String {
    chrono::DateTime::from_timestamp(i64::from(day) * 86_400, 0)
        .map(|t| t.date_naive().to_string())
        .unwrap_or_else(|| day.to_string())
}

fn parse_label(s: &str) -> Option<Label> {
    let (reason, score) = s.split_once(' ')?;
    Some(Label {
        reason: reason.parse::<Reason>().ok()?,
        score: score.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_dates_and_labels_round_trip() {
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(date(20_414), "2025-11-22");
        let label = Label {
            reason: Reason::RoleAccount,
            score: 60,
        };
        assert_eq!(
            parse_label(&format!("{} {}", label.reason, label.score)),
            Some(label)
        );
        assert_eq!(parse_label("safe"), None);
        assert_eq!(parse_label("nonsense 5"), None);
    }
}
