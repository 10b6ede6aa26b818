//! `serve`: runs the gateway until signalled, or takes over from a running one (`--upgrade`).

use std::path::Path;

use super::{settings, CommandError};
use crate::server::ServeMode;

/// Builds the first table and key set (bad ones stop the start), then serves until signalled.
pub fn serve(conf: &Path, listen: Option<&str>, mode: ServeMode) -> Result<(), CommandError> {
    crate::server::run(settings(conf, listen)?, mode)
}
