//! A project's own verdicts (`/v1/overrides`): `allow` or `block` for a name and its
//! subdomains, for that project's answers only, before every list and every inference.
//!
//! An entry carries a stamp and may be a removal (`removed`): the gateway keeps them as records
//! that merge last-writer-wins; this set is what one merge holds, as lookups read it.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::name::DomainName;
use crate::record::{Reason, RiskRecord};
use crate::shards::Shards;

/// What a project says of a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OverrideVerdict {
    /// Answered `safe` (score 0), keeping `is_free_provider` and `mx_provider_label`.
    Allow,
    /// Answered `disposable` 100.
    Block,
}

impl OverrideVerdict {
    /// As the API spells it (`allow`, `block`).
    pub fn as_str(self) -> &'static str {
        match self {
            OverrideVerdict::Allow => "allow",
            OverrideVerdict::Block => "block",
        }
    }

    /// The rule `?explain=true` names.
    pub fn rule(self) -> &'static str {
        self.evidence_rule().as_str()
    }

    /// The rule as the evidence carries it.
    pub fn evidence_rule(self) -> crate::evidence::Rule {
        match self {
            OverrideVerdict::Allow => crate::evidence::Rule::ProjectAllow,
            OverrideVerdict::Block => crate::evidence::Rule::ProjectBlock,
        }
    }

    /// `record` as this verdict answers it.
    pub fn apply(self, record: &mut RiskRecord<'_>) {
        match self {
            OverrideVerdict::Allow => {
                record.reason = Reason::Safe;
                record.risk_score = 0;
            }
            OverrideVerdict::Block => {
                record.reason = Reason::Disposable;
                record.risk_score = 100;
                record.is_corporate_email = false;
            }
        }
    }
}

/// One project's word on one name (or its removal).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
    pub project: String,
    /// The canonical name; it covers its subdomains.
    pub domain: String,
    pub verdict: OverrideVerdict,
    pub note: String,
    /// The id of the key that set (or removed) it.
    pub set_by: String,
    /// Unix seconds.
    pub set_at: i64,
    /// Orders two writes of one name: microseconds of the writer's clock, made larger than
    /// the stamp it replaced.
    pub stamp: u64,
    /// A removal, kept so that a store putting back older entries cannot revive it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

// Kept as last-writer-wins records (the gateway's records engine), keyed by name.
crate::record_fields!(Override, key: domain, writer: set_by);

/// One project's overrides: name -> entry.
type Names = HashMap<String, Arc<Override>>;

/// Every project's overrides, as the request path reads them.
#[derive(Debug, Default, Clone)]
pub struct OverrideSet {
    /// project -> name -> entry (removals included, never found). Each project's map is
    /// shared with the set before when it did not change ([`OverrideSet::next`]): what moved
    /// between two sets is found in the projects whose map is another.
    /// Keyed by `Arc<str>`: a set that follows another copies its keys without allocating.
    by_project: Shards<Arc<str>, Arc<Names>>,
}

impl OverrideSet {
    /// The set of `entries` (one a project and name: the merged records).
    pub fn of(entries: impl IntoIterator<Item = Override>) -> OverrideSet {
        let mut by_project: HashMap<Arc<str>, Names> = HashMap::new();
        for e in entries {
            (by_project.entry(Arc::from(e.project.as_str())).or_default())
                .insert(e.domain.clone(), Arc::new(e));
        }
        let by_project = by_project
            .into_iter()
            .map(|(p, names)| (p, Arc::new(names)))
            .collect();
        OverrideSet { by_project }
    }

    /// The set of `entries` that follows `self`: as [`OverrideSet::of`], each project whose
    /// entries are those `self` holds keeping `self`'s map (so [`OverrideSet::moved`] passes
    /// over it).
    pub fn next(&self, entries: impl IntoIterator<Item = Override>) -> OverrideSet {
        let mut set = OverrideSet::of(entries);
        let same: Vec<(Arc<str>, Arc<Names>)> = (set.by_project.iter())
            .filter_map(|(project, names)| {
                let held = self.by_project.get(project)?;
                (**held == **names).then(|| (project.clone(), held.clone()))
            })
            .collect();
        for (project, held) in same {
            set.by_project.insert(project, held);
        }
        set
    }

    /// The set that follows `self` where only `changed` projects moved, each with all its
    /// entries now (none: it has none left); the others keep `self`'s maps. A project whose
    /// entries are those `self` holds keeps its map too, as in [`OverrideSet::next`].
    pub fn with_projects(
        &self,
        changed: impl IntoIterator<Item = (String, Vec<Override>)>,
    ) -> OverrideSet {
        let mut by_project = self.by_project.clone();
        for (project, entries) in changed {
            let names: Names = (entries.into_iter())
                .map(|e| (e.domain.clone(), Arc::new(e)))
                .collect();
            if names.is_empty() {
                by_project.remove(project.as_str());
            } else if (by_project.get(project.as_str())).is_none_or(|held| **held != names) {
                by_project.insert(Arc::from(project), Arc::new(names));
            }
        }
        OverrideSet { by_project }
    }

    /// The override that decides `name` for `project`: the name's own, else its nearest
    /// parent's (a name covers its subdomains).
    pub fn find(&self, project: &str, name: &DomainName) -> Option<&Arc<Override>> {
        let names = self.by_project.get(project)?;
        let mut at = name.as_str();
        loop {
            if let Some(o) = names.get(at).filter(|o| !o.removed) {
                return Some(o);
            }
            // A parent with a dot left (never a TLD alone).
            match at.split_once('.') {
                Some((_, rest)) if rest.contains('.') => at = rest,
                _ => return None,
            }
        }
    }

