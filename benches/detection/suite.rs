//! A set of detection runs: every seed's world under every condition asked, on GET and on the
//! batch route, in a several-project deployment and (unless left out) a one-project one; run
//! side by side, each against a gateway and servers of its own.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use super::client::Route;
use super::runner::{self, Run};
use super::spec::{Look, Rdap, Spec};
use super::world::{Shipped, Size, World};

/// What to run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seeds: Vec<u64>,
    pub size: Size,
    pub conditions: Vec<Rdap>,
    /// Also the one-project deployment (the attacks' cost).
    pub one_project: bool,
    /// Runs at once.
    pub jobs: usize,
    pub settle: Duration,
    pub outage: Duration,
    /// Listed domains each attack plants at most.
    pub planted: usize,
}

/// The worlds of `plan`'s seeds.
pub fn worlds(plan: &Plan, repo: &Path) -> Vec<World> {
    let shipped = Shipped::read(repo);
    plan.seeds
        .iter()
        .map(|&seed| World::build(seed, plan.size, &shipped))
        .collect()
}

/// Runs every deployment of `plan` over `worlds` with the gateway's look on (see
/// [`run_looking`]).
#[allow(dead_code)]
pub fn run(plan: &Plan, worlds: &[World], repo: &Path) -> (Vec<Run>, Vec<String>) {
    run_looking(plan, worlds, repo, Look::On)
}

/// Runs every deployment of `plan` over `worlds` (the longest first), `plan.jobs` at once, the
/// gateway's look at its listed names as `look` says; the runs, and why each run that did not
/// finish did not.
pub fn run_looking(
    plan: &Plan,
    worlds: &[World],
    repo: &Path,
    look: Look,
) -> (Vec<Run>, Vec<String>) {
    let mut todo: Vec<(usize, Spec)> = Vec::new();
    for one_project in [false, true] {
        if one_project && !plan.one_project {
            continue;
        }
        for &rdap in &plan.conditions {
            for (w, _) in worlds.iter().enumerate() {
                for route in [Route::Get, Route::Batch] {
                    let spec = Spec {
                        rdap,
                        look,
                        route,
                        one_project,
                        settle: plan.settle,
                        outage: plan.outage,
                        planted: plan.planted,
                    };
                    todo.push((w, spec));
                }
            }
        }
    }
    // RDAP on and failing wait for the registries: they start first.
    todo.sort_by_key(|(_, s)| (s.one_project, s.rdap == Rdap::Off));
    let queue = Mutex::new(todo.into_iter());
    let runs = Mutex::new(Vec::new());
    let failed = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..plan.jobs.max(1) {
            s.spawn(|| loop {
                let Some((w, spec)) = queue.lock().unwrap().next() else {
                    return;
                };
                let r = std::panic::catch_unwind(|| runner::run(&worlds[w], repo, spec));
                match r {
                    Ok(r) => runs.lock().unwrap().push(r),
                    Err(e) => failed.lock().unwrap().push(format!(
                        "seed {} RDAP {} {}{}: {}",
                        worlds[w].seed,
                        spec.rdap.label(),
                        spec.route.label(),
                        if spec.one_project { " one project" } else { "" },
                        e.downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| e.downcast_ref::<&str>().copied())
                            .unwrap_or("panicked")
                    )),
                }
            });
        }
    });
    let mut runs = runs.into_inner().unwrap();
    let failed = failed.into_inner().unwrap();
    runs.sort_by_key(|r| {
        (
            r.spec.one_project,
            r.spec.rdap,
            r.seed,
            r.spec.route == Route::Batch,
        )
    });
    (runs, failed)
}
