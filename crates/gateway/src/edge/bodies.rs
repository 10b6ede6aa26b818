//! Request bodies on Pingora's session: the framing check's reading side (an HTTP/2 stream asked
//! whether a body follows, a refused one drained), and the reading of the small bodies the API
//! takes (`POST /v1/keys`, a batch), bounded in size and time. The rules are
//! [`crate::edge::framing`]'s; this reads.

use std::time::Duration;

use bytes::Bytes;
use pingora::prelude::*;

use crate::edge::framing::{check_framing_with_body, unannounced_body, FramingError};
use drg_base::answer::{Answer, ApiError};

/// How much of a refused HTTP/2 request body is read and dropped before answering.
const H2_DRAIN_BYTES: usize = 64 * 1024;

/// Refuses request framing the API never accepts, before routing and before any key is
/// checked (a refused request is never counted). `body_limit` is what the path may carry (0:
/// no body); `h2_wait` bounds the wait for an HTTP/2 stream's end. Otherwise says whether a
/// body was announced and left unread (the handler reads it; if it never does, the connection
/// cannot be reused).
pub async fn refuse_framing(
    session: &mut Session,
    body_limit: usize,
    h2_wait: Duration,
) -> Result<bool, Answer> {
    let header = session.req_header();
    let h2 = header.version == http::Version::HTTP_2;
    match check_framing_with_body(header.version, &header.headers, body_limit) {
        // HTTP/2 frames a body by DATA frames, with or without `Content-Length` (and a
        // `content-length: 0` does not stop DATA from following): only the stream's end
        // says there is none. Reading it costs nothing when the headers ended the stream.
        Ok(0) if h2 => {
            if !h2_body_is_empty(session, h2_wait).await {
                drain_h2(session, h2_wait).await;
                let e = unannounced_body(body_limit);
                return Err(ApiError::BadRequest(e.to_string()).into());
            }
            Ok(false)
        }
        Ok(0) => Ok(false),
        Ok(_) => Ok(true),
        Err(e) => {
            if h2 {
                drain_h2(session, h2_wait).await;
            } else if e.leaves_bytes_unread() {
                session.set_keepalive(None);
            }
            Err(match e {
                FramingError::BodyTooLarge(_) => ApiError::PayloadTooLarge(e.to_string()),
                _ => ApiError::BadRequest(e.to_string()),
            }
            .into())
        }
    }
}

/// Whether an HTTP/2 request carries no body: its stream ended with its headers, or only
/// empty DATA frames came before the end, within `wait`. A byte of body, a reset stream (the
/// h2 layer resets one whose DATA exceed its `Content-Length`) or a client that never ends the
/// stream: `false`.
async fn h2_body_is_empty(session: &mut Session, wait: Duration) -> bool {
    let read = tokio::time::timeout(wait, async {
        while let Some(chunk) = session.read_request_body().await? {
            if !chunk.is_empty() {
                return Ok(false);
            }
        }
        Ok::<_, Box<Error>>(true)
    });
    matches!(read.await, Ok(Ok(true)))
}

/// Reads and drops what is left of a refused HTTP/2 request's body (at most
/// 64 KiB, `H2_DRAIN_BYTES`, within `wait`), so the client, still sending, gets the `400` rather
/// than a reset stream. Past the bound the stream is reset: the connection and its other
/// streams are unharmed either way.
pub async fn drain_h2(session: &mut Session, wait: Duration) {
    let _ = tokio::time::timeout(wait, async {
        let mut read = 0;
        while let Ok(Some(chunk)) = session.read_request_body().await {
            read += chunk.len();
            if read > H2_DRAIN_BYTES {
                break;
            }
        }
    })
    .await;
}

/// Reads a request body of at most `limit` bytes within `wait` (the routes that take one
/// announced its length, checked against `limit` before routing).
pub async fn read(session: &mut Session, limit: usize, wait: Duration) -> Result<Bytes, ApiError> {
    let read = tokio::time::timeout(wait, async {
        let mut body = bytes::BytesMut::new();
        while let Some(chunk) = session.read_request_body().await? {
            if body.len() + chunk.len() > limit {
                return Ok(None);
            }
            body.extend_from_slice(&chunk);
        }
        Ok::<_, Box<Error>>(Some(body.freeze()))
    })
    .await;
    match read {
        Ok(Ok(Some(body))) => Ok(body),
        Ok(Ok(None)) => Err(ApiError::PayloadTooLarge(format!(
            "request body larger than {limit} bytes"
        ))),
        Ok(Err(_)) | Err(_) => Err(ApiError::BadRequest(
            "the request body did not arrive in time".into(),
        )),
    }
}
