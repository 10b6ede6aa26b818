//! Request framing the gateway refuses before routing: what a GET to this API never needs.
//!
//! Every route but `POST /v1/keys` (a small body, bounded by config) is a bodiless GET, DELETE
//! or CORS preflight, so a body, an upgrade, a missing or doubled `Host`, or a `Connection`
//! header that names other headers (and so could strip ours on the way) can only be a mistake or
//! an attack: each is a `400` before any key is checked or any call counted. Pure, unit-tested
//! without sockets.

use http::header::{CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, Version};

/// Why a request's framing is refused; the `Display` text is the `detail` of the `400`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("request bodies are not accepted (Transfer-Encoding)")]
    ChunkedBody,
    #[error("request bodies are not accepted (Content-Length must be 0 or absent)")]
    Body,
    #[error("more than one Content-Length header")]
    DuplicateLength,
    #[error("protocol upgrades are not accepted")]
    Upgrade,
    #[error("Connection may only say keep-alive or close")]
    ConnectionOption,
    #[error("an HTTP/1.1 request needs a Host header")]
    MissingHost,
    #[error("more than one Host header")]
    DuplicateHost,
    /// An HTTP/2 request whose headers announced no body but whose stream carries one.
    #[error("request bodies are not accepted")]
    UnannouncedBody,
    /// An HTTP/2 body without `Content-Length` on the route that takes one: its size must be
    /// known before reading, as on HTTP/1.1 (where chunked bodies are refused).
    #[error("a request body needs a Content-Length")]
    LengthRequired,
    /// A route that takes a body (`POST /v1/keys`) got a larger one than it accepts.
    #[error("request body larger than {0} bytes")]
    BodyTooLarge(usize),
}

impl FramingError {
    /// Whether unread request bytes may follow, so the connection cannot be reused.
    pub fn leaves_bytes_unread(self) -> bool {
        matches!(
            self,
            FramingError::ChunkedBody
                | FramingError::Body
                | FramingError::UnannouncedBody
                | FramingError::LengthRequired
                | FramingError::DuplicateLength
                | FramingError::BodyTooLarge(_)
        )
    }
}

/// What an HTTP/2 stream carrying a body its headers did not announce is refused as: on the
/// route that takes a body (`max_body > 0`) the length must be announced; elsewhere no body is
/// accepted, though an empty stream end may still follow (see the gateway).
pub fn unannounced_body(max_body: usize) -> FramingError {
    match max_body {
        0 => FramingError::UnannouncedBody,
        _ => FramingError::LengthRequired,
    }
}

/// Checks the framing headers of a request.
pub fn check_framing(version: Version, headers: &HeaderMap) -> Result<(), FramingError> {
    check_framing_with_body(version, headers, 0).map(|_| ())
}

