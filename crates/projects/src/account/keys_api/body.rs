//! What the bodies of `POST /v1/keys` and `POST /v1/keys/{id}/rotate` may hold, read into
//! values or refused: `400` for a body that is not a JSON object, `422` naming the field.

use http::StatusCode;
use serde_json::{Map, Value};

use super::error;
use drg_access::keys::MAX_LABEL_LEN;
use drg_base::answer::Answer;

/// Origins a new key may name at most.
pub const MAX_NEW_ORIGINS: usize = 20;
/// The longest lifetime a new key may be given, in days (ten years).
pub const MAX_EXPIRES_IN_DAYS: u32 = 3_650;
/// The longest overlap of a rotation, in hours (thirty days).
pub const MAX_OVERLAP_HOURS: f64 = 720.0;

/// What `POST /v1/keys` asks for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct NewKey {
    pub label: Option<String>,
    /// Empty: a server key; else a browser key for these origin patterns (as written).
    pub origins: Vec<String>,
    /// The key expires this many days after it is made (none: never, or when its maker's
    /// lineage ends).
    pub expires_in_days: Option<u32>,
    /// When it ends (unix seconds), as the maker's lineage allows: set by the keys API, never
    /// read from the body.
    pub until: Option<i64>,
}

/// What `POST /v1/keys` may send: an object with an optional `label`, `origins` and
/// `expires_in_days`; an empty body asks for nothing.
pub fn parse_new_key(body: &[u8]) -> Result<NewKey, Answer> {
    let Some(map) = object(body, r#"{"label": "server"}"#)? else {
        return Ok(NewKey::default());
    };
    Ok(NewKey {
        label: parse_label(map.get("label"))?,
        origins: parse_origins(map.get("origins"))?,
        expires_in_days: parse_days(map.get("expires_in_days"))?,
        until: None,
    })
}

/// The overlap a rotation asks for, in hours: the body's `overlap_hours` (a number, fractions
/// allowed, 0 to [`MAX_OVERLAP_HOURS`]), else `default` (an empty body, or the field absent or
/// null).
pub fn parse_overlap(body: &[u8], default: f64) -> Result<f64, Answer> {
    let Some(map) = object(body, r#"{"overlap_hours": 24}"#)? else {
        return Ok(default);
    };
    match map.get("overlap_hours") {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(h) if (0.0..=MAX_OVERLAP_HOURS).contains(&h) => Ok(h),
            _ => Err(invalid(format!(
                "overlap_hours must be from 0 to {MAX_OVERLAP_HOURS}"
            ))),
        },
        Some(_) => Err(invalid("overlap_hours must be a number".into())),
    }
}

/// The body as a JSON object (`None`: no body); `400` for anything else, whitespace alone
/// included (it is no JSON: the contract's checker sends it as a malformed body), `example`
/// showing what is expected.
fn object(body: &[u8], example: &str) -> Result<Option<Map<String, Value>>, Answer> {
    if body.is_empty() {
        return Ok(None);
    }
    let bad = |detail: &str| {
        error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            &format!("The request body must be a JSON object such as {example}."),
            Some(detail),
        )
    };
    match serde_json::from_slice(body) {
        Ok(Value::Object(map)) => match repeated_key(body) {
            // A key said twice is refused as the other routes' typed bodies refuse it: the
            // last one winning silently would hide a client's mistake.
            Some(k) => Err(invalid(format!("`{k}` is given more than once"))),
            None => Ok(Some(map)),
        },
        Ok(_) => Err(bad("not a JSON object")),
        Err(e) => Err(bad(&format!("not JSON: {e}"))),
    }
}

/// A `422 validation_error` saying what is wrong with the body.
fn invalid(detail: String) -> Answer {
    error(
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_error",
        "The request is not valid.",
        Some(&detail),
    )
}

/// `label`: absent, null, or a string of at most [`MAX_LABEL_LEN`] characters without control
/// characters.
fn parse_label(value: Option<&Value>) -> Result<Option<String>, Answer> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => {
            if s.chars().count() > MAX_LABEL_LEN {
                Err(invalid(format!(
                    "label is longer than {MAX_LABEL_LEN} characters"
                )))
            } else if s.chars().any(char::is_control) {
                Err(invalid("label must not contain control characters".into()))
            } else {
                Ok(Some(s.clone()))
            }
        }
        Some(_) => Err(invalid("label must be a string".into())),
    }
}

