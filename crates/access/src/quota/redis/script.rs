//! The one Lua script every counting call runs: settle earlier batches by id, add the carried
//! counts, count the call (or reserve a lease) under the limit, in one round trip.
//!
//! A call that adds anything records what it added under its id, in a marker key
//! `q:{<key_id>}:<YYYY-MM>:op:<id>`, created only if absent. A call whose reply never came is sent
//! again later as a batch under the same id: if the marker holds a number, the call ran, and the
//! batch only corrects its contribution to the counts it carried; otherwise the batch applies
//! them and leaves the marker `=n` so that the call, should it still arrive, does nothing. Either
//! way each id lands once. Markers of answered calls are deleted by the next call (so about the
//! calls in flight have one), the others expire with the count.
//!
//! Marker keys are named inside the script; they carry the count's `{hash tag}`, so on Redis
//! Cluster they live in the slot of the keys the script declares, which Redis allows.
//!
//! A count that is missing while the calling gateway has seen it above zero this month was
//! flushed or evicted (a count only grows, or shrinks by leases given back, and lives until its
//! month's end): it is set back to what the gateway saw before the call is counted, and the reply
//! says so. Each count has an era (`...:op:e`, `"<epoch> <taken>"`): the epoch names this life of
//! the count (the id of the call that made it) and `taken` the highest pre-loss count put back
//! into it. Every gateway sends the epoch its last-seen count was read in; one whose reading is
//! from an earlier epoch, and higher than `taken`, raises the count by the difference. So a count
//! lost and restored ends at the highest value any gateway had seen before the loss, plus the
//! calls since, whichever gateway called first; nothing is counted twice. What other gateways
//! counted after their last reading and before the loss is lost.
//!
//! Upgrade from names without the tag: on a single server (or Sentinel) the first call of a month
//! on a key whose tagged count does not exist yet adopts the untagged one (`q:<key_id>:<month>`),
//! so this month's counts carry over (a cluster never had untagged names).

use redis::{Cmd, Script, ScriptInvocation, ToRedisArgs};

use super::slots::{Carry, Slot};

/// KEYS: the count, the marker prefix, optionally the count's untagged name. ARGV: limit, ttl
/// (seconds, relative so that clock skew with Redis does not matter), want (0: add only; 1: one
/// call; more: a lease of that many, else one call; -n: a batch of n calls, all or none, which
/// answers as a lease), this call's id (also the epoch of a count it makes), its carried delta,
/// the count this gateway last saw (the floor of a count found missing), the number of batches,
/// the epoch that count was read in (0: unknown), the batches (id, delta), then ids whose
/// markers can go. Returns {outcome (0 not counted, 1 one call, 2 the lease, 3 ran before),
/// count after the call, batches whose call had run, calls put back into a count found missing
/// or raised to (0: none), the count's epoch}.
const CONSUME: &str = r#"
local count, op = KEYS[1], KEYS[2]
local ttl = ARGV[2]
local add, late, i = 0, 0, 9
for _ = 1, tonumber(ARGV[7]) do
  local marker, delta = op .. ARGV[i], tonumber(ARGV[i + 1])
  local before = redis.call('GET', marker)
  if not before then
    add = add + delta
  elseif string.sub(before, 1, 1) ~= '=' then
    add = add + delta - tonumber(before)
    late = late + 1
  end
  redis.call('SET', marker, '=' .. delta, 'EX', ttl)
  i = i + 2
end
local stored = redis.call('GET', count)
if not stored and KEYS[3] then
  stored = redis.call('GET', KEYS[3])
  if stored then
    redis.call('SET', count, stored, 'EX', ttl)
    redis.call('DEL', KEYS[3])
  end
end
local era, floor, seen_in = op .. 'e', tonumber(ARGV[6]), ARGV[8]
local epoch, taken
local held = redis.call('GET', era)
if held then epoch, taken = string.match(held, '^(%S+) (%d+)$') end
local restored = 0
if not stored then
  epoch, taken = ARGV[4], 0
  if floor > 0 then
    restored, taken = floor, floor
    redis.call('SET', count, floor, 'EX', ttl)
    stored = tostring(floor)
  end
  redis.call('SET', era, epoch .. ' ' .. taken, 'EX', ttl)
elseif not epoch then
  epoch = ARGV[4]
  redis.call('SET', era, epoch .. ' ' .. stored, 'EX', ttl)
elseif seen_in ~= '0' and seen_in ~= epoch and floor > tonumber(taken) then
  restored = floor
  stored = tostring(redis.call('INCRBY', count, floor - tonumber(taken)))
  redis.call('SET', era, epoch .. ' ' .. floor, 'KEEPTTL')