    /// The entry held for exactly `domain` (a removal too).
    pub fn get(&self, project: &str, domain: &str) -> Option<&Arc<Override>> {
        self.by_project.get(project)?.get(domain)
    }

    /// The (project, name) pairs whose entry differs between `self` and `newer`: set, changed
    /// or removed since (what a watcher of verdicts judges again), in order. Only the projects
    /// whose map is not the one `self` holds are compared (a set made by [`OverrideSet::next`]
    /// shares the others): a write costs its project's overrides, not every project's.
    pub fn moved(&self, newer: &OverrideSet) -> Vec<(String, String)> {
        let empty = Names::new();
        let mut out: Vec<(String, String)> = Vec::new();
        let mut diff = |project: &str, a: &Names, b: &Names| {
            for (x, y) in [(a, b), (b, a)] {
                for (name, o) in x {
                    if y.get(name).is_none_or(|other| other.stamp != o.stamp) {
                        out.push((project.to_owned(), name.clone()));
                    }
                }
            }
        };
        // Only the shards a write changed can differ.
        for (mine, theirs) in self.by_project.unshared(&newer.by_project) {
            for (project, b) in theirs {
                match mine.get(project) {
                    Some(a) if Arc::ptr_eq(a, b) => {}
                    a => diff(project, a.map_or(&empty, |a| a), b),
                }
            }
            for (project, a) in mine {
                if !theirs.contains_key(project) {
                    diff(project, a, &empty);
                }
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// Whether `project` never had an override (most projects: the lookup skips the walk).
    pub fn none_for(&self, project: &str) -> bool {
        self.by_project.get(project).is_none_or(|m| m.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(project: &str, domain: &str, verdict: OverrideVerdict, stamp: u64) -> Override {
        Override {
            project: project.into(),
            domain: domain.into(),
            verdict,
            note: String::new(),
            set_by: "k1".into(),
            set_at: 0,
            stamp,
            removed: false,
        }
    }

    fn name(s: &str) -> DomainName {
        DomainName::parse(s).unwrap()
    }

    #[test]
    fn a_name_covers_its_subdomains_for_its_project_only() {
        let set = OverrideSet::of([entry("a", "shop.example", OverrideVerdict::Allow, 1)]);
        assert!(set.find("a", &name("shop.example")).is_some());
        assert!(set.find("a", &name("eu.mail.shop.example")).is_some());
        assert!(set.find("a", &name("other.example")).is_none());
        assert!(set.find("a", &name("othershop.example")).is_none());
        assert!(set.find("b", &name("shop.example")).is_none());
        assert!(set.none_for("b") && !set.none_for("a"));
    }

    #[test]
    fn verdicts_answer_as_documented() {
        let mut r = RiskRecord {
            domain: "x.com",
            risk_score: 80,
            reason: Reason::Disposable,
            is_free_provider: true,
            is_corporate_email: false,
            mx_provider_label: Some("Gmail"),
        };
        OverrideVerdict::Allow.apply(&mut r);
        assert_eq!((r.reason, r.risk_score), (Reason::Safe, 0));
        assert!(r.is_free_provider);
        assert_eq!(r.mx_provider_label, Some("Gmail"));
        OverrideVerdict::Block.apply(&mut r);
        assert_eq!((r.reason, r.risk_score), (Reason::Disposable, 100));
    }

    #[test]
    fn what_moved_between_two_sets_is_named_once() {
        use OverrideVerdict::*;
        let before =
            OverrideSet::of([entry("p", "a.com", Allow, 1), entry("p", "b.com", Block, 1)]);
        let mut removed = entry("p", "a.com", Allow, 2);
        removed.removed = true;
        let after = OverrideSet::of([
            removed,
            entry("p", "b.com", Block, 1),
            entry("q", "c.com", Block, 3),
        ]);
        assert_eq!(
            before.moved(&after),
            [
                ("p".to_owned(), "a.com".to_owned()),
                ("q".into(), "c.com".into())
            ]
        );
        assert!(after.moved(&after.clone()).is_empty());
    }

    #[test]
    fn a_write_of_one_project_shares_the_others_maps_and_moves_its_names_only() {
        use OverrideVerdict::*;
        let mut held = vec![entry("a", "x.com", Allow, 1), entry("a", "y.com", Block, 1)];
        held.extend((0..1_000).map(|i| entry("b", &format!("n{i}.com"), Block, 1)));
        let before = OverrideSet::default().next(held.clone());
        held.push(entry("a", "shop.example", Block, 2));
        held[0].stamp = 3;
        let after = before.next(held.clone());
        assert!(Arc::ptr_eq(
            before.by_project.get("b").unwrap(),
            after.by_project.get("b").unwrap()
        ));
        assert!(!Arc::ptr_eq(
            before.by_project.get("a").unwrap(),
            after.by_project.get("a").unwrap()
        ));
        let moved = [
            ("a".to_owned(), "shop.example".to_owned()),
            ("a".into(), "x.com".into()),
        ];
        assert_eq!(before.moved(&after), moved);
        // A set made afresh (no map shared) tells the same, and nothing when nothing moved.
        assert_eq!(before.moved(&OverrideSet::of(held.clone())), moved);
        assert!(after.moved(&after.next(held)).is_empty());
        // A project gone: each of its names moved.
        let gone = OverrideSet::of(
            after
                .by_project
                .get("a")
                .unwrap()
                .values()
                .map(|o| (**o).clone()),
        );
        assert_eq!(after.moved(&gone).len(), 1_000);
    }
}
