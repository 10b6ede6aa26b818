//! The detection benchmark's clients: lookups on `GET /v1/public/domain/{name}` or on the batch
//! route (`POST /v1/public/domains`), sent open-loop (each at its time, whatever the answers
//! before it take, as signups arrive) by a pool of threads, each on a connection of its own.

use std::collections::VecDeque;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::common::read_response;

/// What a lookup answered: `reason` and `risk_score` (`error: ...` when there was no answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub reason: String,
    pub score: u64,
    /// The answer says it waits for a registry's age on its way (`age_pending`): what it is
    /// depends on when the registry answers.
    pub pending: bool,
    /// The answer says DNS gave no MX evidence within the lookup's budget (`mx.status:
    /// unknown`: it failed open): what it is depends on when DNS answered.
    pub no_mx_in_time: bool,
}

impl Answer {
    /// Anything but `safe` (an error included: a signup refused).
    pub fn flagged(&self) -> bool {
        self.reason != "safe"
    }

    /// The answer is the moment's, not the model's settled view: it waited for a registry's
    /// age or failed open on DNS time, so what it is depends on when the other side answered.
    pub fn timed(&self) -> bool {
        self.pending || self.no_mx_in_time
    }

    fn error(why: String) -> Answer {
        Answer {
            reason: format!("error: {why}"),
            score: 0,
            pending: false,
            no_mx_in_time: false,
        }
    }

    fn of(v: &serde_json::Value) -> Answer {
        Answer {
            reason: v["reason"].as_str().unwrap_or("?").to_owned(),
            score: v["risk_score"].as_u64().unwrap_or(0),
            pending: v["evidence"]["age_pending"] == true,
            no_mx_in_time: v["evidence"]["mx"]["status"] == "unknown",
        }
    }
}

/// How lookups go to the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    Get,
    Batch,
}

impl Route {
    pub fn label(self) -> &'static str {
        match self {
            Route::Get => "GET",
            Route::Batch => "batch",
        }
    }
}

/// One request: `project` asks `names` (one on GET), `at` after the start of its phase.
#[derive(Debug, Clone)]
pub struct Request {
    pub at: Duration,
    pub project: &'static str,
    /// (the lookup's place in the phase, the name).
    pub names: Vec<(usize, String)>,
}

/// The key of `project`.
pub fn secret(project: &str) -> String {
    format!("drg_bench_{project}_key_0123456789abcdefghijklmnopqrstu")
}

/// The requests of a phase: `lookups` (project, name) arriving `per_second`; on the batch
/// route, what arrived in each `batch_every` goes at its end, one batch per project.
pub fn schedule(
    lookups: &[(&'static str, String)],
    per_second: f64,
    route: Route,
    batch_every: Duration,
) -> Vec<Request> {
    let gap = Duration::from_secs_f64(1.0 / per_second);
    let at = |i: usize| gap * i as u32;
    match route {
        Route::Get => lookups
            .iter()
            .enumerate()
            .map(|(i, (project, name))| Request {
                at: at(i),
                project,
                names: vec![(i, name.clone())],
            })
            .collect(),
        Route::Batch => {
            let mut out: Vec<Request> = Vec::new();
            let tick = |i: usize| (at(i).as_nanos() / batch_every.as_nanos().max(1)) as u32;
            for (i, (project, name)) in lookups.iter().enumerate() {
                let due = batch_every * (tick(i) + 1);
                match out
                    .iter_mut()
                    .find(|r| r.at == due && r.project == *project)
                {
                    Some(r) => r.names.push((i, name.clone())),
                    None => out.push(Request {
                        at: due,
                        project,
                        names: vec![(i, name.clone())],
                    }),
                }
            }
            out
        }
    }
}

/// Sends `requests` open-loop with `workers` threads; the answer of each lookup in its place
/// (`n` lookups in all).
pub fn drive(
    addr: SocketAddr,
    route: Route,
    requests: Vec<Request>,
    n: usize,
    workers: usize,
) -> Vec<Answer> {
    let start = Instant::now();
    let queue = Mutex::new(requests.into_iter().collect::<VecDeque<_>>());
    let answers = Mutex::new(vec![Answer::error("not asked".into()); n]);
    std::thread::scope(|s| {
        for _ in 0..workers.max(1) {
            s.spawn(|| loop {
                let Some(r) = queue.lock().unwrap().pop_front() else {
                    return;
                };
                std::thread::sleep((start + r.at).saturating_duration_since(Instant::now()));
                let got = ask(addr, route, r.project, &r.names);
                let mut answers = answers.lock().unwrap();
                for ((i, _), a) in r.names.iter().zip(got) {
                    answers[*i] = a;
                }
            });
        }
    });
    answers.into_inner().unwrap()
}

/// One request's answers, one a name (on the batch route, a batch of one for one name).
pub fn ask(
    addr: SocketAddr,
    route: Route,
    project: &str,
    names: &[(usize, String)],
) -> Vec<Answer> {
    let result = if route == Route::Get && names.len() == 1 {
        call(
            addr,
            project,
            "GET",
            &format!("/v1/public/domain/{}?explain=true", names[0].1),
            None,
        )
        .map(|v| vec![Answer::of(&v)])
    } else {
        let body =
            serde_json::json!({ "domains": names.iter().map(|(_, n)| n).collect::<Vec<_>>() });
        call(
            addr,
            project,
            "POST",
            "/v1/public/domains?explain=true",
            Some(body.to_string()),
        )
        .map(|v| {
            v["results"]
                .as_array()
                .map(|r| r.iter().map(Answer::of).collect())
                .unwrap_or_default()
        })
    };
    match result {
        Ok(mut answers) => {
            answers.resize(names.len(), Answer::error("missing from the batch".into()));
            answers
        }
        Err(e) => vec![Answer::error(e); names.len()],
    }
}

/// One HTTP/1.1 request on a connection of its own; the answer's JSON (status 200 only).
fn call(
    addr: SocketAddr,
    project: &str,
    method: &str,
    path: &str,
    body: Option<String>,
) -> Result<serde_json::Value, String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nAuthorization: Bearer {}\r\n",
        secret(project)
    );
    if let Some(b) = &body {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(body.as_deref().unwrap_or(""));
    stream
        .write_all(req.as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let r = read_response(&mut BufReader::new(stream)).map_err(|e| format!("read: {e}"))?;
    if r.status != 200 {
        return Err(format!(
            "{} {}",
            r.status,
            String::from_utf8_lossy(&r.body)
                .chars()
                .take(200)
                .collect::<String>()
        ));
    }
    serde_json::from_slice(&r.body).map_err(|e| format!("json: {e}"))
}
