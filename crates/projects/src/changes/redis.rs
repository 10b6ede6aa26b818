//! The shared change store on Redis (with `quota.store: redis`): what each project was told,
//! its changes and its sent mark, for every gateway. Per project (all keys share its
//! `{<project>}` hash tag, so every script touches one slot): `chg:{p}:w` (domain ->
//! `reason|score|told_at|seen_at`: what it was told and since when, in unix milliseconds, and
//! its last lookup, in seconds; earlier builds wrote `reason|score|seen_at`), `chg:{p}:r` (its
//! domains spelt backwards, a sorted set: the subdomains of a name are a range), `chg:{p}:log` (a
//! sorted set of the changes' JSON by id), `chg:{p}:seq` (the last id), `chg:{p}:sent` and
//! `chg:{p}:lease`; and the set `chg:projects`. Recording is one script: the compare-and-set on
//! what the project was told, the new id and the append happen together, so two gateways
//! judging the same reload record each change once. Ids come from Redis's clock (`store.rs`),
//! so a `FLUSHALL` never makes one repeat.

use std::time::Duration;

use async_trait::async_trait;

use super::store::{
    covered, reversed, ChangeStore, ChangesError, Pending, Proposed, Recorded, ScanPage,
};
use super::{Change, Seen, Told};
use drg_base::infra::redis::config::RedisConfig;
use drg_base::infra::redis::RedisLink;
use drg_base::infra::units::unix_rfc3339;

const PROJECTS: &str = "chg:projects";
/// Entries read per step when paging a project's log or hash.
const STEP: usize = 1_000;

/// Splits a watched value into `reason|score`, since when it was told (unix ms) and its last
/// lookup (unix s); a value of an earlier build (`reason|score|seen_at`) was told at its lookup.
const FIELDS: &str = r#"
local function fields(v)
  local f = {}
  for part in string.gmatch(v, '[^|]+') do f[#f + 1] = part end
  if #f < 3 then return nil end
  local seen = tonumber(f[#f]) or 0
  local told_at = seen * 1000
  if #f >= 4 then told_at = tonumber(f[3]) or told_at end
  return f[1] .. '|' .. f[2], told_at, seen
end
"#;

/// KEYS: the watched hash, its index. ARGV: the domain, `reason|score` answered, when (unix ms),
/// the cap, the domain spelt backwards.
/// What the project was told moves only forwards in time: a lookup older than it (another
/// gateway's late tick) only counts as a lookup. Microseconds and milliseconds since 1970 are
/// exact in Lua's doubles; they are written with `%d` (`tostring` rounds to 14 digits).
const WATCH: &str = r#"
local told, at = ARGV[2], tonumber(ARGV[3])
local seen = math.floor(at / 1000)
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local was, was_at, was_seen = fields(cur)
  if was and at < was_at then told, at = was, was_at end
  if was and was_seen > seen then seen = was_seen end
elseif redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], told .. '|' .. string.format('%d', at) .. '|' .. string.format('%d', seen))
redis.call('ZADD', KEYS[2], 0, ARGV[5])
return 1
"#;

/// KEYS: the watched hash, the log, the sequence, the sent mark. ARGV: the domain, `from` and
/// `to` (`reason|score`), the change's JSON after its id, when it was found (unix ms). Returns
/// the new id, or -1 when the project was no longer told `from`. The id is Redis's clock in
/// microseconds, or the last id plus one when that is not larger; a sequence that is missing (a
/// project's first change, or Redis lost its data) takes the sent mark with it.
const RECORD: &str = r#"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return -1 end
local was, told_at, seen = fields(cur)
if was ~= ARGV[2] then return -1 end
told_at = math.max(told_at, tonumber(ARGV[5]))
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3] .. '|' .. string.format('%d', told_at) .. '|' .. string.format('%d', seen))
local t = redis.call('TIME')
local id = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[3]) or '')
if not last then
  redis.call('DEL', KEYS[4])
elseif last >= id then
  id = last + 1
end
local text = string.format('%d', id)
redis.call('SET', KEYS[3], text)
redis.call('ZADD', KEYS[2], text, '{"id":' .. text .. ',' .. ARGV[4])
return id
"#;

const MARK_SENT: &str = r#"
if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[1]) or '0') then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
"#;

const LEASE: &str = r#"
local h = redis.call('GET', KEYS[1])
if not h or h == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"#;

fn key(project: &str, part: &str) -> String {
    format!("chg:{{{project}}}:{part}")
}

