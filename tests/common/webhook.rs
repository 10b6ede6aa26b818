//! A webhook receiver on loopback for the tests of signed POSTs (quota alerts, verdict
//! changes): records each request and answers it with the next status of a script, then 200;
//! or, for one project's messages, never answers (a receiver that hangs).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// One request the receiver got, and what it answered.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// The status answered; 0: none (the receiver hangs on it).
    pub answered: u16,
    /// When the request was read whole.
    pub at: Instant,
}

impl Delivery {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    /// Whether `X-Signature` is `sha256=` and the HMAC-SHA256 of the body under `secret`.
    pub fn signed_with(&self, secret: &str) -> bool {
        let Some(sig) = self
            .header("x-signature")
            .and_then(|s| s.strip_prefix("sha256="))
        else {
            return false;
        };
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(&self.body);
        mac.verify_slice(&hex::decode(sig).unwrap_or_default())
            .is_ok()
    }
}

impl Delivery {
    /// Whether `Webhook-Signature` is `t=<unix>,v1=<hex>` of HMAC-SHA256 of `<t>.<body>` under
    /// `secret`.
    pub fn timed_signed_with(&self, secret: &str) -> bool {
        let Some((t, v1)) = self
            .header("webhook-signature")
            .and_then(|s| s.split_once(','))
            .and_then(|(t, v)| Some((t.strip_prefix("t=")?, v.strip_prefix("v1=")?)))
        else {
            return false;
        };
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(t.as_bytes());
        mac.update(b".");
        mac.update(&self.body);
        mac.verify_slice(&hex::decode(v1).unwrap_or_default())
            .is_ok()
    }
}

/// A webhook receiver: answers each request with the next status of `script`, then 200.
pub struct Receiver {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Delivery>>>,
    answers: Arc<Answers>,
}

/// How the receiver answers: the script's statuses, and the project whose messages it never
/// answers (reads them, records them, keeps the connection open).
struct Answers {
    script: Mutex<Vec<u16>>,
    hang_for: Option<String>,
    /// Never answer the first request (whatever its project): a delivery in flight.
    hang_first: std::sync::atomic::AtomicBool,
}

impl Receiver {
    pub fn start(addr: SocketAddr, script: Vec<u16>) -> Receiver {
        Receiver::start_with(addr, script, None)
    }

    /// A receiver that accepts `project`'s messages and never answers them (every other
    /// project's it answers 200).
    pub fn start_hanging_for(addr: SocketAddr, project: &str) -> Receiver {
        Receiver::start_with(addr, vec![], Some(project.to_owned()))
    }

    /// A receiver that never answers its first request and answers the others 200: a delivery
    /// left in flight.
    pub fn start_hanging_first(addr: SocketAddr) -> Receiver {
        let r = Receiver::start_with(addr, vec![], None);
        r.answers
            .hang_first
            .store(true, std::sync::atomic::Ordering::SeqCst);
        r
    }

    fn start_with(addr: SocketAddr, script: Vec<u16>, hang_for: Option<String>) -> Receiver {
        let listener = crate::common::bind_again(addr);
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Delivery>>> = Arc::default();
        let answers = Arc::new(Answers {
            script: Mutex::new(script),
            hang_for,
            hang_first: Default::default(),
        });
        let (record, shared) = (seen.clone(), answers.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (record, answers) = (record.clone(), answers.clone());
                std::thread::spawn(move || serve(stream, &record, &answers));
            }
        });
        Receiver {
            addr,
            seen,
            answers: shared,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hooks/drg", self.addr)
    }

    pub fn deliveries(&self) -> Vec<Delivery> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(stream: std::net::TcpStream, record: &Mutex<Vec<Delivery>>, answers: &Answers) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        assert!(line.starts_with("POST /hooks/drg HTTP/1.1"), "{line}");
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            reader.read_line(&mut h).unwrap();
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (k, v) = h.split_once(':').unwrap();
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.parse().unwrap())
            .expect("a Content-Length");
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
        let project = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["project"].as_str().map(str::to_owned));
        let first = answers
            .hang_first
            .swap(false, std::sync::atomic::Ordering::SeqCst);
        if first || (project.is_some() && project == answers.hang_for) {
            record.lock().unwrap().push(Delivery {
                headers,
                body,
                answered: 0,
                at: Instant::now(),
            });
            // Never answered: the connection stays open until the gateway gives up on it.
            loop {
                std::thread::sleep(Duration::from_secs(3_600));
            }
        }
        let status = {
            let mut s = answers.script.lock().unwrap();
            if s.is_empty() {
                200
            } else {
                s.remove(0)
            }
        };
        record.lock().unwrap().push(Delivery {
            headers,
            body,
            answered: status,
            at: Instant::now(),
        });
        let reply = format!("HTTP/1.1 {status} X\r\ncontent-length: 2\r\n\r\nok");
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// How much a project whose messages `receiver` never answers (`acme`, see
/// [`Receiver::start_hanging_for`]) holds up another's (`other`): `foo-dispo.example` (acme's)
/// is added to the `disposable.txt` at `list` (which holds `base`), then `bar-dispo.example`
/// (other's); returns how long acme's message took to arrive, and then other's beside it.
pub fn held_up_beside_a_hung_project(
    receiver: &Receiver,
    list: &std::path::Path,
    base: &str,
) -> (Duration, Duration) {
    let arrived = |project: &str| {
        receiver
            .deliveries()
            .iter()
            .find(|d| d.json()["project"] == project)
            .map(|d| d.at)
    };
    let with_foo = format!("{base}foo-dispo.example\n");
    let reloaded = Instant::now();
    crate::common::write_atomic(list, &with_foo);
    crate::common::wait_until(Duration::from_secs(20), || arrived("acme").is_some());
    let usual = arrived("acme").unwrap() - reloaded;
    let reloaded = Instant::now();
    crate::common::write_atomic(list, &format!("{with_foo}bar-dispo.example\n"));
    crate::common::wait_until(Duration::from_secs(60), || arrived("other").is_some());
    let held_up = arrived("other").unwrap() - reloaded;
    eprintln!("a change reached its receiver in {usual:?}; beside a hung one, in {held_up:?}");
    (usual, held_up)
}
