//! Build script: stamps the git commit into the binary for `drg_build_info` and `--version`
//! ("unknown" when built outside a git checkout, e.g. from a source archive), and renders the
//! command line's definition (`src/args.rs`) as the man page and the bash, zsh and fish
//! completions, into `<target>/<profile>/assets/` where the Debian package and the image take them.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::CommandFactory;

#[allow(dead_code)] // the build script reads the definition, not the parsed values
#[path = "src/args.rs"]
mod args;

fn main() {
    git_hash();
    if let Err(e) = assets() {
        panic!("man page and completions: {e}");
    }
    println!("cargo:rerun-if-changed=src/args.rs");
}

/// The man page and the completions, from the same clap definition the binary parses with.
fn assets() -> std::io::Result<()> {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is <target>/<profile>/build/<package>-<hash>/out.
    let dir = out
        .ancestors()
        .nth(3)
        .expect("OUT_DIR under the target folder")
        .join("assets");
    std::fs::create_dir_all(&dir)?;
    let command = args::Cli::command().version(env!("CARGO_PKG_VERSION"));
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut page)?;
    std::fs::write(dir.join("domain-risk-gateway.1"), page)?;
    let name = "domain-risk-gateway";
    for (shell, file) in [
        (clap_complete::Shell::Bash, "domain-risk-gateway.bash"),
        (clap_complete::Shell::Zsh, "_domain-risk-gateway"),
        (clap_complete::Shell::Fish, "domain-risk-gateway.fish"),
    ] {
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut command.clone(), name, &mut text);
        std::fs::write(dir.join(file), text)?;
    }
    Ok(())
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
    let git = Path::new(".git");
    for file in ["HEAD", "packed-refs"] {
        if git.join(file).exists() {
            println!("cargo:rerun-if-changed=.git/{file}");
        }
    }
    if let Ok(head) = std::fs::read_to_string(git.join("HEAD")) {
        if let Some(reference) = head.trim().strip_prefix("ref: ") {
            if git.join(reference).exists() {
                println!("cargo:rerun-if-changed=.git/{reference}");
            }
        }
    }
}
