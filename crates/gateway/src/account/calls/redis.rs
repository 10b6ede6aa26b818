//! The shared call store on Redis (with `quota.store: redis`): several gateways, one log.
//!
//! Per project, a stream `calls:{<project>}:log` (one entry per logged call, appended by a
//! script that trims it to about `max_per_project` once a batch; the stream ids are the paging
//! positions, and new entries always get larger ones) and a hash per UTC day `calls:{<project>}:day:<YYYY-MM-DD>` with
//! `total` and `blocked` (expiring after the chart's days). Every command names one key, and all
//! keys of a project share the `{<project>}` hash tag, so the layout is cluster-safe.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, TimeDelta, Utc};

use super::{daily_counts, Call, CallStore, CallsError, DayCount, LogItem, Page, STATS_KEPT_DAYS};
use crate::domain::Reason;
use crate::infra::redis::config::RedisConfig;
use crate::infra::redis::{stream_id_after, RedisLink};

/// Entries read per step of a sweep.
const SWEEP_STEP: usize = 256;
/// Steps of one project's sweep per run (the rest waits for the next run).
const SWEEP_STEPS: usize = 64;

/// Appends calls to a project's log: KEYS the log; ARGV its approximate length bound, its
/// retention (ms), then each call's domain, score, reason and time (ms). Trims the log and sets
/// its expiry once for all. Sent with `EVAL` (a few hundred bytes a batch), so a Redis that lost
/// its script cache (a restart, a failover) never refuses it.
const APPEND: &str = r#"
for i = 3, #ARGV, 4 do
  redis.call('XADD', KEYS[1], '*', 'd', ARGV[i], 's', ARGV[i + 1], 'r', ARGV[i + 2], 't', ARGV[i + 3])
end
redis.call('XTRIM', KEYS[1], 'MAXLEN', '~', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"#;

/// Calls appended by one script call at most (its arguments stay well within Redis's limits).
const CALLS_PER_SCRIPT: usize = 1000;

/// The Redis call store.
pub struct RedisCallStore {
    config: RedisConfig,
    /// Made on first use, inside a runtime (the link spawns its driver task there).
    link: tokio::sync::OnceCell<RedisLink>,
    max_per_project: u64,
}

impl RedisCallStore {
    /// Sets the store up without connecting: the gateway starts when Redis is down.
    pub fn new(config: &RedisConfig, max_per_project: u64) -> Result<Self, CallsError> {
        redis::Client::open(config.url.as_str())?;
        Ok(RedisCallStore {
            config: config.clone(),
            link: tokio::sync::OnceCell::new(),
            max_per_project,
        })
    }

    async fn link(&self) -> Result<RedisLink, CallsError> {
        Ok(self
            .link
            .get_or_try_init(|| async { RedisLink::connect_lazy(&self.config) })
            .await?
            .clone())
    }
}

fn log_key(project: &str) -> String {
    format!("calls:{{{project}}}:log")
}

fn day_key(project: &str, day: NaiveDate) -> String {
    format!("calls:{{{project}}}:day:{}", day.format("%Y-%m-%d"))
}

/// A stream id `<ms>-<seq>`, as Redis makes them.
fn is_stream_id(s: &str) -> bool {
    s.split_once('-').is_some_and(|(ms, seq)| {
        !ms.is_empty()
            && !seq.is_empty()
            && ms.len() <= 20
            && seq.len() <= 20
            && ms.bytes().all(|b| b.is_ascii_digit())
            && seq.bytes().all(|b| b.is_ascii_digit())
    })
}

/// A stream entry: its id and its fields as pairs.
type Entry = (String, Vec<String>);

fn field<'a>(fields: &'a [String], name: &str) -> Option<&'a str> {
    fields
        .chunks_exact(2)
        .find(|kv| kv[0] == name)
        .map(|kv| kv[1].as_str())
}

fn created(fields: &[String]) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(field(fields, "t")?.parse().ok()?)
}

fn item((id, fields): Entry) -> Option<LogItem> {
    Some(LogItem {
        email_domain: field(&fields, "d")?.to_owned(),
        risk_score: field(&fields, "s")?.parse().ok()?,
        reason: field(&fields, "r")?.parse::<Reason>().ok()?,
        created_at: super::created_at(created(&fields)?),
        id,
    })
}

