//! libFuzzer's entry for `fuzz/checks/mount.rs`, which holds what is checked (the test command
//! replays the same check on the seeds and their mutations).
#![no_main]

#[path = "../checks/mount.rs"]
mod check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| check::check(data));
