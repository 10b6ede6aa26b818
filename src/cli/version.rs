//! `--version`: the version, the git commit, and the dataset version (`X-Dataset-Version` of a
//! gateway started now) of the configured data: the shipped data with the shipped config.

use std::path::Path;

use crate::config::Settings;

/// Where the Debian package and the container image put the config: read when the given config
/// (by default `conf/gateway.yaml`, a checkout's) is not there.
const PACKAGED_CONF: &str = "/etc/domain-risk-gateway/gateway.yaml";

/// The lines `--version` prints; the dataset line says why when the data cannot be read.
pub fn version(conf: &Path) -> String {
    let head = format!(
        "domain-risk-gateway {} (commit {})",
        env!("CARGO_PKG_VERSION"),
        env!("DRG_GIT_HASH")
    );
    let conf = if conf.exists() {
        conf
    } else {
        Path::new(PACKAGED_CONF)
    };
    let dataset = match Settings::load(conf) {
        Ok(settings) => {
            let sources = settings.gateway.data_sources();
            match sources.build() {
                Ok(table) => format!(
                    "dataset {} ({} names in {}, per {})",
                    table.version().as_str(),
                    table.len(),
                    sources.dir.display(),
                    conf.display()
                ),
                Err(e) => format!("dataset unknown: {e}"),
            }
        }
        Err(e) => format!("dataset unknown: {e}"),
    };
    format!("{head}\n{dataset}")
}
