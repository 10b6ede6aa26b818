//! The operator's accepted verdicts: one record per domain in the shared store (the reports'
//! SQLite file or the quota's Redis), so every gateway answers them, whatever data folder it
//! reads. Only an accepted verdict changes another project's answer: an open report changes
//! nothing for anyone, however many projects file it.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::Said;
use drg_domain::age::AgeRule;
use drg_domain::classify::{verdict_of, Signals, Verdict};
use drg_domain::overrides::OverrideVerdict;
use drg_domain::table::{DomainTable, TableMatch};
use drg_domain::{DomainName, TableRule};

/// The project the operator's records are kept under (no API key names it: project names
/// never start with `_`).
pub const OPERATOR: &str = "_operator";
/// Accepted verdicts kept at most (a bound, not a target: the operator decides each one).
pub const MAX_DECISIONS: u32 = 100_000;
/// The record kind: `verdicts.records.sqlite`, `drg:verdicts:*` on Redis.
pub const KIND: &str = "verdicts";

/// One accepted verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub domain: String,
    /// Always [`OPERATOR`].
    pub project: String,
    pub verdict: Said,
    /// The reports accepted with it, and their projects.
    pub reports: Vec<String>,
    pub projects: Vec<String>,
    /// Unix seconds.
    pub decided_at: i64,
    /// Who decided (`operator`: the CLI).
    pub decided_by: String,
    pub stamp: u64,
    #[serde(default)]
    pub removed: bool,
}

drg_domain::record_fields!(Decision, key: domain, writer: decided_by);

/// The accepted verdicts lookups read: each domain's, with how many projects reported it.
pub type Accepted = HashMap<String, (Said, u32)>;

/// The accepted verdicts in force among `decisions`.
pub fn accepted<'a>(decisions: impl Iterator<Item = &'a Decision>) -> Accepted {
    decisions
        .filter(|d| !d.removed)
        .map(|d| (d.domain.clone(), (d.verdict, d.projects.len() as u32)))
        .collect()
}

/// `name`'s verdict (as [`verdict_of`] gives it) with the operator's accepted verdict
/// applied: an accepted `safe` keeps inference from flagging it (`reported_safe` of the
/// signals: the projects whose reports were accepted), an accepted `disposable` answers a name
/// no list decided as a blocklist entry would, on every gateway, whatever data folder it reads.
pub fn verdict_with<'a>(
    accepted: &Accepted,
    (table, name, found): (&'a DomainTable, &'a DomainName, TableMatch<'a>),
    mut signals: Signals<'_>,
    rule: AgeRule,
) -> Verdict<'a> {
    let said = accepted_of(accepted, name);
    signals.reported_safe = match said {
        Some((Said::Safe, n)) => Some(n.max(1)),
        _ => None,
    };
    let open = found.rule == TableRule::Unknown;
    let mut verdict = verdict_of(table, name, found, signals, rule);
    if let (Some((Said::Disposable, _)), true) = (said, open) {
        OverrideVerdict::Block.apply(&mut verdict.record);
    }
    verdict
}

/// What the operator accepted for `name` or, failing that, its registrable domain.
pub fn accepted_of(accepted: &Accepted, name: &DomainName) -> Option<(Said, u32)> {
    if accepted.is_empty() {
        return None;
    }
    (accepted.get(name.as_str()))
        .or_else(|| name.registrable().and_then(|r| accepted.get(r)))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(domain: &str, verdict: Said, removed: bool) -> Decision {
        Decision {
            domain: domain.into(),
            project: OPERATOR.into(),
            verdict,
            reports: vec!["r_1".into()],
            projects: vec!["a".into(), "b".into()],
            decided_at: 0,
            decided_by: "operator".into(),
            stamp: 1,
            removed,
        }
    }

    #[test]
    fn only_decisions_in_force_count_and_a_parent_covers_its_names() {
        let all = [
            decision("good.example", Said::Safe, false),
            decision("gone.example", Said::Safe, true),
            decision("bad.example", Said::Disposable, false),
        ];
        let a = accepted(all.iter());
        let name = |n: &str| drg_domain::DomainName::parse(n).unwrap();
        assert_eq!(
            accepted_of(&a, &name("mail.good.example")),
            Some((Said::Safe, 2))
        );
        assert_eq!(accepted_of(&a, &name("gone.example")), None);
        assert_eq!(
            accepted_of(&a, &name("bad.example")),
            Some((Said::Disposable, 2))
        );
    }
}
