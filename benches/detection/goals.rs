//! The goals of issue 66 the detection gate holds the model to, over every seed of a report:
//! recall on unlisted throwaways in every age bucket (settled 90%, first 80% of those that
//! arrive after their host is known, counting the answers the model gave: one waiting for a
//! registry's age or failed open on DNS time is the moment's, and at most 10% of a route's first
//! answers are; 50% both for the /24 shape, where a registry dates the case: RDAP on, not the
//! no-RDAP bucket, as a network judges only a dated domain) with RDAP on and failing,
//! but the aged one's (an established age outweighs a finding lookups taught until the
//! registry shows 3 of the listed names on its key held for years, issue 94: in the slice a
//! seed's aged cases of a shape sit on one key, whose names' ages decide them all, so a
//! 90% floor over six cases is the draw of three keys; the full world's 75 are in
//! benches/RESULTS-detection.md);
//! and in every condition, on GET and on the batch route: no must-not-flag case flagged, no
//! attack flagging a victim with 20 planted domains from one project (several projects), GET
//! and batch agreeing on every case, unusable set-ups and missing hosts with minimal answers
//! `undeliverable` 100%, nothing pushed onto top-domains by one project. And one domain, one
//! verdict (DESIGN.md): every project of the deployment asked every case at once gets the same
//! `reason`; no victim of a deployment project flagged by K <= 10 self-serve attacker projects
//! planting 20 listed domains together; no throwaway that K self-serve projects reported
//! `safe` (nor its unreported neighbour) answered `safe` to a deployment project. And (issue 85)
//! no established victim flagged by planting through any of the deployment's own projects,
//! one, two or four of them, with up to 20 planted listed domains; with the gateway's look at
//! its listed names on (the shipped default), no victim of any age flagged by planting, through
//! any project, in the deployment of several projects or of one (the planted names are lapsed
//! listed names re-registered after the look saw them).

use super::broken::{MINIMAL, UNUSABLE};
use super::client::{Answer, Route};
use super::report::{Count, Report, Which, FLOOR_CONDITIONS};
use super::spec::{Look, Rdap};
use super::world::{Arrival, Bucket, Case, Expect, Shape, Through};

/// Planted listed domains from one project that must flag no victim.
pub const PLANTED: usize = 20;

/// Recall floors: settled, and first (of throwaways arriving after their host is known).
fn floors(shape: Shape) -> (f64, f64) {
    match shape {
        Shape::Network => (0.5, 0.5),
        _ => (0.9, 0.8),
    }
}

/// Every goal the report misses, said in a line each (none: every goal met).
pub fn misses(report: &Report) -> Vec<String> {
    let mut out = Vec::new();
    for rdap in Rdap::EVERY {
        if !report.runs.iter().any(|r| r.spec.rdap == rdap) {
            continue;
        }
        for route in [Route::Get, Route::Batch] {
            if FLOOR_CONDITIONS.contains(&rdap) {
                recall(report, rdap, route, &mut out);
            }
            timed(report, rdap, route, &mut out);
            classes(report, rdap, route, &mut out);
        }
        attacks(report, rdap, &mut out);
        crowds(report, rdap, &mut out);
        for which in [Which::First, Which::Settled] {
            // An aged throwaway's answer is `safe` once its age is in, `disposable` before:
            // whether the registry answered within a lookup's budget, on either route, is
            // timing, and both answers are the model's.
            // So is a /24 throwaway's while registries fail for a while: a network judges only
            // a domain a registry dates, and whether its date came in past the outage (or its
            // failure was still remembered) is the moment's.
            let timed = |c: &Case| {
                c.expect == Expect::Disposable
                    && (c.bucket == Some(Bucket::Old)
                        || (rdap == Rdap::Failing && c.shape == Some(Shape::Network)))
            };
            for (class, cases) in report.disagreements_of(rdap, which, |c| !timed(c)) {
                out.push(format!(
                    "RDAP {}: GET and batch disagree on the {which:?} answer of {} {class} cases: {}",
                    rdap.label(),
                    cases.len(),
                    cases.join("; ")
                ));
            }
        }
    }
    out
}

/// Whether a registry can date the cases of `bucket` under `rdap`: a network (the /24 shape)
/// judges only a domain its registry dates (must-not-flag wins: a company's host that a VPS
/// provider numbered beside throwaway hosts shows the same DNS as the operator's next host;
/// `drg_domain::classify::undated_network`), so its floors hold where an age can be had.
fn dated(rdap: Rdap, bucket: Bucket) -> bool {
    rdap == Rdap::On && bucket != Bucket::NoRdap
}

fn recall(report: &Report, rdap: Rdap, route: Route, out: &mut Vec<String>) {
    for shape in Shape::ALL {
        let (settled, first) = floors(shape);
        // The aged bucket: not held in the slice (see above; docs/mx.md, rule 6).
        for bucket in Bucket::ALL
            .into_iter()
            .filter(|b| *b != Bucket::Old)
            .filter(|b| shape != Shape::Network || dated(rdap, *b))
        {
            let checks = [
                (Which::Settled, None, settled),
                (Which::First, Some(Arrival::After), first),
            ];
            for (which, arrival, floor) in checks {
                // A first answer waiting for a registry's age or failed open on DNS time is the
                // moment's (bounded in `timed`); a cell holds what the model answered.
                let model = |a: &Answer| which == Which::Settled || !a.timed();
                let c = report.recall(rdap, route, which, shape, Some(bucket), arrival, model);
                if c.rate() < floor {
                    out.push(format!(
                        "RDAP {} {}: {} {} recall, {}: {}/{} < {floor}",
                        rdap.label(),
                        route.label(),
                        shape.label(),
                        bucket.label(),
                        which_label(which),
                        c.hit,
                        c.of
                    ));
                }
            }
        }
    }
}

