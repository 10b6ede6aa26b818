//! Fuzzes the keys-file parser: the file is edited by hand and hot-reloaded.

use std::collections::BTreeMap;

use drg_access::keys::parse_keys;

/// Checks one input; panics on a broken promise.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let plans = BTreeMap::from([("free".to_owned(), 100), ("test".to_owned(), u64::MAX)]);
    match parse_keys(text, "keys.yaml", &plans) {
        Ok(store) => {
            assert_eq!(store.entries().count(), store.len());
            assert_eq!(store.is_empty(), store.entries().next().is_none());
            for key in store.entries() {
                assert!(!key.id.is_empty());
                assert_eq!(plans.get(&*key.plan), Some(&key.monthly_limit));
            }
            let _ = store.has_enabled_demo_key();
            let _ = store.find("drg_not_a_key");
        }
        Err(e) => assert!(!e.problems.is_empty()),
    }
}
