//! Keys this gateway saw revoked, remembered (in its cache) so that a restore of the control
//! store from before a revocation does not bring the key back into service here: such a key is
//! kept out and named, with the command that revokes it in the store again. Pure.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use drg_access::managed::ManagedKey;

/// Revocations remembered at most (the newest kept).
pub const KEPT: usize = 10_000;

/// Sifts a new set of the store's keys, `after`, against those held `before`: the keys gone
/// since are noted in `seen` at `now` as revoked (unless the store went back, `restored`: then
/// they were lost with the restore, not revoked); the keys of `after` seen revoked before are
/// taken out of it and returned.
pub fn sift(
    before: &[Arc<ManagedKey>],
    after: &mut Vec<Arc<ManagedKey>>,
    seen: &mut BTreeMap<String, i64>,
    restored: bool,
    now: i64,
) -> Vec<String> {
    let revived: Vec<String> = (after.iter())
        .filter(|k| seen.contains_key(&k.id))
        .map(|k| k.id.clone())
        .collect();
    after.retain(|k| !seen.contains_key(&k.id));
    if !restored {
        let there: HashSet<&str> = after.iter().map(|k| k.id.as_str()).collect();
        for k in before.iter().filter(|k| !there.contains(k.id.as_str())) {
            seen.entry(k.id.clone()).or_insert(now);
        }
    }
    if seen.len() > KEPT {
        let mut by_age: Vec<(i64, String)> = seen.iter().map(|(id, t)| (*t, id.clone())).collect();
        by_age.sort_unstable();
        for (_, id) in &by_age[..seen.len() - KEPT] {
            seen.remove(id);
        }
    }
    revived
}

/// The command that revokes `id` in the control store again.
pub fn revoke_again(id: &str) -> String {
    format!("domain-risk-gateway key revoke {id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> Arc<ManagedKey> {
        serde_json::from_value(serde_json::json!({
            "id": id, "project": "p", "plan": "free", "sha256": "00", "prefix": "drg_",
            "created_at": "2026-11-28T00:00:00Z",
        }))
        .unwrap()
    }

    #[test]
    fn a_key_seen_revoked_stays_out_when_a_restore_brings_it_back() {
        let mut seen = BTreeMap::new();
        let mut after = vec![key("b")];
        assert!(sift(&[key("a"), key("b")], &mut after, &mut seen, false, 7).is_empty());
        assert_eq!(seen.get("a"), Some(&7));
        // The restore: `a` is back in the store, `b` (made after the backup) is lost.
        let mut restored = vec![key("a")];
        let revived = sift(&after, &mut restored, &mut seen, true, 9);
        assert_eq!(revived, ["a"]);
        assert!(restored.is_empty());
        assert!(
            !seen.contains_key("b"),
            "lost with a restore is not revoked"
        );
    }
}
