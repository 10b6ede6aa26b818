//! `/v1/overrides`: a project's own verdicts. `PUT /v1/overrides/{domain}` sets `allow` or
//! `block` for a name and its subdomains, `GET /v1/overrides` pages them, `DELETE` removes one;
//! lookups of that project (GET and batch) answer with them before every list and inference.
//!
//! Kept as records ([`drg_base::infra::records`]) in the control store (SQLite in the state
//! folder, or PostgreSQL for several gateways); every gateway reads a change within a poll.
//! Server keys only, not counted, bounded by the plan's `max_overrides`.

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::StatusCode;
use serde::{Deserialize, Serialize};

use drg_access::keys::KeyEntry;
use drg_access::plan::PlanConfig;
use drg_base::answer::{error_answer, Action, Answer, ApiError, Changed};
use drg_base::infra::records::snapshot::Snapshot;
use drg_base::infra::records::{Merged, Moved, Put};
use drg_domain::overrides::{Override, OverrideSet, OverrideVerdict};
use drg_domain::DomainName;

/// Longest `note`, in characters.
pub const MAX_NOTE_CHARS: usize = 500;
/// Largest body of `PUT /v1/overrides/{domain}`.
pub const MAX_BODY_BYTES: usize = 8_192;
/// Default and largest `limit` of `GET /v1/overrides`.
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1_000;

/// A `/v1/overrides` request, its name decoded and its body read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverridesOp {
    List {
        cursor: Option<String>,
        limit: usize,
    },
    Put {
        domain: String,
        body: Bytes,
    },
    Delete {
        domain: String,
    },
}

/// One override as the API shows it.
#[derive(Debug, Serialize)]
pub struct Item<'a> {
    pub domain: &'a str,
    pub verdict: OverrideVerdict,
    pub note: &'a str,
    /// The id of the key that set it.
    pub set_by: &'a str,
    /// RFC 3339, UTC.
    pub set_at: String,
}

impl<'a> Item<'a> {
    pub fn of(o: &'a Override) -> Item<'a> {
        Item {
            domain: &o.domain,
            verdict: o.verdict,
            note: &o.note,
            set_by: &o.set_by,
            set_at: drg_base::infra::units::unix_rfc3339(o.set_at),
        }
    }
}

/// What `PUT` takes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    verdict: OverrideVerdict,
    #[serde(default)]
    note: String,
}

/// The kind of record overrides are (their files and Redis keys are named by it).
pub const KIND: &str = "overrides";

/// The overrides: the records, the snapshot lookups read, the plans that bound them.
pub struct Overrides {
    pub snapshot: Arc<Snapshot<Override>>,
    plans: BTreeMap<String, PlanConfig>,
}

impl Overrides {
    /// Overrides kept in the control store, published to `set` (what lookups read).
    pub fn open(
        set: Arc<ArcSwap<OverrideSet>>,
        control: &std::sync::Arc<drg_base::infra::control::Control>,
        plans: BTreeMap<String, PlanConfig>,
    ) -> Overrides {
        let publish = Box::new(move |m: &Merged<Override>, moved: &Moved| {
            // The projects a write left as they were keep their map (what moved is told by
            // the changed projects alone: `OverrideSet::moved`), and only the changed ones
            // are built again: a write costs its project's overrides.
            let next = match moved {
                Moved::All => set.load().next(m.all().cloned()),
                Moved::Projects(projects) => set.load().with_projects(
                    (projects.iter()).map(|p| (p.clone(), m.of_project(p).cloned().collect())),
                ),
            };
            set.store(Arc::new(next));
        });
        Overrides {
            snapshot: Arc::new(Snapshot::open(KIND, control, publish)),
            plans,
        }
    }

    /// The answer to `op` for the caller's `key`, at `now` (unix seconds); `once`: the
    /// write's `Idempotency-Key` (see [`crate::account::once`]).
    pub async fn answer(
        &self,
        op: OverridesOp,
        key: &KeyEntry,
        now: i64,
        once: Option<&str>,
    ) -> Answer {
        match op {
            OverridesOp::List { cursor, limit } => self.list(key, cursor.as_deref(), limit),
            OverridesOp::Put { domain, body } => match parse(&domain, Some(&body)) {
                Ok((name, Some(b))) => self.write(key, name, Some(b), now, once).await,
                Ok(_) => ApiError::Validation("a body is required".into()).into(),
                Err(e) => e,
            },
            OverridesOp::Delete { domain } => match parse(&domain, None) {
                Ok((name, _)) => self.write(key, name, None, now, once).await,
                Err(e) => e,
            },
        }
    }

