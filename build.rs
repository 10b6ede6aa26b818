//! Build script: renders the command line's definition (`src/args.rs`) as the man page and the
//! bash, zsh and fish completions, into `<target>/<profile>/assets/` where the Debian package and
//! the image take them. (The commit stamp is `crates/gateway/build.rs`'s.)

use std::path::PathBuf;

use clap::CommandFactory;

#[allow(dead_code)] // the build script reads the definition, not the parsed values
#[path = "src/args.rs"]
mod args;

fn main() {
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
