//! A managed file's keys kept by project: a change to some projects' keys makes a list that
//! shares every other project's with the one it came from.

use std::collections::HashSet;
use std::sync::Arc;

use drg_domain::shards::Shards;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ManagedKey;

/// The keys of a managed file, one list to its readers (project after project, each project's
/// keys in the order they came) and by project inside: the rows a gateway holds are replaced
/// a project at a time ([`with_projects`](Self::with_projects)), and a copy shares the rest
/// (a hold at 100,000 keys then copies the shards it touches, not a list of every key).
#[derive(Debug, Clone, Default)]
pub struct Rows {
    by_project: Shards<Arc<str>, Arc<Vec<Arc<ManagedKey>>>>,
    len: usize,
}

impl Rows {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<ManagedKey>> {
        self.by_project.values().flat_map(|keys| keys.iter())
    }

    /// The keys of `project`, in the order they came.
    pub fn project(&self, project: &str) -> &[Arc<ManagedKey>] {
        self.by_project
            .get(project)
            .map_or(&[], |keys| keys.as_slice())
    }

    /// The keys shard by shard (a project's keys always in the same shard, in the order they
    /// came): the cache keeps a file a shard (see `key_files`).
    pub fn shards(&self) -> impl ExactSizeIterator<Item = impl Iterator<Item = &Arc<ManagedKey>>> {
        (self.by_project.shards()).map(|shard| shard.values().flat_map(|keys| keys.iter()))
    }

    /// Whether shard `i` is shared with `other`'s: the same keys there.
    pub fn shares(&self, other: &Rows, i: usize) -> bool {
        self.by_project.shares(&other.by_project, i)
    }

    /// Adds a key, last of its project's.
    pub fn push(&mut self, key: impl Into<Arc<ManagedKey>>) {
        let key = key.into();
        let project: Arc<str> = key.project.as_str().into();
        Arc::make_mut(self.by_project.or_default(project)).push(key);
        self.len += 1;
    }

    /// Puts `key` in the place of the key with its id (none: nothing changes); whether it was
    /// there.
    pub fn replace(&mut self, key: ManagedKey) -> bool {
        let Some(keys) = self.by_project.get_mut(key.project.as_str()) else {
            return false;
        };
        let Some(at) = keys.iter().position(|k| k.id == key.id) else {
            return false;
        };
        Arc::make_mut(keys)[at] = Arc::new(key);
        true
    }

    /// Every key to change (each list shared with another copy copied first: for the few keys
    /// of one project's file, or rewrites of every key).
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Arc<ManagedKey>> {
        (self.by_project.values_mut()).flat_map(|keys| Arc::make_mut(keys).iter_mut())
    }

    /// Keeps the keys `keep` holds to.
    pub fn retain(&mut self, mut keep: impl FnMut(&ManagedKey) -> bool) {
        self.by_project.retain(|_, keys| {
            Arc::make_mut(keys).retain(|k| keep(k));
            !keys.is_empty()
        });
        self.len = self.by_project.values().map(|keys| keys.len()).sum();
    }

    /// These rows with the keys of `projects` replaced by `rows` (keys of those projects), the
    /// other projects' shared.
    pub fn with_projects(&self, projects: &HashSet<String>, rows: &[Arc<ManagedKey>]) -> Rows {
        let mut next = self.clone();
        for project in projects {
            if let Some(keys) = next.by_project.remove(project.as_str()) {
                next.len -= keys.len();
            }
        }
        for key in rows {
            next.push(key.clone());
        }
        next
    }
}

impl PartialEq for Rows {
    /// The same keys, project by project in the same order; only the shards the two do not
    /// share are compared.
    fn eq(&self, other: &Rows) -> bool {
        self.len == other.len && (self.by_project.unshared(&other.by_project)).all(|(a, b)| a == b)
    }
}

impl Eq for Rows {}

impl<K: Into<Arc<ManagedKey>>> FromIterator<K> for Rows {
    fn from_iter<I: IntoIterator<Item = K>>(keys: I) -> Rows {
        let mut rows = Rows::default();
        for key in keys {
            rows.push(key);
        }
        rows
    }
}

impl<'a> IntoIterator for &'a Rows {
    type Item = &'a Arc<ManagedKey>;
    type IntoIter = Box<dyn Iterator<Item = &'a Arc<ManagedKey>> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

/// Written as the list it always was (older gateways read it).
impl Serialize for Rows {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Rows {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Rows, D::Error> {
        let keys = Vec::<ManagedKey>::deserialize(deserializer)?;
        Ok(keys.into_iter().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, project: &str) -> ManagedKey {
        serde_json::from_value(serde_json::json!({
            "id": id, "project": project, "plan": "free", "sha256": "00", "prefix": "drg_",
            "created_at": "2026-11-29T00:00:00Z",
        }))
        .unwrap()
    }

    #[test]
    fn a_change_to_one_project_shares_the_others_and_reads_as_one_list() {
        let held: Rows = (0..1_000)
            .map(|i| key(&format!("k{i}"), &format!("p{}", i % 100)))
            .collect();
        assert_eq!((held.len(), held.iter().count()), (1_000, 1_000));
        let ids = |r: &Rows, p: &str| -> Vec<String> {
            r.project(p).iter().map(|k| k.id.clone()).collect()
        };
        assert_eq!(ids(&held, "p7")[..2], ["k7", "k107"]);
        // p7 loses its keys but one and gains one.
        let rows = [key("k7", "p7"), key("new", "p7")].map(Arc::new);
        let next = held.with_projects(&HashSet::from(["p7".to_owned()]), &rows);
        assert_eq!(ids(&next, "p7"), ["k7", "new"]);
        assert_eq!(next.len(), 1_000 - 10 + 2);
        assert_eq!(next.by_project.unshared(&held.by_project).count(), 1);
        assert!(Arc::ptr_eq(&next.project("p8")[0], &held.project("p8")[0]));
        assert_ne!(next, held);
        assert_eq!(
            next,
            held.with_projects(&HashSet::from(["p7".to_owned()]), &rows)
        );
        // Written as a list, read back the same.
        let text = serde_json::to_string(&next).unwrap();
        assert!(text.starts_with("[{"));
        let back: Rows = serde_json::from_str(&text).unwrap();
        assert_eq!(back, next);
        // One project's file, edited as the keys API edits it.
        let mut one: Rows = [key("a", "p"), key("b", "p")].into_iter().collect();
        let mut b = key("b", "p");
        b.label = Some("renamed".into());
        assert!(one.replace(b) && !one.replace(key("c", "p")));
        one.push(key("c", "p"));
        one.retain(|k| k.id != "a");
        let labels: Vec<_> = one
            .iter()
            .map(|k| (k.id.as_str(), k.label.clone()))
            .collect();
        assert_eq!(labels, [("b", Some("renamed".into())), ("c", None)]);
        assert_eq!(one.len(), 2);
    }
}
