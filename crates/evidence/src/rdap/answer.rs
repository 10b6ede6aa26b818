//! An RDAP domain object (RFC 9083) read defensively: only the `registration` event of the
//! domain that was asked for is taken, and only a date that can be true. Pure.

use serde::Deserialize;

use drg_domain::age::{days_from_civil, DayNumber};

/// Registries older than this never registered a domain (`.com` opened in 1985).
const EARLIEST: (i32, u32, u32) = (1985, 1, 1);

/// What an answer says of the domain's registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// The `registration` event's day.
    On(DayNumber),
    /// A domain object for the name without a `registration` event (some ccTLDs keep it
    /// private).
    Undated,
}

/// Why an answer was not believed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("not an RDAP domain object: {0}")]
    Shape(String),
    #[error("the answer is for another object ({0})")]
    OtherObject(String),
    #[error("the registration date '{0}' is not an RFC 3339 time")]
    BadDate(String),
    #[error("the registration date '{0}' cannot be true")]
    ImpossibleDate(String),
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DomainObject {
    object_class_name: Option<String>,
    ldh_name: Option<String>,
    #[serde(default)]
    events: Vec<Event>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    event_action: String,
    event_date: Option<String>,
}

/// Reads the answer for `name` (lowercase A-labels) as of `today`.
pub fn parse(body: &[u8], name: &str, today: DayNumber) -> Result<Registration, AnswerError> {
    let object: DomainObject =
        serde_json::from_slice(body).map_err(|e| AnswerError::Shape(e.to_string()))?;
    if !object
        .object_class_name
        .as_deref()
        .is_some_and(|c| c.eq_ignore_ascii_case("domain"))
    {
        return Err(AnswerError::OtherObject(
            object.object_class_name.unwrap_or_else(|| "none".into()),
        ));
    }
    // The object must be the name asked for: a registry answering for its parent or for
    // another domain says nothing of this one.
    let ldh = object.ldh_name.unwrap_or_default();
    if !ldh.trim_end_matches('.').eq_ignore_ascii_case(name) {
        return Err(AnswerError::OtherObject(format!("ldhName '{ldh}'")));
    }
    let Some(date) = object
        .events
        .iter()
        .find(|e| e.event_action.eq_ignore_ascii_case("registration"))
        .and_then(|e| e.event_date.as_deref())
    else {
        return Ok(Registration::Undated);
    };
    let parsed = chrono::DateTime::parse_from_rfc3339(date)
        .map_err(|_| AnswerError::BadDate(date.to_owned()))?;
    let day = parsed.to_utc().date_naive();
    use chrono::Datelike;
    let day = days_from_civil(day.year(), day.month(), day.day());
    let (y, m, d) = EARLIEST;
    // A day ahead allows for time zones; a date past it, or before domains existed, is a lie
    // or a broken registry.
    if day < days_from_civil(y, m, d) || day > today + 1 {
        return Err(AnswerError::ImpossibleDate(date.to_owned()));
    }
    Ok(Registration::On(day))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TODAY: DayNumber = 20_781; // 2026-11-24

    fn object(ldh: &str, events: &str) -> String {
        format!(
            r#"{{"objectClassName":"domain","ldhName":"{ldh}","events":[{events}],"rdapConformance":["rdap_level_0"]}}"#
        )
    }

    #[test]
    fn the_registration_event_of_the_name_asked_for_is_taken() {
        let body = object(
            "EXAMPLE.COM",
            r#"{"eventAction":"last changed","eventDate":"2026-01-01T00:00:00Z"},
               {"eventAction":"registration","eventDate":"1995-08-14T04:00:00Z"}"#,
        );
        assert_eq!(
            parse(body.as_bytes(), "example.com", TODAY),
            Ok(Registration::On(days_from_civil(1995, 8, 14)))
        );
        let offset = object(
            "example.com.",
            r#"{"eventAction":"registration","eventDate":"2026-11-23T23:30:00-05:00"}"#,
        );
        assert_eq!(
            parse(offset.as_bytes(), "example.com", TODAY),
            Ok(Registration::On(TODAY))
        );
        let undated = object("example.com", "");
        assert_eq!(
            parse(undated.as_bytes(), "example.com", TODAY),
            Ok(Registration::Undated)
        );
    }

    #[test]
    fn another_object_a_bad_or_impossible_date_is_refused() {
        let other = object(
            "other.com",
            r#"{"eventAction":"registration","eventDate":"2020-01-01T00:00:00Z"}"#,
        );
        assert!(matches!(
            parse(other.as_bytes(), "example.com", TODAY),
            Err(AnswerError::OtherObject(_))
        ));
        let entity = r#"{"objectClassName":"entity","ldhName":"example.com"}"#;
        assert!(parse(entity.as_bytes(), "example.com", TODAY).is_err());
        for date in ["yesterday", "2030-01-01T00:00:00Z", "1970-01-01T00:00:00Z"] {
            let body = object(
                "example.com",
                &format!(r#"{{"eventAction":"registration","eventDate":"{date}"}}"#),
            );
            assert!(
                parse(body.as_bytes(), "example.com", TODAY).is_err(),
                "{date}"
            );
        }
        for body in [
            "",
            "[]",
            "null",
            r#"{"objectClassName":"domain","events":7}"#,
        ] {
            assert!(
                parse(body.as_bytes(), "example.com", TODAY).is_err(),
                "{body}"
            );
        }
    }

    proptest! {
        #[test]
        fn hostile_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse(&body, "example.com", TODAY);
        }
    }
}
