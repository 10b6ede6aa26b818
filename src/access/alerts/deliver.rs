//! One delivery attempt: the payload POSTed as JSON, signed with HMAC-SHA256 of the body
//! (`X-Signature: sha256=<hex>`), with the alert's fixed id (`X-Alert-Id`) so that a receiver
//! can drop the rare repeat (a crash between its answer and our record of it). Blocking: run off
//! the async threads.

use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// `sha256=<hex>` of `body` under `secret`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    // HMAC takes a key of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The HTTP client for the receiver: `timeout` for the whole attempt, no redirects (a signed
/// alert goes where it was configured to), TLS through the system's OpenSSL and trust store.
pub fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .tls_config(crate::infra::http::system_tls())
        .timeout_global(Some(timeout))
        .max_redirects(0)
        .http_status_as_error(false)
        .user_agent(concat!("domain-risk-gateway/", env!("CARGO_PKG_VERSION")))
        .build()
        .new_agent()
}

/// POSTs `body`; `Ok` on a 2xx answer, else why not (the status, or the transport error).
pub fn post(
    agent: &ureq::Agent,
    url: &str,
    id: &str,
    body: &str,
    secret: &[u8],
) -> Result<(), String> {
    let response = agent
        .post(url)
        .header("Content-Type", "application/json")
        .header("X-Signature", signature(secret, body.as_bytes()))
        .header("X-Alert-Id", id)
        .send(body)
        .map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err(format!("the receiver answered {status}"))
    }
}

/// The wait before attempt `attempts + 1`: one second, doubling, at most ten minutes.
pub fn backoff(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.min(10)).min(Duration::from_secs(600))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_rfc_4231s() {
        // RFC 4231 test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn backoff_doubles_to_a_cap() {
        let waits: Vec<u64> = (0..12).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(waits[..4], [1, 2, 4, 8]);
        assert_eq!(waits[11], 600);
    }
}
