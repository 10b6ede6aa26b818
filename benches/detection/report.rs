//! The detection benchmark's tables, over every seed of a condition (RDAP on, off, failing),
//! GET and batch side by side (the lines on many projects in `crowd_report.rs`); and the goals
//! the gate (`tests/detection.rs`) asserts.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::client::{Answer, Route};
use super::runner::Run;
use super::spec::Rdap;
use super::world::{Arrival, Bucket, Case, Expect, Shape, World};

/// Everything the runs found, with the worlds they ran.
pub struct Report<'a> {
    pub worlds: &'a [World],
    pub runs: Vec<Run>,
    /// Whose answers the tables and goals count: the one-project deployment's (`true`) or the
    /// several projects' (`false`, what the gate holds).
    pub one: bool,
}

/// Conditions whose recall the goals hold (with RDAP off no age is known for any domain; its
/// recall is reported, not held).
pub const FLOOR_CONDITIONS: [Rdap; 2] = [Rdap::On, Rdap::Failing];

/// Found of asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count {
    pub hit: usize,
    pub of: usize,
}

impl Count {
    fn add(&mut self, hit: bool) {
        self.hit += usize::from(hit);
        self.of += 1;
    }

    pub fn rate(self) -> f64 {
        if self.of == 0 {
            1.0
        } else {
            self.hit as f64 / self.of as f64
        }
    }

    fn cell(self) -> String {
        if self.of == 0 {
            "-".into()
        } else {
            format!("{}/{}", self.hit, self.of)
        }
    }
}

/// Whether `a` is the answer `expect` wants.
pub fn right(a: &Answer, expect: Expect) -> bool {
    match expect {
        Expect::Disposable => a.reason == "disposable",
        Expect::Undeliverable => a.reason == "undeliverable",
        Expect::NotFlagged => !a.flagged(),
    }
}

/// Which answer of a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    First,
    Settled,
}

impl Which {
    fn of(self, o: &super::runner::Outcome) -> &Answer {
        match self {
            Which::First => &o.first,
            Which::Settled => &o.settled,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Which::First => "first",
            Which::Settled => "settled",
        }
    }
}

