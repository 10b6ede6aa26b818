//! HTTPS on the public listener, end to end: certificates made at test time (a root CA, an
//! intermediate, leaves), HTTP/1.1 over TLS with the `openssl` crate, HTTP/2 with curl, the
//! certificate replaced on disk while clients keep connecting, and bad pairs refused.

use crate::common;
use common::*;

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::ssl::{SslConnector, SslMethod};
use openssl::x509::extension::{
    BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
};
use openssl::x509::{X509NameBuilder, X509};

const LOOKUP: &str = "/v1/public/domain/mailinator.com";

fn new_key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A certificate for `key`, signed by `issuer` (self-signed when `None`).
fn certificate(
    cn: &str,
    serial: u32,
    key: &PKey<Private>,
    issuer: Option<(&X509, &PKey<Private>)>,
    ca: bool,
) -> X509 {
    // An hour back, so a second of clock skew between here and the handshake cannot matter.
    let now = unix_now();
    certificate_valid(cn, serial, key, issuer, ca, (now - 3600, now + 30 * 86_400))
}

/// [`certificate`] valid from `validity.0` to `validity.1` (Unix times).
fn certificate_valid(
    cn: &str,
    serial: u32,
    key: &PKey<Private>,
    issuer: Option<(&X509, &PKey<Private>)>,
    ca: bool,
    validity: (i64, i64),
) -> X509 {
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", cn).unwrap();
    let name = name.build();
    let mut b = X509::builder().unwrap();
    b.set_version(2).unwrap();
    b.set_serial_number(&BigNum::from_u32(serial).unwrap().to_asn1_integer().unwrap())
        .unwrap();
    b.set_subject_name(&name).unwrap();
    b.set_issuer_name(issuer.map_or(&*name, |(c, _)| c.subject_name()))
        .unwrap();
    b.set_pubkey(key).unwrap();
    b.set_not_before(&Asn1Time::from_unix(validity.0).unwrap())
        .unwrap();
    b.set_not_after(&Asn1Time::from_unix(validity.1).unwrap())
        .unwrap();
    if ca {
        b.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
            .unwrap();
        b.append_extension(
            KeyUsage::new()
                .critical()
                .key_cert_sign()
                .crl_sign()
                .build()
                .unwrap(),
        )
        .unwrap();
    } else {
        let san = SubjectAlternativeName::new()
            .dns("localhost")
            .ip("127.0.0.1")
            .build(&b.x509v3_context(issuer.map(|(c, _)| &**c), None))
            .unwrap();
        b.append_extension(san).unwrap();
        b.append_extension(ExtendedKeyUsage::new().server_auth().build().unwrap())
            .unwrap();
    }
    b.sign(issuer.map_or(key, |(_, k)| k), MessageDigest::sha256())
        .unwrap();
    b.build()
}

/// A root CA (trusted by the clients) and an intermediate (sent in the chain) that signs leaves.
struct Pki {
    dir: PathBuf,
    inter: X509,
    inter_key: PKey<Private>,
}

impl Pki {
    /// Makes the CA files in `dir/tls` and a first leaf (serial 100) as `cert.pem`/`key.pem`.
    fn new(dir: &Path) -> Pki {
        let dir = dir.join("tls");
        std::fs::create_dir_all(&dir).unwrap();
        let root_key = new_key();
        let root = certificate("Test Root CA", 1, &root_key, None, true);
        std::fs::write(dir.join("ca.pem"), root.to_pem().unwrap()).unwrap();
        let inter_key = new_key();
        let inter = certificate(
            "Test Intermediate",
            2,
            &inter_key,
            Some((&root, &root_key)),
            true,
        );
        let pki = Pki {
            dir,
            inter,
            inter_key,
        };
        let key = new_key();
        let (cert, key) = pki.leaf(100, &key);
        std::fs::write(pki.dir.join("cert.pem"), cert).unwrap();
        std::fs::write(pki.dir.join("key.pem"), key).unwrap();
        pki
    }

