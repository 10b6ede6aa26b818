//! Verdict changes: each watched project learns when a domain it already looked up changes
//! verdict (a list refresh, evidence learned), by a signed webhook and `GET /v1/changes`.
//!
//! The request path does nothing more: the call-log writer hands each tick's answered lookups
//! to [`Watch::observe`] (`account::calls::CallObserver`), which keeps, per project, the
//! domains it asked about and what it was told (`store.rs`: SQLite embedded, `redis.rs`
//! shared). The service (`service.rs`) judges the watched domains again after every table
//! reload and every `pass_interval` (`judge.rs`: the table and the evidence the gateway holds,
//! never a new DNS or RDAP query), records each change of reason or score band once (a
//! compare-and-set on what the project was told, so two gateways never record one twice; a
//! recorded change is kept, a poller may have read it; its id never repeats, `store.rs`), and
//! sends each project's changes in one signed message per `send_interval` (`message.rs`: a
//! summary when there are more than `max_per_message`; a flip and its flip back left out),
//! under a per-project sender lease, each project's delivery a task of its own
//! (`delivery.rs`): a receiver that never answers one project holds up no other.

pub mod config;
pub mod delivery;
pub mod embedded;
pub mod judge;
pub mod message;
pub mod redis;
pub mod service;
pub mod store;

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use prometheus::IntCounter;
use serde::{Deserialize, Serialize};

use crate::account::calls::{Call, CallObserver};
use drg_base::answer::{Answer, ApiError};
use drg_domain::record::RiskScore;
use drg_domain::Reason;

pub use config::ChangesConfig;
pub use store::{ChangeStore, ChangesError};

/// Calls handed to the service per tick at most, waiting; beyond, the tick's rest is dropped
/// (counted): watching is best effort, the next lookup of a name watches it.
pub const CHANNEL: usize = 64;

/// What a project was told of a domain (or is told now): its reason and score.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Told {
    pub reason: Reason,
    pub score: RiskScore,
}

impl Told {
    /// The score's band, as docs/api.md names them: 0-29, 30-49, 50-79, 80-99, 100.
    pub fn band(self) -> u8 {
        match self.score {
            0..=29 => 0,
            30..=49 => 1,
            50..=79 => 2,
            80..=99 => 3,
            _ => 4,
        }
    }

    /// A change worth telling: another reason, or another score band.
    pub fn differs(self, other: Told) -> bool {
        self.reason != other.reason || self.band() != other.band()
    }

    /// `reason|score`, as the stores keep it.
    pub fn encode(self) -> String {
        format!("{}|{}", self.reason.as_str(), self.score)
    }

    pub fn decode(text: &str) -> Option<Told> {
        let (reason, score) = text.split_once('|')?;
        let score = score.split('|').next()?.parse().ok()?;
        Some(Told {
            reason: reason.parse().ok()?,
            score,
        })
    }
}

/// One answered lookup of a watched project.
#[derive(Debug, Clone)]
pub struct Seen {
    pub project: Arc<str>,
    pub domain: Box<str>,
    pub told: Told,
    /// When it was answered, unix milliseconds: what orders two gateways' ticks.
    pub at_ms: i64,
}

impl Seen {
    /// Unix seconds.
    pub fn at(&self) -> i64 {
        self.at_ms.div_euclid(1_000)
    }
}

/// A watched domain, as a pass reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watched {
    pub project: String,
    pub domain: String,
    pub told: Told,
}

/// One change of verdict, as `GET /v1/changes` and the webhook show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// Increasing per project and never repeating (the microsecond it was recorded at, see
    /// `store.rs`): the paging position and the receiver's deduplication key.
    pub id: u64,
    pub domain: String,
    pub from: Reason,
    pub to: Reason,
    pub score_from: RiskScore,
    pub score_to: RiskScore,
    /// What decided the new verdict (`blocklist`, `record`, `mx`, `mx_neighbourhood`, ...).
    pub rule: String,
    /// What it rests on: `table` (the lists), `evidence` (DNS, the neighbourhood, the age) or
    /// `table_only` (the lists stopped deciding and no evidence was held yet: a delisting).
    /// Empty in changes recorded before changes carried it (filled from `rule` when read).
    #[serde(default)]
    pub basis: String,
    /// RFC 3339, UTC, seconds.
    pub changed_at: String,
    /// The domain table's version that made the change (`X-Dataset-Version`).
    pub dataset_version: String,
}

impl Change {
    /// The change, its `basis` filled from its rule when it was recorded before changes
    /// carried one.
    pub fn with_basis(mut self) -> Change {
        if self.basis.is_empty() {
            self.basis = judge::Basis::of_rule(&self.rule).as_str().to_owned();
        }
        self
    }
}

