//! What `POST /v1/webhooks` may hold: a URL the guard accepts and the events to send there.
//! Pure, so every refusal is unit-tested; each becomes a `422` whose `detail` is its text.

use drg_webhook::guard::Policy;
use serde::Deserialize;

/// Longest `url`, in bytes.
pub const MAX_URL_BYTES: usize = 2_048;

/// What a webhook may be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Event {
    /// A looked-up domain of the project changed verdict (`/v1/changes`).
    #[serde(rename = "verdict.changed")]
    VerdictChanged,
    /// The project's month reached a threshold of its limit.
    #[serde(rename = "quota.threshold")]
    QuotaThreshold,
}

impl Event {
    /// Its name on the wire, and in the records (kept as text, so that a record of an event a
    /// newer gateway knows does not make this one unable to read the rest).
    pub fn as_str(self) -> &'static str {
        match self {
            Event::VerdictChanged => "verdict.changed",
            Event::QuotaThreshold => "quota.threshold",
        }
    }
}

/// A new webhook as asked for, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewHook {
    pub url: String,
    pub events: Vec<Event>,
}

/// Why a body is refused.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the body must be {{\"url\": \"https://...\", \"events\": [\"verdict.changed\", \"quota.threshold\"]}}: {0}")]
    Shape(#[from] serde_json::Error),
    #[error("events: at least one of verdict.changed, quota.threshold")]
    NoEvents,
    #[error("events: {0} is listed twice")]
    Repeated(&'static str),
    #[error("url: {0} bytes; at most {MAX_URL_BYTES}")]
    UrlTooLong(usize),
    /// The guard's problem with the URL (it names the host, never the path or query).
    #[error("{0}")]
    Url(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    url: String,
    events: Vec<Event>,
}

/// The webhook `body` asks for, its URL judged by `policy`.
pub fn parse(body: &[u8], policy: &Policy) -> Result<NewHook, BodyError> {
    let b: Body = serde_json::from_slice(body)?;
    if b.events.is_empty() {
        return Err(BodyError::NoEvents);
    }
    for (i, e) in b.events.iter().enumerate() {
        if b.events[..i].contains(e) {
            return Err(BodyError::Repeated(e.as_str()));
        }
    }
    if b.url.len() > MAX_URL_BYTES {
        return Err(BodyError::UrlTooLong(b.url.len()));
    }
    if let Some(problem) = url_problem(&b.url, policy) {
        return Err(BodyError::Url(problem));
    }
    Ok(NewHook {
        url: b.url,
        events: b.events,
    })
}

/// The guard's problem with `url`, named by the body's field and its host only
/// (`url: host '10.0.0.1' may not receive webhooks: ...`). `policy` judges address ranges; the
/// gateway's own listeners and backends are refused when a message is sent, never here.
fn url_problem(url: &str, policy: &Policy) -> Option<String> {
    drg_webhook::config::receiver_url_problem(url, policy)
}

/// The host of a webhook `url`, what logs and the audit trail show of it: its path and query
/// may hold a token.
pub fn host_of(url: &str) -> Option<String> {
    let uri = url.parse::<http::Uri>().ok()?;
    uri.host().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use drg_webhook::guard::Listener;

    fn policy(allow_private: bool) -> Policy {
        Policy {
            allow_private,
            listeners: vec![Listener::parse("gateway.listen", "127.0.0.1:8080").unwrap()],
        }
    }

    fn body(url: &str, events: &[&str]) -> Vec<u8> {
        serde_json::json!({"url": url, "events": events})
            .to_string()
            .into_bytes()
    }

    fn refused(b: &[u8], allow_private: bool) -> String {
        parse(b, &policy(allow_private)).unwrap_err().to_string()
    }

    #[test]
    fn a_public_url_and_distinct_known_events_are_taken() {
        let b = body(
            "https://hooks.example.com/drg?token=s3cret",
            &["verdict.changed", "quota.threshold"],
        );
        let hook = parse(&b, &policy(false)).unwrap();
        assert_eq!(hook.url, "https://hooks.example.com/drg?token=s3cret");
        assert_eq!(hook.events, [Event::VerdictChanged, Event::QuotaThreshold]);
        assert_eq!(
            host_of(&hook.url).as_deref(),
            Some("hooks.example.com"),
            "the host only"
        );
    }

    #[test]
    fn events_must_be_known_present_and_distinct() {
        let url = "https://hooks.example.com/";
        assert!(refused(&body(url, &[]), false).starts_with("events: at least one"));
        assert!(refused(&body(url, &["key.created"]), false).starts_with("the body must be"));
        assert_eq!(
            refused(&body(url, &["quota.threshold", "quota.threshold"]), false),
            "events: quota.threshold is listed twice"
        );
        let extra = br#"{"url": "https://a.example/", "events": ["quota.threshold"], "x": 1}"#;
        assert!(refused(extra, false).contains("unknown field"));
        assert!(refused(b"[]", false).starts_with("the body must be"));
    }

    #[test]
    fn the_guard_judges_the_url_naming_the_host_only() {
        let events = &["verdict.changed"];
        let loopback = refused(&body("http://127.0.0.1:9000/h?token=s3cret", events), false);
        assert_eq!(
            loopback,
            "url: host '127.0.0.1' may not receive webhooks: a public address is needed"
        );
        let private = refused(&body("https://10.1.2.3/h", events), false);
        assert!(
            private.starts_with("url: host '10.1.2.3' may not"),
            "{private}"
        );
        // allow_private lets loopback and private through, never link-local; the refusal
        // names no range and no setting.
        let ok = parse(&body("http://127.0.0.1:9000/h", events), &policy(true));
        assert!(ok.is_ok(), "{ok:?}");
        let metadata = refused(&body("http://169.254.169.254/latest", events), true);
        assert_eq!(
            metadata,
            "url: host '169.254.169.254' may not receive webhooks"
        );
        // Whatever the policy holds, a refusal never tells a listener or backend apart.
        let own = refused(&body("http://127.0.0.1:8080/v1/usage", events), false);
        assert!(!own.contains("gateway"), "{own}");
        assert!(refused(&body("ftp://hooks.example.com/", events), false)
            .contains("not an http:// or https:// URL"));
        let teredo = refused(&body("http://[2001:0:808:808::80ff:fffe]/h", events), false);
        assert!(teredo.contains("may not receive"), "{teredo}");
        for port in ["0", "99999", "65536"] {
            let url = format!("https://hooks.example.com:{port}/h");
            let bad = refused(&body(&url, events), false);
            assert!(bad.contains("not one from 1 to 65535"), "{url}: {bad}");
        }
        let v6_port = refused(&body("https://[2606:4700::1111]:0/h", events), false);
        assert!(v6_port.contains("port '0'"), "{v6_port}");
        for ok in [
            "https://hooks.example.com:8443/h",
            "https://[2606:4700::1111]:443/h",
            "https://[2606:4700::1111]/h",
        ] {
            assert!(parse(&body(ok, events), &policy(false)).is_ok(), "{ok}");
        }
        let creds = refused(
            &body("https://u%40x:p%3Aw@hooks.example.com/h", events),
            false,
        );
        assert!(creds.contains("user info"), "{creds}");
        assert!(!creds.contains("p%3Aw"), "{creds}");
        let long = format!("https://hooks.example.com/{}", "a".repeat(MAX_URL_BYTES));
        let too_long = refused(&body(&long, events), false);
        assert_eq!(too_long, format!("url: {} bytes; at most 2048", long.len()));
    }
}
