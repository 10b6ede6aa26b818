//! The fuzz targets' checks (fuzz/checks/, what `scripts/fuzz` runs under libFuzzer) replayed in
//! the test command: every committed seed, then a few thousand seeded mutations of them (bytes
//! replaced, inserted, cut, chunks repeated, seeds spliced) and random inputs. Not a substitute for
//! coverage-guided runs (`scripts/fuzz`), but a check the code outgrew fails here, with proptest's
//! smallest failing input, instead of at the next long fuzzing session.

use std::path::Path;

use proptest::prelude::*;
use proptest::sample::{select, Index};

#[path = "../fuzz/checks/batch.rs"]
mod batch;
#[path = "../fuzz/checks/check_target.rs"]
mod check_target;
#[path = "../fuzz/checks/config.rs"]
mod config;
#[path = "../fuzz/checks/keys.rs"]
mod keys;
#[path = "../fuzz/checks/mount.rs"]
mod mount;
#[path = "../fuzz/checks/name.rs"]
mod name;
#[path = "../fuzz/checks/origin.rs"]
mod origin;
#[path = "../fuzz/checks/quota_state.rs"]
mod quota_state;
#[path = "../fuzz/checks/route.rs"]
mod route;

/// Inputs per target beyond its seeds: a few seconds of an unoptimised build for the slowest
/// (the config parser), enough to reach each check's refusals and its accepting paths.
const CASES: u32 = 3_000;

/// Bytes the parsers treat specially, favoured by the mutations.
const SPECIAL: &[u8] = b"\0\t\n\r %./:;?@[]\\#&=*-_'\"{}~\x7f\xc3\xa9\xff";

/// One edit of a byte string.
#[derive(Debug, Clone)]
enum Edit {
    Replace(Index, u8),
    Insert(Index, u8),
    Cut(Index, Index),
    Repeat(Index, Index),
}

fn byte() -> impl Strategy<Value = u8> {
    prop_oneof![any::<u8>(), select(SPECIAL)]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), byte()).prop_map(|(i, b)| Edit::Replace(i, b)),
        (any::<Index>(), byte()).prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<Index>(), any::<Index>()).prop_map(|(i, j)| Edit::Cut(i, j)),
        (any::<Index>(), any::<Index>()).prop_map(|(i, j)| Edit::Repeat(i, j)),
    ]
}

fn apply(mut data: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        let len = data.len();
        match *e {
            Edit::Insert(ref i, b) => data.insert(i.index(len + 1), b),
            _ if len == 0 => {}
            Edit::Replace(ref i, b) => data[i.index(len)] = b,
            Edit::Cut(ref i, ref j) => {
                let (a, b) = ordered(i.index(len), j.index(len));
                data.drain(a..=b.min(a + 16));
            }
            Edit::Repeat(ref i, ref j) => {
                let (a, b) = ordered(i.index(len), j.index(len));
                let chunk = data[a..=b.min(a + 64)].to_vec();
                data.splice(a..a, chunk);
            }
        }
    }
    data
}

fn ordered(a: usize, b: usize) -> (usize, usize) {
    (a.min(b), a.max(b))
}

/// The committed seeds of a target (fuzz/seeds/TARGET), which must exist.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|f| std::fs::read(f.unwrap().path()).unwrap())
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

/// Seeds with edits, two seeds spliced, or random bytes.
fn inputs(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let mutated = (select(seeds.clone()), prop::collection::vec(edit(), 1..6))
        .prop_map(|(seed, edits)| apply(seed, &edits));
    let spliced = (
        select(seeds.clone()),
        select(seeds),
        any::<Index>(),
        any::<Index>(),
    )
        .prop_map(|(a, b, i, j)| {
            let mut out = a[..i.index(a.len() + 1)].to_vec();
            out.extend_from_slice(&b[j.index(b.len() + 1)..]);
            out
        });
    let random = prop::collection::vec(byte(), 0..200);
    prop_oneof![6 => mutated, 2 => spliced, 1 => random]
}

/// Runs `check` on every seed of `target`, then on [`CASES`] generated inputs.
fn replay(target: &str, check: fn(&[u8])) {
    let seeds = seeds(target);
    for seed in &seeds {
        check(seed);
    }
    let config = ProptestConfig {
        cases: CASES,
        ..ProptestConfig::default()
    };
    proptest::test_runner::TestRunner::new(config)
        .run(&inputs(seeds), |data| {
            check(&data);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("fuzz target {target}: {e}"));
}

macro_rules! smoke {
    ($($target:ident),* $(,)?) => {$(
        #[test]
        fn $target() {
            replay(stringify!($target), $target::check);
        }
    )*};
}

smoke!(
    batch,
    check_target,
    config,
    keys,
    mount,
    name,
    origin,
    quota_state,
    route
);
