//! The `/v1/check` relay (`gateway.upstream.mode: relay`): one small GET exchange with the
//! backend, run from the request filter instead of Pingora's generic duplex proxy.
//!
//! A connection comes from Pingora's own HTTP/1 connector and keep-alive pool (so TCP and TLS
//! set-up, connect timeouts and certificate checks are the peer's, as in proxy mode); the
//! request the gateway built is written, the answer read whole (at most `max_body_bytes`), the
//! connection handed back to the pool when it may be reused, and only then is anything written
//! to the client: header and body in one go, framed by `Content-Length`. A backend failing
//! mid-answer therefore gives the client a clean 502/504, never half an answer.
//!
//! Retries: only a pooled connection that failed before any byte of an answer arrived (it was
//! closed or reset while idle, which the pool cannot always see in time) is retried, once, on a
//! new connection (never another pooled one: the backend that closed one idle connection has
//! likely closed its neighbours too); that is the classic keep-alive race, where the backend
//! closed the connection without reading the request. Everything else (timeouts, refused connects, a broken
//! answer) is never retried: the backend may have done the work.

use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, VARY};
use http::StatusCode;
use pingora::connectors::{ConnectorOptions, TransportConnector};
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::protocols::http::v1::client::HttpSession;
use pingora::server::configuration::ServerConf;
use pingora::upstreams::peer::{HttpPeer, Peer};
use pingora::{Error, ErrorType, RetryType};

use crate::upstream::config::{UpstreamConfig, UpstreamMode, HOP_BY_HOP};
use drg_telemetry::metrics::UpstreamError;

/// At most this many informational (1xx, not 101) answers are skipped before the real one.
const MAX_INFORMATIONAL: usize = 4;

/// Why an exchange gave no answer to relay.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// Connecting, writing the request or reading the answer failed (Pingora's error, marked as
    /// the upstream's).
    #[error("{0}")]
    Upstream(Box<Error>),
    /// The request could not be built: our fault, never sent.
    #[error("building the upstream request: {0}")]
    Request(Box<Error>),
    /// The answer's body is larger than `gateway.upstream.max_body_bytes`.
    #[error("upstream: answer body larger than {limit} bytes")]
    TooLarge { limit: usize },
    /// The backend switched protocols to a request that never asked it to: a tunnel later,
    /// key-less bytes of the client's connection could ride.
    #[error("upstream: answered 101 to a request without Upgrade")]
    Upgrade,
}

impl RelayError {
    /// How the failure is counted in `drg_upstream_errors_total` (`None`: not the backend's).
    pub fn kind(&self) -> Option<UpstreamError> {
        match self {
            RelayError::Upstream(e) => {
                Some(crate::upstream::errors::kind_of(e).unwrap_or(UpstreamError::BadResponse))
            }
            RelayError::TooLarge { .. } | RelayError::Upgrade => Some(UpstreamError::BadResponse),
            RelayError::Request(_) => None,
        }
    }
}

impl From<Box<Error>> for RelayError {
    fn from(mut e: Box<Error>) -> Self {
        // Everything that fails inside an exchange is the backend's side.
        e.as_up();
        RelayError::Upstream(e)
    }
}

/// What the backend answered, as far as the exchange got (for the access log and metrics,
/// failures included).
#[derive(Debug, Default, Clone, Copy)]
pub struct Seen {
    /// The final answer's status.
    pub status: Option<u16>,
    /// From the start of the exchange to that answer's header.
    pub header_after: Option<Duration>,
}

