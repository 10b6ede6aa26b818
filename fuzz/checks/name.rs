//! Fuzzes the domain-name parser: hostile path segments and table entries reach it.

use drg_domain::name::MAX_NAME_LEN;
use drg_domain::DomainName;

/// Checks one input; panics on a broken promise.
pub fn check(data: &[u8]) {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(name) = DomainName::parse(input) else {
        return;
    };
    let s = name.as_str();
    // The canonical form is what the table is keyed by and what reaches the upstream: it must
    // be plain lowercase hostname ASCII, and canonical (parsing it again changes nothing).
    assert!(
        s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'),
        "{input:?} -> {s:?}"
    );
    assert!(
        !s.is_empty() && s.len() <= MAX_NAME_LEN,
        "{input:?} -> {s:?}"
    );
    assert!(
        !s.starts_with('.') && !s.ends_with('.') && !s.contains(".."),
        "{s:?}"
    );
    assert_eq!(
        DomainName::parse(s).as_ref(),
        Ok(&name),
        "{input:?} -> {s:?}"
    );
    // Parents are suffixes of the name; the registrable domain is one of them.
    let suffixes: Vec<&str> = name.suffixes().collect();
    assert_eq!(suffixes[0], s);
    assert!(suffixes.iter().all(|p| s.ends_with(p)));
    if let Some(reg) = name.registrable() {
        assert!(suffixes.contains(&reg), "{s:?}: registrable {reg:?}");
    }
}
