//! The outgoing HTTP clients' TLS: ureq through the system's OpenSSL (the one the tree already
//! builds for Pingora) and its trust store; no second TLS stack, no bundled root certificates.

/// TLS for a ureq agent: native-tls, the platform's verifier.
pub fn system_tls() -> ureq::tls::TlsConfig {
    ureq::tls::TlsConfig::builder()
        .provider(ureq::tls::TlsProvider::NativeTls)
        .root_certs(ureq::tls::RootCerts::PlatformVerifier)
        .build()
}