end
local used = tonumber(stored or '0')
local limit, want, mine = tonumber(ARGV[1]), tonumber(ARGV[3]), tonumber(ARGV[5])
local outcome = 0
if want < 0 then
  if used + add + mine - want <= limit then outcome, mine = 2, mine - want end
elseif want > 1 and used + add + mine + want <= limit then
  outcome, mine = 2, mine + want
elseif want > 0 and used + add + mine < limit then
  outcome, mine = 1, mine + 1
end
if mine ~= 0 and not redis.call('SET', op .. ARGV[4], mine, 'NX', 'EX', ttl) then
  outcome, mine = 3, 0
end
add = add + mine
if add ~= 0 then used = redis.call('INCRBY', count, add) end
if #ARGV >= i then
  local done = {}
  for j = i, #ARGV do done[#done + 1] = op .. ARGV[j] end
  redis.call('DEL', unpack(done))
end
if not stored then redis.call('EXPIRE', count, ttl) end
return {outcome, used, late, restored, epoch}
"#;

pub fn script() -> Script {
    Script::new(CONSUME)
}

/// What the script did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// At the limit: the call was not counted.
    NotCounted,
    Counted,
    /// The lease was reserved (the call takes its first).
    Leased,
    /// The id had run already, or a retry settled it: the call added nothing of its own (only a
    /// call sent twice, or answered after it gave up, sees this).
    RanBefore,
}

/// The script's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub outcome: Outcome,
    /// The count after the call.
    pub used: u64,
    /// Carried batches whose call had run after all (their reply was lost).
    pub late: u64,
    /// The count was missing (flushed, evicted) and was set back to this, what this gateway
    /// had seen, or was raised to it (a reading from before the loss above what the restore
    /// took); 0 when neither.
    pub restored: u64,
    /// The count's epoch: which life of it `used` was read in.
    pub epoch: u64,
}

impl redis::FromRedisValue for Reply {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        let (outcome, used, late, restored, epoch): (u8, i64, u64, u64, u64) =
            redis::FromRedisValue::from_redis_value(v)?;
        Ok(Reply {
            outcome: match outcome {
                0 => Outcome::NotCounted,
                1 => Outcome::Counted,
                2 => Outcome::Leased,
                _ => Outcome::RanBefore,
            },
            // Giving back leases of a key that expired meanwhile can take it below zero.
            used: used.max(0) as u64,
            late,
            restored,
            epoch,
        })
    }
}

/// The script's keys: the count, the marker prefix and, with `legacy`, the untagged count.
fn keys(slot: &Slot, legacy: bool) -> Vec<&str> {
    let mut keys = vec![slot.count_key.as_str(), slot.marker_prefix.as_str()];
    if legacy {
        keys.push(&slot.legacy_count_key);
    }
    keys
}

/// The script's arguments for `carry`.
fn args(carry: &Carry, limit: u64, ttl_seconds: i64) -> Vec<Vec<u8>> {
    let mut args = Vec::with_capacity(8 + 2 * carry.unsure.len() + carry.applied.len());
    // The local calls Redis may lack count against the limit all the same.
    args.extend(limit.saturating_sub(carry.local).to_redis_args());
    args.extend(ttl_seconds.to_redis_args());
    if carry.exact {
        args.extend((-i64::try_from(carry.want).unwrap_or(i64::MAX)).to_redis_args());
    } else {
        args.extend(carry.want.to_redis_args());
    }
    args.extend(carry.id.to_redis_args());
    args.extend(carry.delta().to_redis_args());
    args.extend(carry.floor.to_redis_args());
    args.extend(carry.unsure.len().to_redis_args());
    args.extend(carry.floor_epoch.to_redis_args());
    for batch in &carry.unsure {
        args.extend(batch.id.to_redis_args());
        args.extend(batch.delta().to_redis_args());
    }
    for id in &carry.applied {
        args.extend(id.to_redis_args());
    }
    args
}

/// The script call for `carry` on `slot` (`legacy`: may adopt the untagged count).
pub fn invocation<'a>(
    script: &'a Script,
    slot: &Slot,
    carry: &Carry,
    limit: u64,
    ttl_seconds: i64,
    legacy: bool,
) -> ScriptInvocation<'a> {
    let mut call = script.prepare_invoke();
    for key in keys(slot, legacy) {
        call.key(key);
    }
    call.arg(args(carry, limit, ttl_seconds));
    call
}

/// The same call as one `EVALSHA` command, to send in a pipeline (the caller loads the script
/// on `NOSCRIPT`).
pub fn command(
    script: &Script,
    slot: &Slot,
    carry: &Carry,
    limit: u64,
    ttl_seconds: i64,
    legacy: bool,
) -> Cmd {
    let keys = keys(slot, legacy);
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash())
        .arg(keys.len())
        .arg(keys)
        .arg(args(carry, limit, ttl_seconds));
    cmd
}