#[async_trait]
impl CallStore for RedisCallStore {
    async fn write(&self, calls: Vec<Call>) -> Result<(), CallsError> {
        // Per project: its calls with a verdict, and the longest retention among its calls.
        let mut projects: BTreeMap<&str, (Vec<&Call>, Duration)> = BTreeMap::new();
        for call in &calls {
            let (logged, retention) = projects.entry(&call.project).or_default();
            *retention = (*retention).max(call.retention);
            if call.verdict.is_some() {
                logged.push(call);
            }
        }
        let keep = (u64::from(STATS_KEPT_DAYS) + 1) * 86_400;
        let daily = daily_counts(&calls);
        let mut link = self.link().await?;
        let mut first_error = None;
        // One pipeline per project: all its keys share the `{project}` tag, so on a cluster a
        // pipeline goes to one master (redis-rs refuses a pipeline spanning slots).
        for (project, (logged, retention)) in &projects {
            let mut pipe = redis::pipe();
            let key = log_key(project);
            // A project that stops calling loses its whole log once its retention has passed.
            let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX / 2);
            // The entries go in a script call or a few (one reply each, not one an entry);
            // each call trims the log and sets its expiry, so one runs with no entry too.
            let chunks: Vec<&[&Call]> = if logged.is_empty() {
                vec![&[]]
            } else {
                logged.chunks(CALLS_PER_SCRIPT).collect()
            };
            for chunk in chunks {
                pipe.cmd("EVAL")
                    .arg(APPEND)
                    .arg(1)
                    .arg(&key)
                    .arg(self.max_per_project)
                    .arg(retention_ms);
                for call in chunk {
                    let Some(v) = call.verdict else { continue };
                    pipe.arg(&*call.email_domain)
                        .arg(v.risk_score)
                        .arg(v.reason.as_str())
                        .arg(call.at.timestamp_millis());
                }
                pipe.ignore();
            }
            for (_, day, total, blocked) in daily.iter().filter(|d| &*d.0 == *project) {
                let key = day_key(project, *day);
                pipe.cmd("HINCRBY")
                    .arg(&key)
                    .arg("total")
                    .arg(*total)
                    .ignore();
                if *blocked > 0 {
                    pipe.cmd("HINCRBY")
                        .arg(&key)
                        .arg("blocked")
                        .arg(*blocked)
                        .ignore();
                }
                pipe.cmd("EXPIRE").arg(&key).arg(keep).ignore();
            }
            if let Err(e) = pipe.query_async::<()>(&mut link).await {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    async fn page(
        &self,
        project: &str,
        before: Option<&str>,
        limit: usize,
        since: DateTime<Utc>,
    ) -> Result<Option<Page>, CallsError> {
        let end = match before {
            None => "+".to_owned(),
            Some(id) if is_stream_id(id) => format!("({id}"),
            Some(_) => return Ok(None),
        };
        let mut link = self.link().await?;
        let entries: Vec<Entry> = redis::cmd("XREVRANGE")
            .arg(log_key(project))
            .arg(end)
            .arg("-")
            .arg("COUNT")
            .arg(limit + 1)
            .query_async(&mut link)
            .await?;
        let mut more = entries.len() > limit;
        let mut items = Vec::with_capacity(limit.min(entries.len()));
        for entry in entries.into_iter().take(limit) {
            // Newest first: the first entry past the retention ends the log.
            if created(&entry.1).is_none_or(|t| t < since) {
                more = false;
                break;
            }
            items.extend(item(entry));
        }
        Ok(Some(Page::of(items, more)))
    }

    async fn days(
        &self,
        project: &str,
        first: NaiveDate,
        last: NaiveDate,
    ) -> Result<Vec<DayCount>, CallsError> {
        let mut dates = Vec::new();
        let mut d = first;
        while d <= last {
            dates.push(d);
            d += TimeDelta::days(1);
        }
        let mut pipe = redis::pipe();
        for d in &dates {
            pipe.cmd("HMGET")
                .arg(day_key(project, *d))
                .arg("total")
                .arg("blocked");
        }
        let mut link = self.link().await?;
        let counts: Vec<(Option<u64>, Option<u64>)> = pipe.query_async(&mut link).await?;
        Ok(dates
            .into_iter()
            .zip(counts)
            .filter_map(|(date, (total, blocked))| {
                Some(DayCount {
                    date,
                    total_requests: total?,
                    blocked_count: blocked.unwrap_or(0),
                })
            })
            .collect())
    }

    /// Trims each known project's stream up to its first entry inside the retention. Logs of
    /// projects no key names any more, and daily hashes, expire on their own.
    async fn sweep(
        &self,
        cutoffs: &[(Arc<str>, DateTime<Utc>)],
        _oldest: DateTime<Utc>,
        _first_day: NaiveDate,
    ) -> Result<u64, CallsError> {
        let mut link = self.link().await?;
        let mut deleted = 0;
        for (project, cutoff) in cutoffs {
            let key = log_key(project);
            for _ in 0..SWEEP_STEPS {
                let oldest: Vec<Entry> = redis::cmd("XRANGE")
                    .arg(&key)
                    .arg("-")
                    .arg("+")
                    .arg("COUNT")
                    .arg(SWEEP_STEP)
                    .query_async(&mut link)
                    .await?;
                let n = oldest.len();
                let first_kept = oldest
                    .iter()
                    .find(|(_, f)| created(f).is_some_and(|t| t >= *cutoff))
                    .map(|(id, _)| id.clone());
                let (keep_from, done) = match first_kept {
                    Some(id) => (Some(id), true),
                    None => (
                        oldest.last().and_then(|(id, _)| stream_id_after(id)),
                        n < SWEEP_STEP,
                    ),
                };
                let Some(keep_from) = keep_from else { break };
                deleted += redis::cmd("XTRIM")
                    .arg(&key)
                    .arg("MINID")
                    .arg(&keep_from)
                    .query_async::<u64>(&mut link)
                    .await?;
                if done {
                    break;
                }
            }
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_ids_and_their_successors() {
        assert!(is_stream_id("1732290000000-0"));
        for bad in ["", "-", "1-", "-1", "1", "a-1", "1-1-1", "+", "(1-1"] {
            assert!(!is_stream_id(bad), "{bad}");
        }
        assert_eq!(stream_id_after("5-7").as_deref(), Some("5-8"));
        assert_eq!(
            stream_id_after(&format!("5-{}", u64::MAX)).as_deref(),
            Some("6-0")
        );
    }

    #[test]
    fn keys_of_a_project_share_its_hash_tag() {
        let day: NaiveDate = "2026-11-22".parse().unwrap();
        assert_eq!(log_key("acme"), "calls:{acme}:log");
        assert_eq!(day_key("acme", day), "calls:{acme}:day:2026-11-22");
    }
}
