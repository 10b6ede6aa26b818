//! `GET /dashboard`: the browser dashboard, three files embedded in the binary (no CDN, nothing
//! fetched at run time), served on the public listener so that the page and the API share one
//! origin (no CORS). No key is needed for the files and they are not counted; the page then calls
//! the API with the server key typed into it, as any client would.
//!
//! Every answer carries a strict policy: only these files may run or style the page, it may
//! call only its own origin, and no other site may frame it.

use bytes::Bytes;
use http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};
use http::{HeaderValue, StatusCode};

use drg_base::answer::Answer;

/// One of the dashboard's files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asset {
    /// `/dashboard` (and `/dashboard/`)
    Page,
    /// `/dashboard/app.js`
    Script,
    /// `/dashboard/app.css`
    Style,
}

impl Asset {
    /// The asset a path names, if any.
    pub fn at(path: &str) -> Option<Asset> {
        match path {
            "/dashboard" | "/dashboard/" => Some(Asset::Page),
            "/dashboard/app.js" => Some(Asset::Script),
            "/dashboard/app.css" => Some(Asset::Style),
            _ => None,
        }
    }

    fn file(self) -> (&'static str, &'static str) {
        match self {
            Asset::Page => (
                include_str!("dashboard/index.html"),
                "text/html; charset=utf-8",
            ),
            Asset::Script => (
                include_str!("dashboard/app.js"),
                "text/javascript; charset=utf-8",
            ),
            Asset::Style => (include_str!("dashboard/app.css"), "text/css; charset=utf-8"),
        }
    }
}

/// No inline script or style, no plug-ins, no other origin, no framing, no form posts: the page
/// is the three files and talks to its own API with `fetch`.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// The answer for `asset`.
pub fn answer(asset: Asset) -> Answer {
    let (body, content_type) = asset.file();
    Answer::raw(StatusCode::OK, Bytes::from_static(body.as_bytes()))
        .with_header(CONTENT_TYPE, HeaderValue::from_static(content_type))
        .with_header(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP))
        .with_header(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"))
        .with_header(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"))
        .with_header(REFERRER_POLICY, HeaderValue::from_static("no-referrer"))
        // Embedded in the binary: a new one comes with an upgrade, so always ask again.
        .with_header(CACHE_CONTROL, HeaderValue::from_static("no-cache"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_are_embedded_and_the_page_has_no_inline_code() {
        let page = answer(Asset::Page);
        let html = std::str::from_utf8(&page.body).unwrap();
        assert!(html.contains("/dashboard/app.js") && html.contains("/dashboard/app.css"));
        // What the policy would block anyway; caught here rather than in a browser.
        let lower = html.to_ascii_lowercase();
        assert!(
            !lower.contains("<script>") && !lower.contains(" onclick="),
            "inline script"
        );
        assert!(
            !lower.contains("style=\"") && !lower.contains("<style"),
            "inline style"
        );
        assert!(
            !lower.contains("http://") && !lower.contains("https://"),
            "no other origin"
        );
        assert!(page
            .headers
            .iter()
            .any(|(n, v)| n == CONTENT_SECURITY_POLICY && v == CSP));
        assert_eq!(Asset::at("/dashboard/"), Some(Asset::Page));
        assert_eq!(Asset::at("/dashboard/../keys"), None);
        assert!(!answer(Asset::Script).body.is_empty());
        assert!(!answer(Asset::Style).body.is_empty());
    }
}
