//! One delivery attempt: the payload POSTed as JSON, signed (`sign.rs`), with the message's
//! fixed id (`Webhook-Id`, and `X-Alert-Id` / `X-Change-Id` as before) so that a receiver can
//! drop a repeat: delivery is at least once (a crash between its answer and our record of it
//! sends it again, with the same id). Blocking: run off the async threads. The agent
//! connects only to addresses the destination guard let through (`resolve.rs`).

use std::sync::Arc;
use std::time::Duration;

use crate::guard::Policy;
use crate::resolve::{GuardedResolver, Unreachable};
use crate::sign::{signature, timed_signature};

/// Why an attempt did not deliver.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    /// The guard refused every address of the receiver's host: final for the message (another
    /// attempt would ask the same policy, and a name that turns private is no passing failure).
    #[error("{0}")]
    Refused(Unreachable),
    /// The receiver's answer, a transport error or a timeout: retried.
    #[error("{0}")]
    Failed(String),
    /// Not tried: the destination is not known on this gateway yet ([`crate::Found::NotHere`]);
    /// retried, and no mark against the receiver.
    #[error("the destination is not known here yet")]
    NotHere,
}

/// The HTTP client for the receiver: `timeout` for the whole attempt, no redirects (a signed
/// message goes where it was configured to), TLS through the system's OpenSSL and trust store;
/// names resolved and judged by `policy`. No proxy, not even from the environment: through one,
/// the gateway could not tell where the alert goes.
pub fn agent(timeout: Duration, policy: Policy) -> ureq::Agent {
    let config = ureq::Agent::config_builder()
        .tls_config(
            // The system's OpenSSL (the one the gateway builds for Pingora) and trust store.
            ureq::tls::TlsConfig::builder()
                .provider(ureq::tls::TlsProvider::NativeTls)
                .root_certs(ureq::tls::RootCerts::PlatformVerifier)
                .build(),
        )
        .timeout_global(Some(timeout))
        .max_redirects(0)
        .proxy(None)
        .http_status_as_error(false)
        .user_agent(concat!("domain-risk-gateway/", env!("CARGO_PKG_VERSION")))
        .build();
    let resolver = GuardedResolver {
        policy: Arc::new(policy),
    };
    ureq::Agent::with_parts(
        config,
        ureq::unversioned::transport::DefaultConnector::default(),
        resolver,
    )
}

/// POSTs `body` with its fixed id (`(header, value)`: `X-Alert-Id` for an alert,
/// `X-Change-Id` for verdict changes); `Ok` on a 2xx answer, else why not (the guard's refusal,
/// the status, or the transport error).
pub fn post(
    target: &crate::Target,
    (id_header, id): (&str, &str),
    body: &str,
) -> Result<(), AttemptError> {
    let secret = &target.secret;
    let mut request = target
        .agent
        .post(&target.url)
        .header("Content-Type", "application/json")
        // Signed at each attempt: a retry is a new send, and its time is when it left.
        .header(
            "Webhook-Signature",
            timed_signature(secret, chrono::Utc::now().timestamp(), body.as_bytes()),
        )
        // The one id receivers dedupe on, the same on every attempt and after a restart.
        .header("Webhook-Id", id);
    if !id_header.eq_ignore_ascii_case("webhook-id") {
        request = request.header(id_header, id);
    }
    if target.legacy_signature {
        request = request.header("X-Signature", signature(secret, body.as_bytes()));
    }
    let response = request.send(body).map_err(attempt_error)?;
    let status = response.status().as_u16();
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(AttemptError::Failed(format!(
            "the receiver answered {status}"
        )))
    }
}

/// The guard's refusal comes back from ureq as the I/O error `GuardedResolver` made of it.
fn attempt_error(e: ureq::Error) -> AttemptError {
    if let ureq::Error::Io(io) = &e {
        if let Some(why) = io.get_ref().and_then(|r| r.downcast_ref::<Unreachable>()) {
            return AttemptError::Refused(why.clone());
        }
    }
    AttemptError::Failed(e.to_string())
}

/// The wait before attempt `attempts + 1`: one second, doubling, at most ten minutes.
pub fn backoff(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.min(10)).min(Duration::from_secs(600))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guard::Listener;

    /// A receiver on loopback that answers one request `204`.
    fn answer_once() -> std::net::SocketAddr {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            // Headers, then the two-byte body `{}`.
            while !got.ends_with(b"{}") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "closed early");
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap();
        });
        addr
    }

    #[test]
    fn a_refused_address_is_never_connected_to_and_is_told_apart() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let target = |policy: Policy, url: &str| crate::Target {
            url: url.to_owned(),
            secret: b"k".to_vec(),
            agent: agent(Duration::from_secs(2), policy),
            max_attempts: 1,
            legacy_signature: false,
        };
        let refused = |policy: Policy, url: &str| match post(
            &target(policy, url),
            ("X-Alert-Id", "id"),
            "{}",
        ) {
            Err(AttemptError::Refused(why)) => why.to_string(),
            other => panic!("{url}: {other:?}"),
        };
        // `localhost` is a name: it passes the configuration, and is judged once resolved.
        for url in [
            format!("http://{addr}/h"),
            format!("http://localhost:{}/h", addr.port()),
        ] {
            let why = refused(Policy::default(), &url);
            assert!(why.contains("is loopback"), "{why}");
            assert!(!why.contains("/h"), "no path: {why}");
        }
        let own = Policy {
            allow_private: true,
            listeners: vec![Listener {
                key: "gateway.admin.listen",
                addr,
            }],
        };
        let why = refused(own, &format!("http://localhost:{}/h", addr.port()));
        assert!(why.contains("own listener gateway.admin.listen"), "{why}");
        assert!(listener.accept().is_err(), "nothing connected");
        // With allow_private, loopback is delivered to.
        let open = Policy {
            allow_private: true,
            listeners: vec![],
        };
        let receiver = answer_once();
        let url = format!("http://127.0.0.1:{}/h", receiver.port());
        post(&target(open, &url), ("X-Alert-Id", "id"), "{}").unwrap();
    }

    #[test]
    fn backoff_doubles_to_a_cap() {
        let waits: Vec<u64> = (0..12).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(waits[..4], [1, 2, 4, 8]);
        assert_eq!(waits[11], 600);
    }
}
