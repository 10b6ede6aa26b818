//! `serve`: runs the gateway until signalled.

use std::path::Path;

use super::{settings, CommandError};

/// Builds the first table and key set (bad ones stop the start), then serves until signalled.
pub fn serve(conf: &Path, listen: Option<&str>) -> Result<(), CommandError> {
    crate::server::run(settings(conf, listen)?)
}
