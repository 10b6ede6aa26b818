//! Signing: HMAC-SHA256 over the send's time and the body (`Webhook-Signature: t=<unix>,v1=<hex
//! of HMAC(secret, "<t>.<body>")>`, the scheme receivers know from the big payment APIs: a
//! receiver refuses an old `t`, so a captured message cannot be replayed later), and, for
//! receivers written before it, over the body alone (`X-Signature: sha256=<hex>`).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// `sha256=<hex>` of `body` under `secret`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    // HMAC takes a key of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// `t=<unix>,v1=<hex>`: HMAC-SHA256 under `secret` of `<unix>.<body>` (the `Webhook-Signature`
/// header).
pub fn timed_signature(secret: &[u8], unix: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(unix.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={unix},v1={}", hex::encode(mac.finalize().into_bytes()))
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
    fn the_timed_signature_covers_the_time_and_the_body() {
        let sig = timed_signature(b"s3cret", 1_795_000_000, b"{}");
        let (t, v1) = sig.split_once(',').unwrap();
        assert_eq!(t, "t=1795000000");
        let mut mac = Hmac::<Sha256>::new_from_slice(b"s3cret").unwrap();
        mac.update(b"1795000000.{}");
        assert_eq!(
            v1,
            format!("v1={}", hex::encode(mac.finalize().into_bytes()))
        );
        assert_ne!(sig, timed_signature(b"s3cret", 1_795_000_001, b"{}"));
    }
}
