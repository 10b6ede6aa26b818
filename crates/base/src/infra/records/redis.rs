//! Records on the shared Redis: one hash of records (`project` newline `key` -> the record's
//! JSON), a count of each project's records in force, a version moved by every write and an
//! epoch naming the data set, all under one hash tag (the write script touches several). A write
//! is a script: kept only when its stamp is newer than the held record's, refused when a new
//! record would pass the project's bound.
//!
//! **A write the gateway gave up on never lands later.** A paused or slow Redis may run a
//! script after the gateway's call budget ran out and the caller was answered `503` ("nothing
//! changed"). So a write first asks Redis its clock (`TIME`) and sends a deadline on that clock,
//! half the budget ahead: the script refuses itself (`late`) once Redis's clock has passed it,
//! and one that ran by its deadline has its reply back well within the budget. Restores (what
//! a gateway puts back after a data loss) carry no deadline: they are idempotent.

use std::marker::PhantomData;
use std::time::Duration;

use super::{Put, Record, RecordStore, RecordsError, Token};
use crate::infra::redis::config::RedisConfig;
use crate::infra::redis::{LazyLink, LinkError, RedisLink};

/// KEYS: rows, live, version, epoch, the project's removals (a sorted set, by stamp).
/// ARGV: field, record JSON, stamp, removed (0/1), project, max (0: no bound), a new epoch, a
/// deadline in ms on Redis's clock (0: none), removal markers kept (0: all). Returns `late`,
/// `stale`, `full`, `created` or `updated`. A removal past the markers kept drops the oldest.
const PUT: &str = r#"
if tonumber(ARGV[8]) > 0 then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[8]) then
    return 'late'
  end
end
local held = redis.call('HGET', KEYS[1], ARGV[1])
local was_live = false
if held then
  local h = cjson.decode(held)
  if tonumber(h.stamp) >= tonumber(ARGV[3]) then return 'stale' end
  was_live = not h.removed
end
local live = ARGV[4] == '0'
if live and not was_live and tonumber(ARGV[6]) > 0 then
  local n = tonumber(redis.call('HGET', KEYS[2], ARGV[5]) or '0')
  if n >= tonumber(ARGV[6]) then return 'full' end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if live and not was_live then redis.call('HINCRBY', KEYS[2], ARGV[5], 1) end
if was_live and not live then redis.call('HINCRBY', KEYS[2], ARGV[5], -1) end
local gone = KEYS[5]
if live then
  redis.call('ZREM', gone, ARGV[1])
else
  redis.call('ZADD', gone, tonumber(ARGV[3]), ARGV[1])
  local keep = tonumber(ARGV[9])
  if keep > 0 then
    local over = redis.call('ZCARD', gone) - keep
    if over > 0 then
      for _, field in ipairs(redis.call('ZRANGE', gone, 0, over - 1)) do
        redis.call('HDEL', KEYS[1], field)
      end
      redis.call('ZREMRANGEBYRANK', gone, 0, over - 1)
    end
  end
end
redis.call('SET', KEYS[4], ARGV[7], 'NX')
redis.call('INCR', KEYS[3])
if was_live then return 'updated' end
return 'created'
"#;

/// The least budget of one call (reading every record is bigger than a counting call, and none
/// of these calls is on a lookup's path).
const MIN_CALL_BUDGET: Duration = Duration::from_secs(1);

/// The Redis store of one kind of record, its keys under `drg:{<kind>}:`.
pub struct RedisRecords<R> {
    link: LazyLink,
    put: ::redis::Script,
    /// rows, live, version, epoch, the removals' prefix.
    keys: [String; 5],
    _records: PhantomData<fn() -> R>,
}

impl<R: Record> RedisRecords<R> {
    /// Nothing is sent before the first call: the gateway starts with Redis away.
    pub fn new(config: &RedisConfig, kind: &str) -> RedisRecords<R> {
        let key = |name: &str| format!("drg:{{{kind}}}:{name}");
        RedisRecords {
            link: LazyLink::new(config, MIN_CALL_BUDGET),
            put: ::redis::Script::new(PUT),
            keys: [
                key("rows"),
                key("live"),
                key("version"),
                key("epoch"),
                key("gone:"),
            ],
            _records: PhantomData,
        }
    }

