//! What kind of upstream failure a Pingora error is, as `drg_upstream_errors_total` counts it.

use pingora::{Error, ErrorSource, ErrorType};

use drg_telemetry::metrics::UpstreamError;

/// The kind of an error Pingora reports while proxying; `None` when it is not the upstream's
/// (the client went away, or our own fault).
pub fn kind_of(e: &Error) -> Option<UpstreamError> {
    use ErrorType::*;
    let upstream = e.esource() == &ErrorSource::Upstream;
    Some(match e.etype() {
        ConnectRefused => UpstreamError::ConnectRefused,
        ConnectNoRoute | ConnectError | TLSHandshakeFailure | TLSHandshakeTimedout
        | InvalidCert | HandshakeError => UpstreamError::ConnectError,
        ConnectTimedout => UpstreamError::Timeout,
        ReadTimedout | WriteTimedout if upstream => UpstreamError::Timeout,
        ConnectionClosed | ReadError | WriteError if upstream => UpstreamError::Reset,
        _ if upstream => UpstreamError::BadResponse,
        _ => return None,
    })
}
