//! Local answers as values: a status, headers and a JSON body, and the contract's error body
//! (`{"error", "message", "detail"}`). Shared by the parts that answer (the listener, the keys
//! API); written to the client by `edge::http`.

use bytes::Bytes;
use std::sync::OnceLock;

use http::header::{HeaderName, HeaderValue, ALLOW, RETRY_AFTER, WWW_AUTHENTICATE};
use http::StatusCode;
use serde::Serialize;

/// The media type of every body we write.
pub const JSON: &str = "application/json; charset=utf-8";

/// Headers an answer has room for from the start.
const HEADERS: usize = 8;

/// A complete local answer, ready to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
    /// What the call changed, for the project's audit trail (never sent).
    pub changed: Option<Changed>,
}

/// What an API call changed, for the project's audit trail: set by the part that made the
/// change, where it made it, from its own values (never read back from the answer's body, so
/// a body of another shape cannot drop a row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub action: Action,
    /// What it changed: a key id, a domain, a report or webhook id.
    pub target: String,
    /// More, when there is more to say (an override's verdict, a rotation's successor, a
    /// webhook's host).
    pub detail: String,
}

/// The kinds of change the audit trail records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    KeyCreated,
    KeyRevoked,
    KeyRotated,
    OverrideSet,
    OverrideRemoved,
    ReportSent,
    WebhookCreated,
    WebhookRemoved,
}

impl Action {
    /// As the trail names it (`key.created`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Action::KeyCreated => "key.created",
            Action::KeyRevoked => "key.revoked",
            Action::KeyRotated => "key.rotated",
            Action::OverrideSet => "override.set",
            Action::OverrideRemoved => "override.removed",
            Action::ReportSent => "report.sent",
            Action::WebhookCreated => "webhook.created",
            Action::WebhookRemoved => "webhook.removed",
        }
    }
}

impl Changed {
    pub fn new(action: Action, target: impl Into<String>, detail: impl Into<String>) -> Changed {
        Changed {
            action,
            target: target.into(),
            detail: detail.into(),
        }
    }
}

impl Answer {
    /// A JSON answer. Serialising our own plain structs cannot fail; if it ever did, the caller
    /// gets a 500 rather than a panic.
    pub fn json<T: Serialize + ?Sized>(status: StatusCode, value: &T) -> Answer {
        match serde_json::to_vec(value) {
            Ok(body) => Answer::raw(status, body_bytes(body)),
            Err(e) => ApiError::Internal(e.to_string()).into(),
        }
    }

    /// An answer whose JSON body is already rendered.
    pub fn raw(status: StatusCode, body: Bytes) -> Answer {
        Answer {
            status,
            // Room for the answer's own headers and the gateway's (dataset version, Vary,
            // RateLimit, CORS): one allocation per answer, never a regrowth.
            headers: Vec::with_capacity(HEADERS),
            body,
            changed: None,
        }
    }

    /// This answer, recording that the call made `change`.
    pub fn changed(mut self, change: Changed) -> Answer {
        self.changed = Some(change);
        self
    }

    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Answer {
        self.headers.push((name, value));
        self
    }
}

/// A rendered body as `Bytes` without a second allocation: `Bytes` takes a `Vec` whose length
/// is its capacity as it is, but boxes a shared header for any other. Shrinking first is a
/// reallocation the allocator does in place when the body fills at least half of its buffer
/// (a record in its 256-byte buffer), and a copy otherwise.
pub fn body_bytes(mut body: Vec<u8>) -> Bytes {
    body.shrink_to_fit();
    Bytes::from(body)
}