    /// A leaf for `key` as (chain PEM: leaf then intermediate, key PEM).
    fn leaf(&self, serial: u32, key: &PKey<Private>) -> (String, String) {
        let now = unix_now();
        self.leaf_valid(serial, key, (now - 3600, now + 30 * 86_400))
    }

    /// [`Pki::leaf`] valid from `validity.0` to `validity.1` (Unix times).
    fn leaf_valid(
        &self,
        serial: u32,
        key: &PKey<Private>,
        validity: (i64, i64),
    ) -> (String, String) {
        let leaf = certificate_valid(
            "localhost",
            serial,
            key,
            Some((&self.inter, &self.inter_key)),
            false,
            validity,
        );
        let chain = [leaf.to_pem().unwrap(), self.inter.to_pem().unwrap()].concat();
        (
            String::from_utf8(chain).unwrap(),
            String::from_utf8(key.private_key_to_pem_pkcs8().unwrap()).unwrap(),
        )
    }

    fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Replaces the served pair the way the README says: each file written to a temporary name,
    /// then renamed over the old one, the key first.
    fn replace(&self, cert: &str, key: &str) {
        write_atomic(&self.dir.join("key.pem"), key);
        write_atomic(&self.dir.join("cert.pem"), cert);
    }

    fn connector(&self) -> SslConnector {
        let mut b = SslConnector::builder(SslMethod::tls()).unwrap();
        b.set_ca_file(self.ca()).unwrap();
        b.build()
    }
}

/// A gateway serving the pair in `pki`'s folder, header size limit 4 KiB, proxying `/v1/check`
/// to a stub upstream.
fn gateway(h2: bool) -> (Gateway, Pki, Upstream) {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let upstream = Upstream::start(Duration::ZERO);
    let gw = Gateway::builder()
        .in_dir(dir)
        .upstream(upstream.addr)
        .data("disposable.txt", "mailinator.com\n")
        .gateway_yaml("limits: { max_header_bytes: 4096 }")
        .gateway_yaml(&format!(
            "tls: {{ cert: tls/cert.pem, key: tls/key.pem, h2: {h2} }}"
        ))
        .start();
    (gw, pki, upstream)
}

/// One request on a fresh TLS connection (hostname and chain verified against the test CA);
/// the answer and the serial (hex) of the certificate the gateway presented.
fn https(
    addr: SocketAddr,
    tls: &SslConnector,
    path: &str,
    secret: Option<&str>,
    extra: &str,
) -> Result<(Response, String), String> {
    let tcp = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut stream = tls
        .connect("localhost", tcp)
        .map_err(|e| format!("handshake: {e}"))?;
    let serial = stream
        .ssl()
        .peer_certificate()
        .ok_or("no peer certificate")?
        .serial_number()
        .to_bn()
        .unwrap()
        .to_hex_str()
        .unwrap()
        .to_string();
    let auth = secret.map_or(String::new(), |s| {
        format!("Authorization: {}\r\n", bearer(s))
    });
    // A refused request is answered before all of it was sent: read the answer even if
    // the write failed.
    let written = write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}{extra}Connection: close\r\n\r\n"
    );
    match read_response(&mut BufReader::new(stream)) {
        Ok(response) => Ok((response, serial)),
        Err(e) => Err(format!("read: {e} (write: {written:?})")),
    }
}

fn serial_hex(n: u32) -> String {
    BigNum::from_u32(n)
        .unwrap()
        .to_hex_str()
        .unwrap()
        .to_string()
}

