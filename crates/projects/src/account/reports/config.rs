//! `gateway.reports`: how many open reports a project may have.

use serde::{Deserialize, Serialize};

/// `gateway.reports`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReportsConfig {
    /// Kept so that configs which set it still load (2 to 1000); it decides nothing now: only
    /// a verdict the operator accepted changes another project's answer.
    pub min_projects: u32,
    /// Open reports a project may have at once (1 to 100000); more: `409`.
    pub max_open_per_project: u32,
}

impl Default for ReportsConfig {
    fn default() -> Self {
        ReportsConfig {
            min_projects: 3,
            max_open_per_project: 100,
        }
    }
}

impl ReportsConfig {
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !(2..=1_000).contains(&self.min_projects) {
            out.push(format!(
                "gateway.reports.min_projects: {} is outside 2..=1000 (one project alone must never decide for the others)",
                self.min_projects
            ));
        }
        if !(1..=100_000).contains(&self.max_open_per_project) {
            out.push(format!(
                "gateway.reports.max_open_per_project: {} is outside 1..=100000",
                self.max_open_per_project
            ));
        }
        out
    }
}