/// First answers that are the moment's ([`Answer::timed`]) a
/// condition and route may hold, of all its first answers: with a registry hanging or DNS slow
/// on a busy machine some are (docs/mx.md), but never so many that they carry the recall.
pub const TIMED: f64 = 0.1;

fn timed(report: &Report, rdap: Rdap, route: Route, out: &mut Vec<String>) {
    let c = report.count(rdap, route, Which::First, |_| true, |_, a| a.timed());
    if c.hit as f64 > TIMED * c.of as f64 {
        out.push(format!(
            "RDAP {} {}: first answers waiting for a registry's age or failed open on DNS time: {}/{} > {TIMED}",
            rdap.label(),
            route.label(),
            c.hit,
            c.of
        ));
    }
}

fn which_label(which: Which) -> &'static str {
    match which {
        Which::First => "first (arrived after its host was known)",
        Which::Settled => "settled",
    }
}

fn classes(report: &Report, rdap: Rdap, route: Route, out: &mut Vec<String>) {
    for which in [Which::First, Which::Settled] {
        let flagged = report.count(
            rdap,
            route,
            which,
            |c| c.expect == Expect::NotFlagged,
            |_, a| a.flagged(),
        );
        if flagged.hit > 0 {
            out.push(format!(
                "RDAP {} {}: must-not-flag cases flagged on the {which:?} answer: {} of {}",
                rdap.label(),
                route.label(),
                flagged.hit,
                flagged.of
            ));
        }
        for class in [UNUSABLE, MINIMAL] {
            let c: Count = report.count(
                rdap,
                route,
                which,
                |c| c.class == class,
                |_, a| a.reason == "undeliverable",
            );
            if c.hit < c.of {
                out.push(format!(
                    "RDAP {} {}: {class} undeliverable on the {which:?} answer: {}/{}",
                    rdap.label(),
                    route.label(),
                    c.hit,
                    c.of
                ));
            }
        }
    }
}

fn attacks(report: &Report, rdap: Rdap, out: &mut Vec<String>) {
    for run in report
        .runs
        .iter()
        .filter(|r| r.spec.rdap == rdap && (!r.spec.one_project || r.spec.look == Look::On))
    {
        for a in &run.attacks {
            if a.needed.is_some_and(|k| k <= PLANTED) || a.tried < PLANTED {
                out.push(format!(
                    "RDAP {} {} seed {}: {} flagged a victim ({:?}) after {:?} planted",
                    rdap.label(),
                    run.spec.route.label(),
                    run.seed,
                    a.class,
                    a.victim,
                    a.needed
                ));
            }
        }
        if !run.pushed_ranked.is_empty() || !run.control_ranked {
            out.push(format!(
                "RDAP {} {} seed {}: one project put {:?} on top-domains (listed control ranked: {})",
                rdap.label(),
                run.spec.route.label(),
                run.seed,
                run.pushed_ranked,
                run.control_ranked
            ));
        }
    }
}

fn crowds(report: &Report, rdap: Rdap, out: &mut Vec<String>) {
    for route in [Route::Get, Route::Batch] {
        let cases = report.projects_disagree(rdap, route);
        if !cases.is_empty() {
            out.push(format!(
                "RDAP {} {}: the projects disagree on {} cases: {}",
                rdap.label(),
                route.label(),
                cases.len(),
                cases.join("; ")
            ));
        }
        for run in report.runs(rdap, route) {
            // Through deployment projects: no established victim (a younger one is flagged past
            // `min_listed`: docs/mx.md, "What it cannot catch"). With RDAP off nothing is
            // established.
            // With the look on, no victim at all.
            let carried = run
                .crowds
                .iter()
                .filter(|a| a.through == Through::Deployment);
            let looking = run.spec.look == Look::On;
            for a in carried.filter(|_| rdap != Rdap::Off || looking) {
                let hit = a
                    .flagged
                    .iter()
                    .find(|(b, k)| (looking || *b == Bucket::Old) && *k <= PLANTED);
                if let Some((b, k)) = hit {
                    out.push(format!(
                        "RDAP {} {} seed {}: planting through {} deployment projects, {}: flagged the {b:?} victim after {k} planted",
                        rdap.label(),
                        route.label(),
                        run.seed,
                        a.attackers,
                        a.class,
                    ));
                }
            }
            for a in run
                .crowds
                .iter()
                .filter(|a| a.through == Through::SelfServe)
            {
                if a.needed.is_some_and(|k| k <= PLANTED) || a.tried < PLANTED {
                    out.push(format!(
                        "RDAP {} {} seed {}: {} attackers, {}: flagged a deployment project's victim ({:?}) after {:?} planted",
                        rdap.label(),
                        route.label(),
                        run.seed,
                        a.attackers,
                        a.class,
                        a.victim,
                        a.needed
                    ));
                }
            }
            for r in run.reports.iter().filter(|r| !r.safe.is_empty()) {
                out.push(format!(
                    "RDAP {} {} seed {}: after {} attackers' `safe` reports a deployment project got `safe` for {:?}",
                    rdap.label(),
                    route.label(),
                    run.seed,
                    r.attackers,
                    r.safe
                ));
            }
        }
    }
}