/// Counters since start: `drg_changes_total{event=...}` on `/metrics`.
pub struct Counters {
    pub watched: IntCounter,
    pub not_watched_full: IntCounter,
    pub dropped: IntCounter,
    pub judged: IntCounter,
    pub recorded: IntCounter,
    pub withdrawn: IntCounter,
    pub messages_sent: IntCounter,
    pub messages_failed: IntCounter,
    pub attempt_errors: IntCounter,
    pub store_errors: IntCounter,
    pub passes: IntCounter,
}

impl Counters {
    /// The counters, registered in `metrics`.
    pub fn register(
        metrics: &drg_telemetry::metrics::Metrics,
    ) -> Result<Counters, prometheus::Error> {
        let vec = metrics.counter_vec(
            "drg_changes_total",
            "Verdict changes, by event: watched (lookups written to the store: one per project, domain and hour unless the verdict changed), not_watched_full (a project at max_watched_per_project), dropped (lookups the service could not take in), judged, recorded, withdrawn (changes left out of a message because they cancel out), messages_sent, messages_failed (given up), attempt_errors, store_errors, passes.",
            &["event"],
        )?;
        Ok(Counters::of(&vec))
    }

    /// Counters in no registry (tests, tools).
    pub fn unregistered() -> Counters {
        let opts = prometheus::Opts::new("drg_changes_total", "-");
        let vec = prometheus::IntCounterVec::new(opts, &["event"]).expect("a valid metric");
        Counters::of(&vec)
    }

    fn of(vec: &prometheus::IntCounterVec) -> Counters {
        let c = |event: &str| vec.with_label_values(&[event]);
        Counters {
            watched: c("watched"),
            not_watched_full: c("not_watched_full"),
            dropped: c("dropped"),
            judged: c("judged"),
            recorded: c("recorded"),
            withdrawn: c("withdrawn"),
            messages_sent: c("messages_sent"),
            messages_failed: c("messages_failed"),
            attempt_errors: c("attempt_errors"),
            store_errors: c("store_errors"),
            passes: c("passes"),
        }
    }

    pub fn add(c: &IntCounter, n: u64) {
        c.inc_by(n);
    }
}

/// The call writer's side: passes each tick's answered lookups to the service, never waits.
pub struct Watch {
    tx: tokio::sync::mpsc::Sender<Vec<Seen>>,
    counters: Arc<Counters>,
}

impl CallObserver for Watch {
    fn observe(&self, calls: &[Call]) {
        // One entry per (project, domain) a tick, the last answer's: a busy name looked up
        // thousands of times a tick is one write, not thousands.
        let mut seen: HashMap<(&str, &str), Seen> = HashMap::new();
        for c in calls.iter().filter(|c| c.lookup) {
            let Some(v) = c.verdict else { continue };
            let told = Told {
                reason: v.reason,
                score: v.risk_score,
            };
            let at_ms = c.at.timestamp_millis();
            match seen.entry((&c.project, &c.email_domain)) {
                Entry::Occupied(mut e) => {
                    let s = e.get_mut();
                    (s.told, s.at_ms) = (told, at_ms.max(s.at_ms));
                }
                Entry::Vacant(e) => {
                    e.insert(Seen {
                        project: c.project.clone(),
                        domain: c.email_domain.clone(),
                        told,
                        at_ms,
                    });
                }
            }
        }
        if seen.is_empty() {
            return;
        }
        let seen: Vec<Seen> = seen.into_values().collect();
        let n = seen.len() as u64;
        if self.tx.try_send(seen).is_err() {
            Counters::add(&self.counters.dropped, n);
        }
    }
}

/// What `GET /v1/changes` reads: the store.
#[derive(Clone)]
pub struct ChangesApi {
    pub store: Arc<dyn ChangeStore>,
    pub counters: Arc<Counters>,
}

impl ChangesApi {
    /// A page of `project`'s changes after id `after`, made at or after `since`, oldest
    /// first; `next_cursor` is the last id given when the page is full.
    pub async fn page(&self, project: &str, after: u64, since: i64, limit: usize) -> Answer {
        #[derive(Serialize)]
        struct Page<'a> {
            changes: &'a [Change],
            next_cursor: Option<String>,
        }
        match self.store.list(project, after, since, limit).await {
            Ok(changes) => {
                let next_cursor = (changes.len() == limit)
                    .then(|| changes.last().map(|c| c.id.to_string()))
                    .flatten();
                Answer::json(
                    http::StatusCode::OK,
                    &Page {
                        changes: &changes,
                        next_cursor,
                    },
                )
            }
            Err(e) => {
                self.counters.store_errors.inc();
                ApiError::Internal(e.to_string()).into()
            }
        }
    }
}
