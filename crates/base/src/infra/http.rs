//! The outgoing HTTP clients' TLS: ureq through the system's OpenSSL (the one the tree already
//! builds for Pingora) and its trust store; no second TLS stack, no bundled root certificates.

/// TLS for a ureq agent: native-tls, the platform's verifier.
pub fn system_tls() -> ureq::tls::TlsConfig {
    ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::NativeTls)
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build()
}

/// A response header as text, when it is there and visible ASCII.
pub fn header(response: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}
