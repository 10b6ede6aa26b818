//! Fuzzes which paths a mounted gateway claims (`edge::mount`): a path under the prefix is
//! claimed, and so is every spelling of it a lenient backend reads as the same path (escaped,
//! upper case, dotted, doubled, trimmed, NUL-cut, full-width); a plain path elsewhere is not.
//!
//! Input layout: the request path's bytes (UTF-8).

use drg_gateway::edge::mount::{claims_prefix, readings, Mount};

/// Spellings of the leading `/v1` that some backend reads as `/v1`.
const RESPELLINGS: &[&str] = &[
    "/V1",
    "/%76%31",
    "//v1",
    "/./v1",
    "/x/../v1",
    "\\v1",
    "/v1;x",
    "/v1%20",
    "/%20v1",
    "/v1%09",
    "/v1%00",
    "/%EF%BD%96%EF%BC%91",
    "/\u{ff56}\u{ff11}",
    "%EF%BC%8Fv1",
    "/%E2%85%B41",
];

/// Checks one input; panics on a broken promise.
pub fn check(data: &[u8]) {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    assert!(Mount::All.claims(path));
    let mount = Mount::Prefixes(vec!["/v1/".into()]);
    if claims_prefix("/v1/", path) {
        assert!(mount.claims(path), "{path:?}");
    }
    for reading in readings(path) {
        assert!(reading.starts_with('/'), "{path:?} read as {reading:?}");
    }
    // Below the prefix: when the lenient reading of the plain spelling is mounted, so is every
    // respelling's.
    let rest = path.trim_start_matches('/');
    let plain = format!("/v1/{rest}");
    if readings(&plain).iter().any(|r| claims_prefix("/v1/", r)) {
        for head in RESPELLINGS {
            let respelt = format!("{head}/{rest}");
            assert!(mount.claims(&respelt), "{respelt:?} (of {plain:?})");
        }
    }
    // Elsewhere: a path of plain letters, digits and slashes under another name is the host's.
    if rest
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'/' || b == b'-')
    {
        assert!(!mount.claims(&format!("/v2/{rest}")), "/v2/{rest}");
    }
}
