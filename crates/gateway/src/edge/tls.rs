//! HTTPS on the public listener: the certificate pair read and checked from PEM files, handed to
//! every TLS handshake from an [`ArcSwap`], and hot-reloaded by a [`Reloader`] when the files
//! change, so a new certificate is served without a restart and without failing a request.
//!
//! Why a certificate callback rather than rebuilding Pingora's `TlsSettings`: the settings are
//! turned into an acceptor once, when the listener starts, and Pingora offers no way to replace
//! it. The callback runs inside each handshake and only takes a reference to the pair in
//! service, so a reload is one pointer swap; handshakes in progress finish with the pair they
//! took, and a pair that fails to load (unreadable, not PEM, key not matching the certificate)
//! never replaces the one in service. Nor does a certificate outside its validity period (expired,
//! or not valid yet): clients would refuse it, while the one in service still works; at start
//! such a certificate stops the start.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use async_trait::async_trait;
use openssl::asn1::Asn1Time;
use openssl::error::ErrorStack;
use openssl::pkey::{PKey, Private};
use openssl::x509::{X509NameRef, X509};
use pingora::listeners::tls::TlsSettings;
use pingora::listeners::TlsAccept;
use pingora::protocols::http::v2::server::{default_h2_options, H2Options};
use pingora::protocols::tls::TlsRef;
use pingora::tls::ext;
use prometheus::Gauge;

use crate::edge::config::{LimitsConfig, TlsConfig};
use drg_base::reload::{Reloadable, Reloader};
use drg_telemetry::metrics::Metrics;

/// Why a certificate pair cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("gateway.tls.{key} {path}: cannot read it: {source}")]
    Read {
        key: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("gateway.tls.cert {path}: no PEM certificate in it{detail}")]
    NoCertificate { path: PathBuf, detail: String },
    #[error("gateway.tls.key {path}: not a PEM private key: {source}")]
    BadKey { path: PathBuf, source: ErrorStack },
    #[error(
        "gateway.tls: the key {key} does not belong to the certificate {cert} (replace both files together)"
    )]
    Mismatch { cert: PathBuf, key: PathBuf },
    #[error("gateway.tls.cert {path}: {what}: {source}")]
    Certificate {
        path: PathBuf,
        what: &'static str,
        source: ErrorStack,
    },
    #[error("gateway.tls.cert {path}: the certificate (serial {serial}) expired on {not_after}: clients refuse it; install a current one")]
    Expired {
        path: PathBuf,
        serial: String,
        not_after: String,
    },
    #[error("gateway.tls.cert {path}: the certificate (serial {serial}) is not valid before {not_before}: clients refuse it until then")]
    NotYetValid {
        path: PathBuf,
        serial: String,
        not_before: String,
    },
    #[error("gateway.tls: cannot set up TLS: {0}")]
    Settings(String),
}

/// A certificate (with its chain) and the private key that belongs to it.
pub struct CertPair {
    leaf: X509,
    /// Intermediates, in the order of the file, sent after the leaf.
    chain: Vec<X509>,
    key: PKey<Private>,
    /// For logs: the leaf's subject, serial (hex) and expiry.
    pub subject: String,
    pub serial: String,
    pub not_after: String,
    /// The expiry as Unix time, for the metric.
    pub not_after_unix: i64,
    /// The start of the validity period, as text and Unix time.
    pub not_before: String,
    pub not_before_unix: i64,
}

impl std::fmt::Debug for CertPair {
    // The key stays out of every debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertPair")
            .field("subject", &self.subject)
            .field("serial", &self.serial)
            .field("not_after", &self.not_after)
            .field("chain", &self.chain.len())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Display for CertPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "subject {}, serial {}, not after {}, {} chain certificate(s)",
            self.subject,
            self.serial,
            self.not_after,
            self.chain.len()
        )
    }
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        key,
        path: path.to_owned(),
        source,
    })
}

