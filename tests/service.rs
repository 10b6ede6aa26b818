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
    // The new process signals the old one itself, once built: nothing signals it before.
    let reload = service_values(&unit, "ExecReload");
    assert_eq!(reload.len(), 2, "{reload:?}");
    assert!(reload[0].ends_with(" check-config"));
    assert!(reload[1].ends_with(" serve --upgrade --daemon"));
}

/// Runs the unit's `key=` commands in order on `folder`'s config, as systemd does: the first that
/// fails ends the run. Whether all succeeded.
fn run_unit(
    unit: &str,
    key: &str,
    folder: &crate::daemon::Folder,
    main_pid: u32,
    env: &[(&str, &str)],
) -> bool {
    for line in service_values(unit, key) {
        let line = line
            .replace(INSTALLED_BIN, BIN)
            .replace("$MAINPID", &main_pid.to_string())
            .replace(
                "/etc/domain-risk-gateway/gateway.yaml",
                folder.conf().to_str().unwrap(),
            );
        let mut words = line.split_whitespace();
        let mut command = Command::new(words.next().unwrap());
        command.args(words);
        let (status, took) = folder.run_command(command, env);
        eprintln!("{key}: {line}: {status} after {took:?}");
        if !status.success() {
            return false;
        }
    }
    true
}

/// `systemctl reload` with the unit's own commands: a new process that cannot start fails the
/// reload and leaves the running gateway serving, ready; one that can takes over.
#[test]
fn a_failed_reload_leaves_the_gateway_serving_and_a_good_one_takes_over() {
    use crate::daemon::{alive, Daemon, Folder};
    let unit = unit_text();
    let folder = Folder::new();
    assert!(
        run_unit(&unit, "ExecStart", &folder, 0, &[]),
        "{}",
        folder.log()
    );
    let old = Daemon(folder.pid());
    // check-config passes, the start fails (the quota clock cannot be read).
    let broken = [("DOMAIN_RISK_GATEWAY_CLOCK_START", "not a time")];
    let reloaded = run_unit(&unit, "ExecReload", &folder, old.0, &broken);
    assert!(!reloaded, "a reload that could not start succeeded");
    assert_eq!(
        folder.pid(),
        old.0,
        "the pid file names the running gateway"
    );
    let r = folder.admin_get("/readyz").unwrap();
    let v = r.json();
    assert_eq!(
        (r.status, v["status"].as_str(), v["pid"].as_u64()),
        (200, Some("ready"), Some(u64::from(old.0))),
        "{}",
        folder.log()
    );
    let lookup = common::Conn::open(folder.addr)
        .unwrap()
        .get("/v1/public/domain/example.org")
        .unwrap();
    assert_eq!(lookup.status, 200);
    // The same reload with a process that starts.
    assert!(
        run_unit(&unit, "ExecReload", &folder, old.0, &[]),
        "{}",
        folder.log()
    );
    let new = Daemon(folder.pid());
    assert_ne!(new.0, old.0);
    assert!(common::listens_on(new.0, folder.addr.port()));
    common::wait_until(std::time::Duration::from_secs(30), || !alive(old.0));
    assert!(common::listens_on(new.0, folder.addr.port()));
}
