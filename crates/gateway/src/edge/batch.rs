//! The batch lookup's request and answer (`POST /v1/public/domains`): the media type, the body
//! `{"domains": [...]}` read into names (or why each is not one), and the answer's body.
//!
//! Pure: parsing and rendering, unit-tested without sockets; the gateway reads the body, counts
//! the calls and classifies the names.

use std::borrow::Cow;

use http::header::CONTENT_TYPE;
use http::HeaderMap;
use serde::{Deserialize, Serialize};

use drg_base::answer::ApiError;
use drg_domain::DomainName;

/// One name of a batch, in the order sent.
#[derive(Debug, PartialEq, Eq)]
pub enum Item<'a> {
    Valid(DomainName),
    /// Not a domain name: answered in its place with the name as sent and why.
    Invalid {
        sent: Cow<'a, str>,
        detail: String,
    },
}

/// The request body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Body<'a> {
    #[serde(borrow)]
    domains: Vec<Cow<'a, str>>,
}

/// The body must be JSON: `application/json`, any parameters (a `charset` of UTF-8 or none).
pub fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(CONTENT_TYPE) else {
        return Err(ApiError::UnsupportedMediaType(
            "no Content-Type; send application/json".into(),
        ));
    };
    let text = value.to_str().unwrap_or("");
    let mut parts = text.split(';').map(str::trim);
    let essence = parts.next().unwrap_or("");
    let charset_ok = parts.all(|p| match p.split_once('=') {
        Some((k, v)) if k.trim().eq_ignore_ascii_case("charset") => {
            let v = v.trim().trim_matches('"');
            v.eq_ignore_ascii_case("utf-8") || v.eq_ignore_ascii_case("utf8")
        }
        _ => true,
    });
    if essence.eq_ignore_ascii_case("application/json") && charset_ok {
        return Ok(());
    }
    Err(ApiError::UnsupportedMediaType(format!(
        "Content-Type '{}' is not application/json (UTF-8)",
        text.chars().take(100).collect::<String>()
    )))
}

/// Reads `{"domains": [...]}`: 1 to `max_names` strings, each a name or an [`Item::Invalid`].
/// A body that is not such an object is refused whole: `400` when it is not JSON, `422` when it
/// is JSON of the wrong shape or size.
pub fn parse(body: &[u8], max_names: usize) -> Result<Vec<Item<'_>>, ApiError> {
    let parsed: Body<'_> = serde_json::from_slice(body).map_err(|e| {
        let detail = format!("body: {e}");
        match e.classify() {
            serde_json::error::Category::Data => ApiError::Validation(format!(
                "{detail} (expected {{\"domains\": [\"example.com\", ...]}})"
            )),
            _ => ApiError::BadRequest(format!("{detail}: not JSON")),
        }
    })?;
    let n = parsed.domains.len();
    if n == 0 || n > max_names {
        return Err(ApiError::Validation(format!(
            "domains must hold 1 to {max_names} names; got {n}"
        )));
    }
    Ok(parsed
        .domains
        .into_iter()
        .map(|sent| match DomainName::parse(&sent) {
            Ok(name) => Item::Valid(name),
            Err(e) => Item::Invalid {
                detail: e.to_string(),
                sent,
            },
        })
        .collect())
}

/// The answer's entry for a name that is not one.
#[derive(Serialize)]
struct Invalid<'a> {
    domain: &'a str,
    error: &'static str,
    detail: &'a str,
}

/// Appends the entry of an invalid name to a results array being written.
pub fn push_invalid(out: &mut Vec<u8>, sent: &str, detail: &str) {
    let entry = Invalid {
        domain: sent,
        error: "validation_error",
        detail,
    };
    // Strings only: always serialises.
    let _ = serde_json::to_writer(&mut *out, &entry);
}

/// The answer's body, written as the entries come: `{"results":[` ... `],"count":N}`.
pub struct Results {
    out: Vec<u8>,
    count: usize,
}

impl Results {
    /// Room for `names` entries of a typical size (a record is ~140 bytes).
    pub fn with_capacity(names: usize) -> Self {
        let mut out = Vec::with_capacity(32 + names * 150);
        out.extend_from_slice(b"{\"results\":[");
        Results { out, count: 0 }
    }

    /// The buffer the next entry is written to (one JSON value).
    pub fn entry(&mut self) -> &mut Vec<u8> {
        if self.count > 0 {
            self.out.push(b',');
        }
        self.count += 1;
        &mut self.out
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.out.extend_from_slice(b"],\"count\":");
        self.out
            .extend_from_slice(itoa::Buffer::new().format(self.count).as_bytes());
        self.out.push(b'}');
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn with_type(v: &'static str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static(v));
        h
    }

    #[test]
    fn only_json_bodies_are_taken() {
        for ok in [
            "application/json",
            "Application/JSON; charset=UTF-8",
            "application/json;charset=\"utf-8\"",
        ] {
            assert_eq!(check_content_type(&with_type(ok)), Ok(()), "{ok}");
        }
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/json; charset=latin1",
            "application/jsonx",
        ] {
            let e = check_content_type(&with_type(bad)).unwrap_err();
            assert_eq!(
                e.status(),
                http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{bad}"
            );
        }
        assert!(check_content_type(&HeaderMap::new()).is_err());
    }

    #[test]
    fn names_keep_their_order_and_invalid_ones_their_place() {
        let items = parse(br#"{"domains":["B.example.com","not a name","x.org"]}"#, 10).unwrap();
        assert_eq!(items.len(), 3);
        assert!(matches!(&items[0], Item::Valid(n) if n.as_str() == "b.example.com"));
        assert!(matches!(&items[1], Item::Invalid { sent, .. } if sent == "not a name"));
        assert!(matches!(&items[2], Item::Valid(n) if n.as_str() == "x.org"));
    }

    #[test]
    fn bad_bodies_are_refused_whole() {
        let code = |body: &[u8], max| parse(body, max).unwrap_err().status().as_u16();
        assert_eq!(code(b"not json", 10), 400);
        assert_eq!(code(br#"{"domains":"a.com"}"#, 10), 422);
        assert_eq!(code(br#"{"domains":[1]}"#, 10), 422);
        assert_eq!(code(br#"{"domains":[]}"#, 10), 422);
        assert_eq!(code(br#"{"names":["a.com"]}"#, 10), 422);
        assert_eq!(code(br#"{"domains":["a.com","b.com","c.com"]}"#, 2), 422);
    }

    #[test]
    fn the_answer_is_a_results_array_and_its_count() {
        let mut r = Results::with_capacity(2);
        r.entry().extend_from_slice(b"{\"domain\":\"a.com\"}");
        push_invalid(r.entry(), "bad\"name", "why");
        let v: serde_json::Value = serde_json::from_slice(&r.finish()).unwrap();
        assert_eq!(v["count"], 2);
        assert_eq!(v["results"][1]["domain"], "bad\"name");
        assert_eq!(v["results"][1]["error"], "validation_error");
        let empty = Results::with_capacity(0).finish();
        assert_eq!(empty, b"{\"results\":[],\"count\":0}");
    }
}
