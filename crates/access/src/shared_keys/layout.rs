//! The names of the shared keys store in Redis. All carry the hash tag `{keys}`, so that every
//! script sees its keys in one slot of a Redis Cluster.

/// Hash: key id -> the key's row (the managed file's JSON, hashed secret only, no last use).
pub const ROWS: &str = "keys:{keys}:rows";
/// Hash: key id -> unix seconds of the last call any gateway saved.
pub const USED: &str = "keys:{keys}:used";
/// Counter: bumped by every change of the rows (made, revoked).
pub const VERSION: &str = "keys:{keys}:version";
/// The data set's name, set by the first gateway to read it (and named anew by a gateway that
/// finds the data set went back to an older state).
pub const EPOCH: &str = "keys:{keys}:epoch";
/// Hash: key id -> its tombstone, `{"project":..,"at":unix seconds}`: every revocation, kept for
/// [`super::tombstones::LIFETIME_SECS`] (see [`super::tombstones`]).
pub const REVOKED: &str = "keys:{keys}:revoked";

/// Set: the ids of a project's API-made keys (what `max_keys` counts, what revoking walks).
pub fn project(project: &str) -> String {
    format!("keys:{{keys}}:project:{project}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_name_shares_one_hash_tag() {
        let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_owned();
        for k in [
            super::ROWS,
            super::USED,
            super::VERSION,
            super::EPOCH,
            super::REVOKED,
            &super::project("acme"),
        ] {
            assert_eq!(tag(k), "{keys}", "{k}");
        }
        assert_eq!(super::project("acme"), "keys:{keys}:project:acme");
    }
}