/// A complete answer from the backend, ready to relay.
#[derive(Debug)]
pub struct Relayed {
    pub status: StatusCode,
    /// The backend's headers but the hop-by-hop and framing ones.
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Relayed {
    /// The header for the client: the backend's end-to-end headers, `gateway_headers` replacing any of the
    /// same name (but `Vary`, which gets its fields added to the backend's), and our framing.
    pub fn response_header(
        &mut self,
        gateway_headers: Vec<(HeaderName, HeaderValue)>,
        merge_vary: impl Fn(&HeaderMap) -> HeaderValue,
    ) -> pingora::Result<ResponseHeader> {
        let mut headers = std::mem::take(&mut self.headers);
        for (name, value) in gateway_headers {
            if name == VARY {
                let merged = merge_vary(&headers);
                headers.insert(VARY, merged);
            } else {
                headers.insert(name, value);
            }
        }
        // 1xx, 204 and 304 answers have no body and no length (RFC 9110 8.6).
        if !matches!(self.status.as_u16(), 204 | 304) {
            headers.insert(CONTENT_LENGTH, HeaderValue::from(self.body.len()));
        }
        let (mut parts, ()) = http::Response::new(()).into_parts();
        parts.status = self.status;
        parts.headers = headers;
        Ok(ResponseHeader::from(parts))
    }
}

/// The relay: Pingora's transport connector (with its keep-alive pool) and the one peer. The
/// transport one, not the HTTP/1 `Connector` wrapping it: that one only offers "pooled or new",
/// and the retry must be on a new connection.
pub struct Relay {
    connector: TransportConnector,
    peer: HttpPeer,
    max_body: usize,
}

impl Relay {
    /// The relay for `config` when its mode is `relay`; `None` in proxy mode. `server` gives
    /// the pool size (`upstream_keepalive_pool_size`) and CA file, as for the proxy's own pool.
    pub fn from_config(
        config: &UpstreamConfig,
        peer: HttpPeer,
        server: &ServerConf,
    ) -> Option<Relay> {
        (config.mode == UpstreamMode::Relay).then(|| Relay {
            connector: TransportConnector::new(Some(ConnectorOptions::from_server_conf(server))),
            peer,
            max_body: config.max_body_bytes,
        })
    }

    /// Sends the request `build` makes and reads the whole answer; `seen` keeps what was seen
    /// of it, failures included.
    pub async fn exchange(
        &self,
        build: impl Fn() -> pingora::Result<RequestHeader>,
        seen: &mut Seen,
    ) -> Result<Relayed, RelayError> {
        let start = Instant::now();
        let request = build().map_err(RelayError::Request)?;
        let (stream, reused) = self.connector.get_stream(&self.peer).await?;
        let session = HttpSession::new_with_options(stream, &self.peer);
        match self.attempt(session, request, start, seen).await {
            Err(RelayError::Upstream(e)) if reused && e.retry == RetryType::ReusedOnly => {
                log::debug!(
                    "pooled upstream connection failed before answering ({e}): one retry, on a new connection"
                );
                let request = build().map_err(RelayError::Request)?;
                let stream = self.connector.new_stream(&self.peer).await?;
                let session = HttpSession::new_with_options(stream, &self.peer);
                self.attempt(session, request, start, seen).await
            }
            other => other,
        }
    }

    /// Hands the connection back to the pool if the answer was complete and the backend did
    /// not ask to close (what Pingora's HTTP/1 connector does on release).
    async fn release(&self, mut session: HttpSession) {
        session.respect_keepalive();
        if let Some(stream) = session.reuse().await {
            self.connector
                .release_stream(stream, self.peer.reuse_hash(), self.peer.idle_timeout());
        }
    }

