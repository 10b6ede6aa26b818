//! The CLI subcommands, one file each; `main.rs` only parses arguments and calls these.

mod check_config;
mod daemon;
mod health;
mod key_new;
mod key_revoke;
mod key_sync;
mod lookup;
mod migrate;
mod mx_snapshot;
mod ready;
mod reports;
mod serve;
mod taken;
mod version;

use std::path::Path;

pub use check_config::check_config;
pub use health::health;
pub use key_new::key_new;
pub use key_revoke::key_revoke;
pub use key_sync::key_sync;
pub use lookup::lookup;
pub use migrate::migrate;
pub use mx_snapshot::{mx_snapshot, SnapshotOptions};
pub use reports::{reports, ReportsAction};
pub use serve::serve;
pub use serve::ServeMode;
pub use version::{version, GIT_HASH};

pub use crate::config::ListenOverride;
use crate::config::Settings;

/// A boxed error for command results: each carries its own context.
pub type CommandError = Box<dyn std::error::Error + Send + Sync>;

/// The state folder: where the quota state file is (and every other state file beside it).
fn state_folder(gateway: &crate::config::GatewayConfig) -> std::path::PathBuf {
    (gateway.quota.state_file.parent())
        .unwrap_or(Path::new("."))
        .to_path_buf()
}

/// The control store the configuration names, and a runtime for a command's one call to it.
fn control_store(
    gateway: &crate::config::GatewayConfig,
) -> Result<
    (
        std::sync::Arc<drg_base::infra::control::Control>,
        tokio::runtime::Runtime,
    ),
    CommandError,
> {
    let folder = state_folder(gateway);
    let control = drg_base::infra::control::Control::open(gateway.control.as_ref(), &folder)
        .map_err(|e| format!("gateway.control: {e}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok((control, runtime))
}

/// Loads settings, applying `--listen` and `--admin-listen`.
fn settings(conf: &Path, over: ListenOverride<'_>) -> Result<Settings, CommandError> {
    let mut settings = Settings::load(conf)?;
    settings.override_listeners(over)?;
    Ok(settings)
}
