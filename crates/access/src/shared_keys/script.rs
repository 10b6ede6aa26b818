//! The Lua scripts of the shared keys store, each one atomic call on Redis. Every key they touch
//! carries the one hash tag `{keys}` (see [`super::layout`]), so they run on Redis Cluster too.
//!
//! Lineage never leaves a project (a key made by a key is in its maker's project), so the
//! revocation reads the project's few rows only. The version moves by a step each gateway draws
//! at random, not by one: two histories of one data set (a failover to a replica that missed
//! changes, then other changes) then almost never reach the same version, so a gateway that read
//! one of them sees the other as a change.

/// Drops the tombstones of KEYS[5] past their lifetime: `now` and `life` (seconds) are set by
/// the script that includes it. Deletes only, so a Redis over `maxmemory` still runs it.
macro_rules! prune {
    () => {
        r#"
local function prune(revoked, now, life)
  local all = redis.call('HGETALL', revoked)
  for i = 1, #all, 2 do
    local ok, t = pcall(cjson.decode, all[i + 1])
    if ok and type(t) == 'table' and tonumber(t.at) and tonumber(t.at) + life <= now then
      redis.call('HDEL', revoked, all[i])
    end
  end
end
"#
    };
}

/// Makes a key within `max_keys`: KEYS rows, the project's set, version, tombstones; ARGV id,
/// row JSON, the operator's keys of the project, `max_keys`, the version's step. Replies `-1`
/// (the id is taken, or was once: a revoked id is never made again), `0` (the project is full)
/// or the new version. Counting and adding in one script is what keeps `max_keys` exact when
/// gateways make keys at once.
pub const CREATE: &str = r#"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return -1 end
if redis.call('HEXISTS', KEYS[4], ARGV[1]) == 1 then return -1 end
local made = redis.call('SCARD', KEYS[2])
if made + tonumber(ARGV[3]) >= tonumber(ARGV[4]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
return redis.call('INCRBY', KEYS[3], ARGV[5])
"#;

/// Rotates a key: KEYS rows, the project's set, version, tombstones; ARGV the old id, its row
/// as the gateway read it, its row rotated (its overlap's `expires_at`, `rotated_to`), the new
/// id, the new row, the operator's keys of the project, `max_keys`, the version's step.
/// Replies `-3` (no such row: revoked meanwhile), `-2` (the row changed since it was read:
/// rotated elsewhere; read again), `-1` (the new id is taken, or was once), `0` (the project
/// holds more than `max_keys` keys: the old one leaves at its overlap's end, so the successor
/// may take the project one over, not more) or the new version. The row is compared whole, as
/// read: the gateway, not Lua, owns the row's JSON (a newer gateway's fields survive as they
/// are), and two gateways rotating one key at once make one successor. The keys the old key
/// made are handed to the successor (their rows' `created_by`, as the gateway wrote it,
/// compact JSON: replaced as text, the rest of each row kept byte for byte).
pub const ROTATE: &str = r#"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return -3 end
if cur ~= ARGV[2] then return -2 end
if redis.call('HEXISTS', KEYS[1], ARGV[4]) == 1 then return -1 end
if redis.call('HEXISTS', KEYS[4], ARGV[4]) == 1 then return -1 end
local made = redis.call('SCARD', KEYS[2])
if made + tonumber(ARGV[6]) > tonumber(ARGV[7]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[1], ARGV[4], ARGV[5])
local made_by = '"created_by":"' .. ARGV[1] .. '"'
local now_by = '"created_by":"' .. ARGV[4] .. '"'
for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  local row = redis.call('HGET', KEYS[1], id)
  local s, e = nil, nil
  if row and id ~= ARGV[4] then s, e = string.find(row, made_by, 1, true) end
  if s then
    redis.call('HSET', KEYS[1], id, string.sub(row, 1, s - 1) .. now_by .. string.sub(row, e + 1))
  end
end
redis.call('SADD', KEYS[2], ARGV[4])
return redis.call('INCRBY', KEYS[3], ARGV[8])
"#;

/// Revokes a key of a project and every key it made, recursively, each kept as a tombstone:
/// KEYS rows, last-use hash, version, the project's set, tombstones; ARGV id, project, now
/// (unix seconds), the version's step, the tombstones' lifetime (seconds), then the ids the
/// calling gateway knows as the key's lineage (tombstoned also when Redis has no row of them:
/// a Redis that lost its data must not take the revocation with it). Replies the ids of the
/// rows removed (none: no such API-made key in the project; the version then moves only if a
/// known id was tombstoned). In one script, so no gateway ever reads a tree half revoked. The
/// rows go before any tombstone is written: a Redis over `maxmemory` refuses a script's first
/// write unless it frees memory.
pub const REVOKE: &str = concat!(
    prune!(),
    r#"
local now, life = tonumber(ARGV[3]), tonumber(ARGV[5])
local changed = false
local function tomb(id)
  local t = cjson.encode({project = ARGV[2], at = now})
  if redis.call('HSETNX', KEYS[5], id, t) == 1 then changed = true end
end
local ids = redis.call('SMEMBERS', KEYS[4])
local gone = {}
for _, id in ipairs(ids) do
  if id == ARGV[1] then gone[id] = true end
end
local maker = {}
if gone[ARGV[1]] then
  for _, id in ipairs(ids) do
    local row = redis.call('HGET', KEYS[1], id)
    if row then
      local ok, r = pcall(cjson.decode, row)
      if ok and type(r) == 'table' and type(r.created_by) == 'string' then
        maker[id] = r.created_by
      end
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
local removed = {}
for _, id in ipairs(ids) do
  if gone[id] then
    redis.call('HDEL', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('SREM', KEYS[4], id)
    removed[#removed + 1] = id
    changed = true
  end
end
for _, id in ipairs(removed) do tomb(id) end
for i = 6, #ARGV do tomb(ARGV[i]) end
prune(KEYS[5], now, life)
if changed then redis.call('INCRBY', KEYS[3], ARGV[4]) end
return removed
"#
);

/// Everything at one version: KEYS rows, last-use hash, version, epoch, tombstones; ARGV an
/// epoch to set if none is, then the ids the calling gateway knows. Replies {epoch, version,
/// rows as field/value pairs, last uses as pairs, the tombstones of the rows and of the known
/// ids as id/value pairs}: the gateway leaves out any row revoked, and learns the revocations
/// of the keys it knew. It writes only when the epoch is missing: a Redis over `maxmemory`
/// refuses a script's first write, and a poll must still read (a revocation reaches every
/// gateway while Redis is full).
pub const READ: &str = r#"
if redis.call('EXISTS', KEYS[4]) == 0 then redis.call('SET', KEYS[4], ARGV[1]) end
local rows = redis.call('HGETALL', KEYS[1])
local revoked = {}
local function look(id)
  local t = redis.call('HGET', KEYS[5], id)
  if t then
    revoked[#revoked + 1] = id
    revoked[#revoked + 1] = t
  end
end
for i = 1, #rows, 2 do look(rows[i]) end
for i = 2, #ARGV do look(ARGV[i]) end
return {redis.call('GET', KEYS[4]), redis.call('GET', KEYS[3]) or '0',
        rows, redis.call('HGETALL', KEYS[2]), revoked}
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

/// What a gateway does when it finds the store lost data (flushed, evicted, replaced, or gone
/// back to an older state by a failover to a replica that lagged), or a revoked key in it: KEYS
/// rows, last-use hash, version, tombstones, epoch, then the project sets it touches; ARGV now
/// (unix seconds), the version's step, the tombstones' lifetime (seconds), a new epoch ('':
/// keep it), the number of tombstones N, N tombstones (id, value), then the rows to put back
/// (id, row JSON). In this order, in one script: the gateway's tombstones are published (one
/// already there stays); every row a tombstone revokes goes, with what it made, recursively
/// (each tombstoned too); then the rows come back that are not there, not revoked and not made
/// by a revoked key. The version moves by the step when anything changed. Replies {rows put
/// back, rows removed}.
pub const RESTORE: &str = concat!(
    prune!(),
    r#"
local now, life = tonumber(ARGV[1]), tonumber(ARGV[3])
local nt = tonumber(ARGV[5])
local changed = false
local dead = {}
local function dead_in(id, project)
  local p = dead[id]
  return p ~= nil and (p == true or p == project)
end
local function set_of(project) return 'keys:{keys}:project:' .. project end
prune(KEYS[4], now, life)
for i = 6, 5 + 2 * nt, 2 do
  local ok, t = pcall(cjson.decode, ARGV[i + 1])
  if ok and type(t) == 'table' and tonumber(t.at) and tonumber(t.at) + life > now then
    if redis.call('HSETNX', KEYS[4], ARGV[i], ARGV[i + 1]) == 1 then changed = true end
  end
end
local all = redis.call('HGETALL', KEYS[4])
for i = 1, #all, 2 do
  local ok, t = pcall(cjson.decode, all[i + 1])
  if ok and type(t) == 'table' and type(t.project) == 'string' then
    dead[all[i]] = t.project
  else
    dead[all[i]] = true
  end
end
local rows = redis.call('HGETALL', KEYS[1])
local live = {}
for i = 1, #rows, 2 do
  local ok, r = pcall(cjson.decode, rows[i + 1])
  if ok and type(r) == 'table' and type(r.project) == 'string' then live[rows[i]] = r end
end
local removed = 0
local more = true
while more do
  more = false
  for id, r in pairs(live) do
    local by = r.created_by
    if dead_in(id, r.project) or (type(by) == 'string' and dead_in(by, r.project)) then
      redis.call('HDEL', KEYS[1], id)
      redis.call('HDEL', KEYS[2], id)
      redis.call('SREM', set_of(r.project), id)
      if dead[id] == nil then
        redis.call('HSET', KEYS[4], id, cjson.encode({project = r.project, at = now}))
        dead[id] = r.project
      end
      live[id] = nil
      removed = removed + 1
      more = true
      changed = true
    end
  end
end
local back = {}
for i = 6 + 2 * nt, #ARGV, 2 do
  local ok, r = pcall(cjson.decode, ARGV[i + 1])
  if ok and type(r) == 'table' and type(r.project) == 'string' then
    back[#back + 1] = {ARGV[i], ARGV[i + 1], r}
  end
end
more = true
while more do
  more = false
  for _, b in ipairs(back) do
    local by = b[3].created_by
    if not dead_in(b[1], b[3].project)
        and type(by) == 'string' and dead_in(by, b[3].project) then
      dead[b[1]] = b[3].project
      more = true
    end
  end
end
local restored = 0
for _, b in ipairs(back) do
  if not dead_in(b[1], b[3].project) and redis.call('HSETNX', KEYS[1], b[1], b[2]) == 1 then
    redis.call('SADD', set_of(b[3].project), b[1])
    restored = restored + 1
    changed = true
  end
end
if ARGV[4] ~= '' then
  redis.call('SET', KEYS[5], ARGV[4])
  changed = true
end
if changed then redis.call('INCRBY', KEYS[3], ARGV[2]) end
return {restored, removed}
"#
);
