//! Runs one deployment of the detection world against the real gateway binary: a DNS server
//! and an RDAP server on loopback hold the world (registries paced as shipped; in the failing
//! condition some of them throttle, fail or hang for the first part of the run), the gateway
//! runs on the shipped data with the world's blocklist and one key per project, and the
//! traffic goes through it open-loop, phase by phase:
//!
//! 1. the past and the throwaways that arrive before their host is known;
//! 2. the listed names (learned in the background; waited for) and the rest of the past;
//! 3. the signups: every other case (their *first* answer);
//! 4. the missing MX hosts, asked while the DNS server gives minimal answers;
//! 5. settling: until no name waits for RDAP (at most `settle`) and every listed name is
//!    learned; then every case again by the same project (its *settled* answer);
//! 6. the planting attacks, then one project's repeated lookups for top-domains.
//!
//! A one-project deployment runs phases 1, 2, 5 (the wait) and 6's attacks only, every lookup
//! from one project. Every lookup goes on GET or every one on the batch route.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use super::client::{self, Answer, Route};
use super::facts;
use super::world::{Attack, Bucket, Lookup, World, ATTACKER, PROJECTS, SOLO};
use crate::common::Gateway;
use crate::dns::DnsServer;
use crate::rdap_server::{Outage, RdapServer, Reply};

/// The shipped data files the benchmark's gateway reads beside the world's blocklist.
const SHIPPED: [&str; 5] = [
    "mx_providers.csv",
    "relays.txt",
    "free_providers.txt",
    "allowlist.txt",
    "free_exclusions.txt",
];

/// Threads sending one deployment's lookups.
const WORKERS: usize = 32;

/// Domain age in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rdap {
    /// As shipped: every registry answers, paced one request a second.
    On,
    /// `rdap.enabled: false`.
    Off,
    /// As shipped, while the busiest registries misbehave for the first part of the run
    /// (`Spec::outage`): Verisign's `.com` answers 429 (`Retry-After: 10`), its `.net` and
    /// PIR's `.org` 503, CentralNic's TLDs hang past the gateway's timeout.
    Failing,
}

impl Rdap {
    pub const ALL: [Rdap; 3] = [Rdap::On, Rdap::Off, Rdap::Failing];

    pub fn label(self) -> &'static str {
        match self {
            Rdap::On => "on",
            Rdap::Off => "off",
            Rdap::Failing => "failing",
        }
    }
}

/// One deployment's run.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub rdap: Rdap,
    pub route: Route,
    /// All traffic from one project (the attacks only) instead of several.
    pub one_project: bool,
    /// The longest the settling waits for RDAP.
    pub settle: Duration,
    /// How long the failing registries misbehave, from the start.
    pub outage: Duration,
    /// Listed domains each attack plants at most.
    pub planted: usize,
}

/// One case's answers.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub case: usize,
    /// The answer the signup got.
    pub first: Answer,
    /// The answer once the gateway had its evidence (RDAP fetched or the wait's bound, the
    /// neighbourhood learned).
    pub settled: Answer,
}

/// One attack's result: the planted listed domains after which a victim was first flagged
/// (in the victims' project's answers), if any was, and which victim's bucket.
#[derive(Debug, Clone)]
pub struct AttackOutcome {
    pub class: &'static str,
    pub needed: Option<usize>,
    pub tried: usize,
    pub victim: Option<Bucket>,
}

/// What the registries did by the end of the settling.
#[derive(Debug, Clone, Copy, Default)]
pub struct RdapNote {
    pub found: f64,
    pub errors: f64,
    /// Names still waiting when the settling stopped.
    pub queued: f64,
    /// Misses not queued (the queue or a project's share full).
    pub queue_full: f64,
    /// Ages the cache held at start, of the past's ages written to its file.
    pub past_loaded: f64,
    pub past: usize,
    pub settle_secs: f64,
}

