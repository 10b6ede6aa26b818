//! Lists fetched from URLs (`gateway.data.sources`), against a real HTTP server on loopback:
//! the first fetch fills the table, a refresh is a conditional GET answered 304, a change shows
//! within a refresh, broken, shrunken and oversized downloads are refused (the old names keep
//! answering), a restart with the server down serves the cached copy at once, and lookups
//! running meanwhile never fail.

use crate::certs;
use crate::common;
use certs::self_signed;
use common::*;
use openssl::ssl::SslAcceptor;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// One file the list server serves.
#[derive(Clone)]
struct Served {
    body: Vec<u8>,
    etag: String,
    /// Sent with `Content-Length`; without it the body ends when the connection closes, so
    /// only a limit enforced while reading can stop it.
    with_length: bool,
}

/// What the list server saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    if_none_match: Option<String>,
    status: u16,
}

/// A small HTTP/1.1 file server: `ETag` and `Last-Modified` on every file, `304` when
/// `If-None-Match` names the current ETag; one request a connection. Stops when dropped.
struct ListServer {
    addr: SocketAddr,
    files: Arc<Mutex<BTreeMap<String, Served>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl ListServer {
    fn start() -> ListServer {
        ListServer::start_with(None)
    }

    /// Over TLS when `tls` is given (a handshake the client gives up on is no request).
    fn start_with(tls: Option<SslAcceptor>) -> ListServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let files: Arc<Mutex<BTreeMap<String, Served>>> = Arc::default();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s, st) = (files.clone(), seen.clone(), stop.clone());
        let thread = thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = match &tls {
                    Some(acceptor) => match acceptor.accept(conn) {
                        Ok(stream) => serve(stream, &f, &s),
                        Err(_) => continue,
                    },
                    None => serve(conn, &f, &s),
                };
            }
        });
        ListServer {
            addr,
            files,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn https_url(&self, path: &str) -> String {
        format!("https://{}{path}", self.addr)
    }

    fn put(&self, path: &str, etag: &str, body: &[u8], with_length: bool) {
        self.files.lock().unwrap().insert(
            path.to_owned(),
            Served {
                body: body.to_vec(),
                etag: format!("\"{etag}\""),
                with_length,
            },
        );
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until the server has answered `n` more requests than `before`.
    fn wait_requests(&self, before: usize, n: usize) {
        wait_until(Duration::from_secs(10), || self.seen().len() >= before + n);
    }
}

impl Drop for ListServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve<S: Read + Write>(
    conn: S,
    files: &Mutex<BTreeMap<String, Served>>,
    seen: &Mutex<Vec<Seen>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let mut if_none_match = None;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = header.split_once(':') {
            if k.trim().eq_ignore_ascii_case("if-none-match") {
                if_none_match = Some(v.trim().to_owned());
            }
        }
    }
    let file = files.lock().unwrap().get(&path).cloned();
    let mut out = reader.into_inner();
    let status = match &file {
        None => {
            out.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )?;
            404
        }
        Some(f) if if_none_match.as_deref() == Some(f.etag.as_str()) => {
            write!(
                out,
                "HTTP/1.1 304 Not Modified\r\nETag: {}\r\nConnection: close\r\n\r\n",
                f.etag
            )?;
            304
        }
        Some(f) => {
            write!(
                out,
                "HTTP/1.1 200 OK\r\nETag: {}\r\nLast-Modified: Sun, 22 Nov 2026 10:00:00 GMT\r\nContent-Type: text/plain\r\nConnection: close\r\n",
                f.etag
            )?;
            if f.with_length {
                write!(out, "Content-Length: {}\r\n", f.body.len())?;
            }
            out.write_all(b"\r\n")?;
            out.write_all(&f.body)?;
            200
        }
    };
    out.flush()?;
    seen.lock().unwrap().push(Seen {
        path,
        if_none_match,
        status,
    });
    Ok(())
}

