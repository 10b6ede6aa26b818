//! Every file the gateway writes in its state folder is 0600 whatever the umask it was started
//! with: a gateway under umask 022 (a shell's, Docker's) with the call logs, verdict changes,
//! quota alerts, the keys API, RDAP and the top domains on; the folder is walked while it serves
//! (SQLite's `-wal` and `-shm` files exist then) and after it stopped.

use crate::common;
use crate::rdap_server::{RdapServer, Reply};

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::*;

const ACME: &str = "drg_state_files_acme_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

/// Every regular file under `dir` (its path from `dir`) with its permission bits. A file
/// renamed or removed while the walk runs (a replaced state file's temporary) is skipped.
fn modes(dir: &Path) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    let mut folders = vec![dir.to_owned()];
    while let Some(folder) = folders.pop() {
        let Ok(entries) = std::fs::read_dir(&folder) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if meta.is_dir() {
                folders.push(entry.path());
            } else if meta.is_file() {
                let name = entry
                    .path()
                    .strip_prefix(dir)
                    .unwrap()
                    .display()
                    .to_string();
                out.insert(name, meta.permissions().mode() & 0o7777);
            }
        }
    }
    out
}

/// The files of `modes` whose mode `keep` accepts, each shown with its mode.
fn shown(modes: &BTreeMap<String, u32>, keep: impl Fn(u32) -> bool) -> Vec<String> {
    modes
        .iter()
        .filter(|(_, mode)| keep(**mode))
        .map(|(name, mode)| format!("{name} {mode:04o}"))
        .collect()
}

#[test]
fn every_state_file_is_0600_under_umask_022() {
    let registry = RdapServer::start(HashMap::from([("aged-corp.com", Reply::Registered(5_000))]));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("alert.secret"),
        "a-webhook-secret-of-some-length",
    )
    .unwrap();
    let gw = Gateway::builder()
        .in_dir(dir)
        .data("disposable.txt", "mailinator.com\n")
        .plan_yaml("pro", "{ monthly_limit: 1000000, max_keys: 5 }")
        .key_in_project("a", ACME, "pro", "acme")
        .gateway_yaml("calls: { batch_interval_ms: 20 }")
        .gateway_yaml("changes: { watch_days: { pro: 30 } }")
        .gateway_yaml(
            "top_domains: { persist_interval_ms: 200, state_file: state/top_domains.json }",
        )
        .quota_yaml("alerts: { url: 'http://127.0.0.1:9/x', allow_private: true, secret_file: alert.secret }")
        .rdap_yaml(&format!("servers: {{com: \"{}\"}}", registry.base()))
        .rdap_yaml("allow_plain_http: true")
        .rdap_yaml("budget_ms: 3000")
        .start_with(|conf, listen| {
            use std::os::unix::process::CommandExt;
            let mut command = serve_command(conf, listen);
            // SAFETY: umask(2) only, between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    libc::umask(0o022);
                    Ok(())
                })
            };
            command
        });
    for name in ["aged-corp.com", "mailinator.com", "example.org"] {
        let r = gw
            .conn_as(Some(ACME))
            .get(&format!("/v1/public/domain/{name}"))
            .unwrap();
        assert_eq!(r.status, 200, "{name}");
    }
    // A key made through the API: the control store and its cache.
    let made = crate::keys_api::create(&gw, ACME, "state files");
    assert_eq!(made.status, 201, "{}", String::from_utf8_lossy(&made.body));
    // The lookups logged (the call store) and watched (the changes store).
    wait_until(Duration::from_secs(10), || {
        gw.metric("drg_changes_total{event=\"watched\"}")
            .is_some_and(|n| n >= 3.0)
    });
    let state = gw.dir.path().join("state");
    wait_until(Duration::from_secs(10), || {
        let m = modes(&state);
        m.contains_key("top_domains.json") && m.contains_key("changes.sqlite3-wal")
    });
    let serving = modes(&state);
    let dir = gw.stop();
    let stopped = modes(&dir.path().join("state"));
    let all = |modes: &BTreeMap<String, u32>| shown(modes, |_| true);
    eprintln!(
        "state files while serving: {:?}\nafter the stop: {:?}",
        all(&serving),
        all(&stopped)
    );
    for name in [
        "calls.sqlite3",
        "calls.sqlite3-wal",
        "calls.sqlite3-shm",
        "changes.sqlite3",
        "changes.sqlite3-wal",
        "changes.sqlite3-shm",
        "webhooks.sqlite",
        "keys.control-cache.json",
        "control.sqlite",
        "control.sqlite-wal",
    ] {
        assert!(
            serving.contains_key(name),
            "{name} while serving: {:?}",
            all(&serving)
        );
    }
    for name in ["rdap_cache.jsonl", "top_domains.json"] {
        assert!(
            stopped.contains_key(name),
            "{name} after the stop: {:?}",
            all(&stopped)
        );
    }
    let not_private = |modes: &BTreeMap<String, u32>| shown(modes, |mode| mode != 0o600);
    assert_eq!(not_private(&serving), Vec::<String>::new(), "while serving");
    assert_eq!(
        not_private(&stopped),
        Vec::<String>::new(),
        "after the stop"
    );
}

