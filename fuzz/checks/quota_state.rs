//! Fuzzes the quota state-file parser: a corrupt file must be refused, never crash the start.

use drg_access::quota::local::legacy::parse_state;
use drg_access::quota::Month;

/// Checks one input; panics on a broken promise.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(keys) = parse_state(text) else {
        return;
    };
    for (_, month, _) in keys {
        // The store packs each month as its index: that must name the same month again.
        assert_eq!(Month::from_index(month.index()), month, "{text:?}");
        assert_eq!(Month::parse_label(&month.label()), Some(month), "{text:?}");
    }
}