    fn list(&self, key: &KeyEntry, cursor: Option<&str>, limit: usize) -> Answer {
        if !self.snapshot.read_once() {
            return drg_base::answer::not_read_yet("The override store");
        }
        #[derive(Serialize)]
        struct Page<'a> {
            items: Vec<Item<'a>>,
            next_cursor: Option<&'a str>,
        }
        let held = self.snapshot.held();
        let mut live: Vec<&Override> = held.live(&key.project).collect();
        live.sort_by(|a, b| a.domain.cmp(&b.domain));
        let after: Vec<&Override> = live
            .into_iter()
            .filter(|o| cursor.is_none_or(|c| o.domain.as_str() > c))
            .take(limit)
            .collect();
        let next_cursor = (after.len() == limit)
            .then(|| after.last().map(|o| o.domain.as_str()))
            .flatten();
        Answer::json(
            StatusCode::OK,
            &Page {
                items: after.iter().map(|o| Item::of(o)).collect(),
                next_cursor,
            },
        )
    }

    /// Sets (`body`) or removes the override of `name`.
    async fn write(
        &self,
        key: &KeyEntry,
        name: DomainName,
        body: Option<Body>,
        now: i64,
        once: Option<&str>,
    ) -> Answer {
        let held = self
            .snapshot
            .held()
            .get(&key.project, name.as_str())
            .cloned();
        // A removal the copy does not hold still goes to the store: another gateway may have
        // committed the override a moment ago, and the store decides (`Put::Absent`: 404).
        let stamp = self.snapshot.stamp(held.as_ref().map_or(0, |h| h.stamp));
        let (verdict, note) = match (&body, &held) {
            (Some(b), _) => (b.verdict, b.note.clone()),
            (None, Some(h)) => (h.verdict, h.note.clone()),
            (None, None) => (OverrideVerdict::Allow, String::new()),
        };
        let entry = Override {
            project: key.project.to_string(),
            domain: name.as_str().to_owned(),
            verdict,
            note,
            set_by: key.id.to_string(),
            set_at: now,
            stamp,
            removed: body.is_none(),
        };
        let max = self
            .plans
            .get(&*key.plan)
            .map_or(drg_access::plan::default_max_overrides(&key.plan), |p| {
                p.max_overrides(&key.plan)
            });
        let said = format!("{}\n{}", entry.verdict.as_str(), entry.note);
        let asked = crate::account::once::Asked {
            method: if entry.removed { "DELETE" } else { "PUT" },
            target: &entry.domain,
            body: if entry.removed { b"" } else { said.as_bytes() },
        };
        let answer = |put| answer_of(put, &entry, max);
        let who = crate::account::once::Who::new(key, now, &self.plans);
        let snapshot = &self.snapshot;
        crate::account::once::write(snapshot, entry.clone(), max, once, asked, &who, answer).await
    }
}

/// The answer to a write of `entry` (the project's bound `max`) that came to `put`.
fn answer_of(
    put: Result<Put, drg_base::infra::records::RecordsError>,
    entry: &Override,
    max: u32,
) -> Answer {
    match put {
        Ok(Put::Absent) => error_answer(
            StatusCode::NOT_FOUND,
            "not_found",
            "No override of this name in the project.",
            None,
        ),
        Ok(Put::Done { .. }) if entry.removed => Answer::raw(StatusCode::NO_CONTENT, Bytes::new())
            .changed(Changed::new(Action::OverrideRemoved, &entry.domain, "")),
        Ok(Put::Done { created }) => {
            let status = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            let set = Changed::new(Action::OverrideSet, &entry.domain, entry.verdict.as_str());
            Answer::json(status, &Item::of(entry)).changed(set)
        }
        Ok(Put::Full) => error_answer(
            StatusCode::CONFLICT,
            "conflict",
            "The project has as many overrides as its plan allows; remove one first.",
            Some(&format!("max_overrides: {max}")),
        ),
        Ok(Put::Stale) => error_answer(
            StatusCode::CONFLICT,
            "conflict",
            "Another change to this override came first; read it and try again.",
            None,
        ),
        Err(e) => {
            log::warn!("overrides: {e}");
            drg_base::answer::unavailable("The override store", None)
        }
    }
}

/// The name of the path (and the body of a `PUT`), or the 422 saying what is wrong.
fn parse(domain: &str, body: Option<&[u8]>) -> Result<(DomainName, Option<Body>), Answer> {
    let invalid =
        |e: drg_domain::name::NameError| Answer::from(ApiError::Validation(e.to_string()));
    // A public suffix is no name to set (it would cover every owner's domain under it); one set
    // before that rule may still be removed.
    let Some(body) = body else {
        return Ok((DomainName::parse(domain).map_err(invalid)?, None));
    };
    let name = DomainName::parse_owned(domain).map_err(invalid)?;
    let b: Body = serde_json::from_slice(body).map_err(|e| {
        Answer::from(ApiError::Validation(format!(
            "the body must be {{\"verdict\": \"allow\" | \"block\", \"note\": \"...\"}}: {e}"
        )))
    })?;
    if b.note.chars().count() > MAX_NOTE_CHARS || b.note.chars().any(char::is_control) {
        return Err(ApiError::Validation(format!(
            "note: at most {MAX_NOTE_CHARS} characters, no control characters"
        ))
        .into());
    }
    Ok((name, Some(b)))
}
