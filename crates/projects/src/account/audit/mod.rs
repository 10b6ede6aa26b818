//! The audit trail: what changed through the API (keys made, revoked, rotated; overrides set and
//! removed; reports sent; webhooks made and removed), who (the key id), what and when, for the
//! project's `GET /v1/audit`, kept the plan's `audit_retention_days`.
//!
//! Appended once a change succeeded, from its answer (`entry_of`), so no route's own code
//! carries it. Kept in `audit.sqlite` in the state folder (`file.rs`, a row an entry, by
//! project and id) or, with the Redis quota store, in one stream per project (`redis.rs`); each
//! project's at most [`MAX_ENTRIES`] and its plan's days. An entry that
//! could not be written is logged and counted; the change it records stands.

pub mod file;
pub mod redis;

use std::sync::Arc;

use http::StatusCode;
use serde::{Deserialize, Serialize};

use drg_base::answer::Answer;

/// Entries a project's trail keeps at most (the oldest go first), besides its plan's days.
pub const MAX_ENTRIES: usize = 1_000;

/// Default and largest `limit` of `GET /v1/audit`.
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1_000;

/// One change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Increasing within the project: the paging position (set by the store).
    #[serde(default)]
    pub id: String,
    #[serde(skip_serializing_if = "String::is_empty", default)]
    pub project: String,
    /// RFC 3339, UTC, seconds.
    pub at: String,
    /// The key that made the change.
    pub key_id: String,
    /// `key.created`, `key.revoked`, `key.rotated`, `override.set`, `override.removed`,
    /// `report.sent`, `webhook.created`, `webhook.removed`.
    pub action: String,
    /// What it changed: a key id, a domain, a report or webhook id.
    pub target: String,
    /// More, when there is more to say (an override's verdict, a rotation's successor, a
    /// webhook's host).
    #[serde(default)]
    pub detail: String,
}

