//! `POST /v1/reports`: a project tells the operator a verdict is wrong (`safe` or `disposable`),
//! and `GET /v1/reports` shows it its reports and their state. The operator sees them grouped by
//! domain (`grouped.rs`: the admin listener's `GET /reports`, `reports list`) and accepts or
//! rejects them (`accept.rs`: `reports accept | reject`), accepting writing the domain to the
//! allow or block file with its provenance and keeping the verdict in the shared store
//! (`decisions.rs`), which every gateway answers. An open report changes no answer, the
//! reporting project's included, however many projects file it: accounts are free to make,
//! so only the operator's word may change another project's answer.
//!
//! Kept as records ([`drg_base::infra::records`]) in the control store, like overrides. A
//! decided report is a removed record: it no
//! longer counts against `reports.max_open_per_project`, and stays listed with its state.

pub mod accept;
pub mod config;
pub mod decisions;
pub mod grouped;

use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::StatusCode;
use serde::{Deserialize, Serialize};

pub use config::ReportsConfig;
pub use decisions::{Accepted, Decision};
use drg_access::keys::KeyEntry;
use drg_base::answer::{error_answer, Action, Answer, ApiError, Changed};
use drg_base::infra::records::snapshot::Snapshot;
use drg_base::infra::records::{Merged, Put};
use drg_domain::DomainName;

/// Longest `note`, in characters.
pub const MAX_NOTE_CHARS: usize = 500;
/// Largest body of `POST /v1/reports`.
pub const MAX_BODY_BYTES: usize = 8_192;

/// What a project says the verdict should be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Said {
    Safe,
    Disposable,
}

impl Said {
    pub fn as_str(self) -> &'static str {
        match self {
            Said::Safe => "safe",
            Said::Disposable => "disposable",
        }
    }
}

/// Where a report is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Open,
    Accepted,
    Rejected,
}

/// One report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub id: String,
    pub project: String,
    pub domain: String,
    pub verdict: Said,
    pub note: String,
    /// The id of the key that sent it.
    pub reported_by: String,
    /// Unix seconds.
    pub reported_at: i64,
    pub status: Status,
    /// Unix seconds, once decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<i64>,
    pub stamp: u64,
    /// Decided (no longer open): kept, listed, not counted against the open bound.
    #[serde(default)]
    pub removed: bool,
}

drg_domain::record_fields!(Report, key: id, writer: reported_by, keeps_removed);

/// A report as the API shows it.
#[derive(Debug, Serialize)]
pub struct Item<'a> {
    pub id: &'a str,
    pub domain: &'a str,
    pub verdict: Said,
    pub note: &'a str,
    pub reported_by: &'a str,
    pub reported_at: String,
    pub status: Status,
    pub decided_at: Option<String>,
}

impl<'a> Item<'a> {
    pub fn of(r: &'a Report) -> Item<'a> {
        Item {
            id: &r.id,
            domain: &r.domain,
            verdict: r.verdict,
            note: &r.note,
            reported_by: &r.reported_by,
            reported_at: drg_base::infra::units::unix_rfc3339(r.reported_at),
            status: r.status,
            decided_at: r.decided_at.map(drg_base::infra::units::unix_rfc3339),
        }
    }
}

/// The kind of record reports are (their files and Redis keys are named by it).
pub const KIND: &str = "reports";

/// The reports: their records, and the operator's accepted verdicts lookups read.
pub struct Reports {
    pub snapshot: Arc<Snapshot<Report>>,
    pub decisions: Arc<Snapshot<Decision>>,
    pub config: ReportsConfig,
    /// The plans: how long a project keeps its audit trail.
    plans: std::collections::BTreeMap<String, drg_access::plan::PlanConfig>,
}

/// What `POST /v1/reports` takes.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    domain: String,
    verdict: Said,
    #[serde(default)]
    note: String,
}

impl Reports {
    /// Reports and decisions kept in the control store; `accepted` gets the accepted verdicts of
    /// each new set of decisions.
    pub fn open(
        config: ReportsConfig,
        accepted: Arc<ArcSwap<Accepted>>,
        control: &std::sync::Arc<drg_base::infra::control::Control>,
        plans: std::collections::BTreeMap<String, drg_access::plan::PlanConfig>,
    ) -> Reports {
        let publish = Box::new(move |m: &Merged<Decision>, _: &_| {
            accepted.store(Arc::new(decisions::accepted(m.all())));
        });
        Reports {
            snapshot: Arc::new(Snapshot::open(KIND, control, Box::new(|_, _| {}))),
            decisions: Arc::new(Snapshot::open(decisions::KIND, control, publish)),
            config,
            plans,
        }
    }

