//! The detection benchmark: a labelled world of throwaway clusters, real users' domains that
//! must not be flagged, unusable mail set-ups and planting attacks, served by DNS and RDAP
//! servers on loopback, looked up through the real gateway binary; prints one table.
//!
//! ```text
//! benches/detection/run              # the full world (20 cases a class), release build
//! benches/detection/run -- --slice   # 8 cases a class
//! benches/detection/run -- --no-rdap # without domain age (what RDAP buys)
//! benches/detection/run -- --cases   # every case's answers after the table
//! ```
//! The gate itself is `tests/detection.rs`; results with their commit go in
//! `benches/RESULTS-detection.md`.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/dns.rs"]
#[allow(dead_code)]
mod dns;
#[path = "../../tests/common/rdap.rs"]
mod rdap_server;
mod runner;
mod world;

use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo bench` passes `--bench`; the only flag of ours is `--slice`.
    let n = if args.iter().any(|a| a == "--slice") {
        8
    } else {
        20
    };
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let world = world::World::build(n);
    let started = Instant::now();
    let options = runner::Options {
        rdap: !args.iter().any(|a| a == "--no-rdap"),
    };
    let report = runner::run(&world, repo, options);
    println!(
        "detection benchmark: {} cases, {} attacks, {n} a class, RDAP {}, {:.1} s\n",
        world.cases.len(),
        world.attacks.len() + 1,
        if options.rdap { "on" } else { "off" },
        started.elapsed().as_secs_f64()
    );
    print!("{}", report.table());
    if args.iter().any(|a| a == "--cases") {
        for o in &report.outcomes {
            println!(
                "{:<40} {:<32} {:<14} first {} {} settled {} {}",
                o.domain,
                o.class,
                o.expect.as_str(),
                o.first.reason,
                o.first.score,
                o.settled.reason,
                o.settled.score
            );
        }
    }
}
