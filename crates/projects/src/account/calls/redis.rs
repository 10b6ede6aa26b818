//! The shared call store on Redis (with `quota.store: redis`): several gateways, one log.
//!
//! Per project, a stream `calls:{<project>}:log` whose entries are chunks of up to
//! [`CALLS_PER_CHUNK`] calls (`n` the calls, `t` the newest call's time in ms, `c` a line of
//! text a call: time, score, reason, domain), and `calls:{<project>}:kept`, the calls the stream
//! holds. A batch's chunks are appended by one script, which also drops whole oldest chunks
//! while the rest still holds `max_per_project` calls. A call is `<stream id>/<index>`, the
//! paging position; new chunks always get larger ids. An entry a call each, as earlier builds
//! wrote (fields `d`, `s`, `r`, `t`), is read as a chunk of one; and an earlier build sharing the
//! Redis during an upgrade reads a chunk as an entry it skips (text, with the `t` its sweep
//! reads), not as an error. Per UTC day a hash
//! `calls:{<project>}:day:<YYYY-MM-DD>` with `total` and `blocked` (expiring after the chart's
//! days). Every command names keys of one project only, and all share the `{<project>}` hash
//! tag, so the layout is cluster-safe.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, TimeDelta, Utc};

use super::chunk::{self, Stored};
use super::{daily_counts, Call, CallStore, CallsError, DayCount, LogItem, Page, STATS_KEPT_DAYS};
use drg_base::infra::redis::config::RedisConfig;
use drg_base::infra::redis::RedisLink;
use drg_domain::Reason;

/// Oldest entries looked at per step of a sweep.
const SWEEP_STEP: usize = 256;
/// Steps of one project's sweep per run (the rest waits for the next run).
const SWEEP_STEPS: usize = 64;
/// Calls in one stream entry at most. An entry a call cost Redis 1.4-1.8 us of script time a
/// call (1,000 calls appended and trimmed in 1.43-1.82 ms, `INFO commandstats`); chunks of 128,
/// 0.26-0.31 us, trimming included.
const CALLS_PER_CHUNK: usize = 128;
/// Chunks appended by one script call at most (its arguments stay well within Redis's limits).
const CHUNKS_PER_SCRIPT: usize = 16;
/// Entries read by a page's first step: a busy project's few chunks hold a page.
const PAGE_FIRST_STEP: usize = 4;
/// Entries read by a later step at most: a quiet project's chunks hold a call or two each.
const PAGE_STEP_MAX: usize = 64;
/// Entries a page reads at most: entries that hold no call of ours (written by something else)
/// would otherwise keep it reading.
const PAGE_SCAN_MAX: usize = 4096;

/// The calls of a stream entry and its newest call's time (`t`): a chunk's `n` (a whole number
/// up to 128), an entry of earlier builds one call. Anything else is no call of ours, at time 0.
const ENTRY_CALLS: &str = r#"
local function calls_of(f)
  local n, t, d = nil, nil, false
  for j = 1, #f, 2 do
    if f[j] == 'n' then n = f[j + 1] elseif f[j] == 't' then t = tonumber(f[j + 1])
    elseif f[j] == 'd' then d = true end
  end
  if t == nil or t ~= t or t == math.huge or t == -math.huge then return 0, 0 end
  if n then
    if string.match(n, '^%d%d?%d?$') and tonumber(n) <= 128 then return tonumber(n), t end
    return 0, 0
  end
  if d then return 1, t end
  return 0, 0
end
"#;

/// Appends chunks to a project's log: KEYS the log and its count of calls; ARGV the calls kept
/// at least, the retention (ms), then each chunk's calls, newest time (ms) and encoded calls.
/// Then drops whole oldest chunks while the rest still holds the calls to keep, and sets both
/// keys' expiry. A log gone (expired, evicted, flushed) restarts the count; a log without one
/// (written by an earlier build, an entry a call; or its count evicted alone) starts from its
/// length, exact for the former and at most low for the latter; a count that claims more than
/// the log holds is corrected when the log runs out. Sent with `EVAL`, so a Redis that lost its
/// script cache (a restart, a failover) never refuses it.
const APPEND: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[2])
elseif redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('SET', KEYS[2], redis.call('XLEN', KEYS[1]))
end
local added = 0
for i = 3, #ARGV, 3 do
  redis.call('XADD', KEYS[1], '*', 'n', ARGV[i], 't', ARGV[i + 1], 'c', ARGV[i + 2])
  added = added + tonumber(ARGV[i])