impl Report<'_> {
    pub fn world(&self, seed: u64) -> &World {
        self.worlds
            .iter()
            .find(|w| w.seed == seed)
            .expect("a world per seed")
    }

    /// The runs of `rdap` on `route` of the deployment this report counts (see `one`).
    pub fn runs(&self, rdap: Rdap, route: Route) -> impl Iterator<Item = &Run> {
        self.runs.iter().filter(move |r| {
            r.spec.rdap == rdap && r.spec.route == route && r.spec.one_project == self.one
        })
    }

    /// Counts the answers (`which`) of the cases `pick` takes that `hit` holds, over every seed.
    pub fn count(
        &self,
        rdap: Rdap,
        route: Route,
        which: Which,
        pick: impl Fn(&Case) -> bool,
        hit: impl Fn(&Case, &Answer) -> bool,
    ) -> Count {
        self.count_answers(rdap, route, which, |c, _| pick(c), hit)
    }

    /// [`count`](Self::count), picking by the case and its answer.
    pub fn count_answers(
        &self,
        rdap: Rdap,
        route: Route,
        which: Which,
        pick: impl Fn(&Case, &Answer) -> bool,
        hit: impl Fn(&Case, &Answer) -> bool,
    ) -> Count {
        let mut c = Count::default();
        for run in self.runs(rdap, route) {
            let world = self.world(run.seed);
            for o in &run.outcomes {
                let case = &world.cases[o.case];
                let answer = which.of(o);
                if pick(case, answer) {
                    c.add(hit(case, answer));
                }
            }
        }
        c
    }

    /// Recall of throwaways of `shape` in `bucket` (any when `None`) arriving as `arrival`
    /// (any when `None`), over the answers `keep` keeps.
    #[allow(clippy::too_many_arguments)]
    pub fn recall(
        &self,
        rdap: Rdap,
        route: Route,
        which: Which,
        shape: Shape,
        bucket: Option<Bucket>,
        arrival: Option<Arrival>,
        keep: impl Fn(&Answer) -> bool,
    ) -> Count {
        self.count_answers(
            rdap,
            route,
            which,
            |c, a| {
                c.shape == Some(shape)
                    && bucket.is_none_or(|b| c.bucket == Some(b))
                    && arrival.is_none_or(|a| c.arrival == a)
                    && keep(a)
            },
            |c, a| right(a, c.expect),
        )
    }

    /// The classes other than the throwaway clusters, in the order they first appear.
    fn classes(&self) -> Vec<(&'static str, Expect)> {
        let mut out: Vec<(&'static str, Expect)> = Vec::new();
        for w in self.worlds {
            for c in &w.cases {
                if c.shape.is_none() && !out.iter().any(|(k, _)| *k == c.class) {
                    out.push((c.class, c.expect));
                }
            }
        }
        out
    }

    /// Cases whose GET and batch answers (`which`) differ, by class, over every seed.
    pub fn disagreements(&self, rdap: Rdap, which: Which) -> BTreeMap<&'static str, Vec<String>> {
        self.disagreements_of(rdap, which, |_| true)
    }

    /// [`disagreements`](Self::disagreements) among the cases `keep` keeps.
    pub fn disagreements_of(
        &self,
        rdap: Rdap,
        which: Which,
        keep: impl Fn(&Case) -> bool,
    ) -> BTreeMap<&'static str, Vec<String>> {
        let mut out: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
        for get in self.runs(rdap, Route::Get) {
            let Some(batch) = self.runs(rdap, Route::Batch).find(|b| b.seed == get.seed) else {
                continue;
            };
            let world = self.world(get.seed);
            for (g, b) in get.outcomes.iter().zip(&batch.outcomes) {
                let (ga, ba) = (which.of(g), which.of(b));
                let case = &world.cases[g.case];
                // An answer waiting for a registry's age, or one DNS did not answer in time
                // (failed open), is the model's for that moment: the other route asked at
                // another.
                let timed = ga.timed() || ba.timed();
                if ga.reason != ba.reason && keep(case) && !timed {
                    out.entry(case.class).or_default().push(format!(
                        "{} (GET {} {}, batch {} {})",
                        case.domain, ga.reason, ga.score, ba.reason, ba.score
                    ));
                }
            }
        }
        out
    }

    /// The report's Markdown: every condition's tables.
    pub fn tables(&self) -> String {
        let mut out = String::new();
        for rdap in Rdap::EVERY {
            let of = |one: bool| {
                (self.runs.iter())
                    .filter(|r| r.spec.rdap == rdap && r.spec.one_project == one)
                    .cloned()
                    .collect::<Vec<Run>>()
            };
            if !of(false).is_empty() {
                out.push_str(&self.condition(rdap));
            }
            let runs = of(true);
            if !runs.is_empty() {
                // The usual platform deployment: every lookup from one project.
                let one = Report {
                    worlds: self.worlds,
                    runs,
                    one: true,
                };
                let _ = write!(
                    out,
                    "### RDAP {}, one project\n\n{}\n",
                    rdap.label(),
                    one.rdap_line(rdap)
                );
                out.push_str(&one.recall_table(rdap));
                out.push_str(&one.class_table(rdap));
                out.push_str(&one.pending_line(rdap));
            }
        }
        out
    }

    fn condition(&self, rdap: Rdap) -> String {
        let mut out = format!("### RDAP {}\n\n{}\n", rdap.label(), self.rdap_line(rdap));
        out.push_str(&self.recall_table(rdap));
        out.push_str(&self.class_table(rdap));
        out.push_str(&self.disagreement_lines(rdap));
        out.push_str(&self.attack_table(rdap));
        out.push_str(&self.crowd_tables(rdap));
        out
    }

    /// What the registries did, per route: fetched, failed, still queued when the settling
    /// stopped, and how long it waited; the runs' lengths.
    fn rdap_line(&self, rdap: Rdap) -> String {
        let mut parts = Vec::new();
        for route in [Route::Get, Route::Batch] {
            let runs: Vec<&Run> = self.runs(rdap, route).collect();
            if runs.is_empty() {
                continue;
            }
            let sum = |f: fn(&Run) -> f64| runs.iter().map(|r| f(r)).sum::<f64>();
            let most = |f: fn(&Run) -> f64| runs.iter().map(|r| f(r)).fold(0.0, f64::max);
            let ends: Vec<String> = runs[0]
                .phases
                .iter()
                .enumerate()
                .map(|(i, (name, _))| {
                    let most = runs
                        .iter()
                        .filter_map(|r| r.phases.get(i).map(|p| p.1))
                        .fold(0.0, f64::max);
                    format!("{name} {most:.0}")
                })
                .collect();
            parts.push(format!(
                "{}: phases ending by (s, the slowest seed) {}; the RDAP cache held {:.0} of the past's {} ages at start; RDAP fetched {:.0}, failed {:.0}, still queued at settling {:.0}, not queued (full) {:.0}; settling waited up to {:.0} s; runs up to {:.0} s",
                route.label(),
                ends.join(", "),
                sum(|r| r.rdap.past_loaded),
                runs.iter().map(|r| r.rdap.past).sum::<usize>(),
                sum(|r| r.rdap.found),
                sum(|r| r.rdap.errors),
                sum(|r| r.rdap.queued),
                sum(|r| r.rdap.queue_full),
                most(|r| r.rdap.settle_secs),
                most(|r| r.secs),
            ));
        }
        format!("Over {} seeds. {}.\n", self.worlds.len(), parts.join("; "))
    }

    /// Recall on unlisted throwaways: shape by age bucket and arrival, GET · batch.
    fn recall_table(&self, rdap: Rdap) -> String {
        let mut out = String::from(
            "Recall on unlisted throwaways (`disposable`), GET · batch: by age bucket, by arrival (before or after their host was known), and all.\n\n| shape | answer |",
        );
        for b in Bucket::ALL {
            let _ = write!(out, " {} |", b.label());
        }
        out.push_str(" before host known | after | all |\n|---|---|");
        out.push_str(&"---:|".repeat(Bucket::ALL.len() + 3));
        out.push('\n');
        let all = |_: &Answer| true;
        for shape in Shape::ALL {
            for which in [Which::First, Which::Settled] {
                let cell = |bucket, arrival| {
                    let g = self.recall(rdap, Route::Get, which, shape, bucket, arrival, all);
                    let b = self.recall(rdap, Route::Batch, which, shape, bucket, arrival, all);
                    format!("{} · {}", g.cell(), b.cell())
                };
                let _ = write!(out, "| {} | {} |", shape.label(), which.label());
                for b in Bucket::ALL {
                    let _ = write!(out, " {} |", cell(Some(b), None));
                }
                let _ = writeln!(
                    out,
                    " {} | {} | {} |",
                    cell(None, Some(Arrival::Before)),
                    cell(None, Some(Arrival::After)),
                    cell(None, None)
                );
            }
        }
        out.push('\n');
        out
    }

    /// Every other class: must-not-flag ones flagged, unusable ones right, GET · batch.
    fn class_table(&self, rdap: Rdap) -> String {
        let mut out = String::from(
            "Other classes, GET · batch: must-not-flag classes *flagged* (anything but `safe`), the others *right* (`undeliverable`).\n\n| class | expected | cases a run | first | settled |\n|---|---|---:|---:|---:|\n",
        );
        for (class, expect) in self.classes() {
            let per_run = self.worlds[0]
                .cases
                .iter()
                .filter(|c| c.class == class)
                .count();
            let cell = |which| {
                let mut cells = Vec::new();
                for route in [Route::Get, Route::Batch] {
                    let c = self.count(
                        rdap,
                        route,
                        which,
                        |c| c.class == class,
                        |c, a| match expect {
                            Expect::NotFlagged => a.flagged(),
                            _ => right(a, c.expect),
                        },
                    );
                    cells.push(c.cell());
                }
                cells.join(" · ")
            };
            let _ = writeln!(
                out,
                "| {class} | {} | {per_run} | {} | {} |",
                expect.as_str(),
                cell(Which::First),
                cell(Which::Settled)
            );
        }
        out.push('\n');
        out
    }

    /// How many first answers waited for a registry's age, GET · batch.
    fn pending_line(&self, rdap: Rdap) -> String {
        let pending = |route| {
            let runs = self.runs(rdap, route);
            let (mut waited, mut no_mx, mut all) = (0, 0, 0);
            for run in runs {
                all += run.outcomes.len();
                waited += run.outcomes.iter().filter(|o| o.first.pending).count();
                no_mx += run
                    .outcomes
                    .iter()
                    .filter(|o| o.first.no_mx_in_time)
                    .count();
            }
            (format!("{waited}/{all}"), format!("{no_mx}/{all}"))
        };
        let (get, batch) = (pending(Route::Get), pending(Route::Batch));
        format!(
            "First answers waiting for a registry's age on its way (`age_pending`, `safe` 40), GET · batch: {} · {}; with no MX evidence within the lookup's budget (`mx.status: unknown`, failed open): {} · {}.\n\n",
            get.0, batch.0, get.1, batch.1
        )
    }

    fn disagreement_lines(&self, rdap: Rdap) -> String {
        let mut out = self.pending_line(rdap);
        for which in [Which::First, Which::Settled] {
            let d = self.disagreements(rdap, which);
            let total: usize = d.values().map(Vec::len).sum();
            let by: Vec<String> = d.iter().map(|(k, v)| format!("{k} {}", v.len())).collect();
            let _ = writeln!(
                out,
                "GET and batch disagree on the {} answer of {total} cases{}{}.",
                which.label(),
                if by.is_empty() { "" } else { ": " },
                by.join(", ")
            );
        }
        out.push('\n');
        out
    }

    /// The attacks: planted listed domains to flag a victim, per seed, per deployment and
    /// route; and top-domains.
    fn attack_table(&self, rdap: Rdap) -> String {
        let mut out = String::from("Attacks: planted listed domains after which each victim was flagged (its age bucket; `+` between victims), per seed; `none/N`: no victim flagged after N.\n\n| attack | several projects, GET | several projects, batch | one project, GET | one project, batch |\n|---|---|---|---|---|\n");
        let classes: Vec<&'static str> = self.worlds[0].attacks.iter().map(|a| a.class).collect();
        for (i, class) in classes.iter().enumerate() {
            let _ = write!(out, "| {class} |");
            for one in [false, true] {
                for route in [Route::Get, Route::Batch] {
                    let cells: Vec<String> = self
                        .runs
                        .iter()
                        .filter(|r| r.spec.rdap == rdap && r.spec.route == route)
                        .filter(|r| r.spec.one_project == one)
                        .filter_map(|r| r.attacks.get(i))
                        .map(|a| a.cell())
                        .collect();
                    let _ = write!(
                        out,
                        " {} |",
                        if cells.is_empty() {
                            "-".into()
                        } else {
                            cells.join(", ")
                        }
                    );
                }
            }
            out.push('\n');
        }
        for route in [Route::Get, Route::Batch] {
            let ranked: Vec<String> = self
                .runs(rdap, route)
                .map(|r| {
                    format!(
                        "{}{}",
                        r.pushed_ranked.len(),
                        if r.control_ranked {
                            ""
                        } else {
                            " (control not ranked)"
                        }
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "\nRepeated lookups for top-domains ({}): pushed names ranked, per seed: {}.",
                route.label(),
                ranked.join(", ")
            );
        }
        out.push('\n');
        out
    }
}
