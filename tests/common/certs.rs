//! Certificates made at test time: a self-signed one for 127.0.0.1 and a TLS acceptor serving it
//! (for loopback HTTPS servers that the gateway must verify, or be told not to).

use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{SslAcceptor, SslMethod};
use openssl::x509::extension::SubjectAlternativeName;
use openssl::x509::{X509NameBuilder, X509};

/// A self-signed certificate for 127.0.0.1 and `localhost` (PEM) and a TLS acceptor serving it.
#[allow(dead_code)] // not every test file runs a TLS server
pub fn self_signed() -> (String, SslAcceptor) {
    let (key, cert) = self_signed_pair();
    let mut acceptor = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).unwrap();
    acceptor.set_private_key(&key).unwrap();
    acceptor.set_certificate(&cert).unwrap();
    let pem = String::from_utf8(cert.to_pem().unwrap()).unwrap();
    (pem, acceptor.build())
}

/// Writes a self-signed pair for 127.0.0.1 as `dir/tls/cert.pem` and `dir/tls/key.pem`, where
/// a gateway's `tls: { cert: tls/cert.pem, key: tls/key.pem }` finds it.
#[allow(dead_code)] // not every test file runs a TLS gateway
pub fn write_pair(dir: &std::path::Path) {
    let (key, cert) = self_signed_pair();
    let tls = dir.join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    std::fs::write(tls.join("cert.pem"), cert.to_pem().unwrap()).unwrap();
    std::fs::write(tls.join("key.pem"), key.private_key_to_pem_pkcs8().unwrap()).unwrap();
}

/// A key and a certificate for it, valid from today for a day, for 127.0.0.1 and `localhost`.
fn self_signed_pair() -> (PKey<Private>, X509) {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    let key = PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap();
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_nid(Nid::COMMONNAME, "loopback test server")
        .unwrap();
    let name = name.build();
    let mut cert = X509::builder().unwrap();
    cert.set_version(2).unwrap();
    let serial = BigNum::from_u32(7).unwrap().to_asn1_integer().unwrap();
    cert.set_serial_number(&serial).unwrap();
    cert.set_subject_name(&name).unwrap();
    cert.set_issuer_name(&name).unwrap();
    cert.set_pubkey(&key).unwrap();
    cert.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    cert.set_not_after(&Asn1Time::days_from_now(1).unwrap())
        .unwrap();
    let san = SubjectAlternativeName::new()
        .ip("127.0.0.1")
        .dns("localhost")
        .build(&cert.x509v3_context(None, None))
        .unwrap();
    cert.append_extension(san).unwrap();
    cert.sign(&key, MessageDigest::sha256()).unwrap();
    (key, cert.build())
}
