//! A key's lineage, as values: which keys a key may manage (itself and the keys it made,
//! recursively; an operator key every API-made key of its project) and when a lineage ends (the
//! earliest expiry of a key and its makers), so that no key makes or rotates a key that
//! outlives it. Pure: the caller passes the keys as it holds them.

use drg_access::keys::{KeyEntry, KeyOrigin, KeyStore};

/// Makers followed at most: lineages are short, and a cycle (rows written by hand) must end.
const MAX_DEPTH: usize = 64;

/// One key as its lineage sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node<'a> {
    pub created_by: Option<&'a str>,
    pub expires_at: Option<i64>,
}

/// Keys by id, as lineage nodes.
pub trait Keys {
    fn node(&self, id: &str) -> Option<Node<'_>>;
}

impl Keys for KeyStore {
    fn node(&self, id: &str) -> Option<Node<'_>> {
        self.by_id(id).map(|k| Node {
            created_by: k.created_by.as_deref(),
            expires_at: k.expires_at,
        })
    }
}

/// Whether `caller` may rotate or revoke `target` (a key of its project): an operator key is
/// the root of every lineage in its project; any other key manages itself and the keys it
/// made, and theirs.
pub fn manages(keys: &impl Keys, caller: &KeyEntry, target: &str) -> bool {
    if caller.source == KeyOrigin::Operator || *caller.id == *target {
        return true;
    }
    let mut at = keys.node(target);
    for _ in 0..MAX_DEPTH {
        let Some(maker) = at.and_then(|k| k.created_by) else {
            return false;
        };
        if maker == &*caller.id {
            return true;
        }
        at = keys.node(maker);
    }
    false
}

/// When the lineage of key `id` ends (unix seconds): the earliest `expires_at` of the key and
/// of every maker above it (`None`: never). A key it makes or rotates lives no longer.
pub fn end_of(keys: &impl Keys, id: &str) -> Option<i64> {
    let mut end = None;
    let mut at = keys.node(id);
    for _ in 0..MAX_DEPTH {
        let Some(k) = at else {
            break;
        };
        end = earliest(end, k.expires_at);
        at = k.created_by.and_then(|m| keys.node(m));
    }
    end
}

/// The earlier of two ends (`None`: never).
pub fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Why a key may not make a key: its lineage ended, or the lifetime asked for passes its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TooLong {
    /// The lineage ended at this time (unix seconds): an expired key makes none.
    Ended(i64),
    /// `expires_in_days` would end after the lineage does (unix seconds).
    Outlives(i64),
}

/// The end (unix seconds) of a key made at `now` for `days` days (`None`: as long as its
/// maker's lineage, `end`), or why it may not be made.
pub fn new_key_end(now: i64, days: Option<u32>, end: Option<i64>) -> Result<Option<i64>, TooLong> {
    if let Some(end) = end.filter(|e| *e <= now) {
        return Err(TooLong::Ended(end));
    }
    match (days.map(|d| now + i64::from(d) * 86_400), end) {
        (Some(asked), Some(end)) if asked > end => Err(TooLong::Outlives(end)),
        (asked, end) => Ok(asked.or(end)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Rows(HashMap<&'static str, (Option<&'static str>, Option<i64>)>);

    impl Keys for Rows {
        fn node(&self, id: &str) -> Option<Node<'_>> {
            self.0.get(id).map(|(m, e)| Node {
                created_by: *m,
                expires_at: *e,
            })
        }
    }

    fn rows(list: &[(&'static str, Option<&'static str>, Option<i64>)]) -> Rows {
        Rows(list.iter().map(|(id, m, e)| (*id, (*m, *e))).collect())
    }

    fn caller(id: &str, source: KeyOrigin) -> KeyEntry {
        let mut k = KeyEntry::for_tests(id, "acme");
        k.source = source;
        k
    }

    #[test]
    fn a_key_manages_itself_and_what_it_made_an_operator_key_everything() {
        let r = rows(&[
            ("root", None, None),
            ("parent", Some("root"), None),
            ("child", Some("parent"), Some(100)),
            ("grandchild", Some("child"), Some(50)),
        ]);
        let api = |id| caller(id, KeyOrigin::Api);
        assert!(manages(&r, &api("parent"), "grandchild"));
        assert!(manages(&r, &api("child"), "child"));
        assert!(!manages(&r, &api("child"), "parent"), "never its maker");
        assert!(!manages(&r, &api("grandchild"), "child"));
        assert!(!manages(&r, &api("child"), "root"));
        assert!(!manages(&r, &api("parent"), "nobody"));
        let other = caller("other", KeyOrigin::Operator);
        assert!(manages(&r, &other, "grandchild"), "the root");
        assert_eq!(end_of(&r, "grandchild"), Some(50));
        assert_eq!(end_of(&r, "child"), Some(100));
        assert_eq!(end_of(&r, "parent"), None);
    }

    #[test]
    fn a_cycle_of_makers_ends() {
        let r = rows(&[
            ("a", Some("b"), None),
            ("b", Some("a"), Some(7)),
            ("c", None, None),
        ]);
        assert!(!manages(&r, &caller("c", KeyOrigin::Api), "a"));
        assert_eq!(end_of(&r, "a"), Some(7));
    }

    #[test]
    fn a_new_key_lives_no_longer_than_its_lineage() {
        let day = 86_400;
        assert_eq!(new_key_end(0, None, None), Ok(None));
        assert_eq!(new_key_end(0, Some(2), None), Ok(Some(2 * day)));
        assert_eq!(new_key_end(0, None, Some(day)), Ok(Some(day)), "inherits");
        assert_eq!(new_key_end(0, Some(1), Some(day)), Ok(Some(day)));
        assert_eq!(
            new_key_end(0, Some(2), Some(day)),
            Err(TooLong::Outlives(day))
        );
        assert_eq!(new_key_end(day, None, Some(day)), Err(TooLong::Ended(day)));
        assert_eq!(earliest(Some(3), None), Some(3));
        assert_eq!(earliest(Some(3), Some(2)), Some(2));
    }
}
