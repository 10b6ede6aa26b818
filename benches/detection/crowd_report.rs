//! The detection report's lines on many projects: the cases the deployment's projects answered
//! differently when all asked at once, the planting attacks of K self-serve attacker projects
//! together, and what K attackers' `safe` reports did to a deployment project's answers.

use std::fmt::Write as _;

use super::attacks::PARENT_SHAPE;
use super::client::Route;
use super::crowds::{CARRIERS, CROWDS, SHAPES};
use super::report::Report;
use super::runner::Run;
use super::spec::Rdap;
use super::world::Through;

impl Report<'_> {
    /// The cases the projects disagreed on in the runs of `rdap` on `route`, over every seed,
    /// one line each: seed, name, class, each project's answer.
    pub fn projects_disagree(&self, rdap: Rdap, route: Route) -> Vec<String> {
        let mut out = Vec::new();
        for run in self.runs(rdap, route) {
            let world = self.world(run.seed);
            for d in &run.every.disagree {
                let case = &world.cases[d.case];
                let answers: Vec<String> = d
                    .answers
                    .iter()
                    .map(|(p, a)| format!("{p} {} {}", a.reason, a.score))
                    .collect();
                out.push(format!(
                    "seed {} {} ({}): {}",
                    run.seed,
                    case.domain,
                    case.class,
                    answers.join(", ")
                ));
            }
        }
        out
    }

    /// The projects of the report's worlds (they have one number of projects).
    fn projects(&self) -> usize {
        self.worlds.first().map_or(0, |w| w.projects.len())
    }

    /// The tables on many projects of condition `rdap`.
    pub fn crowd_tables(&self, rdap: Rdap) -> String {
        let mut out = String::new();
        let counts: Vec<String> = [Route::Get, Route::Batch]
            .iter()
            .map(|&route| {
                let runs: Vec<&Run> = self.runs(rdap, route).collect();
                let sum = |f: fn(&Run) -> usize| runs.iter().map(|r| f(r)).sum::<usize>();
                if runs.is_empty() {
                    "-".into()
                } else {
                    format!(
                        "{} ({} answers, {} errors)",
                        sum(|r| r.every.disagree.len()),
                        sum(|r| r.every.answers),
                        sum(|r| r.every.errors)
                    )
                }
            })
            .collect();
        let cases: usize = self.worlds.iter().map(|w| w.cases.len()).sum();
        let _ = writeln!(
            out,
            "Projects disagree: every case asked by every one of the {} projects at once, after the settled answers; cases answered with more than one `reason` of {cases}, GET · batch: {}.\n",
            self.projects(),
            counts.join(" · ")
        );
        out.push_str(&self.crowd_attack_table(rdap, Through::SelfServe));
        out.push_str(&self.crowd_attack_table(rdap, Through::Deployment));
        out.push_str(&self.report_table(rdap));
        out
    }

    /// Per seed, what `f` says of each several-project run of `rdap` on `route`.
    fn per_seed(&self, rdap: Rdap, route: Route, f: impl Fn(&Run) -> Option<String>) -> String {
        let cells: Vec<String> = self.runs(rdap, route).filter_map(f).collect();
        if cells.is_empty() {
            "-".into()
        } else {
            cells.join(", ")
        }
    }

    /// K projects' planting attacks (`through` self-serve attackers or the deployment's own
    /// deployment projects): planted listed domains after which a victim of a deployment project was
    /// flagged, per seed.
    fn crowd_attack_table(&self, rdap: Rdap, through: Through) -> String {
        let (intro, ks) = match through {
            Through::SelfServe => ("Attacks by K self-serve attacker projects together (the k-th planted by attacker k mod K)", &CROWDS[..]),
            Through::Deployment => ("Attacks carried by K of the deployment's own projects (the k-th planted looked up by project k mod K: end users typing the planted addresses into their sign-up forms)", &CARRIERS[..]),
        };
        let mut out = format!("{intro}, victims asked by a deployment project: planted listed domains after which each victim was flagged (its age bucket; `+` between victims), per seed; `none/N`: no victim flagged after N.\n\n| attack | K | several projects, GET | several projects, batch |\n|---|---:|---|---|\n");
        let shapes: Vec<&str> = match through {
            Through::SelfServe => SHAPES.to_vec(),
            Through::Deployment => SHAPES.iter().copied().chain([PARENT_SHAPE]).collect(),
        };
        for &k in ks {
            // The deployment crowds are the deployment's own projects: at most as many.
            let k = match through {
                Through::Deployment => k.min(self.projects().max(1)),
                Through::SelfServe => k,
            };
            for &shape in &shapes {
                let _ = write!(out, "| {shape} | {k} |");
                for route in [Route::Get, Route::Batch] {
                    let cell = self.per_seed(rdap, route, |r| {
                        let a = r.crowds.iter().find(|a| {
                            a.attackers == k && a.class == shape && a.through == through
                        })?;
                        Some(a.cell())
                    });
                    let _ = write!(out, " {cell} |");
                }
                out.push('\n');
            }
        }
        out.push('\n');
        out
    }

    /// K attackers' `safe` reports: of the reported throwaways and one unreported one on the
    /// same host, how many a deployment project got `safe`, per seed.
    fn report_table(&self, rdap: Rdap) -> String {
        let mut out = String::from("`safe` reports by K self-serve attacker projects (each looks up and reports the same throwaways on a known throwaway host; no operator accepts): names a deployment project got flagged before the reports and `safe` after them, of the reported ones and one unreported one on that host (`+u`: the unreported one among them), per seed; the attackers' own answers flagged before reporting; reports refused.\n\n| K | reported | GET | batch | flagged before (GET · batch) | refused |\n|---:|---:|---|---|---|---:|\n");
        for k in CROWDS {
            let of = |r: &Run| r.reports.iter().find(|o| o.attackers == k).cloned();
            let reported = self.runs.iter().find_map(&of).map_or(0, |o| o.reported);
            let safe = |route| {
                self.per_seed(rdap, route, |r| {
                    let o = of(r)?;
                    let u = if o.unreported_safe { " +u" } else { "" };
                    Some(format!("{}/{}{u}", o.safe.len(), o.reported + 1))
                })
            };
            let before = |route| {
                self.per_seed(rdap, route, |r| {
                    of(r).map(|o| format!("{}/{}", o.flagged_before, o.reported))
                })
            };
            let refused: usize = self
                .runs
                .iter()
                .filter(|r| r.spec.rdap == rdap)
                .filter_map(of)
                .map(|o| o.refused)
                .sum();
            let _ = writeln!(
                out,
                "| {k} | {reported} | {} | {} | {} · {} | {refused} |",
                safe(Route::Get),
                safe(Route::Batch),
                before(Route::Get),
                before(Route::Batch)
            );
        }
        out.push('\n');
        out
    }

    /// Every run's disagreeing cases (`--cases`; the gate does not print them).
    #[allow(dead_code)]
    pub fn disagree_cases(&self) -> String {
        let mut out = String::new();
        for rdap in Rdap::EVERY {
            for route in [Route::Get, Route::Batch] {
                let lines = self.projects_disagree(rdap, route);
                if lines.is_empty() {
                    continue;
                }
                let _ = writeln!(
                    out,
                    "\n## projects disagree: RDAP {}, {}",
                    rdap.label(),
                    route.label()
                );
                for l in lines {
                    let _ = writeln!(out, "{l}");
                }
            }
        }
        out
    }
}