/// Everything one deployment's run found.
#[derive(Debug, Clone)]
pub struct Run {
    pub spec: Spec,
    pub seed: u64,
    pub outcomes: Vec<Outcome>,
    pub attacks: Vec<AttackOutcome>,
    /// Pushed names that reached top-domains, and whether the listed control did.
    pub pushed_ranked: Vec<String>,
    pub control_ranked: bool,
    pub rdap: RdapNote,
    pub secs: f64,
    /// Seconds since the gateway was ready at the end of each phase (the first: its start).
    pub phases: Vec<(&'static str, f64)>,
}

/// The gateway and its servers.
struct Bench {
    gw: Gateway,
    dns: DnsServer,
    _rdap: RdapServer,
    route: Route,
}

/// Gateways starting at once: many starting together on a small machine miss their
/// readiness deadline.
const STARTS_AT_ONCE: usize = 6;

/// A turn to start a gateway (see [`STARTS_AT_ONCE`]), given back when dropped.
struct Starting;

static STARTS: (std::sync::Mutex<usize>, std::sync::Condvar) =
    (std::sync::Mutex::new(0), std::sync::Condvar::new());

impl Starting {
    fn take() -> Starting {
        let mut n = STARTS.0.lock().unwrap_or_else(|p| p.into_inner());
        while *n >= STARTS_AT_ONCE {
            n = STARTS.1.wait(n).unwrap_or_else(|p| p.into_inner());
        }
        *n += 1;
        Starting
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        *STARTS.0.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        STARTS.1.notify_one();
    }
}

/// The RDAP cache's state file, written before the gateway starts with the past's ages.
const PAST_FILE: &str = "state/rdap_past.jsonl";

/// A gateway folder whose RDAP cache file holds the ages of the names of the world's past (a
/// deployment that has run for a while fetched them then), in the cache's line format.
fn past_ages(world: &World) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a folder");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let today = (now / 86_400) as i64;
    let mut text = String::new();
    for name in &world.past {
        if let Some(days) = world.registered.get(name) {
            let line = serde_json::json!({
                "d": name,
                "k": "registered",
                "r": today - days,
                "e": now + 6 * 86_400,
            });
            text.push_str(&line.to_string());
            text.push('\n');
        }
    }
    let path = dir.path().join(PAST_FILE);
    std::fs::create_dir_all(path.parent().expect("a folder")).expect("state folder");
    std::fs::write(path, text).expect("the past's ages");
    dir
}

/// Where a registry's base URL is served on the loopback server: its host and path under it.
fn local_base(rdap: &RdapServer, base: &str) -> String {
    format!(
        "http://{}/{}",
        rdap.addr,
        base.trim_start_matches("https://")
    )
}

/// The outages of the failing condition, by the bases the world's TLDs use.
fn outages(world: &World, until: Duration) -> Vec<Outage> {
    let mut out = Vec::new();
    for base in world.registries.values() {
        let prefix = format!("/{}", base.trim_start_matches("https://"));
        let reply = if base.contains("rdap.verisign.com/com/") {
            Reply::Raw(
                429,
                vec![("Retry-After".into(), "10".into())],
                String::new(),
            )
        } else if base.contains("rdap.verisign.com/net/") || base.contains("publicinterestregistry")
        {
            Reply::Raw(503, vec![], String::new())
        } else if base.contains("centralnic") {
            Reply::Slow(
                Duration::from_secs(8),
                Box::new(Reply::Raw(504, vec![], String::new())),
            )
        } else {
            continue;
        };
        out.push(Outage {
            prefix,
            from: Duration::ZERO,
            until,
            reply,
        });
    }
    out
}