/// Like [`check_framing`] for the one route that takes a small body (`POST /v1/keys`): a
/// `Content-Length` up to `max_body` is accepted (chunked bodies are not: the size must be
/// known before reading). Returns the announced length.
pub fn check_framing_with_body(
    version: Version,
    headers: &HeaderMap,
    max_body: usize,
) -> Result<usize, FramingError> {
    // One pass over the request's few headers: five map lookups (a hash each) cost more than
    // reading them all, on every request.
    let (mut chunked, mut upgrade, mut connection_ok) = (false, false, true);
    let (mut length, mut lengths, mut hosts) = (None, 0usize, 0usize);
    for (name, value) in headers {
        if name == TRANSFER_ENCODING {
            chunked = true;
        } else if name == CONTENT_LENGTH {
            lengths += 1;
            length.get_or_insert(value);
        } else if name == UPGRADE {
            upgrade = true;
        } else if name == CONNECTION {
            connection_ok &= value.as_bytes().split(|b| *b == b',').all(|token| {
                let token = token.trim_ascii();
                token.is_empty()
                    || token.eq_ignore_ascii_case(b"keep-alive")
                    || token.eq_ignore_ascii_case(b"close")
            });
        } else if name == HOST {
            hosts += 1;
        }
    }
    if chunked {
        return Err(FramingError::ChunkedBody);
    }
    let mut body = 0;
    if let Some(length) = length {
        if lengths > 1 {
            return Err(FramingError::DuplicateLength);
        }
        let text = length.as_bytes().trim_ascii();
        if text != b"0" {
            if max_body == 0 {
                return Err(FramingError::Body);
            }
            body = std::str::from_utf8(text)
                .ok()
                .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|t| t.parse::<usize>().ok())
                .ok_or(FramingError::Body)?;
            if body > max_body {
                return Err(FramingError::BodyTooLarge(max_body));
            }
        }
    }
    if upgrade {
        return Err(FramingError::Upgrade);
    }
    if !connection_ok {
        return Err(FramingError::ConnectionOption);
    }
    match hosts {
        0 if version == Version::HTTP_11 => Err(FramingError::MissingHost),
        0 | 1 => Ok(body),
        _ => Err(FramingError::DuplicateHost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(*k, HeaderValue::from_static(v));
        }
        m
    }

    #[test]
    fn plain_gets_pass() {
        for h in [
            headers(&[("host", "a")]),
            headers(&[("host", "a"), ("connection", "keep-alive")]),
            headers(&[
                ("host", "a"),
                ("connection", "Close"),
                ("content-length", "0"),
            ]),
        ] {
            assert_eq!(check_framing(Version::HTTP_11, &h), Ok(()), "{h:?}");
        }
        // HTTP/1.0 may omit Host.
        assert_eq!(check_framing(Version::HTTP_10, &HeaderMap::new()), Ok(()));
    }

    #[test]
    fn what_a_get_never_needs_is_refused() {
        use FramingError::*;
        let cases: [(&[(&str, &str)], FramingError); 9] = [
            (
                &[("host", "a"), ("transfer-encoding", "chunked")],
                ChunkedBody,
            ),
            (
                &[
                    ("host", "a"),
                    ("content-length", "3"),
                    ("transfer-encoding", "chunked"),
                ],
                ChunkedBody,
            ),
            (&[("host", "a"), ("content-length", "1000000")], Body),
            (
                &[
                    ("host", "a"),
                    ("content-length", "0"),
                    ("content-length", "0"),
                ],
                DuplicateLength,
            ),
            (
                &[
                    ("host", "a"),
                    ("upgrade", "websocket"),
                    ("connection", "upgrade"),
                ],
                Upgrade,
            ),
            (
                &[("host", "a"), ("connection", "X-Forwarded-For")],
                ConnectionOption,
            ),
            (
                &[
                    ("host", "a"),
                    ("connection", "keep-alive"),
                    ("connection", "te"),
                ],
                ConnectionOption,
            ),
            (&[], MissingHost),
            (&[("host", "a"), ("host", "b")], DuplicateHost),
        ];
        for (pairs, want) in cases {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.append(
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            assert_eq!(check_framing(Version::HTTP_11, &m), Err(want), "{pairs:?}");
        }
        assert!(Body.leaves_bytes_unread());
        assert!(!ConnectionOption.leaves_bytes_unread());
    }

    #[test]
    fn a_small_body_passes_where_one_is_allowed() {
        let with = |len: &'static str| headers(&[("host", "a"), ("content-length", len)]);
        let check = |h: &HeaderMap| check_framing_with_body(Version::HTTP_11, h, 100);
        assert_eq!(check(&with("17")), Ok(17));
        assert_eq!(check(&with("0")), Ok(0));
        assert_eq!(check(&headers(&[("host", "a")])), Ok(0));
        assert_eq!(check(&with("101")), Err(FramingError::BodyTooLarge(100)));
        assert_eq!(check(&with("+5")), Err(FramingError::Body));
        assert_eq!(
            check(&headers(&[("host", "a"), ("transfer-encoding", "chunked")])),
            Err(FramingError::ChunkedBody)
        );
        assert!(FramingError::BodyTooLarge(1).leaves_bytes_unread());
        // Elsewhere, still no body at all.
        assert_eq!(
            check_framing(Version::HTTP_11, &with("17")),
            Err(FramingError::Body)
        );
    }
}
