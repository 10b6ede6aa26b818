//! Local answers: JSON bodies, the error body of the contract, and the one writer for them all.
//!
//! Every local answer carries `Content-Type` and `Content-Length`, so keep-alive connections stay
//! open (Pingora closes a connection whose response has no length).

use bytes::Bytes;
use std::sync::OnceLock;

use http::header::{
    HeaderMap, HeaderName, HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER,
    WWW_AUTHENTICATE,
};
use http::StatusCode;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
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
}

impl Answer {
    /// A JSON answer. Serialising our own plain structs cannot fail; if it ever did, the caller
    /// gets a 500 rather than a panic.
    pub fn json<T: Serialize + ?Sized>(status: StatusCode, value: &T) -> Answer {
        match serde_json::to_vec(value) {
            Ok(body) => Answer::raw(status, Bytes::from(body)),
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
        }
    }

    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Answer {
        self.headers.push((name, value));
        self
    }
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
    /// No key, or (`invalid_token`) a malformed, unknown or disabled one.
    Unauthorized {
        invalid_token: bool,
    },
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
    QuotaExceeded {
        reset_at: String,
        retry_after: i64,
    },
    /// The shared quota store is down and the policy is `fail_closed`.
    QuotaUnavailable,
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
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) | ApiError::ServerKeyOnly(_) => StatusCode::FORBIDDEN,
            ApiError::QuotaExceeded { .. } | ApiError::RateLimited { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::QuotaUnavailable => StatusCode::SERVICE_UNAVAILABLE,
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
            ApiError::Unauthorized { .. } => "unauthorized",
            ApiError::Forbidden(_) | ApiError::ServerKeyOnly(_) => "forbidden",
            ApiError::QuotaExceeded { .. } => "quota_exceeded",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::QuotaUnavailable => "service_unavailable",
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
            ApiError::Unauthorized { .. } => {
                "A valid API key is required: send Authorization: Bearer <key>."
            }
            ApiError::Forbidden(_) => "This API key may not be used from this origin.",
            ApiError::ServerKeyOnly(_) => {
                "This route needs a server key (one without origins); a browser key may call the lookups, /v1/check and /v1/usage."
            }
            ApiError::RateLimited { .. } => {
                "Too many calls to this route with this API key; retry after the Retry-After seconds."
            }
            ApiError::QuotaUnavailable => {
                "The quota store is unavailable; let your user through and retry later."
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
        };
        // An ErrorBody of string fields always serialises.
        serde_json::to_vec(&body).unwrap_or_default()
    }

    fn detail(&self) -> Option<&str> {
        match self {
            ApiError::BadRequest(d)
            | ApiError::Validation(d)
            | ApiError::Forbidden(d)
            | ApiError::UpstreamUnavailable(d)
            | ApiError::UpstreamTimeout(d) => Some(d),
            ApiError::ServerKeyOnly(route) => Some(route),
            ApiError::NotFound
            | ApiError::MethodNotAllowed { .. }
            | ApiError::RateLimited { .. }
            | ApiError::Unauthorized { .. }
            | ApiError::QuotaExceeded { .. }
            | ApiError::QuotaUnavailable
            | ApiError::Internal(_) => None,
        }
    }
}

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
            ApiError::Unauthorized { invalid_token } => answer.with_header(
                WWW_AUTHENTICATE,
                HeaderValue::from_static(if invalid_token {
                    r#"Bearer realm="domain-risk", error="invalid_token""#
                } else {
                    r#"Bearer realm="domain-risk""#
                }),
            ),
            ApiError::QuotaExceeded { retry_after, .. } => {
                answer.with_header(RETRY_AFTER, HeaderValue::from(retry_after))
            }
            ApiError::RateLimited { retry_after } => {
                answer.with_header(RETRY_AFTER, HeaderValue::from(retry_after))
            }
            _ => answer,
        }
    }
}