impl Bench {
    fn start(world: &World, repo: &Path, spec: &Spec) -> Bench {
        let dns = DnsServer::start_world(
            world.zones.clone(),
            world.ptr.clone(),
            world.records.clone(),
        );
        let replies: HashMap<&str, Reply> = world
            .registered
            .iter()
            .map(|(d, days)| (d.as_str(), Reply::Registered(*days)))
            .collect();
        let failing = if spec.rdap == Rdap::Failing {
            outages(world, spec.outage)
        } else {
            Vec::new()
        };
        let rdap = RdapServer::start_with_outages(replies, failing);
        let mut b = Gateway::builder().dns(dns.addr);
        b = if spec.rdap == Rdap::Off {
            b.rdap_yaml("enabled: false")
        } else {
            b = b
                .in_dir(past_ages(world))
                .rdap_yaml(&format!("state_file: {PAST_FILE}"));
            let servers: Vec<String> = world
                .registries
                .iter()
                .map(|(tld, base)| format!("\"{tld}\": \"{}\"", local_base(&rdap, base)))
                .collect();
            // Only the world's registries (the gateway's data folder has no bootstrap file):
            // a TLD whose registry runs no RDAP is not asked, as with the shipped bootstrap.
            b.rdap_yaml(&format!("servers: {{{}}}", servers.join(", ")))
                .rdap_yaml("allow_plain_http: true")
        };
        b = b
            // DNS on loopback answers at once: the benchmark judges verdicts, not latency,
            // and a loaded machine must not turn a slow answer into a verdict.
            .mx_yaml("budget_ms: 2000")
            .mx_yaml("query_timeout_ms: 2000")
            .mx_yaml("min_ttl_seconds: 60")
            .mx_yaml("failure_ttl_seconds: 30")
            .gateway_yaml("top_domains:")
            .gateway_yaml("  state_file: state/top_domains.json")
            .gateway_yaml("  render_interval_ms: 50")
            .data("disposable.txt", &(world.listed.join("\n") + "\n"));
        for file in SHIPPED {
            let text = std::fs::read_to_string(repo.join("data").join(file))
                .unwrap_or_else(|e| panic!("data/{file}: {e}"));
            b = b.data(file, &text);
        }
        let projects: Vec<&str> = if spec.one_project {
            vec![SOLO]
        } else {
            PROJECTS.iter().copied().chain([ATTACKER]).collect()
        };
        // The victims' projects are the operator's (a trusted plan); the attacker is a
        // self-serve account (a plan the operator does not trust: `trusted_plans`). A
        // one-project deployment's only project is trusted, victims and attacker alike.
        b = b
            .plan("selfserve", 1_000_000)
            .mx_yaml("neighbourhood: { trusted_plans: [test] }");
        for project in projects {
            let plan = if project == ATTACKER {
                "selfserve"
            } else {
                "test"
            };
            b = b.key_in_project(project, &client::secret(project), plan, project);
        }
        // `DRG_BIN`: another build of the gateway (a before-and-after comparison).
        let _turn = Starting::take();
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
            dns,
            _rdap: rdap,
            route: spec.route,
        }
    }

    fn addr(&self) -> SocketAddr {
        self.gw.addr
    }

    /// Sends `lookups` open-loop at `per_second`; their answers in order.
    fn phase(&self, lookups: &[(&'static str, String)], per_second: f64) -> Vec<Answer> {
        let every = Duration::from_millis(facts::BATCH_EVERY_MS);
        let requests = client::schedule(lookups, per_second, self.route, every);
        client::drive(self.addr(), self.route, requests, lookups.len(), WORKERS)
    }

    /// `project` asks `names` at once (one request on the batch route, one each on GET, side
    /// by side).
    fn ask(&self, project: &str, names: &[String]) -> Vec<Answer> {
        let items: Vec<(usize, String)> = names.iter().cloned().enumerate().collect();
        match self.route {
            Route::Batch => client::ask(self.addr(), Route::Batch, project, &items),
            Route::Get => std::thread::scope(|s| {
                let asked: Vec<_> = items
                    .iter()
                    .map(|i| {
                        s.spawn(|| {
                            client::ask(self.addr(), Route::Get, project, std::slice::from_ref(i))
                        })
                    })
                    .collect();
                asked
                    .into_iter()
                    .flat_map(|h| h.join().expect("a lookup thread"))
                    .collect()
            }),
        }
    }

    fn metric(&self, sample: &str) -> Option<f64> {
        self.gw.metric(sample)
    }

    fn taught(&self) -> Option<f64> {
        self.metric("drg_mx_neighbourhood_taught_total")
    }

    /// Waits until the neighbourhood was taught `at_least` times, or its count stood still for
    /// `quiet` (what the gateway teaches is its own business: a planted name on a host that does
    /// not resolve may teach nothing), at most `within`.
    fn wait_taught(&self, at_least: f64, quiet: Duration, within: Duration) {
        let deadline = Instant::now() + within;
        let (mut last, mut since) = (self.taught(), Instant::now());
        loop {
            let now = self.taught();
            match now {
                Some(t) if t >= at_least => return,
                None => {
                    std::thread::sleep(quiet);
                    return;
                }
                _ if Instant::now() >= deadline => return,
                _ if now != last => (last, since) = (now, Instant::now()),
                _ if since.elapsed() >= quiet => return,
                _ => {}
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until no name waits for RDAP, at most `within`; what the registries did.
    fn settle(&self, within: Duration, past: (f64, usize)) -> RdapNote {
        let started = Instant::now();
        if self.metric("drg_rdap_queued").is_some() {
            while started.elapsed() < within && self.metric("drg_rdap_queued") != Some(0.0) {
                std::thread::sleep(Duration::from_millis(50));
            }
            // The last names taken may still be in flight: a loopback fetch takes about a
            // millisecond, a hanging one the gateway's timeout.
            std::thread::sleep(Duration::from_millis(300));
        }
        let m = |s: &str| self.metric(s).unwrap_or(0.0);
        RdapNote {
            found: m("drg_rdap_fetches_total{outcome=\"found\"}"),
            errors: m("drg_rdap_fetches_total{outcome=\"error\"}"),
            queued: m("drg_rdap_queued"),
            queue_full: m("drg_rdap_queue_full_total"),
            settle_secs: started.elapsed().as_secs_f64(),
            past_loaded: past.0,
            past: past.1,
        }
    }
}

/// The lookups of a traffic phase, each from its project (or `SOLO`).
fn lookups(traffic: &[Lookup], one_project: bool) -> Vec<(&'static str, String)> {
    traffic
        .iter()
        .map(|l| (if one_project { SOLO } else { l.project }, l.domain.clone()))
        .collect()
}

/// Runs `world` in the deployment `spec` against the gateway binary (the shipped data files
/// read from `repo`). A run that fails says why, with the end of the gateway's log.
pub fn run(world: &World, repo: &Path, spec: Spec) -> Run {
    let started = Instant::now();
    let bench = Bench::start(world, repo, &spec);
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        phases(&bench, world, spec, started)
    }));
    ran.unwrap_or_else(|e| {
        let why = e
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| e.downcast_ref::<&str>().copied())
            .unwrap_or("panicked")
            .to_owned();
        let log = bench.gw.log();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        panic!("{why}\nthe gateway's log ends:\n{}", tail.join("\n"))
    })
}

