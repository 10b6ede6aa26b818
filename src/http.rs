//! Local answers: JSON bodies, the error body of the contract, and the one writer for them all.
//!
//! Every local answer carries `Content-Type` and `Content-Length`, so keep-alive connections stay
//! open (Pingora closes a connection whose response has no length).

use bytes::Bytes;
use http::header::{
    HeaderName, HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE,
};
use http::StatusCode;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use serde::Serialize;

/// The media type of every body we write.
pub const JSON: &str = "application/json; charset=utf-8";

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
            headers: Vec::new(),
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
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::QuotaExceeded { .. } => StatusCode::TOO_MANY_REQUESTS,
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
            ApiError::Forbidden(_) => "forbidden",
            ApiError::QuotaExceeded { .. } => "quota_exceeded",
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

    fn detail(&self) -> Option<&str> {
        match self {
            ApiError::BadRequest(d)
            | ApiError::Validation(d)
            | ApiError::Forbidden(d)
            | ApiError::UpstreamUnavailable(d)
            | ApiError::UpstreamTimeout(d) => Some(d),
            ApiError::NotFound
            | ApiError::MethodNotAllowed { .. }
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
        let body = ErrorBody {
            error: e.code(),
            message: e.message(),
            detail: e.detail(),
            reset_at: match &e {
                ApiError::QuotaExceeded { reset_at, .. } => Some(reset_at),
                _ => None,
            },
        };
        // An ErrorBody of string fields always serialises.
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        let answer = Answer::raw(e.status(), Bytes::from(bytes));
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
            _ => answer,
        }
    }
}

/// Builds the response header of an answer.
pub fn response_header(answer: &Answer) -> pingora::Result<ResponseHeader> {
    // No case-preserving name map: our header names are canonical already, and the map costs an
    // allocation per header on every answer.
    let mut header = ResponseHeader::build_no_case(answer.status, Some(2 + answer.headers.len()))?;
    // 204 has no body, hence no content headers (RFC 9110 8.6).
    if answer.status != StatusCode::NO_CONTENT {
        header.insert_header(CONTENT_TYPE, JSON)?;
        header.insert_header(CONTENT_LENGTH, answer.body.len())?;
    }
    for (name, value) in &answer.headers {
        header.append_header(name.clone(), value.clone())?;
    }
    Ok(header)
}

/// Writes an answer to the client: header, then the whole body.
pub async fn write(session: &mut Session, answer: Answer) -> pingora::Result<()> {
    let header = response_header(&answer)?;
    if answer.status == StatusCode::NO_CONTENT {
        return session.write_response_header(Box::new(header), true).await;
    }
    session
        .write_response_header(Box::new(header), false)
        .await?;
    session.write_response_body(Some(answer.body), true).await
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
    fn header_carries_type_and_length() {
        let a = Answer::raw(StatusCode::OK, Bytes::from_static(b"{}"));
        let h = response_header(&a).unwrap();
        assert_eq!(h.headers.get(CONTENT_LENGTH).unwrap(), "2");
        assert_eq!(h.headers.get(CONTENT_TYPE).unwrap(), JSON);
    }
}
