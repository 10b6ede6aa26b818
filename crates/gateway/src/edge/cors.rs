//! CORS of the `/v1/` API: the preflight's answer (any origin may ask; the key decides on the
//! real request), the allowed origin and exposed headers of an answer to a browser key, and the
//! `Vary` that keeps caches from mixing answers across origins. Pure.

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS,
    ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE,
};
use http::StatusCode;

use drg_base::answer::Answer;

/// `Vary` of every `/v1/` answer: they differ by `Origin`.
pub const VARY_ORIGIN: HeaderValue = HeaderValue::from_static("Origin");
/// What a browser script may read of an answer (`Access-Control-Expose-Headers`).
const EXPOSED_HEADERS: &str =
    "RateLimit, RateLimit-Policy, Retry-After, X-Request-Id, X-Dataset-Version, X-Did-You-Mean, X-RateLimit-Would-Reject";

/// The answer to a CORS preflight on `path`: any origin may ask; the key decides on the real
/// request.
pub fn preflight(path: &str, origin: Option<&HeaderValue>) -> Answer {
    let methods = preflight_methods(path);
    let mut answer = Answer::raw(StatusCode::NO_CONTENT, Bytes::new())
        .with_header(
            ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(methods),
        )
        .with_header(
            ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("Authorization, Content-Type, X-Request-Id"),
        )
        .with_header(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("86400"));
    if let Some(origin) = origin {
        answer = answer.with_header(ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    }
    answer
}

/// The methods a preflight on `path` allows: the route's own.
fn preflight_methods(path: &str) -> &'static str {
    use crate::edge::route::{
        BATCH_PATH, KEYS_PATH, OVERRIDES_ITEM_PREFIX, REPORTS_PATH, WEBHOOKS_ITEM_PREFIX,
        WEBHOOKS_PATH,
    };
    match path {
        BATCH_PATH => "POST",
        KEYS_PATH | WEBHOOKS_PATH | REPORTS_PATH => "GET, POST",
        _ if path.ends_with("/rotate") && path.starts_with("/v1/keys/") => "POST",
        _ if path.starts_with("/v1/keys/") || path.starts_with(WEBHOOKS_ITEM_PREFIX) => "DELETE",
        _ if path.starts_with(OVERRIDES_ITEM_PREFIX) => "PUT, DELETE",
        _ => "GET",
    }
}

/// The headers of an answer to a browser key whose `origin` was allowed.
pub fn allow_origin(origin: HeaderValue, out: &mut Vec<(HeaderName, HeaderValue)>) {
    out.push((ACCESS_CONTROL_ALLOW_ORIGIN, origin));
    // A constant: `from_static` at run time checks the value's bytes on every answer.
    const EXPOSED: HeaderValue = HeaderValue::from_static(EXPOSED_HEADERS);
    out.push((ACCESS_CONTROL_EXPOSE_HEADERS, EXPOSED));
}

/// A `Vary` value holding every field of `existing` plus `field` (once).
pub fn merge_vary<'a>(
    existing: impl IntoIterator<Item = &'a HeaderValue>,
    field: &str,
) -> HeaderValue {
    let mut fields: Vec<&str> = existing
        .into_iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .collect();
    if fields.contains(&"*") {
        return HeaderValue::from_static("*");
    }
    if !fields.iter().any(|f| f.eq_ignore_ascii_case(field)) {
        fields.push(field);
    }
    HeaderValue::from_str(&fields.join(", ")).unwrap_or_else(|_| HeaderValue::from_static("*"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vary_is_appended_to_not_replaced() {
        let v = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(
            merge_vary([&v("Accept-Encoding")], "Origin"),
            "Accept-Encoding, Origin"
        );
        assert_eq!(
            merge_vary([&v("origin, Accept")], "Origin"),
            "origin, Accept"
        );
        assert_eq!(
            merge_vary([&v("Accept"), &v("Cookie")], "Origin"),
            "Accept, Cookie, Origin"
        );
        assert_eq!(merge_vary([&v("*")], "Origin"), "*");
        assert_eq!(merge_vary(std::iter::empty(), "Origin"), "Origin");
    }
}
