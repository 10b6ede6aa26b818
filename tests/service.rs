//! The systemd unit in `conf/`: `systemd-analyze verify` accepts it, and its commands run the
//! real binary through start and the reload (upgrade) dance.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::BIN;

const UNIT: &str = "domain-risk-gateway.service";
const INSTALLED_BIN: &str = "/usr/local/bin/domain-risk-gateway";

fn unit_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("conf")
        .join(UNIT);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The values of `key=` lines in the `[Service]` section, in order.
fn service_values(unit: &str, key: &str) -> Vec<String> {
    let mut in_service = false;
    let mut values = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service {
            if let Some(value) = line.strip_prefix(key).and_then(|r| r.strip_prefix('=')) {
                values.push(value.to_owned());
            }
        }
    }
    values
}

#[test]
fn unit_passes_systemd_analyze_verify() {
    let unit = unit_text();
    assert!(unit.contains(INSTALLED_BIN));
    // verify checks that every Exec line's program exists: point them at the built binary.
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join(UNIT);
    std::fs::write(&path, unit.replace(INSTALLED_BIN, BIN)).unwrap();
    // Without systemd-analyze the test fails: a skip would pass with the unit unchecked.
    let out = Command::new("systemd-analyze")
        .args(["verify", path.to_str().unwrap()])
        .output()
        .unwrap_or_else(|e| {
            panic!("systemd-analyze: {e} (scripts/test installs it: Debian package systemd)")
        });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{stderr}"
    );
    // verify reports unknown or misplaced keys as warnings but still exits 0.
    let unit_warnings: Vec<&str> = stderr.lines().filter(|l| l.contains(UNIT)).collect();
    assert!(unit_warnings.is_empty(), "{unit_warnings:?}");
}

#[test]
fn unit_keeps_its_hardening_and_the_upgrade_dance() {
    let unit = unit_text();
    for (key, value) in [
        ("Type", "forking"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("RuntimeDirectory", "domain-risk-gateway"),
        ("StateDirectory", "domain-risk-gateway"),
        ("PIDFile", "/run/domain-risk-gateway/gateway.pid"),
    ] {
        assert_eq!(service_values(&unit, key), vec![value.to_owned()], "{key}");
    }
    let reload = service_values(&unit, "ExecReload");
    assert_eq!(reload.len(), 3, "{reload:?}");
    assert!(reload[0].ends_with(" check-config"));
    assert_eq!(reload[1], "/bin/kill -QUIT $MAINPID");
    assert!(reload[2].ends_with(" serve --upgrade --daemon"));
}
