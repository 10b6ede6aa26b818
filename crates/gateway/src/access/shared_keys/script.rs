//! The Lua scripts of the shared keys store, each one atomic call on Redis. Every key they touch
//! carries the one hash tag `{keys}` (see [`super::layout`]), so they run on Redis Cluster too.
//!
//! Lineage never leaves a project (a key made by a key is in its maker's project), so the
//! revocation reads the project's few rows only.

/// Makes a key within `max_keys`: KEYS rows, the project's set, version; ARGV id, row JSON,
/// the operator's keys of the project, `max_keys`. Replies `-1` (the id is taken), `0` (the
/// project is full) or the new version. Counting and adding in one script is what keeps
/// `max_keys` exact when gateways make keys at once.
pub const CREATE: &str = r#"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return -1 end
local made = redis.call('SCARD', KEYS[2])
if made + tonumber(ARGV[3]) >= tonumber(ARGV[4]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
return redis.call('INCR', KEYS[3])
"#;

/// Revokes a key of a project and every key it made, recursively: KEYS rows, last-use hash,
/// version, the project's set; ARGV id. Replies how many keys went (0: no such API-made key in
/// the project; the version then stays). In one script, so no gateway ever reads a tree half
/// revoked.
pub const REVOKE: &str = r#"
local ids = redis.call('SMEMBERS', KEYS[4])
local gone = {}
local found = false
for _, id in ipairs(ids) do
  if id == ARGV[1] then found = true end
end
if not found then return 0 end
gone[ARGV[1]] = true
local maker = {}
for _, id in ipairs(ids) do
  local row = redis.call('HGET', KEYS[1], id)
  if row then
    local ok, r = pcall(cjson.decode, row)
    if ok and type(r) == 'table' and type(r.created_by) == 'string' then
      maker[id] = r.created_by
    end
  end
end
local more = true
while more do
  more = false
  for _, id in ipairs(ids) do
    if not gone[id] and maker[id] and gone[maker[id]] then
      gone[id] = true
      more = true
    end
  end
end
local n = 0
for _, id in ipairs(ids) do
  if gone[id] then
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('SREM', KEYS[4], id)
    n = n + 1
  end
end
redis.call('INCR', KEYS[3])
return n
"#;

/// Everything at one version: KEYS rows, last-use hash, version, epoch; ARGV an epoch to set
/// if none is. Replies {epoch, version, rows as field/value pairs, last uses as pairs}. It
/// writes only when the epoch is missing: a Redis over `maxmemory` refuses a script's first
/// write, and a poll must still read (a revocation reaches every gateway while Redis is full).
pub const READ: &str = r#"
if redis.call('EXISTS', KEYS[4]) == 0 then redis.call('SET', KEYS[4], ARGV[1]) end
return {redis.call('GET', KEYS[4]), redis.call('GET', KEYS[3]) or '0',
        redis.call('HGETALL', KEYS[1]), redis.call('HGETALL', KEYS[2])}
"#;

/// Records last uses, the later time winning: KEYS last-use hash, rows; ARGV id, unix seconds,
/// ... Keys no longer in `rows` (revoked meanwhile) are skipped. The version stays: a last use
/// is no change of the keys in service.
pub const SAVE_USED: &str = r#"
for i = 1, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 1 then
    local t = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
    if tonumber(ARGV[i + 1]) > t then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
  end
end
return 1
"#;

/// Puts back rows a gateway knew after the store lost them (flushed, evicted, replaced):
/// KEYS rows, version, then each row's project set; ARGV id, row JSON, ... in the same order.
/// A row already there stays as it is (another gateway restored it, or it was made again);
/// the version is bumped when any row came back. Replies how many did.
pub const RESTORE: &str = r#"
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    redis.call('SADD', KEYS[2 + (i + 1) / 2], ARGV[i])
    n = n + 1
  end
end
if n > 0 then redis.call('INCR', KEYS[2]) end
return n
"#;
