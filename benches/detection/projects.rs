//! Who asks in a several-project deployment of the detection world: its projects (4 by
//! default, up to 20 with `--projects N`), all on one plan, and the attacker
//! projects (up to 10), each on a self-serve plan.

use super::facts;

/// The four projects of the default deployment, whose signups the cases are.
pub const PROJECTS: [&str; 4] = ["web", "shop", "forum", "app"];
/// A deployment's projects: the default four first, then `p05` to `p20`.
const NAMES: [&str; 20] = [
    "web", "shop", "forum", "app", "p05", "p06", "p07", "p08", "p09", "p10", "p11", "p12", "p13",
    "p14", "p15", "p16", "p17", "p18", "p19", "p20",
];
/// The most projects a deployment has.
pub const MAX_PROJECTS: usize = NAMES.len();
/// The attacker projects: the first plants and pushes alone; K of them plant or report together.
pub const ATTACKERS: [&str; 10] = [
    "mallory",
    "mallory02",
    "mallory03",
    "mallory04",
    "mallory05",
    "mallory06",
    "mallory07",
    "mallory08",
    "mallory09",
    "mallory10",
];
/// The project that plants and pushes alone.
pub const ATTACKER: &str = ATTACKERS[0];
/// The only project of a one-project deployment (victims and attacker alike).
pub const SOLO: &str = "solo";
/// The plan of the projects (and of the one-project deployment's): the one a build from before
/// issue 85's end trusted (`DRG_BENCH_TRUSTED_PLAN`); now a plan like any other.
pub const TRUSTED_PLAN: &str = "test";
/// The attackers' plan: a self-serve account.
pub const SELF_SERVE_PLAN: &str = "selfserve";

/// The first `n` projects' names.
pub fn named(n: usize) -> Vec<&'static str> {
    assert!(
        (1..=MAX_PROJECTS).contains(&n),
        "--projects 1..={MAX_PROJECTS}, not {n}"
    );
    NAMES[..n].to_vec()
}

/// Each project's share of the signups: the four of the default deployment as `facts` gives
/// them; any other number of projects equal shares (an assumption).
pub fn shares(n: usize) -> Vec<f64> {
    if n == facts::PROJECT_SHARES.len() {
        facts::PROJECT_SHARES.to_vec()
    } else {
        vec![1.0 / n as f64; n]
    }
}
