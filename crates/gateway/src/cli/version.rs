//! `--version`: the version, the git commit, and where the configured data lives (the shipped
//! data with the shipped config). It reads the config only, never the data: building a table of
//! millions of names to print a version would take seconds and gigabytes, and a data file that
//! cannot be read must not stop it; `check-config` builds the table and prints its dataset
//! version.

use std::path::Path;

use crate::config::Settings;

/// The commit the gateway was built from (the telemetry crate's `build.rs`; "unknown" outside a
/// git checkout), as `--version` and `drg_build_info` show it.
pub const GIT_HASH: &str = drg_telemetry::GIT_HASH;

/// Where the Debian package and the container image put the config: read when the given config
/// (by default `conf/gateway.yaml`, a checkout's) is not there.
const PACKAGED_CONF: &str = "/etc/domain-risk-gateway/gateway.yaml";

/// The lines `--version` prints; the data line says why when the config cannot be read.
pub fn version(conf: &Path) -> String {
    let head = format!(
        "domain-risk-gateway {} (commit {})",
        env!("CARGO_PKG_VERSION"),
        GIT_HASH
    );
    let conf = if conf.exists() {
        conf
    } else {
        Path::new(PACKAGED_CONF)
    };
    let data = match Settings::load(conf) {
        Ok(settings) => format!(
            "data in {} (per {}; `check-config` prints its dataset version)",
            settings.gateway.data_sources().dir.display(),
            conf.display()
        ),
        Err(e) => format!("data unknown: {e}"),
    };
    format!("{head}\n{data}")
}
