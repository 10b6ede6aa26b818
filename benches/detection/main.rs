//! The detection benchmark: a labelled world generated from published facts and a seed
//! (throwaway clusters, real users' domains that must not be flagged, unusable mail set-ups,
//! planting attacks), served by DNS and RDAP servers on loopback, looked up through the real
//! gateway binary on GET and on the batch route; prints the tables, then the goals missed.
//!
//! ```text
//! benches/detection/run                      # seeds 1, 2, 3; RDAP on, off, failing, unreachable
//! benches/detection/run -- --seed 7          # one seed (repeat for more)
//! benches/detection/run -- --rdap failing    # one condition (repeat for more)
//! benches/detection/run -- --slice           # the test command's slice of each world
//! benches/detection/run -- --no-one-project  # without the one-project deployment
//! benches/detection/run -- --jobs 6          # runs at once (default: all)
//! benches/detection/run -- --cases           # every case's answers after the tables
//! benches/detection/run -- --world           # what each world holds, without running it
//! benches/detection/run -- --projects 20     # a deployment of 20 projects (default 4)
//! benches/detection/run -- --look off        # the gateway's look at listed names off (default on)
//! DETECTION_EXPLAIN='<class>' benches/detection/run ...  # why: explained answers, on stderr
//! DRG_BIN=/path/to/gateway benches/detection/run ...     # another build of the gateway
//! DRG_BENCH_TRUSTED_PLAN=1 benches/detection/run ...     # a build from before issue 85's end
//! DRG_BENCH_NO_TRUST=1 benches/detection/run ...         # a build from before the trust keys
//! ```
//! The deployment's projects are on one plan (`test`), the attackers on a self-serve one: a
//! lookup teaches the project that made it, whatever its plan, so the plans differ only in
//! name. `DRG_BENCH_TRUSTED_PLAN=1` configures a build from issue 77 to the trust keys'
//! retirement as it ran (`trusted_plans: [test]`, `trusted_projects: []`: the projects' own
//! lookups taught every project, the attackers' only their own). `DRG_BENCH_NO_TRUST=1` writes
//! neither those keys nor `look:` on `--look off`, for a build from before both (it refuses
//! unknown keys): its attackers are then projects like any other.
//! The config also sets the neighbourhood's look at the listed names (`look:`; on: at 2,000
//! names a second, the run waiting for its first pass before the past; `--look off`:
//! `enabled: false`, nothing waits).
//! The gate is `tests/detection.rs`; results with their commit go in
//! `benches/RESULTS-detection.md`; the sources of every distribution in `PROVENANCE.md`.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/dns.rs"]
#[allow(dead_code)]
mod dns;
#[path = "../../tests/common/rdap.rs"]
mod rdap_server;

mod attacking;
mod attacks;
mod broken;
mod client;
mod crowd_report;
mod crowd_run;
mod crowds;
mod deployment;
mod facts;
mod goals;
mod legit;
mod projects;
mod report;
mod rng;
mod runner;
mod spec;
mod suite;
mod throwaway;
mod timeline;
mod world;

use std::time::{Duration, Instant};

use spec::{Look, Rdap};
use world::Size;

