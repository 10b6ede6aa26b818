//! The operator's view of the reports: grouped by domain, with how many distinct projects said
//! what.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::{Item, Report, Said, Status};

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
    fn groups_count_distinct_projects_with_open_reports() {
        let rs = [
            report("1", "a", "x.com", Said::Safe, Status::Open),
            report("2", "a", "x.com", Said::Safe, Status::Open),
            report("3", "b", "x.com", Said::Safe, Status::Accepted),
            report("4", "c", "x.com", Said::Safe, Status::Rejected),
            report("5", "c", "y.com", Said::Disposable, Status::Open),
        ];
        let g = groups(rs.iter(), false);
        assert_eq!(g[0].domain, "x.com");
        assert_eq!((g[0].safe_projects, g[0].disposable_projects), (1, 0));
        assert_eq!(g[0].reports.len(), 4);
        assert_eq!(g[1].domain, "y.com");
        assert_eq!(g[1].disposable_projects, 1);
    }
}