fn reason(gw: &Gateway, domain: &str) -> String {
    let r = gw.get(&format!("/v1/public/domain/{domain}"));
    assert_eq!(r.status, 200);
    r.json()["reason"].as_str().unwrap().to_owned()
}

/// The value of one sample of `/metrics` (0 when absent).
fn metric(gw: &Gateway, sample: &str) -> f64 {
    let body = String::from_utf8(gw.admin_get("/metrics").body).unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn fetches(gw: &Gateway, result: &str) -> f64 {
    metric(
        gw,
        &format!("drg_source_fetches_total{{result=\"{result}\",source=\"block\"}}"),
    )
}

/// A gateway with one disposable-list source at `url`, refreshed every second. Its fetches may
/// take 10 s: a TLS fetch of 9 ms on an idle machine took 1 s beside ten busy loops on 2 cores,
/// and with 2 s a loaded CI machine can time out every try (no test here is about the limit).
fn gateway_for(url: &str, dir: Option<tempfile::TempDir>) -> Gateway {
    gateway_with_env(url, dir, None)
}

fn gateway_with_env(
    url: &str,
    dir: Option<tempfile::TempDir>,
    env: Option<(&str, &str)>,
) -> Gateway {
    let mut b = Gateway::builder()
        .data_yaml("sources_dir: state/sources")
        .data_yaml(&format!(
            "sources: [{{ name: block, url: '{url}', kind: disposable, refresh_seconds: 1, max_bytes: 400, timeout_ms: 10000 }}]"
        ));
    if let Some(dir) = dir {
        b = b.in_dir(dir);
    }
    if let Some((k, v)) = env {
        b = b.env(k, v);
    }
    b.start()
}

/// Keeps looking names up on keep-alive connections until stopped; counts answers that are not
/// a 200 (or no answer at all).
struct Lookups {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Lookups {
    fn start(addr: SocketAddr) -> Lookups {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let threads = ["first-dispo.com", "gmail.com"]
            .into_iter()
            .map(|name| {
                let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
                thread::spawn(move || {
                    let path = format!("/v1/public/domain/{name}");
                    let mut conn = Conn::open(addr).unwrap();
                    while !stop.load(Ordering::Relaxed) {
                        match conn.get(&path) {
                            Ok(r) if r.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                            _ => {
                                conn = Conn::open(addr).unwrap();
                                failed.fetch_add(1, Ordering::Relaxed)
                            }
                        };
                        thread::sleep(Duration::from_millis(2));
                    }
                })
            })
            .collect();
        Lookups {
            stop,
            ok,
            failed,
            threads,
        }
    }

    /// Stops the clients; returns (ok, failed).
    fn finish(self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

const FIRST: &str = "first-dispo.com\nsecond-dispo.com\nthird-dispo.com\nfourth-dispo.com\n";

#[test]
fn sources_refresh_conditionally_and_refuse_bad_downloads_without_a_failed_lookup() {
    let server = ListServer::start();
    server.put("/block.txt", "v1", FIRST.as_bytes(), true);
    let gw = gateway_for(&server.url("/block.txt"), None);
    let lookups = Lookups::start(gw.addr);

    // The first fetch, in the background after start, makes the names disposable.
    let took = wait_until(Duration::from_secs(10), || {
        reason(&gw, "first-dispo.com") == "disposable"
    });
    eprintln!("first fetch served after {took:?}");
    assert_eq!(reason(&gw, "fourth-dispo.com"), "disposable");
    assert_eq!(server.seen()[0].if_none_match, None);

    // The next refresh is conditional: the server answers 304 and nothing changes.
    wait_until(Duration::from_secs(10), || {
        server
            .seen()
            .iter()
            .any(|s| s.if_none_match.as_deref() == Some("\"v1\"") && s.status == 304)
    });
    wait_until(Duration::from_secs(5), || {
        fetches(&gw, "not_modified") >= 1.0
    });
    assert_eq!(reason(&gw, "first-dispo.com"), "disposable");
    assert!(gw.log().contains("source block: not modified"));

    // A changed list is served within a refresh (plus a reload poll).
    server.put(
        "/block.txt",
        "v2",
        format!("{FIRST}fifth-dispo.com\n").as_bytes(),
        true,
    );
    let took = wait_until(Duration::from_secs(10), || {
        reason(&gw, "fifth-dispo.com") == "disposable"
    });
    eprintln!("changed list served after {took:?} (refresh 1 s, reload poll 100 ms)");
    let last_success = metric(
        &gw,
        "drg_source_last_success_timestamp_seconds{source=\"block\"}",
    );
    assert!(last_success > 1.7e9, "{last_success}");

    // Refused downloads: an invalid line, binary garbage, a list that lost most of its names,
    // and one longer than max_bytes (sent without a length, so it is cut while streaming).
    let oversized: String = (0..40).map(|i| format!("big{i}-dispo.com\n")).collect();
    let refusals: [(&str, Vec<u8>, bool); 4] = [
        (
            "v3",
            format!("{FIRST}not a domain!\nbroken-dispo.com\n").into_bytes(),
            true,
        ),
        ("v4", vec![0xff, 0xfe, 0x00, 0x9c, 0x80, b'\n', 0xc3], true),
        ("v5", b"first-dispo.com\n".to_vec(), true),
        ("v6", oversized.into_bytes(), false),
    ];
    for (etag, body, with_length) in refusals {
        let before = fetches(&gw, "refused");
        server.put("/block.txt", etag, &body, with_length);
        wait_until(Duration::from_secs(10), || fetches(&gw, "refused") > before);
        // A refused download replaced neither the copy nor its validators.
        let n = server.seen().len();
        server.wait_requests(n, 1);
        let last = server.seen().last().unwrap().clone();
        assert_eq!(last.path, "/block.txt");
        assert_eq!(last.if_none_match.as_deref(), Some("\"v2\""), "{etag}");
        for name in ["first-dispo.com", "second-dispo.com", "fifth-dispo.com"] {
            assert_eq!(reason(&gw, name), "disposable", "{name} after {etag}");
        }
    }
    assert_ne!(reason(&gw, "broken-dispo.com"), "disposable");
    assert_ne!(reason(&gw, "big1-dispo.com"), "disposable");
    let log = gw.log();
    for needle in [
        "is not a domain",
        "not UTF-8",
        "has 1 entries where the cached one has 5",
        "larger than max_bytes (400 bytes)",
    ] {
        assert!(log.contains(needle), "no {needle:?} in the log:\n{log}");
    }

    // After the refusals a good change still goes through.
    server.put(
        "/block.txt",
        "v7",
        format!("{FIRST}fifth-dispo.com\nsixth-dispo.com\n").as_bytes(),
        true,
    );
    wait_until(Duration::from_secs(10), || {
        reason(&gw, "sixth-dispo.com") == "disposable"
    });
    // The fetch is counted once its copy is stored, and the reloader may publish that copy
    // first (a loaded machine): wait for the count rather than read it once.
    wait_until(Duration::from_secs(10), || fetches(&gw, "ok") >= 3.0);

    let (ok, failed) = lookups.finish();
    eprintln!("lookups meanwhile: {ok} answered, {failed} failed");
    assert!(ok > 100, "the lookups did run: {ok}");
    assert_eq!(failed, 0, "lookups failed during refreshes");
}

#[test]
fn a_restart_with_the_server_down_serves_the_cached_copy_at_once() {
    let server = ListServer::start();
    server.put("/block.txt", "v1", FIRST.as_bytes(), true);
    let url = server.url("/block.txt");
    let gw = gateway_for(&url, None);
    wait_until(Duration::from_secs(10), || {
        reason(&gw, "first-dispo.com") == "disposable"
    });
    let dir = gw.stop();
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let sources = dir.path().join("state/sources");
        assert_eq!(mode(&sources), 0o700);
        assert_eq!(mode(&sources.join("block.txt")), 0o600);
        let meta = std::fs::read_to_string(sources.join("block.meta.json")).unwrap();
        assert!(meta.contains("\\\"v1\\\""), "{meta}");
    }
    drop(server);

    // Nothing listens at the URL now: the start does not wait for it, and the cached names
    // answer from the first request.
    let started = Instant::now();
    let gw = gateway_for(&url, Some(dir));
    eprintln!("restarted with the server down in {:?}", started.elapsed());
    let lookups = Lookups::start(gw.addr);
    assert_eq!(reason(&gw, "first-dispo.com"), "disposable");
    assert_eq!(reason(&gw, "fourth-dispo.com"), "disposable");
    assert!(gw
        .log()
        .contains("source block: serving the cached copy (4 entries"));
    wait_until(Duration::from_secs(10), || fetches(&gw, "error") >= 2.0);
    assert!(gw.log().contains("fetch from"), "{}", gw.log());
    assert_eq!(reason(&gw, "first-dispo.com"), "disposable");
    let (ok, failed) = lookups.finish();
    assert!(ok > 0);
    assert_eq!(failed, 0);
}

#[test]
fn a_source_never_fetched_is_absent_and_bad_source_keys_are_named() {
    // Nothing listens there: the gateway starts, the names are simply not in the table.
    let dead = DeadPort::new();
    let gw = gateway_for(&format!("http://{}/block.txt", dead.addr), None);
    wait_until(Duration::from_secs(10), || fetches(&gw, "error") >= 1.0);
    assert_eq!(reason(&gw, "first-dispo.com"), "safe");
    assert!(gw
        .log()
        .contains("source block: no cached copy yet; absent from the table"));

    let out = crate::common::command(BIN)
        .args(["-c", gw.conf.to_str().unwrap(), "check-config"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let conf = std::fs::read_to_string(&gw.conf).unwrap().replace(
        "sources: [",
        "sources: [{ name: ../x, url: 'ftp://h/x', kind: disposable, refresh_seconds: 0 }, ",
    );
    std::fs::write(&gw.conf, conf).unwrap();
    let out = crate::common::command(BIN)
        .args(["-c", gw.conf.to_str().unwrap(), "check-config"])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    for needle in [
        "gateway.data.sources[0].name: '../x'",
        "gateway.data.sources[0].url: 'ftp://h/x' is not an http:// or https:// URL",
        "gateway.data.sources[0].refresh_seconds: 0 is outside",
    ] {
        assert!(text.contains(needle), "no {needle:?} in:\n{text}");
    }
}

#[test]
fn https_sources_verify_the_certificate() {
    let (pem, acceptor) = self_signed();
    let server = ListServer::start_with(Some(acceptor));
    server.put("/block.txt", "v1", FIRST.as_bytes(), true);
    let url = server.https_url("/block.txt");

    // Not signed by anyone the system trusts: the fetch fails, nothing is served from it.
    let gw = gateway_for(&url, None);
    // Waits for a fetch and a table rebuild, which a loaded CI machine once took over 10 s for.
    wait_until(Duration::from_secs(30), || fetches(&gw, "error") >= 1.0);
    assert_ne!(reason(&gw, "first-dispo.com"), "disposable");
    assert!(
        server.seen().is_empty(),
        "no request went through the handshake"
    );
    let log = gw.log();
    assert!(log.contains("certificate verify failed"), "{log}");
    drop(gw);

    // Trusted (OpenSSL's SSL_CERT_FILE): fetched over TLS like over plain HTTP.
    let ca = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ca.path(), pem).unwrap();
    let gw = gateway_with_env(
        &url,
        None,
        Some(("SSL_CERT_FILE", ca.path().to_str().unwrap())),
    );
    wait_until_or(
        Duration::from_secs(30),
        || reason(&gw, "first-dispo.com") == "disposable",
        || format!("served: {:?}\n{}", server.seen(), gw.log()),
    );
    assert_eq!(server.seen()[0].status, 200);
}
