//! Runs the detection benchmark's world against the real gateway binary: a DNS server and an
//! RDAP server on loopback hold the world, the gateway is started on the shipped data (its
//! provider, free, relay and allow lists) with the world's blocklist, one key per project, and
//! the traffic goes through it in order. Then the table: per class, cases, flagged, correct,
//! recall or false-positive rate, on the first answer and on the answer once evidence settled;
//! for each attack the planted listed domains needed to flag one victim; what reached
//! top-domains.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{Conn, Gateway};
use crate::dns::DnsServer;
use crate::rdap_server::{RdapServer, Reply};

use super::world::{Expect, World, ATTACKER, PROJECTS};

/// The shipped data files the benchmark's gateway reads beside the world's blocklist.
const SHIPPED: [&str; 5] = [
    "mx_providers.csv",
    "relays.txt",
    "free_providers.txt",
    "allowlist.txt",
    "free_exclusions.txt",
];

/// What a lookup answered: `reason` and `risk_score`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub reason: String,
    pub score: u64,
}

impl Answer {
    pub fn flagged(&self) -> bool {
        self.reason != "safe"
    }

    fn matches(&self, expect: Expect) -> bool {
        match expect {
            Expect::Disposable => self.reason == "disposable",
            Expect::Undeliverable => self.reason == "undeliverable",
            Expect::NotFlagged => !self.flagged(),
        }
    }
}

/// One case's answers.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub domain: String,
    pub class: &'static str,
    pub expect: Expect,
    /// The answer the signup got.
    pub first: Answer,
    /// The answer once the gateway had its evidence (RDAP fetched, the neighbourhood learned).
    pub settled: Answer,
}

/// One attack's result: the planted listed domains after which a victim was first flagged
/// (by the victims' project or the attacker's own), if any was.
#[derive(Debug, Clone)]
pub struct AttackOutcome {
    pub class: &'static str,
    pub needed: Option<usize>,
    pub tried: usize,
    pub victims: usize,
}

/// Everything the run found.
pub struct Report {
    pub outcomes: Vec<Outcome>,
    pub attacks: Vec<AttackOutcome>,
    /// Pushed names that reached top-domains, of those pushed.
    pub pushed_ranked: Vec<String>,
    pub pushed: usize,
    /// The listed control reached top-domains (the ranking was rendered).
    pub control_ranked: bool,
}

fn secret(project: &str) -> String {
    format!("drg_bench_{project}_key_0123456789abcdefghijklmnopqrstu")
}

/// The gateway, its servers and a keep-alive connection per project.
struct Bench {
    gw: Gateway,
    conns: HashMap<&'static str, Conn>,
    _dns: DnsServer,
    _rdap: RdapServer,
}

/// How the benchmark's gateway runs besides the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Domain age from the loopback RDAP server (as shipped); off: what the model does
    /// without it (`--no-rdap`).
    pub rdap: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { rdap: true }
    }
}

impl Bench {
    fn start(world: &World, repo: &Path, options: Options) -> Bench {
        let dns = DnsServer::start_with_ptr(world.zones.clone(), world.ptr.clone());
        let replies: HashMap<&str, Reply> = world
            .registered
            .iter()
            .map(|(d, days)| (d.as_str(), Reply::Registered(*days)))
            .collect();
        let rdap = RdapServer::start(replies);
        let servers: Vec<String> = world
            .tlds()
            .iter()
            .map(|t| format!("{t}: \"{}\"", rdap.base()))
            .collect();
        let mut b = Gateway::builder().dns(dns.addr);
        b = if options.rdap {
            b.rdap_yaml(&format!("servers: {{{}}}", servers.join(", ")))
                .rdap_yaml("allow_plain_http: true")
                .rdap_yaml("min_interval_ms: 1")
        } else {
            b.rdap_yaml("enabled: false")
        };
        b = b
            // The benchmark judges verdicts, not latency: DNS answers on loopback in time.
            .mx_yaml("budget_ms: 2000")
            .mx_yaml("min_ttl_seconds: 300")
            .gateway_yaml("top_domains:")
            .gateway_yaml("  state_file: state/top_domains.json")
            .gateway_yaml("  render_interval_ms: 50")
            .data("disposable.txt", &(world.listed.join("\n") + "\n"));
        for file in SHIPPED {
            let text = std::fs::read_to_string(repo.join("data").join(file))
                .unwrap_or_else(|e| panic!("data/{file}: {e}"));
            b = b.data(file, &text);
        }
        for project in PROJECTS.iter().chain([&ATTACKER]) {
            b = b.key_in_project(project, &secret(project), "test", project);
        }
        // `DRG_BIN`: another build of the gateway (a before-and-after comparison).
        let gw = match std::env::var("DRG_BIN") {
            Ok(bin) => b.start_with(|conf, listen| {
                let mut command = std::process::Command::new(&bin);
                command.args(["-c", conf, "serve", "--listen", listen]);
                command
            }),
            Err(_) => b.start(),
        };
        Bench {
            gw,
            conns: HashMap::new(),
            _dns: dns,
            _rdap: rdap,
        }
    }

