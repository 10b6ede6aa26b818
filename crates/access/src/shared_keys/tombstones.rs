//! Revocations kept as tombstones (id, project, time), in Redis (`keys:{keys}:revoked`) and in
//! every gateway's cache that knew the key: a key put back after Redis lost its data (by a
//! gateway whose cache still held it) is subtracted by any tombstone any gateway holds, so a
//! revoked key never comes back, whatever the order of stops, flushes, failovers and restarts.
//!
//! A tombstone is kept for [`LIFETIME_SECS`] after its revocation; a gateway whose cache was last in
//! step with Redis longer ago than that puts nothing back ([`fresh_enough`]), so every key a
//! restore could bring back is covered by a tombstone still kept.

use std::collections::HashSet;

use crate::managed::{ManagedFile, ManagedKey, Tombstone};

/// How long a tombstone is kept (and so how old a cache may be and still put keys back): 400
/// days, over a year, so that a gateway kept stopped for a season, or a state folder restored
/// from a yearly backup, still finds every revocation it missed.
pub const LIFETIME_SECS: u64 = 400 * 86_400;

/// Now, in unix seconds (tombstones and the cache's times are in these).
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Adds `t` unless `list` holds its id already (the earlier revocation's time stays); whether
/// it was added.
pub fn add(list: &mut Vec<Tombstone>, t: Tombstone) -> bool {
    if list.iter().any(|x| x.id == t.id) {
        return false;
    }
    list.push(t);
    true
}

/// Drops the tombstones past [`LIFETIME_SECS`] at `now`, and sorts the rest by id (the cache
/// is written in one order whatever the order they came in).
pub fn prune(list: &mut Vec<Tombstone>, now: u64) {
    list.retain(|t| t.at.saturating_add(LIFETIME_SECS) > now);
    list.sort_by(|a, b| a.id.cmp(&b.id));
}

/// Whether `t` revokes `row` (same id, same project: a project never revokes another's key).
fn revokes(t: &Tombstone, row: &ManagedKey) -> bool {
    t.id == row.id && t.project == row.project
}

/// Takes the keys `list` revokes out of `file`, with every key they made, recursively (lineage
/// never leaves a project); the ids of the revoked keys that were there (not those only made by
/// one).
pub fn strip(file: &mut ManagedFile, list: &[Tombstone]) -> Vec<String> {
    let dead: Vec<String> = file
        .keys
        .iter()
        .filter(|row| list.iter().any(|t| revokes(t, row)))
        .map(|row| row.id.clone())
        .collect();
    // A key made by a revoked key goes with it, also when its maker's row is gone already.
    let mut gone: HashSet<(String, String)> = list
        .iter()
        .map(|t| (t.project.clone(), t.id.clone()))
        .collect();
    loop {
        let before = file.keys.len();
        file.keys.retain(|k| {
            let by = |id: &str| gone.contains(&(k.project.clone(), id.to_owned()));
            let out = by(&k.id) || k.created_by.as_deref().is_some_and(by);
            if out {
                gone.insert((k.project.clone(), k.id.clone()));
            }
            !out
        });
        if file.keys.len() == before {
            return dead;
        }
    }
}

/// `id` of `project` and every key it made among `rows`, recursively; empty when `rows` has
/// no key `id` in `project` (this gateway does not know it).
pub fn lineage(rows: &[ManagedKey], project: &str, id: &str) -> Vec<String> {
    if !rows.iter().any(|r| r.id == id && r.project == project) {
        return Vec::new();
    }
    let mut tree: HashSet<&str> = HashSet::from([id]);
    let mut out = vec![id.to_owned()];
    loop {
        let more: Vec<&ManagedKey> = rows
            .iter()
            .filter(|r| !tree.contains(r.id.as_str()))
            .filter(|r| r.created_by.as_deref().is_some_and(|by| tree.contains(by)))
            .collect();
        if more.is_empty() {
            return out;
        }
        for r in more {
            tree.insert(&r.id);
            out.push(r.id.clone());
        }
    }
}

/// Whether a cache last in step with Redis at `read_at` may put its keys back at `now`: only
/// within [`LIFETIME_SECS`], while every revocation it could have missed is still kept. A
/// cache of a release before tombstones (no time) may, as it did then.
pub fn fresh_enough(read_at: Option<u64>, now: u64) -> bool {
    read_at.is_none_or(|t| t.saturating_add(LIFETIME_SECS) > now)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::managed::test_key as key;

    fn stone(id: &str, project: &str, at: u64) -> Tombstone {
        Tombstone {
            id: id.into(),
            project: project.into(),
            at,
        }
    }

    #[test]
    fn a_tombstone_takes_its_key_and_what_it_made_only_in_its_project() {
        let mut file = ManagedFile {
            keys: vec![
                key("a", "acme", Some("server")),
                key("b", "acme", Some("a")),
                key("c", "acme", Some("b")),
                key("d", "acme", Some("gone")),
                key("e", "other", Some("server")),
                key("f", "acme", Some("server")),
            ],
            ..ManagedFile::default()
        };
        let list = [
            stone("a", "acme", 1),
            stone("e", "acme", 1),
            stone("gone", "acme", 1),
        ];
        assert_eq!(strip(&mut file, &list), ["a"], "e is another project's");
        let left: Vec<_> = file.keys.iter().map(|k| k.id.as_str()).collect();
        assert_eq!(
            left,
            ["e", "f"],
            "d's maker was revoked before its row came"
        );
    }

    #[test]
    fn a_lineage_is_known_only_from_a_key_of_the_project() {
        let rows = [
            key("a", "acme", Some("server")),
            key("b", "acme", Some("a")),
            key("c", "acme", Some("b")),
            key("d", "acme", Some("server")),
        ];
        assert_eq!(lineage(&rows, "acme", "a"), ["a", "b", "c"]);
        assert_eq!(lineage(&rows, "acme", "c"), ["c"]);
        assert!(lineage(&rows, "other", "a").is_empty());
        assert!(lineage(&rows, "acme", "x").is_empty());
    }

    #[test]
    fn tombstones_are_added_once_kept_for_their_lifetime_and_sorted() {
        let mut list = vec![stone("b", "acme", 100)];
        assert!(add(&mut list, stone("a", "acme", 200)));
        assert!(
            !add(&mut list, stone("b", "acme", 300)),
            "the first time stays"
        );
        let now = 150 + LIFETIME_SECS;
        prune(&mut list, now);
        assert_eq!(list, [stone("a", "acme", 200)]);
        assert!(fresh_enough(None, now));
        assert!(fresh_enough(Some(151), now));
        assert!(!fresh_enough(Some(150), now));
    }
}