/// `CN=example.com, O=Example` from an X.509 name.
fn name_text(name: &X509NameRef) -> String {
    name.entries()
        .map(|e| {
            let field = e.object().nid().short_name().unwrap_or("?");
            let value = e.data().to_string().unwrap_or_default();
            format!("{field}={value}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl CertPair {
    /// Reads and checks a pair: the certificate file holds the leaf then any intermediates, the
    /// key file the leaf's private key.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<CertPair, TlsError> {
        let cert_pem = read("cert", cert_path)?;
        let key_pem = read("key", key_path)?;
        let mut certs = X509::stack_from_pem(&cert_pem).map_err(|e| TlsError::NoCertificate {
            path: cert_path.to_owned(),
            detail: format!(": {e}"),
        })?;
        if certs.is_empty() {
            return Err(TlsError::NoCertificate {
                path: cert_path.to_owned(),
                detail: String::new(),
            });
        }
        let leaf = certs.remove(0);
        let key = PKey::private_key_from_pem(&key_pem).map_err(|source| TlsError::BadKey {
            path: key_path.to_owned(),
            source,
        })?;
        let cert_error = |what| {
            let path = cert_path.to_owned();
            move |source| TlsError::Certificate { path, what, source }
        };
        let public = leaf
            .public_key()
            .map_err(cert_error("unreadable public key"))?;
        if !public.public_eq(&key) {
            return Err(TlsError::Mismatch {
                cert: cert_path.to_owned(),
                key: key_path.to_owned(),
            });
        }
        let serial = leaf
            .serial_number()
            .to_bn()
            .and_then(|bn| bn.to_hex_str().map(|s| s.to_string()))
            .map_err(cert_error("unreadable serial number"))?;
        let unix = |t: &openssl::asn1::Asn1TimeRef| {
            Asn1Time::from_unix(0)
                .and_then(|epoch| epoch.diff(t))
                .map(|d| i64::from(d.days) * 86_400 + i64::from(d.secs))
        };
        let not_after_unix = unix(leaf.not_after()).map_err(cert_error("unreadable expiry"))?;
        let not_before_unix =
            unix(leaf.not_before()).map_err(cert_error("unreadable start of validity"))?;
        Ok(CertPair {
            subject: name_text(leaf.subject_name()),
            serial,
            not_after: leaf.not_after().to_string(),
            not_after_unix,
            not_before: leaf.not_before().to_string(),
            not_before_unix,
            leaf,
            chain: certs,
            key,
        })
    }

    /// Reads a pair (as [`CertPair::load`]) that is also valid now: what `serve` and
    /// `check-config` accept at start.
    pub fn load_current(cert_path: &Path, key_path: &Path) -> Result<CertPair, TlsError> {
        let pair = CertPair::load(cert_path, key_path)?;
        pair.check_validity(cert_path, unix_now())?;
        Ok(pair)
    }

    /// Whether the leaf is inside its validity period at `now` (Unix time): clients refuse it
    /// otherwise.
    fn check_validity(&self, path: &Path, now: i64) -> Result<(), TlsError> {
        if self.not_after_unix <= now {
            return Err(TlsError::Expired {
                path: path.to_owned(),
                serial: self.serial.clone(),
                not_after: self.not_after.clone(),
            });
        }
        if self.not_before_unix > now {
            return Err(TlsError::NotYetValid {
                path: path.to_owned(),
                serial: self.serial.clone(),
                not_before: self.not_before.clone(),
            });
        }
        Ok(())
    }

    /// Sets this pair on one connection in its handshake.
    fn install(&self, ssl: &mut TlsRef) -> Result<(), ErrorStack> {
        ext::ssl_use_certificate(ssl, &self.leaf)?;
        for cert in &self.chain {
            ext::ssl_add_chain_cert(ssl, cert)?;
        }
        ext::ssl_use_private_key(ssl, &self.key)
    }
}

/// The configured certificate files, as a [`Reloadable`] source.
pub struct TlsSource {
    cert: PathBuf,
    key: PathBuf,
    /// `drg_tls_cert_not_after_seconds`.
    not_after: Option<Gauge>,
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl TlsSource {
    fn note(&self, pair: &CertPair, what: &str) {
        log::info!("TLS certificate {what}: {pair}");
        if let Some(gauge) = &self.not_after {
            // f64 holds every Unix time of this era exactly.
            gauge.set(pair.not_after_unix as f64);
        }
    }
}

impl Reloadable for TlsSource {
    type Snapshot = CertPair;
    type Error = TlsError;

    fn name(&self) -> &str {
        "TLS certificate"
    }

    fn watched_files(&self) -> Vec<PathBuf> {
        vec![self.cert.clone(), self.key.clone()]
    }

    fn build(&self) -> Result<CertPair, TlsError> {
        CertPair::load(&self.cert, &self.key)
    }

    /// A pair outside its validity period is refused (the reloader logs it at WARN and counts
    /// `drg_reloads_total{source="tls",result="refused"}`): the pair in service still works.
    /// Not retried until the files change again (or SIGHUP), also for a certificate that
    /// becomes valid later: replace it once it is.
    fn accept(&self, _current: &CertPair, next: &CertPair) -> Result<(), TlsError> {
        next.check_validity(&self.cert, unix_now())
    }

    fn published(&self, pair: &CertPair) {
        self.note(pair, "reloaded");
    }
}

/// Hands the pair in service to each handshake.
struct Served(Arc<ArcSwap<CertPair>>);

#[async_trait]
impl TlsAccept for Served {
    async fn certificate_callback(&self, ssl: &mut TlsRef) {
        if let Err(e) = self.0.load().install(ssl) {
            // The handshake then fails for want of a certificate; nothing else can be done.
            log::error!("TLS: cannot set the certificate on a handshake: {e}");
        }
    }
}

/// What the public listener needs for HTTPS.
pub struct ListenerTls {
    /// For `add_tls_with_settings`.
    pub settings: TlsSettings,
    /// The background service that reloads the pair.
    pub reloader: Reloader<TlsSource>,
}

/// Loads the configured pair (a bad one stops the start) and builds Pingora's TLS settings
/// (Mozilla's intermediate profile: TLS 1.2 and 1.3) around the certificate callback; `h2`
/// offers HTTP/2 by ALPN, else only HTTP/1.1 is agreed.
pub fn listener(
    config: &TlsConfig,
    poll_interval: Duration,
    metrics: &Metrics,
) -> Result<ListenerTls, TlsError> {
    let pair = CertPair::load_current(&config.cert, &config.key)?;
    let not_after = match metrics.gauge(
        "drg_tls_cert_not_after_seconds",
        "Expiry (Unix time) of the certificate the public listener serves.",
    ) {
        Ok(g) => Some(g),
        Err(e) => {
            log::error!("cannot register drg_tls_cert_not_after_seconds: {e}");
            None
        }
    };
    let source = TlsSource {
        cert: config.cert.clone(),
        key: config.key.clone(),
        not_after,
    };
    source.note(&pair, "loaded");
    let current = Arc::new(ArcSwap::from_pointee(pair));
    let mut settings = TlsSettings::with_callbacks(Box::new(Served(current.clone())))
        .map_err(|e| TlsError::Settings(e.to_string()))?;
    if config.h2 {
        settings.enable_h2();
    } else {
        settings.set_alpn(pingora::listeners::ALPN::H1);
    }
    let reloader =
        Reloader::new(source, current, poll_interval).with_hook(metrics.reload_hook("tls"));
    Ok(ListenerTls { settings, reloader })
}

/// HTTP/2 settings from the connection limits: the decoded header list is bounded by
/// `max_header_bytes` (HTTP/2 counts 32 bytes of overhead per field, so this also bounds the
/// number of fields); Pingora's cap of 100 concurrent streams per connection is kept.
pub fn h2_options(limits: &LimitsConfig) -> H2Options {
    let mut options = default_h2_options();
    options.max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_names_its_key_and_path() {
        let err = CertPair::load(
            Path::new("/nonexistent/c.pem"),
            Path::new("/nonexistent/k.pem"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("gateway.tls.cert /nonexistent/c.pem: cannot read it"),
            "{err}"
        );
    }

    #[test]
    fn a_file_without_a_certificate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("c.pem");
        let key = dir.path().join("k.pem");
        std::fs::write(&cert, "not a certificate\n").unwrap();
        std::fs::write(&key, "not a key\n").unwrap();
        let err = CertPair::load(&cert, &key).unwrap_err().to_string();
        assert!(err.contains("no PEM certificate"), "{err}");
    }
}