/// `PUT /v1/overrides/{domain}` for [`ACME`], answering `expect`.
fn put_override(gw: &Gateway, domain: &str, expect: u16) {
    let body = br#"{"verdict": "block"}"#;
    let r = send(
        gw,
        "PUT",
        &format!("/v1/overrides/{domain}"),
        Some(ACME),
        &[],
        Some(body),
    );
    assert_eq!(r.status, expect, "{}", r.text());
}

/// `reason` of `name` for [`ACME`].
fn reason_for_acme(gw: &Gateway, name: &str) -> String {
    let r = gw
        .conn_as(Some(ACME))
        .get(&format!("/v1/public/domain/{name}"))
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["reason"].as_str().unwrap().to_owned()
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        out.push(p.display().to_string());
        if p.is_dir() {
            out.extend(walk(&p));
        }
    }
    out
}

#[test]
fn a_state_folder_written_with_dot_dot_holds_the_control_store_and_takes_back_a_misplaced_one() {
    // The quick start's shape: `-c conf/gateway.yaml` from the project's folder, the state in
    // `../state`. An earlier release opened `conf/state/control.sqlite` for it (its URL read
    // `conf` as a host) and put the runtime folder in `conf/state/run`. The misplaced store is
    // made here as it was: by a gateway whose state folder is `conf/state`.
    let builder = || {
        Gateway::builder()
            .plan_yaml("team", "{ monthly_limit: 100000, max_overrides: 5 }")
            .key_in_project("acme-server", ACME, "team", "acme")
    };
    let gw = builder()
        .quota_section("quota: { state_file: conf/state/quota.json }")
        .start();
    put_override(&gw, "shop.example", 201);
    assert_eq!(reason_for_acme(&gw, "shop.example"), "disposable");
    let dir = gw.stop();
    let root = dir.path().to_path_buf();
    let misplaced = root.join("conf/state/control.sqlite");
    assert!(std::fs::metadata(&misplaced).unwrap().len() > 0);

    // This release on the same folder, its config in `conf/` and every path in it relative,
    // the pid file and the upgrade socket left to their default (the runtime folder).
    let text = std::fs::read_to_string(root.join("gateway.yaml")).unwrap();
    let mut conf = String::new();
    for line in text.lines() {
        if line.starts_with("pid_file:") || line.starts_with("upgrade_sock:") {
            continue;
        }
        let line = line
            .replace("dir: data", "dir: ../data")
            .replace("keys_file: keys.yaml", "keys_file: ../keys.yaml")
            .replace("conf/state/quota.json", "../state/quota.json")
            .replace("state_file: state/", "state_file: ../state/");
        conf.push_str(&line);
        conf.push('\n');
    }
    let conf_path = root.join("conf/gateway.yaml");
    std::fs::write(&conf_path, conf).unwrap();
    let cwd = root.clone();
    let gw = Gateway::spawn_with(dir, conf_path, &[], |_, listen| {
        let mut c = serve_command("conf/gateway.yaml", listen);
        // Under systemd the runtime folder would be its own, not the state folder's.
        c.current_dir(&cwd).env_remove("RUNTIME_DIRECTORY");
        c
    });
    // The store moved to the folder the config names, with what it held; private.
    let file = root.join("state/control.sqlite");
    assert!(gw.log().contains("control store: moved"), "{}", gw.log());
    assert!(!misplaced.exists());
    assert_eq!(reason_for_acme(&gw, "shop.example"), "disposable");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(
        gw.log().contains(&format!("SQLite ({})", file.display())),
        "{}",
        gw.log()
    );
    // The runtime folder beside the state, once: nothing under `conf/` but the config.
    assert!(root.join("state/run").is_dir(), "{:?}", walk(&root));
    // What is written now lands there, and nothing makes the misplaced files again.
    put_override(&gw, "mart.example", 201);
    assert_eq!(reason_for_acme(&gw, "mart.example"), "disposable");
    let mut under_conf: Vec<String> = std::fs::read_dir(root.join("conf"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    under_conf.sort();
    // `conf/state` itself stays, emptied of the store (the earlier release's folder).
    let left: Vec<String> = std::fs::read_dir(root.join("conf/state"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("control.sqlite") || n == "run")
        .collect();
    assert_eq!(under_conf, ["gateway.yaml", "state"], "{under_conf:?}");
    assert_eq!(left, Vec::<String>::new());
}
