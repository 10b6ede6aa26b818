//! The shared change store on Redis (with `quota.store: redis`): what each project was told,
//! its changes and its sent mark, for every gateway. Per project (all keys share its
//! `{<project>}` hash tag, so every script touches one slot): `chg:{p}:w` (domain ->
//! `reason|score|seen_at`), `chg:{p}:log` (a sorted set of the changes' JSON by id),
//! `chg:{p}:seq`, `chg:{p}:sent` and `chg:{p}:lease`; and the set `chg:projects`. Recording is
//! one script: the compare-and-set on what the project was told and the append happen together,
//! so two gateways judging the same reload record each change once.

use std::time::Duration;

use async_trait::async_trait;

use super::store::{rfc3339, ChangeStore, ChangesError, Pending, Proposed, Recorded, ScanPage};
use super::{Change, Seen, Told};
use crate::infra::redis::config::RedisConfig;
use crate::infra::redis::RedisLink;

const PROJECTS: &str = "chg:projects";
/// Entries read per step when paging a project's log or hash.
const STEP: usize = 1_000;

const WATCH: &str = r#"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"#;

const RECORD: &str = r#"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur then return -1 end
local a = string.find(cur, '|', 1, true)
local b = a and string.find(cur, '|', a + 1, true)
if not b then return -1 end
if string.sub(cur, 1, b - 1) ~= ARGV[2] then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3] .. string.sub(cur, b))
local id = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[2], id, '{"id":' .. id .. ',' .. ARGV[4])
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
            watch: redis::Script::new(WATCH),
            record: redis::Script::new(RECORD),
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
                let Ok(change) = serde_json::from_str::<Change>(&member) else {
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

/// The change's JSON after `{"id":N,` (the script puts the id in front).
fn json_rest(ch: &Proposed) -> String {
    let rest = serde_json::json!({
        "domain": ch.domain,
        "from": ch.from.reason,
        "to": ch.to.reason,
        "score_from": ch.from.score,
        "score_to": ch.to.score,
        "rule": ch.rule,
        "changed_at": rfc3339(ch.at),
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
            call.arg(&*s.domain)
                .arg(format!("{}|{}", s.told.encode(), s.at))
                .arg(cap);
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

    async fn record(&self, project: &str, change: &Proposed) -> Result<Recorded, ChangesError> {
        let mut link = self.link().await?;
        let mut call = self.record.prepare_invoke();
        for part in ["w", "log", "seq"] {
            call.key(key(project, part));
        }
        call.arg(&change.domain)
            .arg(change.from.encode())
            .arg(change.to.encode())
            .arg(json_rest(change));
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

    async fn pending(&self, project: &str, after: u64) -> Result<Pending, ChangesError> {
        let mut p = Pending::default();
        self.each_change(project, after, |c| {
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

impl RedisChanges {
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
            let (next, pairs): (u64, Vec<(String, String)>) = redis::cmd("HSCAN")
                .arg(&w)
                .arg(cursor)
                .arg("COUNT")
                .arg(STEP)
                .query_async(&mut link)
                .await?;
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
                let _: () = redis::cmd("HDEL")
                    .arg(&w)
                    .arg(&old)
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
