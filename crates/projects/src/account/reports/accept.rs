//! The operator's decision on a report: accepting keeps the verdict in the shared store (every
//! gateway answers it at its next poll), writes the domain to the allow file (`safe`) or the
//! block file (`disposable`) of this data folder with a provenance comment (the reports, their
//! projects, the date), and marks every open report of that domain and verdict accepted.
//! Rejecting marks the one report rejected: open reports count for nothing, so it leaves no
//! trace. Accepting again is harmless (the verdict is kept again if the store lost it), and two
//! operators deciding at once write the same verdict.

use std::path::{Path, PathBuf};

use super::decisions::{Decision, MAX_DECISIONS, OPERATOR};
use super::{Report, Said, Status};
use drg_base::infra::records::sql::SqlRecords;
use drg_base::infra::records::{Merged, Put, RecordsError};

/// Why a decision was not made.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("no report with id {0}")]
    NotFound(String),
    #[error("report {0} was already {1}")]
    Decided(String, &'static str),
    #[error("the store holds {0} accepted verdicts, the most it keeps")]
    Full(u32),
    #[error("the report store: {0}")]
    Store(#[from] RecordsError),
    #[error("{path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
}

/// What a decision did, for the operator.
#[derive(Debug)]
pub struct Decided {
    pub reports: Vec<String>,
    /// The file written (accepting).
    pub file: Option<PathBuf>,
    /// The report was accepted before: only the verdict was kept again.
    pub again: bool,
}

/// Where reports and the operator's accepted verdicts are kept.
pub struct Stores<'s> {
    pub reports: &'s SqlRecords<Report>,
    pub decisions: &'s SqlRecords<Decision>,
}

/// Accepts (`accept`) or rejects the report `id` held in `stores`; `data` is the data folder.
pub async fn decide(
    stores: Stores<'_>,
    id: &str,
    accept: bool,
    data: &Path,
    now: i64,
) -> Result<Decided, DecideError> {
    let store = stores.reports;
    let held = Merged::of(store.read().await?.1);
    let report = (held.all())
        .find(|r| r.id == id)
        .ok_or_else(|| DecideError::NotFound(id.to_owned()))?;
    if accept && report.status == Status::Accepted {
        keep(stores.decisions, std::slice::from_ref(report), now).await?;
        return Ok(Decided {
            reports: vec![id.to_owned()],
            file: None,
            again: true,
        });
    }
    if report.status != Status::Open {
        let was = if report.status == Status::Accepted {
            "accepted"
        } else {
            "rejected"
        };
        return Err(DecideError::Decided(id.to_owned(), was));
    }
    let mut decided: Vec<Report> = if accept {
        (held.all())
            .filter(|r| {
                r.status == Status::Open && r.domain == report.domain && r.verdict == report.verdict
            })
            .cloned()
            .collect()
    } else {
        vec![report.clone()]
    };
    decided.sort_by(|a, b| a.id.cmp(&b.id));
    let file = if accept {
        keep(stores.decisions, &decided, now).await?;
        Some(write_listed(data, &decided, now)?)
    } else {
        None
    };
    let last = std::sync::atomic::AtomicU64::new(0);
    for r in &mut decided {
        r.status = if accept {
            Status::Accepted
        } else {
            Status::Rejected
        };
        r.decided_at = Some(now);
        r.removed = true;
        r.stamp = drg_base::infra::records::next_stamp(&last, r.stamp);
        // A report changed meanwhile (another operator's decision) is left as it is.
        if store.put(r, 0).await? == Put::Stale {
            log::warn!("report {} changed meanwhile; left as it is", r.id);
        }
    }
    Ok(Decided {
        reports: decided.into_iter().map(|r| r.id).collect(),
        file,
        again: false,
    })
}

/// Keeps the verdict `reports` (one domain, one verdict) say in the shared store, unless it is
/// in force there already.
async fn keep(
    store: &SqlRecords<Decision>,
    reports: &[Report],
    now: i64,
) -> Result<(), DecideError> {
    let first = &reports[0];
    let held = Merged::of(store.read().await?.1);
    let before = (held.all()).find(|d| d.domain == first.domain);
    if before.is_some_and(|d| !d.removed && d.verdict == first.verdict) {
        return Ok(());
    }
    let mut projects: Vec<String> = reports.iter().map(|r| r.project.clone()).collect();
    projects.sort_unstable();
    projects.dedup();
    let last = std::sync::atomic::AtomicU64::new(0);
    let decision = Decision {
        domain: first.domain.clone(),
        project: OPERATOR.to_owned(),
        verdict: first.verdict,
        reports: reports.iter().map(|r| r.id.clone()).collect(),
        projects,
        decided_at: now,
        decided_by: "operator".to_owned(),
        stamp: drg_base::infra::records::next_stamp(&last, before.map_or(0, |d| d.stamp)),
        removed: false,
    };
    match store.put(&decision, MAX_DECISIONS).await? {
        // Stale: another operator's decision of the same domain won; it stands.
        // (`Absent` is a removal's outcome: a decision is never removed here.)
        Put::Done { .. } | Put::Stale | Put::Absent => Ok(()),
        Put::Full => Err(DecideError::Full(MAX_DECISIONS)),
    }
}

/// Appends the reports' domain to the allow or block file with its provenance.
fn write_listed(data: &Path, reports: &[Report], now: i64) -> Result<PathBuf, DecideError> {
    let first = &reports[0];
    let (name, said) = match first.verdict {
        Said::Safe => ("allowlist.txt", "safe"),
        Said::Disposable => ("disposable.txt", "disposable"),
    };
    let path = data.join(name);
    let io = |source| DecideError::File {
        path: path.display().to_string(),
        source,
    };
    let mut text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(io(e)),
    };
    if text.lines().any(|l| l.trim() == first.domain) {
        // Accepted before (another operator, or a store lost since): written once.
        return Ok(path);
    }
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    let ids: Vec<&str> = reports.iter().map(|r| r.id.as_str()).collect();
    let mut projects: Vec<&str> = reports.iter().map(|r| r.project.as_str()).collect();
    projects.sort_unstable();
    projects.dedup();
    let day = drg_base::infra::units::unix_rfc3339(now);
    text.push_str(&format!(
        "# {domain}: reported {said} by {n} project(s) ({projects}), reports {ids}; accepted {day}\n{domain}\n",
        domain = first.domain,
        n = projects.len(),
        projects = projects.join(", "),
        ids = ids.join(", "),
    ));
    // The file keeps its mode; the reloader sees it whole or not at all.
    let mode = drg_base::infra::fsutil::mode_of(&path).unwrap_or(0o644);
    drg_base::infra::fsutil::write_atomic(&path, mode, text.as_bytes()).map_err(io)?;
    Ok(path)
}
