//! Fuzzes the config parser (our sections and Pingora's server keys).

use std::path::Path;

use drg_gateway::config::Settings;

/// Checks one input; panics on a broken promise.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(settings) = Settings::from_yaml(text, Path::new("/etc/drg/gateway.yaml")) {
        // Accepted settings have no problems left, and their derived values do not panic.
        let problems = settings.gateway.problems();
        assert!(problems.is_empty(), "{problems:?}");
        let _ = settings.listens_on_loopback();
        let _ = settings.gateway.upstream.server_name();
    }
}
