//! Which request paths are the gateway's when it is mounted in a host ([`Mount`]), pure: a path
//! is claimed when it starts with a mounted prefix, or when some backend could read it as one
//! (escaped, dotted, doubled, upper-case, trimmed, NUL-truncated or compatibility spellings).

use std::borrow::Cow;

use icu_normalizer::ComposingNormalizerBorrowed;
use percent_encoding::percent_decode_str;

/// Which requests are the gateway's: everything (the standalone gateway), or those whose path
/// starts with one of the mounted prefixes (`/v1/` by default when embedded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    All,
    Prefixes(Vec<String>),
}

impl Mount {
    /// Whether a request for `path` (as received: not decoded, not normalised) is ours. A path
    /// that a backend could read as a mounted one (`//v1/`, `/%76%31/`, `/x/../v1/`, `/V1/`,
    /// `/v1;x/`, `/v1%20/`, `/v1%09/`, `/v1%00/`, `/ｖ１/`) is ours too, and answered by the
    /// gateway's router (`404`): a host whose own backend also serves `/v1/` never forwards a
    /// spelling of it around the gateway.
    pub fn claims(&self, path: &str) -> bool {
        let prefixes = match self {
            Mount::All => return true,
            Mount::Prefixes(prefixes) => prefixes,
        };
        if prefixes.iter().any(|p| claims_prefix(p, path)) {
            return true;
        }
        // A mount with an upper-case letter matches its lower-case spellings too.
        let mixed_case = || {
            prefixes
                .iter()
                .any(|p| p.bytes().any(|b| b.is_ascii_uppercase()))
        };
        if !may_be_respelt(path) && !mixed_case() {
            return false;
        }
        readings(path).iter().any(|reading| {
            prefixes
                .iter()
                .any(|p| claims_prefix(&p.to_lowercase(), reading))
        })
    }
}

/// Whether some backend could read `path` as another path: it holds an escape, an empty, dot or
/// parameter segment, a backslash, an upper-case letter, a space or control character, or a
/// byte outside ASCII.
fn may_be_respelt(path: &str) -> bool {
    path.bytes()
        .any(|b| matches!(b, b'%' | b'\\' | b';' | b'A'..=b'Z') || b <= b' ' || b >= 0x7f)
        || path.contains("//")
        || path.contains("/.")
}

/// `path` as lenient backends would read it, normalised ([`segments`]): percent-decoded and
/// NFKC-normalised until neither changes anything (a full-width `／ｖ１／` is `/v1/`, a
/// full-width `％７６` an escape), lower case, whole or cut at the first NUL (a backend that
/// reads the path as a C string), then with every space and control character dropped
/// ([`stripped`]) or dropped from its names only ([`trimmed_names`]). A respelt prefix
/// (`/v1%20/`) is read as the plain one under the same reading of the rest.
pub fn readings(path: &str) -> Vec<String> {
    let mut text = path.to_owned();
    // Each round undoes one layer; three cover an escape inside a compatibility form inside an
    // escape, and a path longer than that is no backend's spelling of a prefix either.
    for _ in 0..3 {
        let decoded = percent_decode_str(&text).decode_utf8_lossy();
        let folded = match ComposingNormalizerBorrowed::new_nfkc().normalize(&decoded) {
            Cow::Borrowed(_) => decoded.into_owned(),
            Cow::Owned(folded) => folded,
        };
        if folded == text {
            break;
        }
        text = folded;
    }
    let text = text.replace('\\', "/").to_lowercase();
    let mut out = Vec::with_capacity(4);
    let cut = text.find('\0').map(|at| &text[..at]);
    for text in std::iter::once(text.as_str()).chain(cut) {
        for reading in [segments(&stripped(text)), segments(&trimmed_names(text))] {
            if !out.contains(&reading) {
                out.push(reading);
            }
        }
    }
    out
}

/// `text` without its spaces and control characters (a backend that strips them before it
/// resolves dots: `.\x7f.` is `..`).
fn stripped(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_control() && !c.is_whitespace())
        .collect()
}

