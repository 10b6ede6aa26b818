//! The detection benchmark's gate: a slice of its labelled world (`benches/detection`, 8 cases
//! a class) through the real binary, with DNS and RDAP servers on loopback. No must-not-flag
//! case is flagged, on the first answer or once evidence settled; each throwaway class keeps
//! its recall floor; unusable mail set-ups are `undeliverable`; no planting attack flags a
//! victim with 20 planted listed domains from one project; one project's repeated lookups put
//! nothing inferred on top-domains.

#[path = "../benches/detection/runner.rs"]
mod runner;
#[path = "../benches/detection/world.rs"]
mod world;

use world::Expect;

/// Recall floors on the first answer, per class (the goals on the full world).
const FLOORS: [(&str, f64); 5] = [
    ("cluster: one host", 0.9),
    ("cluster: numbered hosts", 0.8),
    ("cluster: one /24", 0.8),
    ("minting 5:1", 0.9),
    ("unusable mail", 1.0),
];

#[test]
fn the_gate_slice_flags_no_real_user_keeps_its_floors_and_resists_planting() {
    let world = world::World::build(20);
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let report = runner::run(&world, repo, runner::Options::default());
    let table = report.table();
    let rows = report.rows();
    let wrongly: Vec<String> = report
        .outcomes
        .iter()
        .filter(|o| o.expect == Expect::NotFlagged && (o.first.flagged() || o.settled.flagged()))
        .map(|o| format!("{} ({:?} then {:?})", o.domain, o.first, o.settled))
        .collect();
    assert!(
        wrongly.is_empty(),
        "must-not-flag flagged: {wrongly:?}\n{table}"
    );
    for (class, floor) in FLOORS {
        let row = rows
            .iter()
            .find(|r| r.class == class)
            .unwrap_or_else(|| panic!("no class {class}"));
        let recall = row.correct as f64 / row.cases as f64;
        assert!(
            recall >= floor,
            "{class}: recall {recall} < {floor}\n{table}"
        );
    }
    for a in &report.attacks {
        assert!(
            a.needed.is_none_or(|k| k > 20) && a.tried > 20,
            "{}: a victim flagged after {:?} planted\n{table}",
            a.class,
            a.needed
        );
    }
    assert!(
        report.control_ranked,
        "top-domains never ranked the listed control\n{table}"
    );
    assert!(
        report.pushed_ranked.is_empty(),
        "one project put {:?} on top-domains\n{table}",
        report.pushed_ranked
    );
}
