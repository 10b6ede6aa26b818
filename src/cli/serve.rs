//! `serve`: runs the gateway until signalled, or takes over from a running one (`--upgrade`).

use std::path::Path;

use super::{settings, CommandError};

/// How `serve` starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServeMode {
    /// Take the listening sockets from the running gateway (over `upgrade_sock`, once it gets
    /// SIGQUIT) instead of binding them.
    pub upgrade: bool,
    /// Run in the background (Pingora's daemon mode: it writes `pid_file`).
    pub daemon: bool,
}

/// Builds the first table and key set (bad ones stop the start), then serves until signalled.
pub fn serve(conf: &Path, listen: Option<&str>, mode: ServeMode) -> Result<(), CommandError> {
    crate::server::run(settings(conf, listen)?, mode)
}
