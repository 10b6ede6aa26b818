//! The operator's view of the reports: grouped by domain, with how many distinct projects said
//! what; and the safe counts lookups read.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{Item, Report, SafeCounts, Said, Status};

/// Distinct projects that reported each domain `safe`, open or accepted (a rejected report
/// counts for nothing).
pub fn safe_counts<'a>(reports: impl Iterator<Item = &'a Report>) -> SafeCounts {
    let mut by: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for r in reports.filter(|r| r.verdict == Said::Safe && r.status != Status::Rejected) {
        by.entry(&r.domain).or_default().insert(&r.project);
    }
    by.into_iter()
        .map(|(d, p)| (d.to_owned(), p.len() as u32))
        .collect()
}

/// Distinct projects that reported `name` (or its registrable domain) `safe`, when at least
/// `min` did: what a lookup's signals carry.
pub fn reported_safe(counts: &SafeCounts, name: &drg_domain::DomainName, min: u32) -> Option<u32> {
    if counts.is_empty() {
        return None;
    }
    let own = counts.get(name.as_str()).copied().unwrap_or(0);
    let parent = (name.registrable())
        .and_then(|r| counts.get(r).copied())
        .unwrap_or(0);
    Some(own.max(parent)).filter(|n| *n >= min)
}

/// What the projects said of one domain.
#[derive(Debug, Serialize)]
pub struct Group<'a> {
    pub domain: &'a str,
    /// Distinct projects with an open report saying `safe`, and saying `disposable`.
    pub safe_projects: usize,
    pub disposable_projects: usize,
    /// Every report of the domain, open first, newest first.
    pub reports: Vec<Item<'a>>,
}

/// The reports grouped by domain: domains with open reports first (most projects first), then
/// the decided ones; `open_only` leaves decided groups out.
pub fn groups<'a>(reports: impl Iterator<Item = &'a Report>, open_only: bool) -> Vec<Group<'a>> {
    let mut by: BTreeMap<&str, Vec<&Report>> = BTreeMap::new();
    for r in reports {
        by.entry(&r.domain).or_default().push(r);
    }
    let mut out: Vec<Group<'a>> = by
        .into_iter()
        .filter(|(_, rs)| !open_only || rs.iter().any(|r| r.status == Status::Open))
        .map(|(domain, mut rs)| {
            let projects = |said| {
                (rs.iter())
                    .filter(|r| r.verdict == said && r.status == Status::Open)
                    .map(|r| r.project.as_str())
                    .collect::<BTreeSet<_>>()
                    .len()
            };
            let (safe_projects, disposable_projects) =
                (projects(Said::Safe), projects(Said::Disposable));
            rs.sort_by_key(|r| (r.status != Status::Open, std::cmp::Reverse(r.reported_at)));
            Group {
                domain,
                safe_projects,
                disposable_projects,
                reports: rs.into_iter().map(Item::of).collect(),
            }
        })
        .collect();
    out.sort_by_key(|g| {
        let open = g.safe_projects + g.disposable_projects;
        (open == 0, std::cmp::Reverse(open))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(id: &str, project: &str, domain: &str, verdict: Said, status: Status) -> Report {
        Report {
            id: id.into(),
            project: project.into(),
            domain: domain.into(),
            verdict,
            note: String::new(),
            reported_by: "k".into(),
            reported_at: 1,
            status,
            decided_at: None,
            stamp: 1,
            removed: status != Status::Open,
        }
    }

    #[test]
    fn distinct_projects_count_and_a_rejection_counts_for_nothing() {
        let rs = [
            report("1", "a", "x.com", Said::Safe, Status::Open),
            report("2", "a", "x.com", Said::Safe, Status::Open),
            report("3", "b", "x.com", Said::Safe, Status::Accepted),
            report("4", "c", "x.com", Said::Safe, Status::Rejected),
            report("5", "c", "y.com", Said::Disposable, Status::Open),
        ];
        let counts = safe_counts(rs.iter());
        assert_eq!(counts.get("x.com"), Some(&2));
        assert_eq!(counts.get("y.com"), None);
        let g = groups(rs.iter(), false);
        assert_eq!(g[0].domain, "x.com");
        assert_eq!((g[0].safe_projects, g[0].disposable_projects), (1, 0));
        assert_eq!(g[0].reports.len(), 4);
        assert_eq!(g[1].domain, "y.com");
        assert_eq!(g[1].disposable_projects, 1);
    }
}
