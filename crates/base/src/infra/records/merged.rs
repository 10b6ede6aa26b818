//! The records a gateway holds of one kind, by project then key, the newest of each kept. A
//! project's records (and a shard of projects) are shared between two sets until one of them
//! changes it: a copy costs the shards, a change its own shard's projects and its project's
//! records, whatever the rest hold.

use std::collections::{BTreeSet, HashMap};

use drg_domain::shards::Shards;
use std::sync::Arc;

use super::Record;

/// One project's records, by key.
type Keys<R> = HashMap<String, R>;

/// Records by project and key, the newest of each kept.
#[derive(Debug, Clone)]
pub struct Merged<R> {
    /// Keyed by `Arc<str>`: a shard copied copies its keys without allocating.
    by_project: Shards<Arc<str>, Arc<Keys<R>>>,
}

impl<R> Default for Merged<R> {
    fn default() -> Self {
        Merged {
            by_project: Shards::default(),
        }
    }
}

/// What moved between two sets a snapshot published: every project (a whole read), or the
/// projects named (a write, or a read of what changed since the revision held).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Moved {
    All,
    Projects(BTreeSet<String>),
}

impl<R: Record> Merged<R> {
    pub fn of(records: impl IntoIterator<Item = R>) -> Merged<R> {
        let mut m = Merged::default();
        for r in records {
            m.merge(r);
        }
        m
    }

    /// Takes `record` if it is newer than what is held of its key; whether it did.
    pub fn merge(&mut self, record: R) -> bool {
        if self
            .get(record.project(), record.key())
            .is_some_and(|held| !record.newer_than(held))
        {
            return false;
        }
        let keys = self.by_project.or_default(Arc::from(record.project()));
        Arc::make_mut(keys).insert(record.key().to_owned(), record);
        true
    }

    /// Replaces `project`'s records with `records` (what the store holds of it now).
    pub fn replace(&mut self, project: &str, records: impl IntoIterator<Item = R>) {
        let keys: Keys<R> = (records.into_iter())
            .map(|r| (r.key().to_owned(), r))
            .collect();
        if keys.is_empty() {
            self.by_project.remove(project);
        } else {
            self.by_project.insert(Arc::from(project), Arc::new(keys));
        }
    }

    /// Sets `project`'s `key` to `record` (what the store holds of it now; `None`: nothing).
    pub fn set(&mut self, project: &str, key: &str, record: Option<R>) {
        match (record, self.by_project.get_mut(project)) {
            (Some(r), Some(keys)) => {
                Arc::make_mut(keys).insert(key.to_owned(), r);
            }
            (Some(r), None) => {
                let keys = Keys::from([(key.to_owned(), r)]);
                self.by_project.insert(Arc::from(project), Arc::new(keys));
            }
            (None, Some(keys)) if keys.contains_key(key) => {
                Arc::make_mut(keys).remove(key);
                if keys.is_empty() {
                    self.by_project.remove(project);
                }
            }
            (None, _) => {}
        }
    }

    pub fn get(&self, project: &str, key: &str) -> Option<&R> {
        self.by_project.get(project)?.get(key)
    }

    /// `project`'s records, removals included.
    pub fn of_project<'a>(&'a self, project: &str) -> impl Iterator<Item = &'a R> + 'a {
        self.by_project
            .get(project)
            .into_iter()
            .flat_map(|k| k.values())
    }

    /// `project`'s records in force.
    pub fn live<'a>(&'a self, project: &str) -> impl Iterator<Item = &'a R> + 'a {
        self.of_project(project).filter(|r| !r.removed())
    }

    /// Every record, removals included.
    pub fn all(&self) -> impl Iterator<Item = &R> {
        self.by_project.values().flat_map(|k| k.values())
    }

    /// Every record, by project and key (a file's order).
    pub fn sorted(&self) -> Vec<R> {
        let mut all: Vec<R> = self.all().cloned().collect();
        all.sort_by(|a, b| (a.project(), a.key()).cmp(&(b.project(), b.key())));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::infra::records::tests::over;

    #[test]
    fn a_change_to_one_project_leaves_the_others_shared() {
        let mut a = Merged::of([over("a.example", 1, false)]);
        let mut other = over("b.example", 1, false);
        other.project = "q".into();
        a.merge(other);
        let b = {
            let mut b = a.clone();
            assert!(b.merge(over("c.example", 2, false)));
            assert!(!b.merge(over("c.example", 1, false)), "older loses");
            b
        };
        assert!(Arc::ptr_eq(
            a.by_project.get("q").unwrap(),
            b.by_project.get("q").unwrap()
        ));
        assert!(!Arc::ptr_eq(
            a.by_project.get("p").unwrap(),
            b.by_project.get("p").unwrap()
        ));
        assert_eq!(a.live("p").count(), 1);
        assert_eq!(b.live("p").count(), 2);
        let mut c = b.clone();
        c.replace("p", [over("d.example", 3, true)]);
        assert_eq!(c.live("p").count(), 0);
        assert_eq!(c.of_project("p").count(), 1);
        c.replace("p", []);
        assert_eq!(c.all().count(), 1, "q's record alone");
        // One record set alone: the others of its project stay, the other projects shared.
        let mut d = b.clone();
        d.set("p", "a.example", None);
        assert_eq!(d.live("p").count(), 1);
        assert!(Arc::ptr_eq(
            d.by_project.get("q").unwrap(),
            b.by_project.get("q").unwrap()
        ));
        d.set("p", "c.example", None);
        assert!(!d.by_project.contains_key("p"), "an empty project goes");
        d.set("p", "e.example", Some(over("e.example", 5, false)));
        assert_eq!(d.live("p").count(), 1);
    }
}