/// The errors of the contract, each with its status and `error` code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiError {
    /// Request framing the API never accepts (a body, an upgrade, no `Host`, ...).
    BadRequest(String),
    NotFound,
    MethodNotAllowed {
        allow: &'static str,
    },
    Validation(String),
    /// A request body larger than the route accepts (`413`).
    PayloadTooLarge(String),
    /// A request body in a media type the route does not take (`415`).
    UnsupportedMediaType(String),
    /// No key, or (`invalid_token`) a malformed, unknown or disabled one.
    Unauthorized {
        invalid_token: bool,
    },
    /// A key past its expiry; holds the detail naming when (`this API key expired at ...`).
    KeyExpired(String),
    /// The key may not be used from this origin; holds `Origin: <value>`.
    Forbidden(String),
    /// A browser key (one with `origins`: its secret sits in web pages) on a route for server
    /// keys only; holds the route, e.g. `GET /v1/logs`.
    ServerKeyOnly(&'static str),
    /// Too many calls to the account routes (`/v1/usage`, `/v1/logs`, `/v1/stats`, `/v1/keys`)
    /// for this key: try again in `retry_after` seconds.
    RateLimited {
        retry_after: u64,
    },
    /// Over the per-second rate of the project's plan.
    PlanRateLimited {
        retry_after: u64,
    },
    QuotaExceeded {
        reset_at: String,
        retry_after: i64,
        /// A batch: the calls left this month, and the detail naming the batch's size.
        batch: Option<(u64, String)>,
    },
    /// The shared quota store is down and the policy is `fail_closed`.
    QuotaUnavailable,
    /// An API-made key the control store has not vouched for within
    /// `keys_api.unverified_after_seconds` (it may have been revoked meanwhile).
    KeyUnverified,
    UpstreamUnavailable(String),
    UpstreamTimeout(String),
    /// A bug on our side; the detail is logged, never sent.
    Internal(String),
}

/// The error body every error answer has.
#[derive(Debug, Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    message: &'a str,
    detail: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reset_at: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining: Option<u64>,
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Unauthorized { .. } | ApiError::KeyExpired(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) | ApiError::ServerKeyOnly(_) => StatusCode::FORBIDDEN,
            ApiError::QuotaExceeded { .. }
            | ApiError::RateLimited { .. }
            | ApiError::PlanRateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::QuotaUnavailable | ApiError::KeyUnverified => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::UpstreamUnavailable(_) => StatusCode::BAD_GATEWAY,
            ApiError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The machine-readable `error` code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::NotFound => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::Validation(_) => "validation_error",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::Unauthorized { .. } | ApiError::KeyExpired(_) => "unauthorized",
            ApiError::Forbidden(_) | ApiError::ServerKeyOnly(_) => "forbidden",
            ApiError::QuotaExceeded { .. } => "quota_exceeded",
            ApiError::RateLimited { .. } | ApiError::PlanRateLimited { .. } => "rate_limited",
            ApiError::QuotaUnavailable | ApiError::KeyUnverified => "service_unavailable",
            ApiError::UpstreamUnavailable(_) => "upstream_unavailable",
            ApiError::UpstreamTimeout(_) => "upstream_timeout",
            ApiError::Internal(_) => "internal_error",
        }
    }

    fn message(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "The request is not accepted by this API.",
            ApiError::NotFound => "No such route.",
            ApiError::MethodNotAllowed { .. } => "This route does not accept that method.",
            ApiError::Validation(_) => "The request is not valid.",
            ApiError::PayloadTooLarge(_) => "The request body is larger than this route accepts.",
            ApiError::UnsupportedMediaType(_) => {
                "The request body must be JSON: send Content-Type: application/json."
            }
            ApiError::Unauthorized { .. } => {
                "A valid API key is required: send Authorization: Bearer <key>."
            }
            ApiError::KeyExpired(_) => {
                "This API key has expired: use the key that replaced it, or make a new one."
            }
            ApiError::Forbidden(_) => "This API key may not be used from this origin.",
            ApiError::ServerKeyOnly(_) => {
                "This route needs a server key (one without origins); a browser key may call the lookups, /v1/check and /v1/usage."
            }
            ApiError::RateLimited { .. } => {
                "Too many calls to this route with this API key; retry after the Retry-After seconds."
            }
            ApiError::PlanRateLimited { .. } => {
                "Too many calls per second for this project's plan; let your user through and retry after the Retry-After seconds."
            }
            ApiError::QuotaUnavailable => {
                "The quota store is unavailable; let your user through and retry later."
            }
            ApiError::KeyUnverified => {
                "This key was made through the API and the key store has been unreachable too \
                 long to vouch for it; let your user through and retry later."
            }
            ApiError::QuotaExceeded { .. } => {
                "The monthly quota of this API key is used up; let your user through."
            }
            ApiError::UpstreamUnavailable(_) => {
                "The analysis backend is unavailable; let your user through and retry later."
            }
            ApiError::UpstreamTimeout(_) => {
                "The analysis backend did not answer in time; let your user through and retry later."
            }
            ApiError::Internal(_) => {
                "An internal error occurred; let your user through and retry later."
            }
        }
    }

    /// The error body. Errors without a detail of their own (401, 404, 405, ...) have one body
    /// each, rendered at first use and then only copied by reference: a flood of them (a client
    /// without its key) costs no serialisation.
    fn body(&self) -> Bytes {
        const FIXED: usize = 5;
        static BODIES: [OnceLock<&'static [u8]>; FIXED] = [const { OnceLock::new() }; FIXED];
        let fixed = match self {
            ApiError::NotFound => 0,
            ApiError::MethodNotAllowed { .. } => 1,
            ApiError::Unauthorized { .. } => 2,
            ApiError::QuotaUnavailable => 3,
            ApiError::Internal(_) => 4,
            _ => return Bytes::from(self.render()),
        };
        Bytes::from_static(BODIES[fixed].get_or_init(|| self.render().leak()))
    }

    fn render(&self) -> Vec<u8> {
        let body = ErrorBody {
            error: self.code(),
            message: self.message(),
            detail: self.detail(),
            reset_at: match self {
                ApiError::QuotaExceeded { reset_at, .. } => Some(reset_at),
                _ => None,
            },
            remaining: match self {
                ApiError::QuotaExceeded {
                    batch: Some((remaining, _)),
                    ..
                } => Some(*remaining),
                _ => None,
            },
        };
        // An ErrorBody of string fields always serialises.
        serde_json::to_vec(&body).unwrap_or_default()
    }

    fn detail(&self) -> Option<&str> {
        match self {
            ApiError::BadRequest(d)
            | ApiError::Validation(d)
            | ApiError::PayloadTooLarge(d)
            | ApiError::UnsupportedMediaType(d)
            | ApiError::Forbidden(d)
            | ApiError::KeyExpired(d)
            | ApiError::UpstreamUnavailable(d)
            | ApiError::UpstreamTimeout(d) => Some(d),
            ApiError::ServerKeyOnly(route) => Some(route),
            ApiError::QuotaExceeded {
                batch: Some((_, detail)),
                ..
            } => Some(detail),
            ApiError::NotFound
            | ApiError::MethodNotAllowed { .. }
            | ApiError::RateLimited { .. }
            | ApiError::PlanRateLimited { .. }
            | ApiError::Unauthorized { .. }
            | ApiError::QuotaExceeded { .. }
            | ApiError::QuotaUnavailable
            | ApiError::KeyUnverified
            | ApiError::Internal(_) => None,
        }
    }
}