/// The value of a metric line of `/metrics` on the admin listener whose name and labels
/// contain every one of `parts`.
fn metric(gw: &Gateway, parts: &[&str]) -> Option<f64> {
    let text = String::from_utf8(gw.admin_get("/metrics").body).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| parts.iter().all(|p| l.contains(p)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// curl over HTTPS trusting the test CA: (HTTP version as curl reports it, status, headers, body).
/// curl is the HTTP/2 client of these tests: without it they fail (a skip would pass untested).
fn curl(gw: &Gateway, pki: &Pki, args: &[&str], path: &str) -> (String, u16, String, String) {
    let port = gw.addr.port();
    let headers = pki.dir.join("curl-headers.txt");
    let out = Command::new("curl")
        .args(["-sS", "--cacert"])
        .arg(pki.ca())
        .args(["--resolve", &format!("localhost:{port}:127.0.0.1")])
        .arg("-D")
        .arg(&headers)
        .args(["-w", "\n%{http_version} %{http_code}"])
        .args(args)
        .arg(format!("https://localhost:{port}{path}"))
        .output()
        .unwrap_or_else(|e| panic!("curl: {e} (scripts/test installs it)"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "curl failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (body, tail) = stdout.rsplit_once('\n').unwrap();
    let (version, code) = tail.split_once(' ').unwrap();
    (
        version.to_owned(),
        code.parse().unwrap(),
        std::fs::read_to_string(&headers).unwrap().to_lowercase(),
        body.to_owned(),
    )
}

#[test]
fn http1_over_tls_serves_the_contract_and_keeps_its_limits() {
    let (gw, pki, _up) = gateway(false);
    let tls = pki.connector();
    let (r, serial) = https(gw.addr, &tls, LOOKUP, Some(TEST_SECRET), "").unwrap();
    assert_eq!(serial, serial_hex(100));
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-type"),
        Some("application/json; charset=utf-8")
    );
    assert_eq!(r.json()["reason"], "disposable");
    assert_eq!(r.json()["risk_score"], 100);
    assert!(r.header("ratelimit").is_some());
    assert!(r.header("ratelimit-policy").is_some());

    let (r, _) = https(gw.addr, &tls, LOOKUP, None, "").unwrap();
    r.assert_error(401, "unauthorized");
    assert!(r.header("www-authenticate").is_some());

    // The header limits of plain HTTP hold behind TLS too.
    let big = format!("X-Big: {}\r\n", "a".repeat(8_000));
    let (r, _) = https(gw.addr, &tls, LOOKUP, Some(TEST_SECRET), &big).unwrap();
    assert_eq!(r.status, 431);

    // Plain HTTP on the TLS port gets no answer.
    assert!(gw.conn().get(LOOKUP).is_err());

    // Without `h2`, HTTP/2 is not agreed: curl falls back to HTTP/1.1.
    let (version, status, _, _) = curl(&gw, &pki, &["--http2"], "/healthz");
    assert_eq!((version.as_str(), status), ("1.1", 200));
    assert!(gw
        .log()
        .contains("TLS certificate loaded: subject CN=localhost, serial 64"));
    assert!(
        metric(&gw, &["drg_tls_cert_not_after_seconds"]).unwrap() > 1.7e9,
        "the expiry gauge"
    );
}

#[test]
fn h2_by_alpn_goes_through_the_same_routes_and_checks() {
    let (gw, pki, up) = gateway(true);
    let key = format!("Authorization: {}", bearer(TEST_SECRET));
    let (version, status, headers, body) = curl(&gw, &pki, &["--http2", "-H", &key], LOOKUP);
    assert_eq!((version.as_str(), status), ("2", 200), "{headers}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["reason"], "disposable");
    for header in ["ratelimit:", "ratelimit-policy:", "vary: origin"] {
        assert!(headers.contains(header), "{header} missing in:\n{headers}");
    }
    let (version, status, headers, _) = curl(&gw, &pki, &["--http2"], LOOKUP);
    assert_eq!((version.as_str(), status), ("2", 401));
    assert!(headers.contains("www-authenticate:"), "{headers}");
    // The header bound applies to HTTP/2's header list.
    let big = format!("X-Big: {}", "a".repeat(8_000));
    let r = Command::new("curl")
        .args(["-s", "--http2", "--cacert"])
        .arg(pki.ca())
        .args([
            "--resolve",
            &format!("localhost:{}:127.0.0.1", gw.addr.port()),
        ])
        .args([
            "-H",
            &key,
            "-H",
            &big,
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg(format!("https://localhost:{}{LOOKUP}", gw.addr.port()))
        .output()
        .unwrap();
    let code = String::from_utf8_lossy(&r.stdout).into_owned();
    assert_eq!(code, "431", "an 8 kB header over HTTP/2");
    // Proxied calls too: the upstream is told the client came over HTTPS.
    let (version, status, _, body) = curl(
        &gw,
        &pki,
        &["--http2", "-H", &key],
        "/v1/check/jane@example.com",
    );
    assert_eq!((version.as_str(), status), ("2", 200), "{body}");
    let seen = up.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/check/jane@example.com");
    assert_eq!(seen[0].header("x-forwarded-proto"), Some("https"));
    // HTTP/1.1 clients are still served on the same port.
    let (r, _) = https(gw.addr, &pki.connector(), LOOKUP, Some(TEST_SECRET), "").unwrap();
    assert_eq!(r.status, 200);
}

#[test]
fn a_replaced_certificate_is_served_without_failing_a_request_and_a_bad_pair_is_refused() {
    let (gw, pki, _up) = gateway(false);
    let tls = Arc::new(pki.connector());
    let stop = Arc::new(AtomicBool::new(false));
    // Per client, the serials it was shown, in order (repeats collapsed).
    let seen = Arc::new(Mutex::new(vec![Vec::<String>::new(); 2]));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let done = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..2)
        .map(|i| {
            let (tls, stop, seen, failures, done) = (
                tls.clone(),
                stop.clone(),
                seen.clone(),
                failures.clone(),
                done.clone(),
            );
            let addr = gw.addr;
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match https(addr, &tls, LOOKUP, Some(TEST_SECRET), "") {
                        Ok((r, serial)) if r.status == 200 => {
                            let mut seen = seen.lock().unwrap();
                            if seen[i].last() != Some(&serial) {
                                seen[i].push(serial);
                            }
                        }
                        Ok((r, _)) => failures
                            .lock()
                            .unwrap()
                            .push(format!("status {}", r.status)),
                        Err(e) => failures.lock().unwrap().push(e),
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let old = serial_hex(100);
    let new = serial_hex(101);
    let every_client_saw = |serial: &str| {
        seen.lock()
            .unwrap()
            .iter()
            .all(|s| s.last().is_some_and(|last| last == serial))
    };
    wait_until(Duration::from_secs(10), || every_client_saw(&old));

    let requests = |n| {
        let from = done.load(Ordering::Relaxed);
        wait_until(Duration::from_secs(10), || {
            done.load(Ordering::Relaxed) >= from + n
        });
    };
    requests(20);
    let (cert, key) = pki.leaf(101, &new_key());
    pki.replace(&cert, &key);
    wait_until(Duration::from_secs(10), || every_client_saw(&new));
    requests(20);
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    let done = done.load(Ordering::Relaxed);
    let failures = failures.lock().unwrap().clone();
    assert!(
        failures.is_empty(),
        "{} of {done} failed: {failures:?}",
        failures.len()
    );
    // Each client went from the old certificate to the new one, never back.
    for serials in seen.lock().unwrap().iter() {
        assert_eq!(serials, &[old.clone(), new.clone()]);
    }
    assert!(gw
        .log()
        .contains("TLS certificate reloaded: subject CN=localhost, serial 65"));
    assert_eq!(
        metric(
            &gw,
            &["drg_reloads_total", "source=\"tls\"", "result=\"ok\""]
        ),
        Some(1.0)
    );

    // A certificate whose key is not the one in the key file: the pair in service stays.
    let errors = || {
        metric(
            &gw,
            &["drg_reloads_total", "source=\"tls\"", "result=\"error\""],
        )
        .unwrap_or(0.0)
    };
    let before = errors();
    let (cert, _) = pki.leaf(102, &new_key());
    let (_, other_key) = pki.leaf(103, &new_key());
    pki.replace(&cert, &other_key);
    wait_until(Duration::from_secs(10), || errors() > before);
    assert!(
        gw.log().contains("does not belong to the certificate"),
        "{}",
        gw.log()
    );
    let (r, serial) = https(gw.addr, &tls, LOOKUP, Some(TEST_SECRET), "").unwrap();
    assert_eq!((r.status, serial), (200, new));

    // Then the right key arrives: the new pair is taken.
    let key = new_key();
    let (cert, key_pem) = pki.leaf(104, &key);
    pki.replace(&cert, &key_pem);
    let newest = serial_hex(104);
    wait_until(Duration::from_secs(10), || {
        https(gw.addr, &tls, LOOKUP, Some(TEST_SECRET), "")
            .is_ok_and(|(r, serial)| r.status == 200 && serial == newest)
    });
}

fn run(args: &[&str]) -> (bool, String) {
    let out = crate::common::command(BIN).args(args).output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_bad_certificate_pair_stops_the_start_and_fails_check_config() {
    let (gw, pki, _up) = gateway(false);
    let conf = gw.conf.to_str().unwrap().to_owned();
    let dir = gw.stop();
    let (ok, out) = run(&["check-config", "-c", &conf]);
    assert!(ok, "{out}");
    assert!(
        out.contains("TLS: subject CN=localhost, serial 64"),
        "{out}"
    );
    let serve = ["-c", &conf, "serve", "--listen", "127.0.0.1:1"];

    let (cert, key) = pki.leaf(200, &new_key());
    let (_, other_key) = pki.leaf(201, &new_key());
    pki.replace(&cert, &other_key);
    for args in [&["check-config", "-c", &conf][..], &serve[..]] {
        let (ok, out) = run(args);
        assert!(!ok, "{args:?}: {out}");
        assert!(
            out.contains("gateway.tls: the key")
                && out.contains("does not belong to the certificate"),
            "{args:?}: {out}"
        );
    }

    pki.replace(&cert, &key);
    std::fs::remove_file(pki.dir.join("cert.pem")).unwrap();
    for args in [&["check-config", "-c", &conf][..], &serve[..]] {
        let (ok, out) = run(args);
        assert!(!ok, "{args:?}: {out}");
        assert!(
            out.contains("gateway.tls.cert") && out.contains("cert.pem: cannot read it"),
            "{args:?}: {out}"
        );
    }

    std::fs::write(pki.dir.join("cert.pem"), "-----BEGIN NONSENSE-----\n").unwrap();
    let (ok, out) = run(&serve);
    assert!(!ok);
    assert!(out.contains("no PEM certificate"), "{out}");
    drop(dir);
}

#[test]
fn a_certificate_outside_its_validity_is_refused_on_reload_and_stops_the_start() {
    let (gw, pki, _up) = gateway(false);
    let tls = pki.connector();
    let old = serial_hex(100);
    let refused = || {
        metric(
            &gw,
            &["drg_reloads_total", "source=\"tls\"", "result=\"refused\""],
        )
        .unwrap_or(0.0)
    };
    let day = 86_400;
    let now = unix_now();
    let expired = pki.leaf_valid(300, &new_key(), (now - 30 * day, now - day));
    let early = pki.leaf_valid(301, &new_key(), (now + day, now + 30 * day));
    for (n, (cert, key), says) in [
        (1.0, &expired, "expired on"),
        (2.0, &early, "is not valid before"),
    ] {
        pki.replace(cert, key);
        wait_until(Duration::from_secs(10), || refused() >= n);
        let log = gw.log();
        assert!(
            log.contains("TLS certificate: reload refused, keeping the current data")
                && log.contains(says),
            "{log}"
        );
        // The pair in service stays.
        let (r, serial) = https(gw.addr, &tls, LOOKUP, Some(TEST_SECRET), "").unwrap();
        assert_eq!((r.status, serial), (200, old.clone()));
    }
    assert_eq!(refused(), 2.0);

    // At start, an expired certificate stops `serve` and fails `check-config`.
    let conf = gw.conf.to_str().unwrap().to_owned();
    let dir = gw.stop();
    pki.replace(&expired.0, &expired.1);
    let serve = ["-c", &conf, "serve", "--listen", "127.0.0.1:1"];
    for args in [&["check-config", "-c", &conf][..], &serve[..]] {
        let (ok, out) = run(args);
        assert!(!ok, "{args:?}: {out}");
        assert!(
            out.contains("gateway.tls.cert")
                && out.contains(&format!("(serial {}) expired on", serial_hex(300))),
            "{args:?}: {out}"
        );
    }
    drop(dir);
}