/// The phases of [`run`] (see the module documentation).
fn phases(bench: &Bench, world: &World, spec: Spec, started: Instant) -> Run {
    let mut phases = vec![("start", started.elapsed().as_secs_f64())];
    let t = Instant::now();
    let past = (
        bench.metric("drg_rdap_cache_entries").unwrap_or(0.0),
        world
            .past
            .iter()
            .filter(|n| world.registered.contains_key(*n))
            .count(),
    );
    let mut first: HashMap<usize, Answer> = HashMap::new();
    let early = lookups(&world.early, spec.one_project);
    let answers = bench.phase(&early, facts::HISTORY_PER_SECOND);
    note(&world.early, answers, &mut first);
    let before = bench.taught().unwrap_or(0.0);
    let listing = lookups(&world.listing, spec.one_project);
    let _ = bench.phase(&listing, facts::HISTORY_PER_SECOND);
    let listed = world.listing.len() as f64;
    bench.wait_taught(
        before + listed,
        Duration::from_secs(2),
        Duration::from_secs(90),
    );
    phases.push(("the past", t.elapsed().as_secs_f64()));
    if !spec.one_project {
        let arrivals = lookups(&world.arrivals, false);
        let answers = bench.phase(&arrivals, facts::ARRIVALS_PER_SECOND);
        note(&world.arrivals, answers, &mut first);
        minimal(bench, world, &mut first);
    }
    phases.push(("signups", t.elapsed().as_secs_f64()));
    let rdap = bench.settle(spec.settle, past);
    let outcomes = if spec.one_project {
        Vec::new()
    } else {
        settled(bench, world, first)
    };
    phases.push(("settled", t.elapsed().as_secs_f64()));
    explain(bench, world);
    let attacker = if spec.one_project { SOLO } else { ATTACKER };
    let victims_project = if spec.one_project { SOLO } else { PROJECTS[0] };
    let attacks = attack_all(
        bench,
        &world.attacks,
        attacker,
        victims_project,
        spec.planted,
    );
    phases.push(("attacks", t.elapsed().as_secs_f64()));
    let (pushed_ranked, control_ranked) = if spec.one_project {
        (Vec::new(), true)
    } else {
        top_push(bench, world)
    };
    phases.push(("top-domains", t.elapsed().as_secs_f64()));
    Run {
        phases,
        spec,
        seed: world.seed,
        outcomes,
        attacks,
        pushed_ranked,
        control_ranked,
        rdap,
        secs: started.elapsed().as_secs_f64(),
    }
}

