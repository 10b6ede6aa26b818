//! The command line's definition (clap), shared by the binary (`main.rs`) and the build script,
//! which renders it as the man page and the shell completions the package installs.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "domain-risk-gateway", about, disable_version_flag = true)]
pub struct Cli {
    /// Print the version, the git commit and where the configured data lives (the shipped data
    /// with the packaged config; the data is not read: `check-config` prints its dataset
    /// version), then exit.
    #[arg(short = 'V', long, global = true)]
    pub version: bool,
    /// Config file (Pingora server keys plus a `gateway:` section).
    #[arg(short, long, global = true, default_value = "conf/gateway.yaml")]
    pub conf: PathBuf,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the gateway (the default).
    Serve {
        /// Listen on this ip:port instead of the configured `gateway.listen`.
        #[arg(long)]
        listen: Option<String>,
        /// The admin listener on this ip:port or unix:/path instead of the configured
        /// `gateway.admin.listen` (a second gateway on the same config needs its own).
        #[arg(long)]
        admin_listen: Option<String>,
        /// Take the listening sockets over from the running gateway (same config): start this,
        /// then send SIGQUIT to the old process (with --daemon, this process sends it itself,
        /// once built, to the gateway `pid_file` names).
        #[arg(long)]
        upgrade: bool,
        /// Run in the background: fork first, then build; exit 0 once the listeners accept
        /// (`pid_file` then names the daemon), non-zero if the daemon failed first.
        #[arg(long)]
        daemon: bool,
    },
    /// Validate the config and data files, then exit.
    CheckConfig,
    /// Ask the running gateway's listener for /healthz: exit 0 when it answers 200 (the
    /// container image's health check).
    Health,
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
    /// The projects' reports of wrong verdicts (`POST /v1/reports`): list them grouped by
    /// domain, accept one (its domain written to the allow or block file with its provenance;
    /// the gateways reload it) or reject one.
    #[command(subcommand)]
    Reports(ReportsCommand),
    /// Gone with the shared Redis store of keys: the control store is the truth and nothing is
    /// withheld. Says so.
    #[command(hide = true)]
    RestoreWithheld,
    /// Move what an earlier release kept of the projects' API-made keys, overrides, webhooks,
    /// reports and accepted verdicts (the state folder's files, the shared Redis) into the control store,
    /// once, and tell what moved. Run it with the gateways' configuration.
    Migrate,
}

#[derive(Subcommand)]
pub enum ReportsCommand {
    /// Open reports grouped by domain, as JSON (with --all, decided ones too).
    List {
        #[arg(long)]
        all: bool,
    },
    /// Accept the report (and every open report of the same domain and verdict): `safe` to
    /// allowlist.txt, `disposable` to disposable.txt, with a comment naming the reports.
    Accept { id: String },
    /// Reject the report.
    Reject { id: String },
}

#[derive(Subcommand)]
pub enum KeyCommand {
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
    /// Apply the keys file to the control store: keys made through the API by an operator key
    /// the file no longer holds are revoked with what they made (audited), and that key is
    /// refused by every gateway; a key the file holds again comes back. With several gateways
    /// (PostgreSQL) this is the only way a keys file removes anything from the store.
    Sync {
        /// Say what would change, write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Revoke an API-made key, and every key it made, in the control store (audited): a key a
    /// restore from before its revocation brought back, which a gateway names so.
    Revoke {
        /// The key's id (`key_...`).
        id: String,
    },
}