/// The Redis change store.
pub struct RedisChanges {
    config: RedisConfig,
    link: tokio::sync::OnceCell<RedisLink>,
    watch: redis::Script,
    record: redis::Script,
    mark_sent: redis::Script,
    lease: redis::Script,
}

impl RedisChanges {
    /// Sets the store up without connecting.
    pub fn new(config: &RedisConfig) -> Result<Self, ChangesError> {
        redis::Client::open(config.url.as_str())?;
        Ok(RedisChanges {
            config: config.clone(),
            link: tokio::sync::OnceCell::new(),
            watch: redis::Script::new(&format!("{FIELDS}{WATCH}")),
            record: redis::Script::new(&format!("{FIELDS}{RECORD}")),
            mark_sent: redis::Script::new(MARK_SENT),
            lease: redis::Script::new(LEASE),
        })
    }

    async fn link(&self) -> Result<RedisLink, ChangesError> {
        Ok(self
            .link
            .get_or_try_init(|| async { RedisLink::connect_lazy(&self.config) })
            .await?
            .clone())
    }

    /// The changes of `project` with ids in `(after, ..]`, `STEP` at a time, each page
    /// handed to `each` until it says stop.
    async fn each_change(
        &self,
        project: &str,
        after: u64,
        mut each: impl FnMut(Change) -> bool + Send,
    ) -> Result<(), ChangesError> {
        let mut link = self.link().await?;
        let log = key(project, "log");
        let mut from = after;
        loop {
            // With the scores: the next page starts after the last id read, also when a whole
            // page is members this version cannot read (skipped, never read again forever).
            let page: Vec<(String, u64)> = redis::cmd("ZRANGEBYSCORE")
                .arg(&log)
                .arg(format!("({from}"))
                .arg("+inf")
                .arg("WITHSCORES")
                .arg("LIMIT")
                .arg(0)
                .arg(STEP)
                .query_async(&mut link)
                .await?;
            let full = page.len() == STEP;
            for (member, id) in page {
                from = from.max(id);
                let Some(change) = change_of(&member, id) else {
                    continue;
                };
                if !each(change) {
                    return Ok(());
                }
            }
            if !full {
                return Ok(());
            }
        }
    }
}

/// A change of the log, its id taken from its score: an earlier build wrote the member's id
/// with Lua's `tostring`, which rounds an id of 16 digits (`1.7800000000000e+15`).
fn change_of(member: &str, id: u64) -> Option<Change> {
    let mut json: serde_json::Value = serde_json::from_str(member).ok()?;
    json.as_object_mut()?.insert("id".into(), id.into());
    serde_json::from_value(json).ok().map(Change::with_basis)
}

/// The change's JSON after `{"id":N,` (the script puts the id in front).
fn json_rest(ch: &Proposed) -> String {
    let rest = serde_json::json!({
        "domain": ch.domain,
        "from": ch.from.reason,
        "to": ch.to.reason,
        "score_from": ch.from.score,
        "score_to": ch.to.score,
        "rule": ch.rule,
        "basis": ch.basis,
        "changed_at": unix_rfc3339(ch.at()),
        "dataset_version": ch.dataset_version,
    })
    .to_string();
    rest[1..].to_owned()
}

fn unix(rfc: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(rfc).map_or(0, |t| t.timestamp())
}

#[async_trait]
impl ChangeStore for RedisChanges {
    async fn watch(&self, seen: Vec<Seen>, cap: u32) -> Result<u64, ChangesError> {
        let mut link = self.link().await?;
        let mut pipe = redis::pipe();
        let mut projects: Vec<&str> = Vec::new();
        for s in &seen {
            if !projects.contains(&&*s.project) {
                projects.push(&s.project);
            }
            let mut call = self.watch.key(key(&s.project, "w"));
            call.key(key(&s.project, "r"))
                .arg(&*s.domain)
                .arg(s.told.encode())
                .arg(s.at_ms)
                .arg(cap)
                .arg(reversed(&s.domain));
            pipe.invoke_script(&call);
        }
        let taken: Vec<u8> = match pipe.query_async(&mut link).await {
            Ok(t) => t,
            // A pipeline sends EVALSHA only: the script is loaded (a new or flushed Redis) and
            // the pipeline sent once more.
            Err(_) => {
                self.watch.prepare_invoke().load_async(&mut link).await?;
                pipe.query_async(&mut link).await?
            }
        };
        let _: () = redis::cmd("SADD")
            .arg(PROJECTS)
            .arg(&projects)
            .query_async(&mut link)
            .await?;
        Ok(taken.iter().filter(|t| **t == 0).count() as u64)
    }

