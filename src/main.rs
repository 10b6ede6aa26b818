//! Command line of domain-risk-gateway: parses arguments and runs a command from the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc: Pingora allocates and frees per request; glibc malloc showed up in its profile.
#[global_allocator]
static GLOBAL: domain_risk_gateway::internals::infra::alloc::Allocator =
    domain_risk_gateway::internals::infra::alloc::Allocator;
use domain_risk_gateway::internals::cli;

#[derive(Parser)]
#[command(version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("DRG_GIT_HASH"), ")"), about)]
struct Cli {
    /// Config file (Pingora server keys plus a `gateway:` section).
    #[arg(short, long, global = true, default_value = "conf/gateway.yaml")]
    conf: PathBuf,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (the default).
    Serve {
        /// Listen on this ip:port instead of the configured `gateway.listen`.
        #[arg(long)]
        listen: Option<String>,
        /// Take the listening sockets over from the running gateway (same config): start this,
        /// then send SIGQUIT to the old process.
        #[arg(long)]
        upgrade: bool,
        /// Run in the background and write the pid file (`pid_file`).
        #[arg(long)]
        daemon: bool,
    },
    /// Validate the config and data files, then exit.
    CheckConfig,
    /// Classify a domain from the configured data and show which rule decided.
    Lookup { domain: String },
    /// Resolve the MX hosts of every listed throwaway name into a snapshot the gateway loads at
    /// start (`gateway.mx.neighbourhood.snapshot`); resumable: run it again to go on.
    MxSnapshot {
        /// The snapshot file (appended to; names already in it are skipped).
        #[arg(long)]
        out: PathBuf,
        /// Names resolved at once.
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
        concurrency: u32,
        /// Names started per second at most.
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100000))]
        rate: u32,
        /// Stop after this many new names.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Manage API keys.
    #[command(subcommand)]
    Key(KeyCommand),
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Generate a new key: prints the secret once, and the entry for the keys file.
    New {
        /// The key's id (letters, digits, '-', '_', '.'), shown to the upstream and in usage.
        #[arg(long)]
        id: String,
        /// One of the plans configured under gateway.access.plans.
        #[arg(long)]
        plan: String,
        /// An authorised origin (repeatable); none makes a server key.
        #[arg(long = "origin")]
        origins: Vec<String>,
        /// The project whose quota the key shares (default: its own id).
        #[arg(long)]
        project: Option<String>,
        /// Append the entry to the configured keys file instead of printing it.
        #[arg(long)]
        append: bool,
    },
}

fn main() -> ExitCode {
    if let Err(e) = domain_risk_gateway::install_logger() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let cli = Cli::parse();
    let serve = Command::Serve {
        listen: None,
        upgrade: false,
        daemon: false,
    };
    let result = match cli.command.unwrap_or(serve) {
        Command::Serve {
            listen,
            upgrade,
            daemon,
        } => {
            let mode = cli::ServeMode { upgrade, daemon };
            cli::serve(&cli.conf, listen.as_deref(), mode).map(|()| None)
        }
        Command::CheckConfig => cli::check_config(&cli.conf).map(Some),
        Command::Lookup { domain } => cli::lookup(&cli.conf, &domain).map(Some),
        Command::MxSnapshot {
            out,
            concurrency,
            rate,
            limit,
        } => {
            let opts = cli::SnapshotOptions {
                concurrency: concurrency as usize,
                rate,
                limit,
            };
            cli::mx_snapshot(&cli.conf, &out, opts).map(Some)
        }
        Command::Key(KeyCommand::New {
            id,
            plan,
            origins,
            project,
            append,
        }) => cli::key_new(&cli.conf, &id, &plan, &origins, project.as_deref(), append).map(Some),
    };
    match result {
        Ok(output) => {
            if let Some(output) = output {
                println!("{output}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