    /// `project` looks up `domain`.
    fn lookup(&mut self, project: &'static str, domain: &str) -> Answer {
        let path = format!("/v1/public/domain/{domain}");
        for _ in 0..3 {
            let addr = self.gw.addr;
            let conn = self
                .conns
                .entry(project)
                .or_insert_with(|| Conn::open_as(addr, Some(&secret(project))).unwrap());
            match conn.get(&path) {
                Ok(r) if r.status == 200 => {
                    let v = r.json();
                    return Answer {
                        reason: v["reason"].as_str().unwrap_or("?").to_owned(),
                        score: v["risk_score"].as_u64().unwrap_or(0),
                    };
                }
                Ok(r) => panic!(
                    "{domain}: {} {}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                ),
                // A closed keep-alive connection: open another.
                Err(_) => {
                    self.conns.remove(project);
                }
            }
        }
        panic!("{domain}: no answer");
    }

    fn taught(&self) -> f64 {
        self.gw
            .metric("drg_mx_neighbourhood_taught_total")
            .unwrap_or(0.0)
    }

    /// Waits until the neighbourhood was taught `at_least` times (the background learning of
    /// listed names), at most `within`.
    fn wait_taught(&self, at_least: f64, within: Duration) {
        let deadline = Instant::now() + within;
        while self.taught() < at_least && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until the RDAP queue is empty (every asked age fetched), at most `within`.
    fn wait_rdap(&self, within: Duration) {
        if self.gw.metric("drg_rdap_queued").is_none() {
            return;
        }
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.gw.metric("drg_rdap_queued") == Some(0.0) {
                // The last names taken may still be in flight: a loopback fetch takes about
                // a millisecond.
                std::thread::sleep(Duration::from_millis(100));
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Runs `world` against the gateway binary (the shipped data files read from `repo`).
pub fn run(world: &World, repo: &Path, options: Options) -> Report {
    let mut bench = Bench::start(world, repo, options);
    // History: listed names (learned in the background) and the companies seen before.
    let start = bench.taught();
    for (domain, project) in &world.history {
        let _ = bench.lookup(project, domain);
    }
    bench.wait_taught(start + world.history.len() as f64, Duration::from_secs(30));
    let firsts: Vec<Answer> = world
        .cases
        .iter()
        .map(|c| bench.lookup(c.project, &c.domain))
        .collect();
    bench.wait_rdap(Duration::from_secs(10));
    let outcomes = world
        .cases
        .iter()
        .zip(firsts)
        .map(|(c, first)| Outcome {
            domain: c.domain.clone(),
            class: c.class,
            expect: c.expect,
            settled: bench.lookup(c.project, &c.domain),
            first,
        })
        .collect();
    let attacks = world
        .attacks
        .iter()
        .map(|a| attack(&mut bench, a))
        .collect();
    let (pushed_ranked, control_ranked) = top_push(&mut bench, world);
    Report {
        outcomes,
        attacks,
        pushed_ranked,
        pushed: world.pushed.len(),
        control_ranked,
    }
}

/// Plants the attack's listed domains one at a time; after each, every victim is looked up by
/// its own project and by the attacker's.
fn attack(bench: &mut Bench, a: &super::world::Attack) -> AttackOutcome {
    let victim_project = PROJECTS[0];
    for v in &a.victims {
        let _ = bench.lookup(victim_project, v);
    }
    bench.wait_rdap(Duration::from_secs(10));
    for (k, planted) in a.planted.iter().enumerate() {
        let before = bench.taught();
        let _ = bench.lookup(ATTACKER, planted);
        bench.wait_taught(before + 1.0, Duration::from_secs(5));
        for v in &a.victims {
            for project in [victim_project, ATTACKER] {
                if bench.lookup(project, v).flagged() {
                    return AttackOutcome {
                        class: a.class,
                        needed: Some(k + 1),
                        tried: k + 1,
                        victims: a.victims.len(),
                    };
                }
            }
        }
    }
    AttackOutcome {
        class: a.class,
        needed: None,
        tried: a.planted.len(),
        victims: a.victims.len(),
    }
}

/// The attacker looks each pushed name up 12 times, and the listed control as often; once the
/// control is ranked, which pushed names are too.
fn top_push(bench: &mut Bench, world: &World) -> (Vec<String>, bool) {
    for _ in 0..12 {
        for d in world.pushed.iter().chain([&world.pushed_control]) {
            let _ = bench.lookup(ATTACKER, d);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = bench.gw.get("/v1/public/top-domains?limit=1000");
        let v = r.json();
        let ranked: Vec<String> = v["domains"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|d| d["domain"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let control = ranked.contains(&world.pushed_control);
        if control || Instant::now() > deadline {
            let pushed = world
                .pushed
                .iter()
                .filter(|p| ranked.contains(p))
                .cloned()
                .collect();
            return (pushed, control);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One class's row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub class: &'static str,
    pub expect: Expect,
    pub cases: usize,
    pub flagged: usize,
    pub correct: usize,
    pub settled_flagged: usize,
    pub settled_correct: usize,
}

impl Report {
    /// The rows, in the order classes first appear.
    pub fn rows(&self) -> Vec<Row> {
        let mut rows: Vec<Row> = Vec::new();
        for o in &self.outcomes {
            let i = match rows.iter().position(|r| r.class == o.class) {
                Some(i) => i,
                None => {
                    rows.push(Row {
                        class: o.class,
                        expect: o.expect,
                        cases: 0,
                        flagged: 0,
                        correct: 0,
                        settled_flagged: 0,
                        settled_correct: 0,
                    });
                    rows.len() - 1
                }
            };
            let r = &mut rows[i];
            r.cases += 1;
            r.flagged += usize::from(o.first.flagged());
            r.correct += usize::from(o.first.matches(o.expect));
            r.settled_flagged += usize::from(o.settled.flagged());
            r.settled_correct += usize::from(o.settled.matches(o.expect));
        }
        rows
    }

    /// Precision and recall over every case (first answers): a flag is right when the case
    /// expects one, recall counts the right reason.
    pub fn totals(&self) -> (f64, f64) {
        let flagged: Vec<&Outcome> = self.outcomes.iter().filter(|o| o.first.flagged()).collect();
        let right = flagged
            .iter()
            .filter(|o| o.expect != Expect::NotFlagged)
            .count();
        let positives = self
            .outcomes
            .iter()
            .filter(|o| o.expect != Expect::NotFlagged);
        let found = positives
            .clone()
            .filter(|o| o.first.matches(o.expect))
            .count();
        let precision = right as f64 / flagged.len().max(1) as f64;
        let recall = found as f64 / positives.count().max(1) as f64;
        (precision, recall)
    }

    /// The table, as Markdown.
    pub fn table(&self) -> String {
        let pct = |a: usize, b: usize| format!("{:.0}%", 100.0 * a as f64 / b.max(1) as f64);
        let mut out = String::from(
            "| class | expected | cases | flagged | correct | recall / FP rate | settled: flagged | settled: recall / FP rate |\n|---|---|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in self.rows() {
            let (rate, settled) = match r.expect {
                Expect::NotFlagged => (
                    format!("FP {}", pct(r.flagged, r.cases)),
                    format!("FP {}", pct(r.settled_flagged, r.cases)),
                ),
                _ => (
                    format!("recall {}", pct(r.correct, r.cases)),
                    format!("recall {}", pct(r.settled_correct, r.cases)),
                ),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.class,
                r.expect.as_str(),
                r.cases,
                r.flagged,
                r.correct,
                rate,
                r.settled_flagged,
                settled
            );
        }
        let (precision, recall) = self.totals();
        let _ = writeln!(
            out,
            "\nAll cases, first answers: precision {:.1}%, recall {:.1}%.\n",
            100.0 * precision,
            100.0 * recall
        );
        out.push_str("| attack (one project) | victims | planted listed domains to flag one victim |\n|---|---:|---|\n");
        for a in &self.attacks {
            let needed = match a.needed {
                Some(k) => k.to_string(),
                None => format!("none flagged after {}", a.tried),
            };
            let _ = writeln!(out, "| {} | {} | {} |", a.class, a.victims, needed);
        }
        let _ = writeln!(
            out,
            "| attack: repeated lookups for top-domains | {} names x 12 | {} reached top-domains{} |",
            self.pushed,
            self.pushed_ranked.len(),
            if self.control_ranked {
                ""
            } else {
                " (the listed control was not ranked either)"
            }
        );
        out
    }
}
