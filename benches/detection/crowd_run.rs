//! The phases of a detection run that ask one name of many projects: every case asked by every
//! project of the deployment at once (one domain, one verdict: do they agree?), and K attacker
//! projects reporting throwaways `safe` before a deployment project asks them.

use std::time::Duration;

use super::client::{self, Answer, Request, Route};
use super::deployment::{Bench, WORKERS};
use super::projects::ATTACKERS;
use super::world::{Reported, World};

/// A case the projects answered differently, asked at the same moment: each project's answer.
#[derive(Debug, Clone)]
pub struct Disagreement {
    pub case: usize,
    pub answers: Vec<(&'static str, Answer)>,
}

/// Every case asked by every project at once: the cases they disagreed on, and how many
/// answers there were and how many of them errors (an error is an answer like any other: a
/// project refused where another was answered disagrees).
#[derive(Debug, Clone, Default)]
pub struct EveryProject {
    pub disagree: Vec<Disagreement>,
    pub answers: usize,
    pub errors: usize,
}

/// The gateway's `rdap.established_days` (its default, which the benchmark's deployment keeps).
const ESTABLISHED_DAYS: i64 = 365;

/// What K attackers' `safe` reports did: how many of the reported throwaways the attackers'
/// own lookups flagged before they reported them, the reports refused, and the names (the
/// reported ones and the unreported one) a deployment project got flagged before the reports and
/// `safe` afterwards.
#[derive(Debug, Clone)]
pub struct ReportOutcome {
    pub attackers: usize,
    pub reported: usize,
    pub flagged_before: usize,
    pub refused: usize,
    pub safe: Vec<String>,
    pub unreported_safe: bool,
}

/// Every case asked by every project of the deployment at once (those with minimal answers
/// while the DNS server gives them).
pub fn everyone(bench: &Bench, world: &World) -> EveryProject {
    let (minimal, rest): (Vec<usize>, Vec<usize>) =
        (0..world.cases.len()).partition(|&c| world.cases[c].minimal);
    let mut out = EveryProject::default();
    all_ask(bench, world, &rest, &mut out);
    bench.dns.set_glue(false);
    all_ask(bench, world, &minimal, &mut out);
    bench.dns.set_glue(true);
    out.disagree.sort_by_key(|d| d.case);
    out
}

/// `cases` asked by every project at once: on GET, each name by every project back to back;
/// on the batch route, one batch a project, side by side.
fn all_ask(bench: &Bench, world: &World, cases: &[usize], out: &mut EveryProject) {
    let projects = &world.projects;
    let n = projects.len();
    let name = |i: usize| (i * n, world.cases[cases[i]].domain.clone());
    let requests: Vec<Request> = match bench.route {
        Route::Get => (0..cases.len())
            .flat_map(|i| {
                projects
                    .iter()
                    .enumerate()
                    .map(move |(p, project)| Request {
                        at: Duration::ZERO,
                        project,
                        names: vec![(name(i).0 + p, name(i).1)],
                    })
            })
            .collect(),
        Route::Batch => projects
            .iter()
            .enumerate()
            .map(|(p, project)| Request {
                at: Duration::ZERO,
                project,
                names: (0..cases.len())
                    .map(|i| (name(i).0 + p, name(i).1))
                    .collect(),
            })
            .collect(),
    };
    let answers = client::drive(
        bench.addr(),
        bench.route,
        requests,
        cases.len() * n,
        WORKERS,
    );
    out.answers += answers.len();
    out.errors += answers
        .iter()
        .filter(|a| a.reason.starts_with("error"))
        .count();
    for (&case, a) in cases.iter().zip(answers.chunks(n.max(1))) {
        if a.iter().any(|x| x.reason != a[0].reason) {
            out.disagree.push(Disagreement {
                case,
                answers: projects.iter().copied().zip(a.iter().cloned()).collect(),
            });
        }
    }
}

/// A deployment project (the deployment's first) asks the reported names and the unreported one;
/// every crowd's reports (side by side: each on its own host); then the deployment project asks
/// them again.
pub fn reports(bench: &Bench, world: &World) -> Vec<ReportOutcome> {
    // Every crowd's names at once (a name no registry has answered for yet waits its bound),
    // first before any report, once their registries have answered: what the reports changed,
    // not what the names' own evidence (an established age) answers anyway.
    let names: Vec<String> = world
        .reported
        .iter()
        .flat_map(|r| r.reported.iter().chain([&r.unreported]).cloned())
        .collect();
    bench.ask(world.projects[0], &names);
    bench.settle(Duration::from_secs(10), (0.0, 0));
    let flagged_first: Vec<bool> = (bench.ask(world.projects[0], &names).iter())
        .map(|a| a.flagged())
        .collect();
    let mut out: Vec<ReportOutcome> = std::thread::scope(|s| {
        let filed: Vec<_> = world
            .reported
            .iter()
            .map(|r| s.spawn(move || file(bench, r)))
            .collect();
        filed
            .into_iter()
            .map(|h| h.join().expect("a reporting thread"))
            .collect()
    });
    // A report is held by the gateway's next poll of the reports (every 400 ms).
    std::thread::sleep(Duration::from_millis(1_000));
    let mut answers = bench.ask(world.projects[0], &names).into_iter();
    // A name the registry shows established is `safe` once its age is in, reports or not (a
    // finding lookups taught never outweighs it): whether its age came before the first ask
    // or after is timing, not the reports' doing.
    let established = |n: &str| {
        let tld = n.rsplit('.').next().unwrap_or_default();
        world.has_rdap(tld)
            && world
                .registered
                .get(n)
                .is_some_and(|d| *d >= ESTABLISHED_DAYS)
    };
    let flagged_first: Vec<bool> = (names.iter().zip(flagged_first))
        .map(|(n, f)| f && !established(n))
        .collect();
    let mut names = names.into_iter().zip(flagged_first);
    for (r, o) in world.reported.iter().zip(&mut out) {
        let mut safe: Vec<String> = Vec::new();
        for _ in 0..=r.reported.len() {
            let (name, answer) = (names.next(), answers.next());
            if let (Some((n, true)), Some(a)) = (name, answer) {
                if !a.flagged() {
                    safe.push(n);
                }
            }
        }
        o.unreported_safe = safe.contains(&r.unreported);
        o.safe = safe;
    }
    out
}

/// The crowd's attackers each look the reported names up, then (once all have) report each
/// `safe`; the attackers side by side.
fn file(bench: &Bench, r: &Reported) -> ReportOutcome {
    let attackers = &ATTACKERS[..r.attackers.min(ATTACKERS.len())];
    let each = |f: &(dyn Fn(&str) -> usize + Sync)| -> Vec<usize> {
        std::thread::scope(|s| {
            let threads: Vec<_> = attackers.iter().map(|a| s.spawn(move || f(a))).collect();
            threads
                .into_iter()
                .map(|h| h.join().expect("an attacker's thread"))
                .collect()
        })
    };
    let flagged = each(&|attacker| {
        let answers = bench.ask(attacker, &r.reported);
        answers.iter().filter(|a| a.flagged()).count()
    });
    let refused = each(&|attacker| report(bench, attacker, &r.reported));
    ReportOutcome {
        attackers: r.attackers,
        reported: r.reported.len(),
        flagged_before: flagged.first().copied().unwrap_or(0),
        refused: refused.iter().sum(),
        safe: Vec::new(),
        unreported_safe: false,
    }
}

/// `attacker` reports each of `names` `safe`: how many reports were refused.
fn report(bench: &Bench, attacker: &str, names: &[String]) -> usize {
    let mut refused = 0;
    for name in names {
        let body = serde_json::json!({"domain": name, "verdict": "safe"}).to_string();
        let sent = crate::common::send(
            &bench.gw,
            "POST",
            "/v1/reports",
            Some(&client::secret(attacker)),
            &[],
            Some(body.as_bytes()),
        );
        refused += usize::from(sent.status != 202);
    }
    refused
}
