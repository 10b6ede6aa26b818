//! The audit trail: what changed through the API (keys made, revoked, rotated; overrides set and
//! removed; reports sent; webhooks made and removed), who (the key id), what and when, for the
//! project's `GET /v1/audit`, kept the plan's `audit_retention_days`.
//!
//! Written in the transaction of the change it records (keys: `keys_api/control.rs`; records:
//! `once::write`), from the typed change the part attached to its answer ([`Changed`], never a
//! parse of the body): a change and its entry commit together or not at all; there is no other
//! way in. Kept in the control store (`sql.rs`: SQLite in the state folder, or PostgreSQL for several
//! gateways; a row an entry, by project and id); each project's at most [`MAX_ENTRIES`] and its
//! plan's days. What an earlier release kept elsewhere is `legacy.rs`'s, for `migrate`.

pub mod legacy;
pub mod sql;

use std::sync::Arc;

use http::StatusCode;
use serde::{Deserialize, Serialize};

#[cfg(test)]
use drg_base::answer::Action;
use drg_base::answer::{Answer, Changed};

/// Entries a project's trail keeps at most (the oldest go first), besides its plan's days.
pub const MAX_ENTRIES: usize = drg_base::infra::control::audit::MAX_ENTRIES;

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
    #[error("{0}")]
    Control(String),
    #[error("an entry is not JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The trail, as `GET /v1/audit` reads it (entries are written by the changes themselves).
pub struct Audit {
    store: sql::SqlAudit,
}

impl Audit {
    /// The trail in the control store.
    pub fn open(control: &Arc<drg_base::infra::control::Control>) -> Audit {
        Audit {
            store: sql::SqlAudit::new(control.clone()),
        }
    }

    /// `GET /v1/audit` for `project`.
    pub async fn page(&self, project: &str, cursor: Option<&str>, limit: usize) -> Answer {
        #[derive(Serialize)]
        struct Page<'a> {
            items: &'a [Entry],
            next_cursor: Option<&'a str>,
        }
        // Boxed: the store's query is a large future, and a request's future holds the largest
        // of its branches whatever route it takes (every request would copy it).
        match Box::pin(self.store.page(project, cursor, limit)).await {
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
            // The store away (the database down): 503, as every route whose
            // store is away answers, never a 500.
            Err(e) => {
                log::warn!("audit: {e}");
                drg_base::answer::unavailable("The audit trail", None)
            }
        }
    }
}

/// How many days `plan` keeps its trail.
pub fn keep_days(
    plans: &std::collections::BTreeMap<String, drg_access::plan::PlanConfig>,
    plan: &str,
) -> u32 {
    (plans.get(plan)).map_or(drg_access::plan::DEFAULT_AUDIT_DAYS, |p| {
        p.audit_retention_days()
    })
}

impl Entry {
    /// The entry of `change`, made by the key `key_id` at `at` (RFC 3339).
    pub fn of(change: &Changed, key_id: &str, at: String) -> Entry {
        Entry {
            id: String::new(),
            project: String::new(),
            at,
            key_id: key_id.to_owned(),
            action: change.action.as_str().to_owned(),
            target: change.target.clone(),
            detail: change.detail.clone(),
        }
    }
}

/// The trail, shared by the routes that append to it.
pub type SharedAudit = Arc<Audit>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_what_the_part_said_it_changed_whatever_the_body() {
        // The part names the change from its own values: an answer of any body shape (none
        // here) keeps its row.
        let change = Changed::new(Action::KeyRotated, "k_old", "successor k_new");
        let answer = Answer::raw(StatusCode::CREATED, bytes::Bytes::new()).changed(change);
        let e = Entry::of(answer.changed.as_ref().unwrap(), "server", "t".into());
        assert_eq!(
            (e.action.as_str(), e.target.as_str(), e.detail.as_str()),
            ("key.rotated", "k_old", "successor k_new")
        );
    }
}