/// Builds the response header of an answer.
pub fn response_header(answer: &Answer) -> pingora::Result<ResponseHeader> {
    header_of(
        answer.status,
        answer.body.len(),
        answer.headers.iter().cloned(),
    )
}

/// The header map is filled directly and handed to Pingora as a case-less header: its
/// `append_header` would render each name to bytes and parse it back (two allocations per
/// custom name, on every answer), and our names are canonical already.
fn header_of(
    status: StatusCode,
    body_len: usize,
    headers: impl ExactSizeIterator<Item = (HeaderName, HeaderValue)>,
) -> pingora::Result<ResponseHeader> {
    let too_many = |_| {
        pingora::Error::explain(
            pingora::ErrorType::InvalidHTTPHeader,
            "too many response headers",
        )
    };
    let mut map = HeaderMap::with_capacity(2 + headers.len());
    // 204 has no body, hence no content headers (RFC 9110 8.6).
    if status != StatusCode::NO_CONTENT {
        map.try_insert(CONTENT_TYPE, HeaderValue::from_static(JSON))
            .map_err(too_many)?;
        map.try_insert(CONTENT_LENGTH, HeaderValue::from(body_len))
            .map_err(too_many)?;
    }
    for (name, value) in headers {
        map.try_append(name, value).map_err(too_many)?;
    }
    let (mut parts, ()) = http::Response::new(()).into_parts();
    parts.status = status;
    parts.headers = map;
    Ok(ResponseHeader::from(parts))
}

/// Writes an answer to the client: header, then the whole body.
pub async fn write(session: &mut Session, answer: Answer) -> pingora::Result<()> {
    let Answer {
        status,
        headers,
        body,
    } = answer;
    let header = header_of(status, body.len(), headers.into_iter())?;
    write_header_and_body(session, header, body).await
}

/// Writes a header and its whole body, then the end of the stream (one flush on HTTP/1: the
/// header sits in the connection's write buffer until the body joins it). No body (a 204, or an
/// empty one): the header ends the stream.
pub async fn write_header_and_body(
    session: &mut Session,
    header: ResponseHeader,
    body: Bytes,
) -> pingora::Result<()> {
    if body.is_empty() {
        return session.write_response_header(Box::new(header), true).await;
    }
    session
        .write_response_header(Box::new(header), false)
        .await?;
    session.write_response_body(Some(body), true).await
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
        let a: Answer = ApiError::QuotaExceeded {
            reset_at: "2026-12-01T00:00:00Z".into(),
            retry_after: 60,
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

    #[test]
    fn header_lists_the_answer_headers_after_the_content_headers() {
        let a = Answer::raw(StatusCode::OK, Bytes::from_static(b"{}"))
            .with_header(HeaderName::from_static("x-one"), HeaderValue::from(1))
            .with_header(HeaderName::from_static("x-one"), HeaderValue::from(2));
        let h = response_header(&a).unwrap();
        let names: Vec<_> = h
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.clone()))
            .collect();
        assert_eq!(
            names,
            [
                ("content-type", HeaderValue::from_static(JSON)),
                ("content-length", HeaderValue::from(2)),
                ("x-one", HeaderValue::from(1)),
                ("x-one", HeaderValue::from(2)),
            ]
        );
        assert!(!h.has_case());
        let none = response_header(&Answer::raw(StatusCode::NO_CONTENT, Bytes::new())).unwrap();
        assert!(none.headers.is_empty());
        assert_eq!(none.status, StatusCode::NO_CONTENT);
    }

    #[test]
    fn header_carries_type_and_length() {
        let a = Answer::raw(StatusCode::OK, Bytes::from_static(b"{}"));
        let h = response_header(&a).unwrap();
        assert_eq!(h.headers.get(CONTENT_LENGTH).unwrap(), "2");
        assert_eq!(h.headers.get(CONTENT_TYPE).unwrap(), JSON);
    }
}