end
local kept = redis.call('INCRBY', KEYS[2], added)
if kept < 0 then kept = 0 end
local keep = tonumber(ARGV[1])
while kept > keep do
  local oldest = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 32)
  if #oldest == 0 then kept = 0 break end
  local gone = {}
  for _, e in ipairs(oldest) do
    local n = calls_of(e[2])
    if kept - n < keep then break end
    kept = kept - n
    gone[#gone + 1] = e[1]
  end
  if #gone == 0 then break end
  redis.call('XDEL', KEYS[1], unpack(gone))
  if #gone < #oldest then break end
end
redis.call('SET', KEYS[2], kept)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"#;

/// One step of a sweep: drops the oldest entries whose newest call is before ARGV[1] (ms), at
/// most ARGV[2] of them, from the log (KEYS[1]) and its count (KEYS[2]). Returns the calls
/// dropped and whether more may follow.
const SWEEP: &str = r#"
local oldest = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', ARGV[2])
local cutoff = tonumber(ARGV[1])
local gone, calls = {}, 0
for _, e in ipairs(oldest) do
  local n, t = calls_of(e[2])
  if t >= cutoff then break end
  gone[#gone + 1] = e[1]
  calls = calls + n
end
if #gone > 0 then
  redis.call('XDEL', KEYS[1], unpack(gone))
  if redis.call('EXISTS', KEYS[2]) == 1 and redis.call('DECRBY', KEYS[2], calls) < 0 then
    redis.call('SET', KEYS[2], 0, 'KEEPTTL')
  end
end
local more = 0
if #gone == #oldest and #oldest == tonumber(ARGV[2]) then more = 1 end
return {calls, more}
"#;

/// The Redis call store.
pub struct RedisCallStore {
    config: RedisConfig,
    /// Made on first use, inside a runtime (the link spawns its driver task there).
    link: tokio::sync::OnceCell<RedisLink>,
    max_per_project: u64,
    append: String,
    sweep: String,
}

impl RedisCallStore {
    /// Sets the store up without connecting: the gateway starts when Redis is down.
    pub fn new(config: &RedisConfig, max_per_project: u64) -> Result<Self, CallsError> {
        redis::Client::open(config.url.as_str())?;
        Ok(RedisCallStore {
            config: config.clone(),
            link: tokio::sync::OnceCell::new(),
            max_per_project,
            append: format!("{ENTRY_CALLS}{APPEND}"),
            sweep: format!("{ENTRY_CALLS}{SWEEP}"),
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

fn kept_key(project: &str) -> String {
    format!("calls:{{{project}}}:kept")
}

fn day_key(project: &str, day: NaiveDate) -> String {
    format!("calls:{{{project}}}:day:{}", day.format("%Y-%m-%d"))
}

/// A stream id `<ms>-<seq>`, as Redis makes them (each part a `u64`).
fn is_stream_id(s: &str) -> bool {
    let part = |p: &str| {
        !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u64>().is_ok()
    };
    s.split_once('-')
        .is_some_and(|(ms, seq)| part(ms) && part(seq))
}

/// A page position: a call of a chunk (`<stream id>/<index>`), or an entry of earlier builds
/// (its stream id).
#[derive(Debug, PartialEq, Eq)]
struct Position<'a> {
    entry: &'a str,
    index: Option<usize>,
}

impl<'a> Position<'a> {
    fn parse(s: &'a str) -> Option<Position<'a>> {
        let (entry, index) = match s.split_once('/') {
            Some((entry, i)) => {
                let ok = !i.is_empty() && i.len() <= 6 && i.bytes().all(|b| b.is_ascii_digit());
                (entry, Some(i.parse().ok().filter(|_| ok)?))
            }
            None => (s, None),
        };
        // `0-0` is before every entry: nothing is older than it (and Redis refuses `(0-0`).
        (is_stream_id(entry) && !(index.is_none() && entry == "0-0"))
            .then_some(Position { entry, index })
    }

    /// Where `XREVRANGE` starts for the page after this position: the entry of a chunk's call
    /// is read again (its older calls), an entry of earlier builds is passed.
    fn range_end(&self) -> String {
        match self.index {
            Some(_) => self.entry.to_owned(),
            None => format!("({}", self.entry),
        }
    }
}

/// A stream entry: its id and its fields as pairs (bytes: a chunk's are binary).
type Entry = (String, Vec<Vec<u8>>);

fn field<'a>(fields: &'a [Vec<u8>], name: &str) -> Option<&'a [u8]> {
    fields
        .chunks_exact(2)
        .find(|kv| kv[0] == name.as_bytes())
        .map(|kv| kv[1].as_slice())
}

fn text_field<'a>(fields: &'a [Vec<u8>], name: &str) -> Option<&'a str> {
    std::str::from_utf8(field(fields, name)?).ok()
}

/// The calls of an entry, oldest first: a chunk's, or the one call of an entry of earlier
/// builds. `None`: not an entry of ours (skipped).
fn calls_of(fields: &[Vec<u8>]) -> Option<Vec<Stored>> {
    if let Some(text) = field(fields, "c") {
        return chunk::decode_lines(text);
    }
    Some(vec![Stored {
        at_ms: text_field(fields, "t")?.parse().ok()?,
        verdict: super::Verdict {
            risk_score: text_field(fields, "s")?
                .parse()
                .ok()
                .filter(|s| *s <= 100)?,
            reason: text_field(fields, "r")?.parse::<Reason>().ok()?,
        },
        domain: text_field(fields, "d")?.to_owned(),
    }])
}

fn item(id: String, call: Stored) -> Option<LogItem> {
    Some(LogItem {
        id,
        email_domain: call.domain,
        risk_score: call.verdict.risk_score,
        reason: call.verdict.reason,
        created_at: super::created_at(DateTime::from_timestamp_millis(call.at_ms)?),
    })
}

/// A project's logged calls of a batch as chunks: (calls, newest time in ms, encoded calls).
fn chunks_of(logged: &[&Call]) -> Vec<(usize, i64, String)> {
    logged
        .chunks(CALLS_PER_CHUNK)
        .map(|calls| {
            // Text, not the binary form of SQLite's chunks: an earlier build reading the stream
            // during an upgrade reads every field as UTF-8, and skips an entry it cannot use
            // where a binary one failed its whole page.
            let mut text = String::with_capacity(calls.len() * 40);
            let (mut n, mut newest) = (0, i64::MIN);
            for call in calls {
                let Some(v) = call.verdict else { continue };
                let at = call.at.timestamp_millis();
                newest = newest.max(at);
                chunk::encode_line(&mut text, at, v, &call.email_domain);
                n += 1;
            }
            (n, newest, text)
        })
        .collect()
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
            let (key, kept) = (log_key(project), kept_key(project));
            // A project that stops calling loses its whole log once its retention has passed.
            let retention_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX / 2);
            // The chunks go in a script call or a few (one reply each, not one a chunk); each
            // call trims the log and sets its expiry, so one runs with no chunk too.
            let chunks = chunks_of(logged);
            let scripts: Vec<&[(usize, i64, String)]> = if chunks.is_empty() {
                vec![&[]]
            } else {
                chunks.chunks(CHUNKS_PER_SCRIPT).collect()
            };
            for script in scripts {
                pipe.cmd("EVAL")
                    .arg(&self.append)
                    .arg(2)
                    .arg(&key)
                    .arg(&kept)
                    .arg(self.max_per_project)
                    .arg(retention_ms);
                for (n, newest, data) in script {
                    pipe.arg(*n).arg(*newest).arg(data);
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
        let position = match before {
            None => None,
            Some(p) => match Position::parse(p) {
                Some(p) => Some(p),
                None => return Ok(None),
            },
        };
        let mut end = position
            .as_ref()
            .map_or("+".to_owned(), Position::range_end);
        let since = since.timestamp_millis();
        let mut link = self.link().await?;
        let mut items = Vec::with_capacity(limit.min(64));
        let mut step = PAGE_FIRST_STEP;
        let mut scanned = 0;
        loop {
            let entries: Vec<Entry> = redis::cmd("XREVRANGE")
                .arg(log_key(project))
                .arg(&end)
                .arg("-")
                .arg("COUNT")
                .arg(step)
                .query_async(&mut link)
                .await?;
            let last = entries.len() < step;
            scanned += entries.len();
            for (id, fields) in entries {
                end = format!("({id}");
                let Some(calls) = calls_of(&fields) else {
                    continue;
                };
                let upto = match &position {
                    Some(Position {
                        entry,
                        index: Some(i),
                    }) if *entry == id => (*i).min(calls.len()),
                    _ => calls.len(),
                };
                let chunked = field(&fields, "c").is_some();
                for (i, call) in calls.into_iter().take(upto).enumerate().rev() {
                    // Newest first: the first call past the retention ends the log.
                    if call.at_ms < since {
                        return Ok(Some(Page::of(items, false)));
                    }
                    if items.len() == limit {
                        return Ok(Some(Page::of(items, true)));
                    }
                    let id = if chunked {
                        format!("{id}/{i}")
                    } else {
                        id.clone()
                    };
                    items.extend(item(id, call));
                }
            }
            if last {
                return Ok(Some(Page::of(items, false)));
            }
            if scanned >= PAGE_SCAN_MAX {
                // The next page goes on from the last call shown (none: the log ends here).
                let more = !items.is_empty();
                return Ok(Some(Page::of(items, more)));
            }
            // At least a call an entry: what the page still wants (and one more, which tells
            // whether more follow) is as many entries at most.
            step = (limit + 1 - items.len()).clamp(1, PAGE_STEP_MAX);
        }
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

    /// Drops each known project's oldest entries whose calls are all past the retention (a call
    /// past it in a younger chunk is hidden by the read and goes with its chunk). Logs of
    /// projects no key names any more, and daily hashes, expire on their own.
    async fn sweep(
        &self,
        cutoffs: &[(Arc<str>, DateTime<Utc>)],
        _oldest: DateTime<Utc>,
        _first_day: NaiveDate,
    ) -> Result<u64, CallsError> {
        let mut link = self.link().await?;
        let mut deleted = 0;
        let mut first_error = None;
        // A project whose sweep fails (its count not a number, say) leaves the others theirs.
        'projects: for (project, cutoff) in cutoffs {
            let (key, kept) = (log_key(project), kept_key(project));
            for _ in 0..SWEEP_STEPS {
                let step: Result<(u64, u8), _> = redis::cmd("EVAL")
                    .arg(&self.sweep)
                    .arg(2)
                    .arg(&key)
                    .arg(&kept)
                    .arg(cutoff.timestamp_millis())
                    .arg(SWEEP_STEP)
                    .query_async(&mut link)
                    .await;
                match step {
                    Ok((calls, more)) => {
                        deleted += calls;
                        if more == 0 {
                            break;
                        }
                    }
                    Err(e) => {
                        first_error.get_or_insert(e);
                        continue 'projects;
                    }
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e.into());
        }
        Ok(deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_a_chunks_call_or_an_entry_of_earlier_builds() {
        assert!(is_stream_id("1732290000000-0"));
        for bad in ["", "-", "1-", "-1", "1", "a-1", "1-1-1", "+", "(1-1"] {
            assert!(!is_stream_id(bad), "{bad}");
            assert_eq!(Position::parse(bad), None, "{bad}");
        }
        assert_eq!(
            Position::parse("5-7/12"),
            Some(Position {
                entry: "5-7",
                index: Some(12)
            })
        );
        assert_eq!(
            Position::parse("5-7"),
            Some(Position {
                entry: "5-7",
                index: None
            })
        );
        for bad in [
            "5-7/",
            "5-7/x",
            "5-7/-1",
            "5-7/1/2",
            "/1",
            "5-7/1234567",
            "x-1/0",
            "0-0",
            "18446744073709551616-0",
        ] {
            assert_eq!(Position::parse(bad), None, "{bad}");
        }
        assert!(Position::parse("0-0/3").is_some());
    }

    #[test]
    fn entries_of_earlier_builds_read_as_one_call() {
        let fields = |kv: &[(&str, &str)]| -> Vec<Vec<u8>> {
            kv.iter()
                .flat_map(|(k, v)| [k.as_bytes().to_vec(), v.as_bytes().to_vec()])
                .collect()
        };
        let old = fields(&[
            ("d", "a.example"),
            ("s", "95"),
            ("r", "disposable"),
            ("t", "7"),
        ]);
        let calls = calls_of(&old).unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!((calls[0].at_ms, calls[0].domain.as_str()), (7, "a.example"));
        assert_eq!(calls[0].verdict.reason, Reason::Disposable);
        for bad in [
            fields(&[("d", "a.example"), ("s", "101"), ("r", "safe"), ("t", "7")]),
            fields(&[("d", "a.example"), ("s", "5"), ("r", "nope"), ("t", "7")]),
            fields(&[("x", "y")]),
        ] {
            assert_eq!(calls_of(&bad), None);
        }
        let chunk = |c: &str| fields(&[("n", "1"), ("t", "7"), ("c", c)]);
        assert_eq!(calls_of(&chunk("7 5 safe")), None, "a cut line");
        let call = Call {
            project: "p".into(),
            retention: Duration::from_secs(60),
            email_domain: "b.example".into(),
            verdict: Some(super::super::Verdict {
                risk_score: 10,
                reason: Reason::Safe,
            }),
            lookup: true,
            at: DateTime::from_timestamp_millis(9).unwrap(),
            queued: None,
        };
        let (n, newest, text) = chunks_of(&[&call, &call]).remove(0);
        assert_eq!((n, newest), (2, 9));
        let back = calls_of(&chunk(&text)).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!((back[1].at_ms, back[1].domain.as_str()), (9, "b.example"));
    }

    #[test]
    fn keys_of_a_project_share_its_hash_tag() {
        let day: NaiveDate = "2026-11-22".parse().unwrap();
        assert_eq!(log_key("acme"), "calls:{acme}:log");
        assert_eq!(kept_key("acme"), "calls:{acme}:kept");
        assert_eq!(day_key("acme", day), "calls:{acme}:day:2026-11-22");
    }
}
