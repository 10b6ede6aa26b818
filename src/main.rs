//! Command line of domain-risk-gateway: parses arguments and runs a command from the library.

use std::process::ExitCode;

use clap::Parser;

mod args;
use args::{Cli, Command, KeyCommand, ReportsCommand};

/// mimalloc: Pingora allocates and frees per request; glibc malloc showed up in its profile.
#[global_allocator]
static GLOBAL: drg_base::infra::alloc::Allocator = drg_base::infra::alloc::Allocator;
use drg_gateway::cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.version {
        // Before the logger: the table build's log line is not part of the answer.
        println!("{}", cli::version(&cli.conf));
        return ExitCode::SUCCESS;
    }
    if let Err(e) = domain_risk_gateway::install_logger() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let serve = Command::Serve {
        listen: None,
        admin_listen: None,
        upgrade: false,
        daemon: false,
    };
    let result = match cli.command.unwrap_or(serve) {
        Command::Serve {
            listen,
            admin_listen,
            upgrade,
            daemon,
        } => {
            let mode = cli::ServeMode { upgrade, daemon };
            let over = cli::ListenOverride {
                listen: listen.as_deref(),
                admin: admin_listen.as_deref(),
            };
            cli::serve(&cli.conf, over, mode).map(|()| None)
        }
        Command::CheckConfig => cli::check_config(&cli.conf).map(Some),
        Command::Health => cli::health(&cli.conf).map(Some),
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
        Command::Key(KeyCommand::Sync { dry_run }) => cli::key_sync(&cli.conf, dry_run).map(Some),
        Command::Key(KeyCommand::Revoke { id }) => cli::key_revoke(&cli.conf, &id).map(Some),
        Command::Reports(what) => {
            let action = match &what {
                ReportsCommand::List { all } => cli::ReportsAction::List { all: *all },
                ReportsCommand::Accept { id } => cli::ReportsAction::Accept(id),
                ReportsCommand::Reject { id } => cli::ReportsAction::Reject(id),
            };
            cli::reports(&cli.conf, action).map(Some)
        }
        Command::RestoreWithheld => Err("restore-withheld is gone: API-made keys live in the \
             control store (gateway.control), which gateways never write back to; an earlier \
             release's keys move there once with `domain-risk-gateway migrate`"
            .into()),
        Command::Migrate => cli::migrate(&cli.conf).map(Some),
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
