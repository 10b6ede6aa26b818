//! A real RDAP server on loopback for tests and the detection benchmark: HTTP/1.1 answering
//! RFC 9083 domain objects from a map (registered N days ago), 404s, 429s with `Retry-After`,
//! slow answers and redirects; every request recorded. Outages ([`Outage`]): for a while
//! after the server starts, the requests under one path (one registry's base URL) get another
//! answer (a 429, a 503, an answer slower than any client waits).
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How the server answers one name.
#[derive(Clone)]
pub enum Reply {
    /// A domain object registered this many days ago.
    Registered(i64),
    /// `status`, extra headers and a body.
    Raw(u16, Vec<(String, String)>, String),
    /// As the inner reply, after a wait.
    Slow(Duration, Box<Reply>),
    /// `status` (429 or 503) with `Retry-After: <secs>` the first time, then the inner reply.
    LaterOnce(u16, u64, Box<Reply>),
}

/// For `from..until` after the server started, every request whose path starts with
/// `prefix` is answered `reply` instead.
#[derive(Clone)]
pub struct Outage {
    pub prefix: String,
    pub from: Duration,
    pub until: Duration,
    pub reply: Reply,
}

/// A loopback RDAP server: `GET /domain/<name>` answered from a map, every request recorded
/// (name, when) in arrival order.
pub struct RdapServer {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<(String, Instant)>>>,
    replies: Arc<Mutex<HashMap<String, Reply>>>,
}

impl RdapServer {
    pub fn start(replies: HashMap<&str, Reply>) -> RdapServer {
        RdapServer::start_with_outages(replies, Vec::new())
    }

    /// Like `start`, with `outages` (timed from now).
    pub fn start_with_outages(replies: HashMap<&str, Reply>, outages: Vec<Outage>) -> RdapServer {
        let started = Instant::now();
        let outages = Arc::new(outages);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let replies: Arc<Mutex<HashMap<String, Reply>>> = Arc::new(Mutex::new(
            replies
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
        ));
        let (log, served) = (seen.clone(), replies.clone());
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (log, replies) = (log.clone(), served.clone());
                let outages = outages.clone();
                thread::spawn(move || {
                    let mut reader = BufReader::new(stream);
                    let mut line = String::new();
                    if reader.read_line(&mut line).is_err() {
                        return;
                    }
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                            break;
                        }
                    }
                    let path = line.split(' ').nth(1).unwrap_or("").to_owned();
                    let name = path.rsplit('/').next().unwrap_or("").to_owned();
                    log.lock().unwrap().push((name.clone(), Instant::now()));
                    let since = started.elapsed();
                    let outage = outages.iter().find(|o| {
                        path.starts_with(&o.prefix) && o.from <= since && since < o.until
                    });
                    let reply = if let Some(o) = outage {
                        o.reply.clone()
                    } else {
                        let mut map = replies.lock().unwrap();
                        match map.get(&name).cloned() {
                            Some(Reply::LaterOnce(status, secs, then)) => {
                                map.insert(name.clone(), *then);
                                Reply::Raw(
                                    status,
                                    vec![("Retry-After".into(), secs.to_string())],
                                    String::new(),
                                )
                            }
                            Some(r) => r,
                            None => Reply::Raw(404, vec![], String::new()),
                        }
                    };
                    let (status, headers, body) = render(&name, reply);
                    let mut out = format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: application/rdap+json\r\nContent-Length: {}\r\nConnection: close\r\n",
                        body.len()
                    );
                    for (k, v) in headers {
                        out.push_str(&format!("{k}: {v}\r\n"));
                    }
                    out.push_str("\r\n");
                    out.push_str(&body);
                    let _ = reader.get_mut().write_all(out.as_bytes());
                });
            }
        });
        RdapServer {
            addr,
            seen,
            replies,
        }
    }

    /// Answers `name` (the last path segment) with `reply` from now on.
    pub fn serve(&mut self, name: &str, reply: Reply) {
        self.replies.lock().unwrap().insert(name.to_owned(), reply);
    }

    pub fn base(&self) -> String {
        format!("http://{}/rdap/", self.addr)
    }

    /// Requests for `name` so far.
    pub fn asked(&self, name: &str) -> usize {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _)| n == name)
            .count()
    }

    pub fn order(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }

    pub fn times(&self, name: &str) -> Vec<Instant> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(n, _)| n == name)
            .map(|(_, t)| *t)
            .collect()
    }
}

fn render(name: &str, reply: Reply) -> (u16, Vec<(String, String)>, String) {
    match reply {
        Reply::Registered(days_ago) => {
            let when = chrono::Utc::now() - chrono::Duration::days(days_ago);
            let body = serde_json::json!({
                "objectClassName": "domain",
                "ldhName": name.to_uppercase(),
                "rdapConformance": ["rdap_level_0"],
                "events": [
                    {"eventAction": "last changed", "eventDate": chrono::Utc::now().to_rfc3339()},
                    {"eventAction": "registration", "eventDate": when.to_rfc3339()},
                ],
            });
            (200, vec![], body.to_string())
        }
        Reply::Raw(status, headers, body) => (status, headers, body),
        Reply::Slow(wait, inner) => {
            thread::sleep(wait);
            render(name, *inner)
        }
        Reply::LaterOnce(_, _, inner) => render(name, *inner),
    }
}
