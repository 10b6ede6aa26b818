//! The one backend as Pingora's peer (timeouts, TLS), and what a failed exchange with it is
//! answered with: the same in proxy and relay mode.

use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorSource, ErrorType};

use crate::upstream::config::UpstreamConfig;
use drg_base::answer::ApiError;

/// The upstream peer for `config` (timeouts, TLS); also what the bench floor proxies with.
pub fn http_peer(config: &UpstreamConfig) -> HttpPeer {
    let mut peer = HttpPeer::new(config.address.as_str(), config.tls, config.server_name());
    peer.options.connection_timeout = Some(config.connect_timeout);
    peer.options.total_connection_timeout = Some(config.connect_timeout);
    peer.options.read_timeout = Some(config.read_timeout);
    peer.options.write_timeout = Some(config.read_timeout);
    peer.options.verify_cert = config.verify_cert;
    peer.options.verify_hostname = config.verify_cert;
    peer
}

/// The answer to a failed upstream call (the same in proxy and relay mode); `None` when it is
/// the client's failure (nothing to answer).
pub fn api_error(e: &Error) -> Option<ApiError> {
    match (e.esource(), e.etype()) {
        (_, ErrorType::ConnectTimedout)
        | (ErrorSource::Upstream, ErrorType::ReadTimedout | ErrorType::WriteTimedout) => Some(
            ApiError::UpstreamTimeout(format!("upstream: {}", e.etype().as_str())),
        ),
        (ErrorSource::Upstream, _)
        | (
            _,
            ErrorType::ConnectRefused
            | ErrorType::ConnectNoRoute
            | ErrorType::ConnectError
            | ErrorType::TLSHandshakeFailure
            | ErrorType::TLSHandshakeTimedout
            | ErrorType::InvalidCert
            | ErrorType::HandshakeError,
        ) => Some(ApiError::UpstreamUnavailable(format!(
            "upstream: {}",
            e.etype().as_str()
        ))),
        (ErrorSource::Downstream, _) => None,
        _ => Some(ApiError::Internal(e.to_string())),
    }
}
