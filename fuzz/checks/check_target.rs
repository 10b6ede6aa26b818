//! Fuzzes the `/v1/check/{target}` screen: its output becomes the upstream request line.

use drg_domain::target::screen_target;

/// Checks one input; panics on a broken promise.
pub fn check(data: &[u8]) {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(target) = screen_target(input) else {
        return;
    };
    // What passes must not be able to steer the upstream request: one path segment of plain
    // ASCII, no query, fragment, dot segment, backslash or control byte.
    let path = target.upstream_path();
    let rest = path
        .strip_prefix("/v1/check/")
        .expect("upstream path prefix");
    assert!(
        !rest.is_empty() && rest != "." && rest != "..",
        "{input:?} -> {path:?}"
    );
    assert!(
        rest.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+%@".contains(&b)),
        "{input:?} -> {path:?}"
    );
    let domain = target.domain.as_str();
    assert!(
        !domain.bytes().any(|b| b.is_ascii_uppercase()),
        "{domain:?}"
    );
    assert!(rest.ends_with(domain), "{input:?} -> {path:?}");
    // The local part survives the encoding exactly.
    if let Some(local) = &target.local {
        let encoded = &rest[..rest.len() - domain.len() - 1];
        let decoded = percent_encoding::percent_decode_str(encoded).decode_utf8();
        assert_eq!(
            decoded.as_deref(),
            Ok(local.as_str()),
            "{input:?} -> {path:?}"
        );
    }
}
