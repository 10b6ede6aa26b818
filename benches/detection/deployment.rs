//! The deployment a detection run looks up through: the gateway binary (`DRG_BIN`: another
//! build) on the shipped data with the world's blocklist, one key per project (the projects on
//! one plan, the attackers on a self-serve one), a DNS server and an RDAP server on
//! loopback holding the world (registries paced as shipped; in the failing condition some of
//! them throttle, fail or hang for the first part of the run); the gateway's background look
//! at its listed names (on unless `--look off`); and how a run talks to it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use super::client::{self, Answer, Route};
use super::facts;
use super::projects::{ATTACKERS, SELF_SERVE_PLAN, SOLO, TRUSTED_PLAN};
use super::spec::{Look, Rdap, RdapNote, Spec};
use super::world::{Lapsed, World};
use crate::common::{Gateway, GatewayBuilder};
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
pub const WORKERS: usize = 32;

/// The gateway and its servers.
pub struct Bench {
    pub gw: Gateway,
    pub dns: DnsServer,
    _rdap: RdapServer,
    pub route: Route,
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
pub(super) const PAST_FILE: &str = "state/rdap_past.jsonl";

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

/// The outages of the failing condition (or, `every`, of the unreachable one: every registry
/// 503 for the whole run), by the bases the world's TLDs use.
fn outages(world: &World, until: Duration, every: bool) -> Vec<Outage> {
    let mut out = Vec::new();
    for base in world.registries.values() {
        let prefix = format!("/{}", base.trim_start_matches("https://"));
        let reply = if every {
            Reply::Raw(503, vec![], String::new())
        } else if base.contains("rdap.verisign.com/com/") {
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

/// The keys: every project of the world on the deployment's plan and every attacker on a
/// self-serve one (or the one project's key), and the neighbourhood's look at the listed names
/// as `spec.look` says. A build from before the trust keys were retired (issue 85) is measured
/// as it was configured: `DRG_BENCH_TRUSTED_PLAN=1` writes `trusted_plans: [test]`
/// (`DRG_BENCH_NO_TRUST=1`: a build from before the trust keys and the look, which refuses
/// both).
fn who_asks(mut b: GatewayBuilder, world: &World, spec: &Spec) -> GatewayBuilder {
    let keys: Vec<(&str, &str)> = if spec.one_project {
        vec![(SOLO, TRUSTED_PLAN)]
    } else {
        let projects = world.projects.iter().map(|p| (*p, TRUSTED_PLAN));
        let attackers = ATTACKERS.iter().map(|a| (*a, SELF_SERVE_PLAN));
        projects.chain(attackers).collect()
    };
    for (project, plan) in keys {
        b = b.key_in_project(project, &client::secret(project), plan, project);
    }
    b = b.plan(SELF_SERVE_PLAN, 1_000_000);
    let knows_look = std::env::var_os("DRG_BENCH_NO_TRUST").is_none();
    let mut neighbourhood = Vec::new();
    if knows_look && std::env::var_os("DRG_BENCH_TRUSTED_PLAN").is_some() {
        neighbourhood.push(format!("trusted_plans: [{TRUSTED_PLAN}]"));
        neighbourhood.push("trusted_projects: []".to_owned());
    }
    match spec.look {
        // The bench's look is fast (2,000 names a second; the default starts at 20) so the run
        // stays short: it waits for the look's first pass before the past. One pass a run: the
        // next is a day later. Its 8 lookups at once are its own, not the shipped
        // `look.concurrency` (32): nine runs side by side on a CI machine's two cores at 32
        // each once left a listed name's /24 to one project's lookups (benches/RESULTS.md,
        // "The first look").
        Look::On => neighbourhood.push(
            "look: {enabled: true, rate: 2000, concurrency: 8, every_secs: 86400}".to_owned(),
        ),
        // A build from before the look (`DRG_BENCH_NO_TRUST`): off is its only way, and it
        // refuses the key.
        Look::Off if knows_look => neighbourhood.push("look: {enabled: false}".to_owned()),
        Look::Off => {}
    }
    if !neighbourhood.is_empty() {
        b = b.mx_yaml("neighbourhood:");
        for line in neighbourhood {
            b = b.mx_yaml(&format!("  {line}"));
        }
    }
    b
}

impl Bench {
    pub fn start(world: &World, repo: &Path, spec: &Spec) -> Bench {
        let dns = DnsServer::start_world(
            world.zones.clone(),
            world.ptr.clone(),
            world.records.clone(),
        );
        Bench::start_in(world, repo, spec, dns, (0, None))
    }

    /// A gateway on `dns` (the world's DNS as it stands), `days` after the world's day 0 (the
    /// registries give every age that much older), in `dir`: the folder a stopped gateway left
    /// (the timeline's next day), or `None`, a fresh one (with the past's ages, RDAP on).
    pub fn start_in(
        world: &World,
        repo: &Path,
        spec: &Spec,
        dns: DnsServer,
        (days, dir): (i64, Option<tempfile::TempDir>),
    ) -> Bench {
        let replies: HashMap<&str, Reply> = world
            .registered
            .iter()
            .map(|(d, age)| (d.as_str(), Reply::Registered(age + days)))
            .collect();
        let failing = match spec.rdap {
            Rdap::Failing => outages(world, spec.outage, false),
            Rdap::Unreachable => outages(world, Duration::from_secs(86_400), true),
            Rdap::On | Rdap::Off => Vec::new(),
        };
        let rdap = RdapServer::start_with_outages(replies, failing);
        let mut b = Gateway::builder().dns(dns.addr);
        let fresh = dir.is_none();
        if let Some(dir) = dir {
            b = b.in_dir(dir);
        }
        b = if spec.rdap == Rdap::Off {
            b.rdap_yaml("enabled: false")
        } else {
            if fresh {
                b = b.in_dir(past_ages(world));
            }
            b = b.rdap_yaml(&format!("state_file: {PAST_FILE}"));
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
        b = who_asks(b, world, spec);
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

    pub fn addr(&self) -> SocketAddr {
        self.gw.addr
    }

    /// Stops the gateway (its state saved): its folder, and the DNS server, for the next day.
    #[allow(dead_code)]
    pub fn stop(self) -> (tempfile::TempDir, DnsServer) {
        (self.gw.stop(), self.dns)
    }

    /// Sends `lookups` open-loop at `per_second`; their answers in order.
    pub fn phase(&self, lookups: &[(&'static str, String)], per_second: f64) -> Vec<Answer> {
        let every = Duration::from_millis(facts::BATCH_EVERY_MS);
        let requests = client::schedule(lookups, per_second, self.route, every);
        client::drive(self.addr(), self.route, requests, lookups.len(), WORKERS)
    }

    /// `project` asks `names` at once (one request on the batch route, one each on GET, side
    /// by side).
    pub fn ask(&self, project: &str, names: &[String]) -> Vec<Answer> {
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

    pub fn metric(&self, sample: &str) -> Option<f64> {
        self.gw.metric(sample)
    }

    /// Waits until the gateway's look at its listed names completed a pass (the look on), at
    /// most `within`; panics if it did not.
    pub fn wait_first_look(&self, within: Duration) {
        let started = Instant::now();
        loop {
            let passes = self.metric("drg_mx_neighbourhood_look_passes_total");
            if passes.is_some_and(|p| p >= 1.0) {
                return;
            }
            assert!(
                started.elapsed() < within,
                "the gateway's first look at its listed names did not complete in {} s \
                 (drg_mx_neighbourhood_look_passes_total {passes:?}, \
                 drg_mx_neighbourhood_looked_total {:?}); a build without the look runs with \
                 --look off",
                within.as_secs(),
                self.metric("drg_mx_neighbourhood_looked_total"),
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The attacker re-registers lapsed listed `name`: its zone and records served from now on.
    pub fn re_register(&self, name: &str, lapsed: &Lapsed) {
        self.dns.set_zone(name, Some(lapsed.zone.clone()));
        for (n, r) in &lapsed.records {
            self.dns.set_records(n, Some(r.clone()));
        }
    }

    pub fn taught(&self) -> Option<f64> {
        self.metric("drg_mx_neighbourhood_taught_total")
    }

    /// Waits until the neighbourhood was taught `at_least` times, or its count stood still for
    /// `quiet` (what the gateway teaches is its own business: a planted name on a host that does
    /// not resolve may teach nothing), at most `within`.
    pub fn wait_taught(&self, at_least: f64, quiet: Duration, within: Duration) {
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
    pub fn settle(&self, within: Duration, past: (f64, usize)) -> RdapNote {
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