/// Why the trail could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("redis: {0}")]
    Link(#[from] drg_base::infra::redis::LinkError),
    #[error("an entry is not JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Where the trail is kept.
#[async_trait::async_trait]
pub trait AuditStore: Send + Sync {
    /// Appends `entry` (its `id` set here), dropping the project's entries older than
    /// `keep_days`.
    async fn append(&self, entry: Entry, keep_days: u32) -> Result<(), AuditError>;
    /// The project's entries before `cursor` (an id; `None`: the newest), newest first.
    async fn page(
        &self,
        project: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Entry>, AuditError>;
}

/// The trail and how long each plan keeps it.
pub struct Audit {
    store: Box<dyn AuditStore>,
    plans: std::collections::BTreeMap<String, drg_access::plan::PlanConfig>,
    failures: prometheus::IntCounter,
}

impl Audit {
    /// The trail in `folder` (`audit.sqlite`) or on `redis`.
    pub fn open(
        folder: &std::path::Path,
        redis: Option<&drg_base::infra::redis::config::RedisConfig>,
        plans: std::collections::BTreeMap<String, drg_access::plan::PlanConfig>,
        failures: prometheus::IntCounter,
    ) -> Audit {
        let store: Box<dyn AuditStore> = match redis {
            None => Box::new(file::FileAudit::new(folder.join("audit.sqlite"))),
            Some(config) => Box::new(redis::RedisAudit::new(config)),
        };
        Audit {
            store,
            plans,
            failures,
        }
    }

    /// Records `entry` for `plan`'s project (best effort: a failure is logged and counted).
    pub async fn record(&self, plan: &str, entry: Entry) {
        let keep = (self.plans.get(plan)).map_or(drg_access::plan::DEFAULT_AUDIT_DAYS, |p| {
            p.audit_retention_days()
        });
        if let Err(e) = self.store.append(entry, keep).await {
            self.failures.inc();
            log::warn!("audit: an entry was not written: {e}");
        }
    }

    /// `GET /v1/audit` for `project`.
    pub async fn page(&self, project: &str, cursor: Option<&str>, limit: usize) -> Answer {
        #[derive(Serialize)]
        struct Page<'a> {
            items: &'a [Entry],
            next_cursor: Option<&'a str>,
        }
        match self.store.page(project, cursor, limit).await {
            Ok(mut items) => {
                items.iter_mut().for_each(|e| e.project.clear());
                let next_cursor = (items.len() == limit)
                    .then(|| items.last().map(|e| e.id.as_str()))
                    .flatten();
                Answer::json(
                    StatusCode::OK,
                    &Page {
                        items: &items,
                        next_cursor,
                    },
                )
            }
            // The store away (Redis down, the file unreadable): 503, as every route whose
            // store is away answers, never a 500.
            Err(e) => {
                log::warn!("audit: {e}");
                drg_base::answer::unavailable("The audit trail", None)
            }
        }
    }
}

/// What changed, as an answer to an API call shows it: the entry to record, when the answer
/// says the change was made. `what` names the call; `target` what it named.
pub fn entry_of(what: Change<'_>, answer: &Answer, key_id: &str, at: String) -> Option<Entry> {
    let ok = answer.status.is_success();
    let body = || serde_json::from_slice::<serde_json::Value>(&answer.body).ok();
    let (action, target, detail) = match what {
        Change::KeyCreated if ok => {
            let b = body()?;
            ("key.created", b["id"].as_str()?.to_owned(), String::new())
        }
        Change::KeyRevoked(id) if ok => ("key.revoked", id.to_owned(), String::new()),
        Change::KeyRotated(id) if ok => {
            let b = body()?;
            let next = b["id"].as_str().unwrap_or_default();
            ("key.rotated", id.to_owned(), format!("successor {next}"))
        }
        Change::OverrideSet(domain) if ok => {
            let b = body()?;
            let verdict = b["verdict"].as_str().unwrap_or_default();
            ("override.set", domain.to_owned(), verdict.to_owned())
        }
        Change::OverrideRemoved(domain) if ok => {
            ("override.removed", domain.to_owned(), String::new())
        }
        Change::ReportSent if ok => {
            let b = body()?;
            let detail = format!(
                "{} {}",
                b["domain"].as_str().unwrap_or_default(),
                b["verdict"].as_str().unwrap_or_default()
            );
            ("report.sent", b["id"].as_str()?.to_owned(), detail)
        }
        Change::WebhookCreated if ok => {
            let b = body()?;
            // The host only: a webhook URL's path or query may hold a token.
            let url = b["url"].as_str().unwrap_or_default();
            let host = crate::account::webhooks::body::host_of(url).unwrap_or_default();
            ("webhook.created", b["id"].as_str()?.to_owned(), host)
        }
        Change::WebhookRemoved(id) if ok => ("webhook.removed", id.to_owned(), String::new()),
        _ => return None,
    };
    Some(Entry {
        id: String::new(),
        project: String::new(),
        at,
        key_id: key_id.to_owned(),
        action: action.to_owned(),
        target,
        detail,
    })
}

/// The calls that change something.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    KeyCreated,
    KeyRevoked(&'a str),
    KeyRotated(&'a str),
    OverrideSet(&'a str),
    OverrideRemoved(&'a str),
    ReportSent,
    WebhookCreated,
    WebhookRemoved(&'a str),
}

/// The trail, shared by the routes that append to it.
pub type SharedAudit = Arc<Audit>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_made_is_recorded_with_its_host_only() {
        let body = serde_json::json!({
            "id": "wh_0123456789abcdef",
            "url": "https://hooks.example.com/in/T0K3N?sig=s3cret",
            "secret": "whsec_00",
        });
        let made = Answer::json(StatusCode::CREATED, &body);
        let e = entry_of(Change::WebhookCreated, &made, "server", "t".into()).unwrap();
        assert_eq!(
            (e.action.as_str(), e.target.as_str(), e.detail.as_str()),
            (
                "webhook.created",
                "wh_0123456789abcdef",
                "hooks.example.com"
            )
        );
        let refused = Answer::from(drg_base::answer::ApiError::Validation("url".into()));
        assert_eq!(
            entry_of(Change::WebhookCreated, &refused, "server", "t".into()),
            None
        );
        let gone = Answer::raw(StatusCode::NO_CONTENT, bytes::Bytes::new());
        let e = entry_of(Change::WebhookRemoved("wh_1"), &gone, "server", "t".into()).unwrap();
        assert_eq!(
            (e.action.as_str(), e.target.as_str()),
            ("webhook.removed", "wh_1")
        );
    }
}