/// `origins`: absent, null or a list of up to [`MAX_NEW_ORIGINS`] origin patterns
/// (`scheme://host[:port]`, host may start with `*.`), each checked as the keys file's are.
fn parse_origins(value: Option<&Value>) -> Result<Vec<String>, Answer> {
    let list = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(invalid("origins must be a list of strings".into())),
    };
    if list.len() > MAX_NEW_ORIGINS {
        return Err(invalid(format!(
            "origins has {} entries, at most {MAX_NEW_ORIGINS}",
            list.len()
        )));
    }
    let mut out = Vec::with_capacity(list.len());
    for item in list {
        let Value::String(s) = item else {
            return Err(invalid("origins must be a list of strings".into()));
        };
        if drg_access::origin::OriginPattern::parse(s).is_err() {
            return Err(invalid(format!(
                "origin {:?} is not scheme://host[:port] (host may start with *.)",
                s.chars().take(100).collect::<String>()
            )));
        }
        let s = s.trim().to_owned();
        if !out.contains(&s) {
            out.push(s);
        }
    }
    Ok(out)
}

/// `expires_in_days`: absent, null, or a whole number from 1 to [`MAX_EXPIRES_IN_DAYS`] (`1.0`
/// is one; `1.5` is refused rather than rounded either way).
fn parse_days(value: Option<&Value>) -> Result<Option<u32>, Answer> {
    let refused = || {
        invalid(format!(
            "expires_in_days must be a whole number from 1 to {MAX_EXPIRES_IN_DAYS}"
        ))
    };
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            let days = n.as_u64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= f64::from(u32::MAX))
                    .map(|f| f as u64)
            });
            match days.and_then(|d| u32::try_from(d).ok()) {
                Some(d) if (1..=MAX_EXPIRES_IN_DAYS).contains(&d) => Ok(Some(d)),
                _ => Err(refused()),
            }
        }
        Some(_) => Err(refused()),
    }
}