/// `DETECTION_EXPLAIN=<class>`: the neighbourhood listing and the explained answers of the
/// class's first four cases, on stderr (a look at why).
fn explain(bench: &Bench, world: &World) {
    let Ok(class) = std::env::var("DETECTION_EXPLAIN") else {
        return;
    };
    let r = bench.gw.admin_get("/mx/neighbourhoods");
    eprintln!("neighbourhoods: {}", String::from_utf8_lossy(&r.body));
    for c in world.cases.iter().filter(|c| c.class == class).take(4) {
        let path = format!("/v1/public/domain/{}?explain=true", c.domain);
        let r = crate::common::send(
            &bench.gw,
            "GET",
            &path,
            Some(&client::secret(c.project)),
            &[],
            None,
        );
        eprintln!(
            "{} {:?}: {}",
            c.domain,
            c.bucket,
            String::from_utf8_lossy(&r.body)
        );
    }
}

/// Keeps the answers of the cases among `traffic`.
fn note(traffic: &[Lookup], answers: Vec<Answer>, into: &mut HashMap<usize, Answer>) {
    for (l, a) in traffic.iter().zip(answers) {
        if let Some(c) = l.case {
            into.entry(c).or_insert(a);
        }
    }
}

/// The missing MX hosts' first answers, asked while the DNS server gives minimal answers.
fn minimal(bench: &Bench, world: &World, first: &mut HashMap<usize, Answer>) {
    bench.dns.set_glue(false);
    for c in world.minimal_cases() {
        let case = &world.cases[c];
        let a = bench.ask(case.project, std::slice::from_ref(&case.domain));
        first.insert(c, a.into_iter().next().expect("one answer"));
    }
    bench.dns.set_glue(true);
}