/// `WWW-Authenticate` of a `401`, checked at compile time: `from_static` called at run time
/// checks the value's bytes on every answer (~170 instructions of each `401`).
const NO_TOKEN: HeaderValue = HeaderValue::from_static(r#"Bearer realm="domain-risk""#);
/// The same, when the key sent was refused.
const INVALID_TOKEN: HeaderValue =
    HeaderValue::from_static(r#"Bearer realm="domain-risk", error="invalid_token""#);

impl From<ApiError> for Answer {
    fn from(e: ApiError) -> Answer {
        if let ApiError::Internal(why) = &e {
            log::error!("internal error: {why}");
        }
        let answer = Answer::raw(e.status(), e.body());
        match e {
            ApiError::MethodNotAllowed { allow } => {
                answer.with_header(ALLOW, HeaderValue::from_static(allow))
            }
            // RFC 6750: an expired token is an invalid one.
            ApiError::KeyExpired(_) => answer.with_header(WWW_AUTHENTICATE, INVALID_TOKEN),
            ApiError::Unauthorized { invalid_token } => answer.with_header(
                WWW_AUTHENTICATE,
                if invalid_token {
                    INVALID_TOKEN
                } else {
                    NO_TOKEN
                },
            ),
            ApiError::QuotaExceeded { retry_after, .. } => {
                answer.with_header(RETRY_AFTER, HeaderValue::from(retry_after))
            }
            ApiError::RateLimited { retry_after } | ApiError::PlanRateLimited { retry_after } => {
                answer.with_header(RETRY_AFTER, HeaderValue::from(retry_after))
            }
            _ => answer,
        }
    }
}

/// An error answer in the contract's shape (`error`, `message`, `detail`) for a status or a
/// message no [`ApiError`] has (a route's own 409, 503 with a reason).
pub fn error_answer(status: StatusCode, code: &str, message: &str, detail: Option<&str>) -> Answer {
    Answer::json(
        status,
        &ErrorBody {
            error: code,
            message,
            detail,
            reset_at: None,
            remaining: None,
        },
    )
}

/// `503 service_unavailable` with `Retry-After: 1`: the store of `what` (a sentence's subject,
/// "The override store") did not answer, so nothing was changed; `detail` names it further.
pub fn unavailable(what: &str, detail: Option<&str>) -> Answer {
    error_answer(
        StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        &format!("{what} is unreachable; nothing was changed. Try again shortly."),
        detail,
    )
    .with_header(RETRY_AFTER, HeaderValue::from_static("1"))
}

/// `503 service_unavailable` for a read of what the control store holds, before this gateway
/// could read it once (started while the store is away): an empty list would say the project
/// has none.
pub fn not_read_yet(what: &str) -> Answer {
    error_answer(
        StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        &format!(
            "{what} has not been read since this gateway started (the control store is \
             unreachable). Try again shortly."
        ),
        None,
    )
    .with_header(RETRY_AFTER, HeaderValue::from_static("1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_follow_the_contract() {
        let a: Answer = ApiError::Validation("domain is empty".into()).into();
        assert_eq!(a.status, StatusCode::UNPROCESSABLE_ENTITY);
        let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(v["error"], "validation_error");
        assert_eq!(v["detail"], "domain is empty");
        assert!(v["message"].as_str().unwrap().ends_with('.'));

        let a: Answer = ApiError::MethodNotAllowed { allow: "GET" }.into();
        assert_eq!(a.headers, [(ALLOW, HeaderValue::from_static("GET"))]);
        let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(v["detail"], serde_json::Value::Null);
    }

    #[test]
    fn access_errors_carry_their_headers() {
        let a: Answer = ApiError::Unauthorized {
            invalid_token: true,
        }
        .into();
        assert_eq!(a.status, StatusCode::UNAUTHORIZED);
        assert!(a.headers[0].1.to_str().unwrap().contains("invalid_token"));
        let a: Answer =
            ApiError::KeyExpired("this API key expired at 2026-12-01T00:00:00Z".into()).into();
        assert_eq!(a.status, StatusCode::UNAUTHORIZED);
        assert!(a.headers[0].1.to_str().unwrap().contains("invalid_token"));
        let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(v["error"], "unauthorized");
        assert_eq!(v["detail"], "this API key expired at 2026-12-01T00:00:00Z");
        let a: Answer = ApiError::QuotaExceeded {
            reset_at: "2026-12-01T00:00:00Z".into(),
            retry_after: 60,
            batch: None,
        }
        .into();
        assert_eq!(a.headers, [(RETRY_AFTER, HeaderValue::from(60))]);
        let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
        assert_eq!(v["reset_at"], "2026-12-01T00:00:00Z");
        assert_eq!(v["error"], "quota_exceeded");
    }

    #[test]
    fn fixed_error_bodies_are_the_rendered_ones() {
        for e in [
            ApiError::NotFound,
            ApiError::MethodNotAllowed { allow: "GET" },
            ApiError::Unauthorized {
                invalid_token: false,
            },
            ApiError::Unauthorized {
                invalid_token: true,
            },
            ApiError::QuotaUnavailable,
            ApiError::Internal("first".into()),
            ApiError::Internal("second".into()),
        ] {
            // Twice: the first call renders, the second reuses.
            assert_eq!(e.body(), e.render(), "{e:?}");
            assert_eq!(e.body(), e.render(), "{e:?}");
            let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
            assert_eq!(v["error"], e.code());
        }
        // Errors with a detail of their own are rendered each time.
        let a = ApiError::Validation("a".into()).body();
        let b = ApiError::Validation("b".into()).body();
        assert_ne!(a, b);
    }
}