/// The first key an object's top level names twice, if any (`serde_json`'s map keeps the last).
fn repeated_key(body: &[u8]) -> Option<String> {
    use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
    struct Keys;
    impl<'de> Visitor<'de> for Keys {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(k) = map.next_key::<String>()? {
                map.next_value::<IgnoredAny>()?;
                if !seen.insert(k.clone()) {
                    return Ok(Some(k));
                }
            }
            Ok(None)
        }
    }
    serde_json::Deserializer::from_slice(body)
        .deserialize_map(Keys)
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(r: Result<impl std::fmt::Debug, Answer>) -> u16 {
        r.unwrap_err().status.as_u16()
    }

    #[test]
    fn a_field_given_twice_is_refused() {
        for body in [
            &br#"{"expires_in_days": 1, "expires_in_days": 3650}"#[..],
            br#"{"label": "a", "origins": [], "label": "b"}"#,
        ] {
            assert_eq!(status(parse_new_key(body)), 422);
        }
        assert_eq!(
            status(parse_overlap(
                br#"{"overlap_hours":1,"overlap_hours":0}"#,
                24.0
            )),
            422
        );
        assert!(parse_new_key(br#"{"label": "a", "expires_in_days": 2}"#).is_ok());
    }

    #[test]
    fn origins_are_checked_as_the_keys_files_are() {
        let ok = parse_new_key(
            br#"{"label":"web","origins":["https://app.example.com"," https://*.example.org ","https://app.example.com"]}"#,
        )
        .unwrap();
        assert_eq!(ok.label.as_deref(), Some("web"));
        assert_eq!(
            ok.origins,
            ["https://app.example.com", "https://*.example.org"],
            "trimmed, once each"
        );
        assert_eq!(parse_new_key(b"").unwrap(), NewKey::default());
        for body in [
            &br#"{"origins":"https://a.example"}"#[..],
            br#"{"origins":[5]}"#,
            br#"{"origins":["not an origin"]}"#,
            br#"{"origins":["https://a.example/path"]}"#,
        ] {
            assert_eq!(
                status(parse_new_key(body)),
                422,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let many: Vec<String> = (0..=MAX_NEW_ORIGINS)
            .map(|i| format!("\"https://a{i}.example\""))
            .collect();
        let body = format!(r#"{{"origins":[{}]}}"#, many.join(","));
        assert_eq!(status(parse_new_key(body.as_bytes())), 422);
    }

    #[test]
    fn labels_are_bounded_and_bodies_must_be_json_objects() {
        let label = |body: &[u8]| parse_new_key(body).map(|k| k.label);
        assert_eq!(label(b"").ok(), Some(None));
        assert_eq!(label(br#"{"label":"ci"}"#).ok(), Some(Some("ci".into())));
        assert_eq!(label(br#"{"label":null,"x":1}"#).ok(), Some(None));
        for (body, status) in [
            (&b"{"[..], 400),
            (b"\n", 400),
            (b"[1]", 400),
            (b"\"x\"", 400),
            (br#"{"label":5}"#, 422),
            (br#"{"label":"a\u0000b"}"#, 422),
        ] {
            let a = label(body).unwrap_err();
            assert_eq!(
                a.status.as_u16(),
                status,
                "{}",
                String::from_utf8_lossy(body)
            );
            let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
            assert!(v["error"].is_string() && v["message"].is_string(), "{v}");
            assert!(v.get("detail").is_some());
        }
        let long = format!(r#"{{"label":"{}"}}"#, "é".repeat(MAX_LABEL_LEN + 1));
        assert_eq!(status(label(long.as_bytes())), 422);
        let fits = format!(r#"{{"label":"{}"}}"#, "é".repeat(MAX_LABEL_LEN));
        assert!(label(fits.as_bytes()).is_ok());
    }

    #[test]
    fn expires_in_days_is_a_whole_number_of_days_within_ten_years() {
        let days = |body: &str| parse_new_key(body.as_bytes()).map(|k| k.expires_in_days);
        assert_eq!(days("{}").unwrap(), None);
        assert_eq!(days(r#"{"expires_in_days":null}"#).unwrap(), None);
        assert_eq!(days(r#"{"expires_in_days":1}"#).unwrap(), Some(1));
        assert_eq!(days(r#"{"expires_in_days":30.0}"#).unwrap(), Some(30));
        assert_eq!(days(r#"{"expires_in_days":3650}"#).unwrap(), Some(3_650));
        for bad in [
            "0",
            "-1",
            "3651",
            "1.5",
            "1e12",
            "18446744073709551616",
            "\"7\"",
            "true",
            "[7]",
        ] {
            let a = days(&format!(r#"{{"expires_in_days":{bad}}}"#)).unwrap_err();
            assert_eq!(a.status.as_u16(), 422, "{bad}");
            let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
            assert_eq!(
                v["detail"], "expires_in_days must be a whole number from 1 to 3650",
                "{bad}"
            );
        }
    }

    #[test]
    fn overlap_hours_may_be_fractional_within_thirty_days_and_defaults_from_config() {
        let overlap = |body: &str| parse_overlap(body.as_bytes(), 24.0);
        assert_eq!(overlap("").unwrap(), 24.0);
        assert_eq!(overlap("{}").unwrap(), 24.0);
        assert_eq!(overlap(r#"{"overlap_hours":null}"#).unwrap(), 24.0);
        assert_eq!(overlap(r#"{"overlap_hours":0}"#).unwrap(), 0.0);
        assert_eq!(overlap(r#"{"overlap_hours":0.001}"#).unwrap(), 0.001);
        assert_eq!(overlap(r#"{"overlap_hours":720}"#).unwrap(), 720.0);
        for (bad, code) in [
            (r#"{"overlap_hours":-0.5}"#, 422),
            (r#"{"overlap_hours":720.01}"#, 422),
            (r#"{"overlap_hours":"24"}"#, 422),
            (r#"{"overlap_hours":[1]}"#, 422),
            ("[]", 400),
            ("{", 400),
            (" \n", 400),
        ] {
            assert_eq!(status(overlap(bad)), code, "{bad}");
        }
    }
}