/// `text` with spaces and control characters dropped from its names only (a backend that trims
/// each name after it resolves dots): a segment that would turn empty or into a dot segment is
/// kept as it is, so the path keeps the shape it has read as sent, and `/v1 /` under it is `/v1/`.
fn trimmed_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, segment) in text.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        let name = stripped(segment);
        match name.split(';').next().unwrap_or_default() {
            "" | "." | ".." => out.push_str(segment),
            _ => out.push_str(&name),
        }
    }
    out
}

/// `text` with segment parameters (`;x`) dropped, empty and `.` segments removed and `..`
/// applied; `/` when nothing is left.
pub fn segments(text: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    for segment in text.split('/') {
        let segment = segment.split(';').next().unwrap_or_default();
        match segment {
            "" | "." => {}
            ".." => {
                kept.pop();
            }
            s => kept.push(s),
        }
    }
    let mut out = String::with_capacity(text.len() + 1);
    for s in &kept {
        out.push('/');
        out.push_str(s);
    }
    if text.ends_with('/') || out.is_empty() {
        out.push('/');
    }
    out
}

/// `/v1/` claims `/v1/...` and `/v1` itself; `/dashboard` claims `/dashboard` and `/dashboard/...`
/// but not `/dashboards`.
pub fn claims_prefix(prefix: &str, path: &str) -> bool {
    let bare = prefix.trim_end_matches('/');
    match path.strip_prefix(bare) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_claims_its_path_and_below_never_a_longer_name() {
        let mount = Mount::Prefixes(vec!["/v1/".into(), "/dashboard".into()]);
        for ours in [
            "/v1/",
            "/v1",
            "/v1/public/domain/a.com",
            "/dashboard",
            "/dashboard/app.js",
        ] {
            assert!(mount.claims(ours), "{ours}");
        }
        for host in [
            "/",
            "/v1x",
            "/v10/a",
            "/dashboards",
            "/app/v1/",
            "",
            "/app%2Fv1",
            "/x/v1/..",
            "/x%00/v2/",
            "/caf%C3%A9/",
        ] {
            assert!(!mount.claims(host), "{host}");
        }
        assert!(Mount::All.claims(""));
    }

    #[test]
    fn every_spelling_a_backend_could_read_as_mounted_is_claimed() {
        let mount = Mount::Prefixes(vec!["/v1/".into(), "/Dashboard".into()]);
        for respelt in [
            "//v1/check/a@b.com",
            "/%76%31/check/a",
            "/%2576%2531/check/a",
            "/app/../v1/check/a",
            "/./v1/usage",
            "/%2e%2e/v1/usage",
            "/V1/usage",
            "/v1;jsessionid=x/check/a",
            "\\v1\\check\\a",
            "/app/%2e%2e/v1",
            "/dashboard/",
            // Trimmed, stripped or cut at a NUL.
            "/v1%20/check/a",
            "/%20v1/check/a",
            "/v1%09/usage",
            "/v1%0d%0a/usage",
            "/v1%00/usage",
            "/v1%00.php",
            "/v1%20/%00/app//../../x/usage",
            "/v1%20/app//.%7F./..%00/x/usage",
            "/v1%20/%20/..",
            "/v%001/usage",
            "/v%201/a",
            "/v1%C2%A0/usage",
            // Full-width and other compatibility forms (NFKC).
            "/%EF%BD%96%EF%BC%91/usage",
            "%EF%BC%8Fv1%EF%BC%8Fusage",
            "/%EF%BC%B61/usage",
            "/%E2%85%B41/usage",
            "/v%C2%B9/usage",
            "/%EF%BC%85%EF%BC%97%EF%BC%96%EF%BC%91/usage",
        ] {
            assert!(mount.claims(respelt), "{respelt}");
        }
    }

    #[test]
    fn normalising_resolves_dots_escapes_case_and_compatibility_forms() {
        assert_eq!(readings("/A/./b/../C//d/"), ["/a/c/d/"]);
        assert_eq!(readings("/../../x"), ["/x"]);
        assert_eq!(readings("/%2F%2e%2E/v1"), ["/v1"]);
        assert_eq!(readings(""), ["/"]);
        assert_eq!(readings("/v1%00x/y"), ["/v1x/y", "/v1"]);
        assert_eq!(readings("/%EF%BD%96%EF%BC%91/"), ["/v1/"]);
    }
}
