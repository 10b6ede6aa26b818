//! `check-config`: validates the config, data and keys files without serving.

use std::path::Path;

use super::{settings, CommandError};
use crate::server::keys_source;
use drg_evidence::data::files::summary;

/// Validates the config, data and keys without serving; the summary on success.
pub fn check_config(conf: &Path) -> Result<String, CommandError> {
    let settings = settings(conf, Default::default())?;
    let table = settings.gateway.data_sources().build()?;
    let keys = keys_source(&settings).load()?;
    // The alerts' secret is read at start: a missing or short one stops it, so it is checked here.
    if let Some(alerts) = &settings.gateway.quota.alerts {
        alerts.read_secret()?;
    }
    let tls = match &settings.gateway.tls {
        Some(tls) => format!(
            " (TLS: {})",
            crate::edge::tls::CertPair::load_current(&tls.cert, &tls.key)?
        ),
        None => String::new(),
    };
    Ok(format!(
        "{}: ok; listen {}{tls}; upstream {}; {} keys; data {}: dataset {}, {}",
        conf.display(),
        settings.gateway.listen,
        settings.gateway.upstream.address,
        keys.len(),
        settings.gateway.data.dir.display(),
        table.version().as_str(),
        summary(&table)
    ))
}
