//! Runs one deployment of the detection world against the real gateway binary (started by
//! `deployment.rs` with the world's servers), open-loop, phase by phase:
//!
//! 0. with the look on, the gateway's first look at its listed names (waited for: a deployment
//!    that has run for a while has looked at them, the planted names lapsed then);
//! 1. the past and the throwaways that arrive before their host is known;
//! 2. the listed names (learned in the background; waited for) and the rest of the past;
//! 3. the signups: every other case (their *first* answer);
//! 4. the missing MX hosts, asked while the DNS server gives minimal answers;
//! 5. settling: until no name waits for RDAP (at most `settle`) and every listed name is
//!    learned; then every case again by the same project (its *settled* answer);
//! 6. every case by every project at once (do the projects agree?), the planting attacks, one
//!    attacker's and K attackers' together (`attacking.rs`), then one attacker's repeated
//!    lookups for top-domains; beside them, K attackers' `safe` reports and a deployment
//!    project's answers after them (`crowd_run.rs`), on hosts of their own.
//!
//! A one-project deployment (the usual platform deployment) runs phases 1 to 5 and 6's
//! one-attacker attacks only, every lookup from its one project. Every lookup goes on GET or
//! every one on the batch route.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use super::attacking::{self, AttackOutcome};
use super::client::{self, Answer};
use super::crowd_run::{self, EveryProject, ReportOutcome};
use super::deployment::Bench;
use super::facts;
use super::projects::SOLO;
use super::spec::{Look, RdapNote, Spec};
use super::world::{Attack, Lookup, World};

/// The longest the run waits for the gateway's first look at its listed names.
const FIRST_LOOK_WITHIN: Duration = Duration::from_secs(120);

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

/// Everything one deployment's run found.
#[derive(Debug, Clone)]
pub struct Run {
    pub spec: Spec,
    pub seed: u64,
    pub outcomes: Vec<Outcome>,
    pub attacks: Vec<AttackOutcome>,
    /// The attacks of several attacker projects together (several projects only).
    pub crowds: Vec<AttackOutcome>,
    /// Every case asked by every project at once, after the settled answers.
    pub every: EveryProject,
    /// What several attacker projects' `safe` reports did to a deployment project's answers.
    pub reports: Vec<ReportOutcome>,
    /// Pushed names that reached top-domains, and whether the listed control did.
    pub pushed_ranked: Vec<String>,
    pub control_ranked: bool,
    pub rdap: RdapNote,
    pub secs: f64,
    /// Seconds since the gateway was ready at the end of each phase (the first: its start).
    pub phases: Vec<(&'static str, f64)>,
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
    if spec.look == Look::On {
        bench.wait_first_look(FIRST_LOOK_WITHIN);
        phases.push(("first look", t.elapsed().as_secs_f64()));
    }
    let past = (
        bench.metric("drg_rdap_cache_entries").unwrap_or(0.0),
        world
            .past
            .iter()
            .filter(|n| world.registered.contains_key(*n))
            .count(),
    );
    let mut first = the_past(bench, world, spec);
    phases.push(("the past", t.elapsed().as_secs_f64()));
    let one = spec.one_project;
    let arrivals = lookups(&world.arrivals, one);
    let answers = bench.phase(&arrivals, facts::ARRIVALS_PER_SECOND);
    note(&world.arrivals, answers, &mut first);
    minimal(bench, world, one, &mut first);
    phases.push(("signups", t.elapsed().as_secs_f64()));
    let rdap = bench.settle(spec.settle, past);
    let several = !one;
    let outcomes = settled(bench, world, one, first);
    phases.push(("settled", t.elapsed().as_secs_f64()));
    // The reports aim at hosts of their own: they go side by side with what follows.
    let (every, attacks, crowds, pushed, reports) = std::thread::scope(|s| {
        let reports = s.spawn(|| {
            if several {
                crowd_run::reports(bench, world)
            } else {
                Vec::new()
            }
        });
        let every = if several {
            crowd_run::everyone(bench, world)
        } else {
            EveryProject::default()
        };
        phases.push(("every project", t.elapsed().as_secs_f64()));
        explain(bench, world);
        let (attacks, crowds) = attacks(bench, world, spec);
        phases.push(("attacks", t.elapsed().as_secs_f64()));
        let pushed = if several {
            attacking::top_push(bench, world)
        } else {
            (Vec::new(), true)
        };
        phases.push(("top-domains", t.elapsed().as_secs_f64()));
        let reports = reports.join().expect("the reports' thread");
        (every, attacks, crowds, pushed, reports)
    });
    phases.push(("reports (beside the last three)", t.elapsed().as_secs_f64()));
    Run {
        phases,
        spec,
        seed: world.seed,
        outcomes,
        attacks,
        crowds,
        every,
        reports,
        pushed_ranked: pushed.0,
        control_ranked: pushed.1,
        rdap,
        secs: started.elapsed().as_secs_f64(),
    }
}

/// The past: its early part (keeping the first answers of the cases in it), then the listed
/// names, waited for until learned.
fn the_past(bench: &Bench, world: &World, spec: Spec) -> HashMap<usize, Answer> {
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
    first
}

/// The planting attacks, one attacker's and (several projects) the crowds', round by round
/// together; the victims asked by the deployment's first project.
fn attacks(bench: &Bench, world: &World, spec: Spec) -> (Vec<AttackOutcome>, Vec<AttackOutcome>) {
    let one = spec.one_project;
    let victims_project = if one { SOLO } else { world.projects[0] };
    let crowds = if one { &[][..] } else { &world.crowds[..] };
    let all: Vec<&Attack> = world.attacks.iter().chain(crowds).collect();
    let mut out = attacking::attack_all(
        bench,
        &all,
        &world.lapsed,
        (one, &world.projects),
        victims_project,
        spec.planted,
    );
    let crowds = out.split_off(world.attacks.len());
    (out, crowds)
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

/// Who asks `case` (`one`: the one project of its deployment).
fn asker(case: &super::world::Case, one: bool) -> &'static str {
    if one {
        SOLO
    } else {
        case.project
    }
}

/// The missing MX hosts' first answers, asked while the DNS server gives minimal answers.
fn minimal(bench: &Bench, world: &World, one: bool, first: &mut HashMap<usize, Answer>) {
    bench.dns.set_glue(false);
    for c in world.minimal_cases() {
        let case = &world.cases[c];
        let a = bench.ask(asker(case, one), std::slice::from_ref(&case.domain));
        first.insert(c, a.into_iter().next().expect("one answer"));
    }
    bench.dns.set_glue(true);
}

/// Every case asked again by its project (the minimal-answer ones with minimal answers).
fn settled(
    bench: &Bench,
    world: &World,
    one: bool,
    mut first: HashMap<usize, Answer>,
) -> Vec<Outcome> {
    let (minimal, rest): (Vec<usize>, Vec<usize>) =
        (0..world.cases.len()).partition(|&c| world.cases[c].minimal);
    let again: Vec<(&'static str, String)> = rest
        .iter()
        .map(|&c| (asker(&world.cases[c], one), world.cases[c].domain.clone()))
        .collect();
    let mut answers: HashMap<usize, Answer> = rest
        .iter()
        .copied()
        .zip(bench.phase(&again, 4.0 * facts::ARRIVALS_PER_SECOND))
        .collect();
    bench.dns.set_glue(false);
    for c in minimal {
        let case = &world.cases[c];
        let a = bench.ask(asker(case, one), std::slice::from_ref(&case.domain));
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