    async fn projects(&self) -> Result<Vec<String>, ChangesError> {
        let mut link = self.link().await?;
        Ok(redis::cmd("SMEMBERS")
            .arg(PROJECTS)
            .query_async(&mut link)
            .await?)
    }

    async fn scan(&self, project: &str, cursor: &str, n: usize) -> Result<ScanPage, ChangesError> {
        let mut link = self.link().await?;
        let at: u64 = cursor.parse().unwrap_or(0);
        let (next, pairs): (u64, Vec<(String, String)>) = redis::cmd("HSCAN")
            .arg(key(project, "w"))
            .arg(at)
            .arg("COUNT")
            .arg(n)
            .query_async(&mut link)
            .await?;
        let page = pairs
            .into_iter()
            .filter_map(|(d, v)| Some((d, Told::decode(&v)?)))
            .collect();
        Ok((page, (next != 0).then(|| next.to_string())))
    }

    /// Each name by the hash and its subdomains by a range of the index; an index that does
    /// not hold as many names as the hash (entries an earlier build watched or swept) is made
    /// again from the whole hash first ([`RedisChanges::reindex`]). An index as large but not
    /// the same (an earlier build both watched and swept meanwhile) may miss a name: the next
    /// pass judges it.
    async fn watched_under(
        &self,
        project: &str,
        names: &[String],
    ) -> Result<Vec<(String, Told)>, ChangesError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut link = self.link().await?;
        let (w, r) = (key(project, "w"), key(project, "r"));
        let (held, indexed): (u64, u64) = redis::pipe()
            .cmd("HLEN")
            .arg(&w)
            .cmd("ZCARD")
            .arg(&r)
            .query_async(&mut link)
            .await?;
        if held != indexed {
            return self.reindex(project, names).await;
        }
        let mut pipe = redis::pipe();
        for n in names {
            let rev = reversed(n);
            pipe.cmd("ZRANGEBYLEX")
                .arg(&r)
                .arg(format!("({rev}."))
                .arg(format!("({rev}/"));
        }
        let under: Vec<Vec<String>> = pipe.query_async(&mut link).await?;
        let mut domains: std::collections::BTreeSet<String> = names.iter().cloned().collect();
        domains.extend(under.iter().flatten().map(|m| reversed(m)));
        let domains: Vec<String> = domains.into_iter().collect();
        let mut out = Vec::new();
        for chunk in domains.chunks(STEP) {
            let values: Vec<Option<String>> = redis::cmd("HMGET")
                .arg(&w)
                .arg(chunk)
                .query_async(&mut link)
                .await?;
            out.extend(
                (chunk.iter().zip(values))
                    .filter_map(|(d, v)| Some((d.clone(), Told::decode(&v?)?))),
            );
        }
        Ok(out)
    }

    async fn record(&self, project: &str, change: &Proposed) -> Result<Recorded, ChangesError> {
        let mut link = self.link().await?;
        let mut call = self.record.prepare_invoke();
        for part in ["w", "log", "seq", "sent"] {
            call.key(key(project, part));
        }
        call.arg(&change.domain)
            .arg(change.from.encode())
            .arg(change.to.encode())
            .arg(json_rest(change))
            .arg(change.at_ms);
        let id: i64 = call.invoke_async(&mut link).await?;
        Ok(match u64::try_from(id) {
            Ok(id) if id > 0 => Recorded::New(id),
            _ => Recorded::Stale,
        })
    }

    async fn list(
        &self,
        project: &str,
        after: u64,
        since: i64,
        n: usize,
    ) -> Result<Vec<Change>, ChangesError> {
        let mut out = Vec::new();
        self.each_change(project, after, |c| {
            if unix(&c.changed_at) >= since {
                out.push(c);
            }
            out.len() < n
        })
        .await?;
        Ok(out)
    }

    async fn sent_upto(&self, project: &str) -> Result<u64, ChangesError> {
        let mut link = self.link().await?;
        let v: Option<u64> = redis::cmd("GET")
            .arg(key(project, "sent"))
            .query_async(&mut link)
            .await?;
        Ok(v.unwrap_or(0))
    }

    async fn pending(&self, project: &str, after: u64, upto: u64) -> Result<Pending, ChangesError> {
        let mut p = Pending::default();
        self.each_change(project, after, |c| {
            if c.id > upto {
                return false;
            }
            p.total += 1;
            p.last_id = p.last_id.max(c.id);
            *p.transitions
                .entry(format!("{}->{}", c.from.as_str(), c.to.as_str()))
                .or_default() += 1;
            true
        })
        .await?;
        Ok(p)
    }

    async fn mark_sent(&self, project: &str, upto: u64) -> Result<(), ChangesError> {
        let mut link = self.link().await?;
        let mut call = self.mark_sent.key(key(project, "sent"));
        call.arg(upto);
        let _: u8 = call.invoke_async(&mut link).await?;
        Ok(())
    }

    async fn lease(
        &self,
        project: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, ChangesError> {
        let mut link = self.link().await?;
        let mut call = self.lease.key(key(project, "lease"));
        call.arg(holder).arg(ttl.as_millis().max(1) as u64);
        let won: u8 = call.invoke_async(&mut link).await?;
        Ok(won == 1)
    }

    async fn sweep(
        &self,
        cutoffs: &[(String, i64)],
        other: i64,
        changes_before: i64,
    ) -> Result<u64, ChangesError> {
        let mut n = 0;
        for project in self.projects().await? {
            let cutoff = cutoffs
                .iter()
                .find(|(p, _)| *p == project)
                .map_or(other, |(_, c)| *c);
            n += self.sweep_project(&project, cutoff, changes_before).await?;
        }
        Ok(n)
    }
}

