//! Fuzzes the batch lookup's body and media type (`POST /v1/public/domains`): any bytes either
//! parse into 1..=max names, in order, or are refused whole with a 400 or 422; the answer built
//! from them is always one JSON object with an entry per name.
//!
//! Input layout: the Content-Type value, a NUL, then the body.

use drg_domain::DomainName;
use drg_gateway::edge::batch::{check_content_type, parse, push_invalid, Item, Results};
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue};

/// Small, so the fuzzer also meets the "too many names" refusal.
const MAX_NAMES: usize = 8;

/// Checks one input; panics on a broken promise.
pub fn check(data: &[u8]) {
    let (content_type, body) = match data.iter().position(|&b| b == 0) {
        Some(nul) => (&data[..nul], &data[nul + 1..]),
        None => (&b""[..], data),
    };
    if let Ok(value) = HeaderValue::from_bytes(content_type) {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, value);
        if let Err(e) = check_content_type(&headers) {
            assert_eq!(e.status().as_u16(), 415, "{e:?}");
        }
    }
    let items = match parse(body, MAX_NAMES) {
        Ok(items) => items,
        Err(e) => {
            assert!(matches!(e.status().as_u16(), 400 | 422), "{e:?}");
            return;
        }
    };
    assert!((1..=MAX_NAMES).contains(&items.len()));
    let mut results = Results::with_capacity(items.len());
    for item in &items {
        match item {
            // A valid name is already in its canonical form: parsing it again changes nothing.
            Item::Valid(name) => {
                assert_eq!(DomainName::parse(name.as_str()).as_ref(), Ok(name));
                serde_json::to_writer(results.entry(), name.as_str()).unwrap();
            }
            Item::Invalid { sent, detail } => {
                assert!(DomainName::parse(sent).is_err());
                push_invalid(results.entry(), sent, detail);
            }
        }
    }
    let answer: serde_json::Value = serde_json::from_slice(&results.finish()).unwrap();
    assert_eq!(answer["count"], items.len());
    assert_eq!(
        answer["results"].as_array().map(Vec::len),
        Some(items.len())
    );
}
