//! Build script: stamps the git commit for `drg_build_info` and (through `drg_telemetry::GIT_HASH`) `--version`
//! ("unknown" when built outside a git checkout, e.g. from a source archive).

use std::path::Path;
use std::process::Command;

fn main() {
    git_hash();
}

/// `DRG_GIT_HASH`: the commit the build is made from.
fn git_hash() {
    let hash = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=DRG_GIT_HASH={hash}");
    // Rebuild when HEAD moves; a path that does not exist would make every build rerun this.
    // The workspace root's: this crate is `crates/telemetry`.
    let git = Path::new("../../.git");
    for file in ["HEAD", "packed-refs"] {
        if git.join(file).exists() {
            println!("cargo:rerun-if-changed=../../.git/{file}");
        }
    }
    if let Ok(head) = std::fs::read_to_string(git.join("HEAD")) {
        if let Some(reference) = head.trim().strip_prefix("ref: ") {
            if git.join(reference).exists() {
                println!("cargo:rerun-if-changed=../../.git/{reference}");
            }
        }
    }
}