    async fn link(&self) -> Result<RedisLink, RecordsError> {
        Ok(self.link.get().await?)
    }

    async fn timed<T>(
        &self,
        call: impl std::future::Future<Output = ::redis::RedisResult<T>>,
    ) -> Result<T, RecordsError> {
        self.link.timed(call).await.map_err(|e| match e {
            LinkError::Redis(e) => RecordsError::Redis(e),
            LinkError::TimedOut(ms) => RecordsError::TimedOut(ms),
        })
    }

    /// A deadline half the call budget ahead on Redis's own clock (see the module).
    async fn deadline(&self, link: &mut RedisLink) -> Result<u64, RecordsError> {
        let (secs, micros): (u64, u64) = self.timed(::redis::cmd("TIME").query_async(link)).await?;
        let half = u64::try_from(self.link.budget().as_millis() / 2).unwrap_or(u64::MAX);
        Ok((secs * 1000 + micros / 1000).saturating_add(half.max(1)))
    }

    /// Runs the write script; `bounded`: with a deadline (an API write), else a restore.
    async fn write(&self, record: &R, max: u32, bounded: bool) -> Result<String, RecordsError> {
        let mut link = self.link().await?;
        let deadline = if bounded {
            self.deadline(&mut link).await?
        } else {
            0
        };
        let epoch = format!(
            "{:016x}{:016x}",
            getrandom::u64().unwrap_or_default(),
            getrandom::u64().unwrap_or_default()
        );
        let mut call = self.put.prepare_invoke();
        for k in &self.keys[..4] {
            call.key(k);
        }
        call.key(format!("{}{}", self.keys[4], record.project()));
        call.arg(format!("{}\n{}", record.project(), record.key()))
            .arg(serde_json::to_string(record)?)
            .arg(record.stamp())
            .arg(u8::from(record.removed()))
            .arg(record.project())
            .arg(max)
            .arg(epoch)
            .arg(deadline)
            .arg(if max == 0 {
                0
            } else {
                super::tombstones_kept(max)
            });
        self.timed(call.invoke_async(&mut link)).await
    }
}

#[async_trait::async_trait]
impl<R: Record> RecordStore<R> for RedisRecords<R> {
    async fn put(&self, record: &R, max_live: u32) -> Result<Put, RecordsError> {
        // A bound of 0 is "none allowed": never sent as the script's "no bound".
        if !record.removed() && max_live == 0 {
            return Ok(Put::Full);
        }
        Ok(match self.write(record, max_live, true).await?.as_str() {
            // Redis ran it past its deadline, after this gateway gave up: nothing changed.
            "late" => return Err(RecordsError::TimedOut(self.link.budget().as_millis())),
            "stale" => Put::Stale,
            "full" => Put::Full,
            "created" => Put::Done { created: true },
            _ => Put::Done { created: false },
        })
    }

    async fn token(&self) -> Result<Token, RecordsError> {
        let mut link = self.link().await?;
        let mut cmd = ::redis::cmd("MGET");
        cmd.arg(&self.keys[3]).arg(&self.keys[2]);
        let (epoch, version): (Option<String>, Option<u64>) =
            self.timed(cmd.query_async(&mut link)).await?;
        Ok(match epoch {
            Some(e) => Token::At(format!("{e}:{}", version.unwrap_or(0))),
            None => Token::Lost,
        })
    }

    async fn read(&self) -> Result<Vec<R>, RecordsError> {
        let mut link = self.link().await?;
        let rows: Vec<String> = self
            .timed(
                ::redis::cmd("HVALS")
                    .arg(&self.keys[0])
                    .query_async(&mut link),
            )
            .await?;
        // A record that does not parse (written by hand, another release) is left out.
        Ok(rows
            .iter()
            .filter_map(|r| serde_json::from_str(r).ok())
            .collect())
    }

    async fn restore(&self, records: &[R]) -> Result<(), RecordsError> {
        for r in records {
            self.write(r, 0, false).await?;
        }
        Ok(())
    }
}