    /// `POST /v1/reports` (`body`) or `GET /v1/reports` (`None`) for the caller's `key`;
    /// `once`: the write's `Idempotency-Key` (see [`crate::account::once`]).
    pub async fn answer(
        &self,
        body: Option<Bytes>,
        key: &KeyEntry,
        now: i64,
        once: Option<&str>,
    ) -> Answer {
        match body {
            None => self.list(key),
            Some(body) => match parse(&body) {
                Ok(b) => {
                    let asked = crate::account::once::Asked {
                        method: "POST",
                        target: "reports",
                        body: &body,
                    };
                    self.report(key, b, now, once, asked).await
                }
                Err(e) => e,
            },
        }
    }

    fn list(&self, key: &KeyEntry) -> Answer {
        if !self.snapshot.read_once() {
            return drg_base::answer::not_read_yet("The report store");
        }
        #[derive(Serialize)]
        struct Page<'a> {
            items: Vec<Item<'a>>,
        }
        let held = self.snapshot.held();
        let mut mine: Vec<&Report> = held.all().filter(|r| r.project == *key.project).collect();
        mine.sort_by(|a, b| (b.reported_at, &b.id).cmp(&(a.reported_at, &a.id)));
        let items = mine.into_iter().take(1_000).map(Item::of).collect();
        Answer::json(StatusCode::OK, &Page { items })
    }

    async fn report(
        &self,
        key: &KeyEntry,
        b: Body,
        now: i64,
        once: Option<&str>,
        asked: crate::account::once::Asked<'_>,
    ) -> Answer {
        let id = format!("r_{:016x}", getrandom::u64().unwrap_or_default());
        let report = Report {
            stamp: self.snapshot.stamp(0),
            id,
            project: key.project.to_string(),
            domain: b.domain,
            verdict: b.verdict,
            note: b.note,
            reported_by: key.id.to_string(),
            reported_at: now,
            status: Status::Open,
            decided_at: None,
            removed: false,
        };
        let max = self.config.max_open_per_project;
        let answer = |put| {
            match put {
            Ok(Put::Done { .. }) => {
                let said = format!("{} {}", report.domain, report.verdict.as_str());
                Answer::json(StatusCode::ACCEPTED, &Item::of(&report))
                    .changed(Changed::new(Action::ReportSent, &report.id, said))
            }
            Ok(Put::Full | Put::Stale | Put::Absent) => error_answer(
                StatusCode::CONFLICT,
                "conflict",
                "The project has as many open reports as the operator allows; wait for them to be decided.",
                Some(&format!("max_open_per_project: {max}")),
            ),
            Err(e) => {
                log::warn!("reports: {e}");
                drg_base::answer::unavailable("The report store", None)
            }
        }
        };
        let who = crate::account::once::Who::new(key, now, &self.plans);
        let snapshot = &self.snapshot;
        crate::account::once::write(snapshot, report.clone(), max, once, asked, &who, answer).await
    }
}

/// The body of a report, its domain canonical, or the 422 saying what is wrong.
fn parse(body: &[u8]) -> Result<Body, Answer> {
    let mut b: Body = serde_json::from_slice(body).map_err(|e| {
        Answer::from(ApiError::Validation(format!(
            "the body must be {{\"domain\": \"...\", \"verdict\": \"safe\" | \"disposable\", \"note\": \"...\"}}: {e}"
        )))
    })?;
    let name = DomainName::parse_owned(&b.domain)
        .map_err(|e| Answer::from(ApiError::Validation(format!("domain: {e}"))))?;
    b.domain = name.as_str().to_owned();
    if b.note.chars().count() > MAX_NOTE_CHARS || b.note.chars().any(char::is_control) {
        return Err(ApiError::Validation(format!(
            "note: at most {MAX_NOTE_CHARS} characters, no control characters"
        ))
        .into());
    }
    Ok(b)
}