/// The command line's plan and look (see the module documentation).
fn plan(args: &[String]) -> (suite::Plan, Look, bool) {
    let values = |flag: &str| -> Vec<String> {
        args.windows(2)
            .filter(|w| w[0] == flag)
            .map(|w| w[1].clone())
            .collect()
    };
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let mut seeds: Vec<u64> = values("--seed")
        .iter()
        .map(|s| s.parse().expect("--seed N"))
        .collect();
    if seeds.is_empty() {
        seeds = vec![1, 2, 3];
    }
    let mut conditions: Vec<Rdap> = values("--rdap")
        .iter()
        .map(|s| match s.as_str() {
            "on" => Rdap::On,
            "off" => Rdap::Off,
            "failing" => Rdap::Failing,
            "unreachable" => Rdap::Unreachable,
            other => panic!("--rdap on|off|failing|unreachable, not {other}"),
        })
        .collect();
    if conditions.is_empty() {
        conditions = Rdap::EVERY.to_vec();
    }
    let look = match values("--look").last().map(String::as_str) {
        None | Some("on") => Look::On,
        Some("off") => Look::Off,
        Some(other) => panic!("--look off|on, not {other}"),
    };
    let slice = has("--slice");
    let one_project = !has("--no-one-project");
    let runs = seeds.len() * conditions.len() * 2 * (1 + usize::from(one_project));
    let jobs = values("--jobs")
        .first()
        .map_or(runs, |j| j.parse().expect("--jobs N"));
    let mut size = if slice { Size::SLICE } else { Size::FULL };
    if let Some(n) = values("--projects").first() {
        size.projects = n.parse().expect("--projects N");
    }
    let plan = suite::Plan {
        seeds,
        size,
        conditions,
        one_project,
        jobs,
        settle: Duration::from_secs(if slice { 15 } else { 120 }),
        outage: Duration::from_secs(if slice { 8 } else { 30 }),
        planted: if slice {
            goals::PLANTED + 1
        } else {
            world::MAX_PLANTED
        },
    };
    (plan, look, has("--cases"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (plan, look, cases) = plan(&args);
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let started = Instant::now();
    if args.iter().any(|a| a == "--timeline") {
        run_timeline(&plan, repo);
        return;
    }
    let worlds = suite::worlds(&plan, repo);
    if args.iter().any(|a| a == "--world") {
        describe(&worlds);
        return;
    }
    let (runs, failed) = suite::run_looking(&plan, &worlds, repo, look);
    let report = report::Report {
        worlds: &worlds,
        runs,
        one: false,
    };
    for f in &failed {
        println!("RUN FAILED: {}", f.chars().take(2000).collect::<String>());
    }
    let w = &worlds[0];
    println!(
        "detection benchmark: seeds {:?}, {} world, {} projects, the look {}; seed {}: {} cases, {} listed ({} lapsed until planted), {} attacks; {} runs, {:.0} s\n",
        plan.seeds,
        if plan.size.big_host { "full" } else { "slice" },
        w.projects.len(),
        look.label(),
        w.seed,
        w.cases.len(),
        w.listed.len(),
        w.lapsed.len(),
        w.attacks.len() + w.crowds.len(),
        report.runs.len(),
        started.elapsed().as_secs_f64()
    );
    print!("{}", report.tables());
    let mut misses = goals::misses(&report);
    misses.extend(failed.iter().map(|f| format!("a run did not finish: {f}")));
    println!("Goals (tests/detection.rs): {} missed.", misses.len());
    for m in &misses {
        println!("- {}", m.chars().take(400).collect::<String>());
    }
    if cases {
        print_cases(&report);
    }
}

/// What each world holds: cases by class, listed names, the past, and the names RDAP is asked
/// for during the run, by registry.
/// `--timeline`: the time axis (timeline.rs) for each seed, with RDAP on, off and unreachable (or the
/// conditions `--rdap` names), every run at once; a table a condition, over the seeds.
fn run_timeline(plan: &suite::Plan, repo: &std::path::Path) {
    let started = Instant::now();
    let shipped = world::Shipped::read(repo);
    let conditions: Vec<Rdap> = if plan.conditions == Rdap::EVERY.to_vec() {
        vec![Rdap::On, Rdap::Off, Rdap::Unreachable]
    } else {
        plan.conditions.clone()
    };
    let drawn: Vec<(world::World, timeline::Timeline)> = (plan.seeds.iter())
        .map(|&seed| {
            let mut w = world::World::build(seed, plan.size, &shipped);
            let t = timeline::Timeline::draw(&mut w);
            (w, t)
        })
        .collect();
    let results: Vec<(Rdap, Vec<timeline::Row>)> = std::thread::scope(|s| {
        let runs: Vec<_> = (conditions.iter())
            .flat_map(|&c| drawn.iter().map(move |(w, t)| (c, w, t)))
            .map(|(c, w, t)| s.spawn(move || (c, timeline::run(w, t, repo, c))))
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("a timeline run"))
            .collect()
    });
    println!(
        "detection timeline: seeds {:?}, {:.0} s\n",
        plan.seeds,
        started.elapsed().as_secs_f64()
    );
    for c in conditions {
        let rows: Vec<timeline::Row> = (results.iter())
            .filter(|(k, _)| *k == c)
            .flat_map(|(_, r)| r.iter().cloned())
            .collect();
        println!(
            "RDAP {}: customers flagged, settled (first answers in brackets where they differ)\n",
            c.label()
        );
        println!("{}", timeline::table(&drawn[0].1, &rows));
    }
}

fn describe(worlds: &[world::World]) {
    for w in worlds {
        let mut classes: Vec<(&str, usize)> = Vec::new();
        for c in &w.cases {
            match classes.iter_mut().find(|(k, _)| *k == c.class) {
                Some((_, n)) => *n += 1,
                None => classes.push((c.class, 1)),
            }
        }
        let past: std::collections::HashSet<&String> = w.past.iter().collect();
        let mut asked: std::collections::BTreeMap<&str, usize> = Default::default();
        for l in w.early.iter().chain(&w.arrivals) {
            let tld = l.domain.rsplit('.').next().unwrap_or("");
            if w.registered.contains_key(&l.domain) && !past.contains(&l.domain) {
                *asked.entry(w.registries[tld].as_str()).or_default() += 1;
            }
        }
        let mut asked: Vec<(&str, usize)> = asked.into_iter().collect();
        asked.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        println!(
            "seed {}: {} cases {:?}; {} listed ({} lapsed until planted); the past {} lookups ({} ages cached); {} zones; RDAP asked during the run for {} names, by registry {:?}",
            w.seed,
            w.cases.len(),
            classes,
            w.listed.len(),
            w.lapsed.len(),
            w.early.len() + w.listing.len() - w.cases.iter().filter(|c| c.arrival == world::Arrival::Before).count(),
            w.past.iter().filter(|n| w.registered.contains_key(*n)).count(),
            w.zones.len(),
            asked.iter().map(|(_, n)| n).sum::<usize>(),
            &asked[..asked.len().min(8)]
        );
    }
}

/// Every case's answers, run by run.
fn print_cases(report: &report::Report) {
    for run in report.runs.iter().filter(|r| !r.spec.one_project) {
        let world = report.worlds.iter().find(|w| w.seed == run.seed).unwrap();
        println!(
            "\n## seed {}, RDAP {}, {}",
            run.seed,
            run.spec.rdap.label(),
            run.spec.route.label()
        );
        for o in &run.outcomes {
            let c = &world.cases[o.case];
            println!(
                "{:<32} {:<46} {:<13} {:<15} {:<7} first {} {} settled {} {}",
                c.domain,
                c.class,
                c.expect.as_str(),
                c.bucket.map_or("", |b| b.label()),
                if c.arrival == world::Arrival::Before {
                    "before"
                } else {
                    ""
                },
                o.first.reason,
                o.first.score,
                o.settled.reason,
                o.settled.score
            );
        }
    }
    print!("{}", report.disagree_cases());
}
