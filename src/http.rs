//! Local answers: JSON bodies, the error body of the contract, and the one writer for them all.
//!
//! Every local answer carries `Content-Type` and `Content-Length`, so keep-alive connections stay
//! open (Pingora closes a connection whose response has no length).

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, ALLOW, CONTENT_LENGTH, CONTENT_TYPE};
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
    NotFound,
    MethodNotAllowed {
        allow: &'static str,
    },
    Validation(String),
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
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::UpstreamUnavailable(_) => StatusCode::BAD_GATEWAY,
            ApiError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The machine-readable `error` code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::NotFound => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::Validation(_) => "validation_error",
            ApiError::UpstreamUnavailable(_) => "upstream_unavailable",
            ApiError::UpstreamTimeout(_) => "upstream_timeout",
            ApiError::Internal(_) => "internal_error",
        }
    }

    fn message(&self) -> &'static str {
        match self {
            ApiError::NotFound => "No such route.",
            ApiError::MethodNotAllowed { .. } => "This route does not accept that method.",
            ApiError::Validation(_) => "The request is not valid.",
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
            ApiError::Validation(d)
            | ApiError::UpstreamUnavailable(d)
            | ApiError::UpstreamTimeout(d) => Some(d),
            ApiError::NotFound | ApiError::MethodNotAllowed { .. } | ApiError::Internal(_) => None,
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
        };
        // An ErrorBody of string fields always serialises.
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        let answer = Answer::raw(e.status(), Bytes::from(bytes));
        match e {
            ApiError::MethodNotAllowed { allow } => {
                answer.with_header(ALLOW, HeaderValue::from_static(allow))
            }
            _ => answer,
        }
    }
}

/// Builds the response header of an answer.
pub fn response_header(answer: &Answer) -> pingora::Result<ResponseHeader> {
    let mut header = ResponseHeader::build(answer.status, Some(2 + answer.headers.len()))?;
    header.insert_header(CONTENT_TYPE, JSON)?;
    header.insert_header(CONTENT_LENGTH, answer.body.len())?;
    for (name, value) in &answer.headers {
        header.append_header(name.clone(), value.clone())?;
    }
    Ok(header)
}

/// Writes an answer to the client: header, then the whole body.
pub async fn write(session: &mut Session, answer: Answer) -> pingora::Result<()> {
    let header = response_header(&answer)?;
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
    fn header_carries_type_and_length() {
        let a = Answer::raw(StatusCode::OK, Bytes::from_static(b"{}"));
        let h = response_header(&a).unwrap();
        assert_eq!(h.headers.get(CONTENT_LENGTH).unwrap(), "2");
        assert_eq!(h.headers.get(CONTENT_TYPE).unwrap(), JSON);
    }
}