    async fn attempt(
        &self,
        mut session: HttpSession,
        request: RequestHeader,
        start: Instant,
        seen: &mut Seen,
    ) -> Result<Relayed, RelayError> {
        session.read_timeout = self.peer.options.read_timeout;
        session.write_timeout = self.peer.options.write_timeout;
        session.write_request_header(Box::new(request)).await?;
        let mut informational = 0;
        let status = loop {
            session.read_response().await?;
            let status = session.get_status().unwrap_or(StatusCode::BAD_GATEWAY);
            if status.is_informational()
                && status != StatusCode::SWITCHING_PROTOCOLS
                && informational < MAX_INFORMATIONAL
            {
                informational += 1;
                continue;
            }
            break status;
        };
        seen.status = Some(status.as_u16());
        seen.header_after = Some(start.elapsed());
        if status.is_informational() {
            // The session is dropped, hence closed: never pooled after a switch.
            return Err(if status == StatusCode::SWITCHING_PROTOCOLS {
                RelayError::Upgrade
            } else {
                RelayError::Upstream(Error::explain(
                    ErrorType::InvalidHTTPHeader,
                    "too many informational answers",
                ))
            });
        }
        let announced = session
            .get_header(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
        if announced.is_some_and(|n| n > self.max_body) {
            return Err(RelayError::TooLarge {
                limit: self.max_body,
            });
        }
        let mut body = BytesMut::with_capacity(announced.unwrap_or(0));
        while let Some(chunk) = session.read_body_ref().await? {
            if body.len() + chunk.len() > self.max_body {
                return Err(RelayError::TooLarge {
                    limit: self.max_body,
                });
            }
            body.extend_from_slice(chunk);
            if session.is_body_done() {
                break;
            }
        }
        let headers = end_to_end(session.resp_header().map(|h| &h.headers));
        // Back to the pool before the client is written to: the connection serves the next
        // request while this answer goes out. Pingora keeps it only if the answer was complete
        // and the backend did not ask to close.
        self.release(session).await;
        Ok(Relayed {
            status,
            headers,
            body: body.freeze(),
        })
    }
}

/// The backend's headers without the hop-by-hop ones, nor those its `Connection` names.
fn end_to_end(from: Option<&HeaderMap>) -> HeaderMap {
    let Some(from) = from else {
        return HeaderMap::new();
    };
    let named: Vec<&str> = from
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    let mut out = HeaderMap::with_capacity(from.len() + 8);
    for (name, value) in from {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || named.iter().any(|c| c.eq_ignore_ascii_case(n)) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
        let from = map(&[
            ("content-type", "application/json"),
            ("connection", "keep-alive, X-Hop"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("content-length", "17"),
            ("x-hop", "1"),
            ("set-cookie", "a=1"),
            ("set-cookie", "b=2"),
            ("upgrade", "h2c"),
        ]);
        let kept = end_to_end(Some(&from));
        let names: Vec<String> = kept
            .iter()
            .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                "content-type: application/json",
                "set-cookie: a=1",
                "set-cookie: b=2"
            ]
        );
        assert!(end_to_end(None).is_empty());
    }

    #[test]
    fn the_client_header_is_framed_by_length_with_ours_on_top() {
        let mut r = Relayed {
            status: StatusCode::OK,
            headers: map(&[
                ("content-type", "application/json"),
                ("x-dataset-version", "backend"),
                ("vary", "Accept-Encoding"),
            ]),
            body: Bytes::from_static(b"{\"ok\":1}"),
        };
        let h = r
            .response_header(
                vec![
                    (
                        HeaderName::from_static("x-dataset-version"),
                        HeaderValue::from_static("ours"),
                    ),
                    (VARY, HeaderValue::from_static("Origin")),
                ],
                |m| {
                    let mut v = m.get(VARY).unwrap().to_str().unwrap().to_owned();
                    v.push_str(", Origin");
                    HeaderValue::from_str(&v).unwrap()
                },
            )
            .unwrap();
        assert_eq!(h.status, StatusCode::OK);
        assert_eq!(h.headers.get("x-dataset-version").unwrap(), "ours");
        assert_eq!(h.headers.get(VARY).unwrap(), "Accept-Encoding, Origin");
        assert_eq!(h.headers.get(CONTENT_LENGTH).unwrap(), "8");
        let mut none = Relayed {
            status: StatusCode::NO_CONTENT,
            headers: HeaderMap::new(),
            body: Bytes::new(),
        };
        let h = none
            .response_header(Vec::new(), |_| HeaderValue::from_static(""))
            .unwrap();
        assert!(h.headers.get(CONTENT_LENGTH).is_none());
    }

    #[test]
    fn failures_are_the_upstreams_and_counted_by_kind() {
        let e: RelayError = Error::explain(ErrorType::ConnectRefused, "refused").into();
        assert_eq!(e.kind(), Some(UpstreamError::ConnectRefused));
        let RelayError::Upstream(inner) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(inner.esource(), &pingora::ErrorSource::Upstream);
        let e: RelayError = Error::explain(ErrorType::ReadTimedout, "slow").into();
        assert_eq!(e.kind(), Some(UpstreamError::Timeout));
        assert_eq!(
            RelayError::TooLarge { limit: 1 }.kind(),
            Some(UpstreamError::BadResponse)
        );
        assert_eq!(RelayError::Upgrade.kind(), Some(UpstreamError::BadResponse));
        let ours = RelayError::Request(Error::explain(ErrorType::InternalError, "bug"));
        assert_eq!(ours.kind(), None);
    }
}