/// One page of the hash `key` from `cursor`: the next cursor (0: done) and its pairs.
async fn hscan(
    link: &mut RedisLink,
    key: &str,
    cursor: u64,
) -> Result<(u64, Vec<(String, String)>), ChangesError> {
    Ok(redis::cmd("HSCAN")
        .arg(key)
        .arg(cursor)
        .arg("COUNT")
        .arg(STEP)
        .query_async(link)
        .await?)
}

impl RedisChanges {
    /// `project`'s index of watched names (`chg:{p}:r`) made again from the whole hash (the
    /// hash paged once), and the watched names `names` cover, found on the way. A name watched
    /// or swept meanwhile leaves the two apart again: the next call makes it again.
    async fn reindex(
        &self,
        project: &str,
        names: &[String],
    ) -> Result<Vec<(String, Told)>, ChangesError> {
        let mut link = self.link().await?;
        let (w, r) = (key(project, "w"), key(project, "r"));
        let mut all: std::collections::BTreeMap<String, String> = Default::default();
        let mut cursor = 0u64;
        loop {
            let (next, pairs) = hscan(&mut link, &w, cursor).await?;
            all.extend(pairs);
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        let members: Vec<String> = all.keys().flat_map(|d| ["0".into(), reversed(d)]).collect();
        // Not a transaction (a cluster's pipeline may not hold one): a call in between finds
        // the two apart, and makes the index again.
        let mut pipe = redis::pipe();
        pipe.del(&r);
        for chunk in members.chunks(2 * STEP) {
            pipe.cmd("ZADD").arg(&r).arg(chunk);
        }
        let _: () = pipe.query_async(&mut link).await?;
        Ok((all.into_iter())
            .filter(|(d, _)| covered(names, d))
            .filter_map(|(d, v)| Some((d, Told::decode(&v)?)))
            .collect())
    }

    /// One project's sweep: watched domains not seen since `cutoff`, changes before
    /// `changes_before`.
    async fn sweep_project(
        &self,
        project: &str,
        cutoff: i64,
        changes_before: i64,
    ) -> Result<u64, ChangesError> {
        let mut link = self.link().await?;
        let w = key(project, "w");
        let mut n = 0;
        let mut cursor = 0u64;
        loop {
            let (next, pairs) = hscan(&mut link, &w, cursor).await?;
            let old: Vec<&String> = pairs
                .iter()
                .filter(|(_, v)| {
                    v.rsplit('|')
                        .next()
                        .and_then(|s| s.parse::<i64>().ok())
                        .is_none_or(|seen| seen < cutoff)
                })
                .map(|(d, _)| d)
                .collect();
            if !old.is_empty() {
                let rev: Vec<String> = old.iter().map(|d| reversed(d)).collect();
                let _: () = redis::pipe()
                    .cmd("HDEL")
                    .arg(&w)
                    .arg(&old)
                    .cmd("ZREM")
                    .arg(key(project, "r"))
                    .arg(&rev)
                    .query_async(&mut link)
                    .await?;
                n += old.len() as u64;
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        let mut old_upto = None;
        self.each_change(project, 0, |c| {
            let old = unix(&c.changed_at) < changes_before;
            if old {
                old_upto = Some(c.id);
            }
            old
        })
        .await?;
        if let Some(upto) = old_upto {
            let removed: u64 = redis::cmd("ZREMRANGEBYSCORE")
                .arg(key(project, "log"))
                .arg("-inf")
                .arg(upto)
                .query_async(&mut link)
                .await?;
            n += removed;
        }
        Ok(n)
    }
}
