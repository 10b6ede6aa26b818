//! Fuzzes the origin parsers: `Origin` and `Referer` headers come from any client, patterns from
//! the keys file.

use drg_access::origin::{Origin, OriginPattern};

/// Checks one input; panics on a broken promise.
pub fn check(data: &[u8]) {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let pattern = OriginPattern::parse(input);
    let referer = Origin::from_referer(input);
    if let Some(origin) = Origin::from_origin_header(input) {
        // A bare origin is also a valid referer, and names the same origin.
        assert_eq!(referer.as_ref(), Some(&origin), "{input:?}");
        // Its printed form parses back to it (the printed form is what CORS answers carry).
        let shown = origin.to_string();
        assert_eq!(
            Origin::from_origin_header(&shown).as_ref(),
            Some(&origin),
            "{input:?} -> {shown:?}"
        );
        // Written as a key's pattern, it allows exactly that origin.
        let pattern = pattern.as_ref().expect("an origin is a valid pattern");
        assert!(pattern.matches(&origin), "{input:?}");
    }
    if let Ok(p) = &pattern {
        if let Some(r) = &referer {
            let _ = p.matches(r);
        }
    }
}