/// Every case asked again by its project (the minimal-answer ones with minimal answers).
fn settled(bench: &Bench, world: &World, mut first: HashMap<usize, Answer>) -> Vec<Outcome> {
    let (minimal, rest): (Vec<usize>, Vec<usize>) =
        (0..world.cases.len()).partition(|&c| world.cases[c].minimal);
    let again: Vec<(&'static str, String)> = rest
        .iter()
        .map(|&c| (world.cases[c].project, world.cases[c].domain.clone()))
        .collect();
    let mut answers: HashMap<usize, Answer> = rest
        .iter()
        .copied()
        .zip(bench.phase(&again, 4.0 * facts::ARRIVALS_PER_SECOND))
        .collect();
    bench.dns.set_glue(false);
    for c in minimal {
        let case = &world.cases[c];
        let a = bench.ask(case.project, std::slice::from_ref(&case.domain));
        answers.insert(c, a.into_iter().next().expect("one answer"));
    }
    bench.dns.set_glue(true);
    (0..world.cases.len())
        .map(|c| Outcome {
            case: c,
            first: first
                .remove(&c)
                .unwrap_or_else(|| panic!("case {c} was never asked")),
            settled: answers.remove(&c).expect("asked again"),
        })
        .collect()
}

/// Plants the attacks' listed domains one at a time, the k-th of every attack together (they
/// aim at separate hosts and networks); after each round, every victim of an attack still
/// going is looked up by its own project.
fn attack_all(
    bench: &Bench,
    attacks: &[Attack],
    attacker: &str,
    victims_project: &str,
    most: usize,
) -> Vec<AttackOutcome> {
    let mut out: Vec<AttackOutcome> = attacks
        .iter()
        .map(|a| AttackOutcome {
            class: a.class,
            needed: None,
            tried: 0,
            victim: None,
        })
        .collect();
    for k in 0..most {
        let going: Vec<usize> = (0..attacks.len())
            .filter(|&i| out[i].needed.is_none() && k < attacks[i].planted.len())
            .collect();
        if going.is_empty() {
            break;
        }
        let planted: Vec<String> = going
            .iter()
            .map(|&i| attacks[i].planted[k].clone())
            .collect();
        let before = bench.taught().unwrap_or(0.0);
        let _ = bench.ask(attacker, &planted);
        let quiet = Duration::from_millis(150);
        bench.wait_taught(before + planted.len() as f64, quiet, Duration::from_secs(3));
        let victims: Vec<(usize, &(String, Bucket))> = going
            .iter()
            .flat_map(|&i| attacks[i].victims.iter().map(move |v| (i, v)))
            .collect();
        let names: Vec<String> = victims.iter().map(|(_, (d, _))| d.clone()).collect();
        for &i in &going {
            out[i].tried = k + 1;
        }
        // The victims' own project's answers. What one project alone taught judges only that
        // project's answers (DESIGN: the rule the goal holds the model to), so the attacker's
        // own lookups of the victims are not the victims' harm; in a one-project deployment
        // the victims' project is the attacker's, and its cost is reported.
        {
            let project = victims_project;
            for ((i, (_, bucket)), answer) in victims.iter().zip(bench.ask(project, &names)) {
                if answer.flagged() && out[*i].needed.is_none() {
                    out[*i].needed = Some(k + 1);
                    out[*i].victim = Some(*bucket);
                }
            }
        }
    }
    out
}

/// The attacker looks each pushed name up 12 times, and the listed control as often (the twelve
/// rounds side by side); once the control is ranked (or 10 s passed), which pushed names are.
fn top_push(bench: &Bench, world: &World) -> (Vec<String>, bool) {
    let names: Vec<String> = world
        .pushed
        .iter()
        .chain([&world.pushed_control])
        .cloned()
        .collect();
    // Twelve rounds at once: an attacker does not wait for its answers.
    std::thread::scope(|s| {
        for _ in 0..12 {
            s.spawn(|| bench.ask(ATTACKER, &names));
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = bench.gw.get("/v1/public/top-domains?limit=1000");
        let ranked: Vec<String> = r.json()["domains"]
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
