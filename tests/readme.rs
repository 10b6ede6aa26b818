//! The README's curl session, replayed as printed against the real binary started on the shipped
//! configuration, keys and data (only the ports change): each command runs in bash with the
//! README's own `KEY` and `c` alias, and its output must be what the README shows. Where the
//! README elides (`{...}`) only the fields it names are checked; numbers that depend on the date
//! (`reset_at`, the `RateLimit` seconds) are checked for their form.

use crate::common;
use crate::dns;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// One `$ command` of the session and the lines the README prints after it.
#[derive(Debug)]
struct Step {
    command: String,
    expected: Vec<String>,
}

/// The steps of the first `console` block under "## A curl session".
fn session() -> Vec<Step> {
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    let section = readme
        .split("\n## A curl session")
        .nth(1)
        .expect("README has a curl session");
    let block = section
        .split("```console\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("a console block");
    let mut steps: Vec<Step> = Vec::new();
    for line in block.lines() {
        if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step {
                command: command.to_owned(),
                expected: Vec::new(),
            });
        } else if !line.trim().is_empty() {
            steps.last_mut().unwrap().expected.push(line.to_owned());
        }
    }
    steps
}

/// The shipped conf/ and data/ in a folder of their own: conf/ copied (the admin listener on a
/// Unix socket, the backend on a port where nothing listens, DNS at `dns`: a socket that never
/// answers, as on a machine without DNS, or a resolver that lies: tests reach no server beyond
/// loopback), data/ linked, state/ empty.
fn shipped_gateway(dead: &DeadPort, dns: std::net::SocketAddr) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let conf_dir = dir.path().join("conf");
    std::fs::create_dir_all(&conf_dir).unwrap();
    std::fs::create_dir_all(dir.path().join("state")).unwrap();
    std::os::unix::fs::symlink(repo("data"), dir.path().join("data")).unwrap();
    std::fs::copy(repo("conf/keys.yaml"), conf_dir.join("keys.yaml")).unwrap();
    let shipped = std::fs::read_to_string(repo("conf/gateway.yaml")).unwrap();
    let admin = format!("listen: unix:{}/admin.sock", dir.path().display());
    let conf = shipped
        .replacen("listen: 127.0.0.1:9180", &admin, 1)
        .replacen(
            "address: 127.0.0.1:9090",
            &format!("address: {}", dead.addr),
            1,
        )
        .replacen("servers: []", &format!("servers: [\"{dns}\"]"), 1)
        // No registry is reached from a test.
        .replacen(
            "  rdap:\n    enabled: true",
            "  rdap:\n    enabled: false",
            1,
        );
    assert_ne!(
        conf, shipped,
        "the shipped config names its admin and backend addresses"
    );
    let path = conf_dir.join("gateway.yaml");
    std::fs::write(&path, conf).unwrap();
    Gateway::spawn(dir, path, &[])
}

/// Runs one README command in bash, the README's host names pointed at this gateway.
fn run(command: &str, key: &str, gw: &Gateway) -> String {
    let admin = format!(
        "curl -s --unix-socket {}/admin.sock http://localhost",
        gw.dir.path().display()
    );
    let command = command
        .replace("curl -s localhost:9180", &admin)
        .replace("localhost:8080", &gw.addr.to_string());
    let script = format!(
        "shopt -s expand_aliases\nKEY={key}\nalias c='curl -s -H \"Authorization: Bearer $KEY\"'\n{command}\n"
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// `actual` matches the README's JSON line `expected`: the same fields with the same values,
/// but for values that move with the date; with `{...}` in it, only the fields it names.
fn assert_json_like(expected: &str, actual: &str, command: &str) {
    let got: Value = serde_json::from_str(actual.trim())
        .unwrap_or_else(|e| panic!("{command}: not JSON ({e}): {actual}"));
    if expected.contains("...") {
        for name in expected.split('"').skip(1).step_by(2) {
            if expected.contains(&format!("\"{name}\":")) {
                assert!(got.get(name).is_some(), "{command}: no `{name}` in {got}");
            }
        }
        return;
    }
    let want: Value = serde_json::from_str(expected)
        .unwrap_or_else(|e| panic!("{command}: the README's line is not JSON ({e})"));
    let (Value::Object(want), Value::Object(got)) = (&want, &got) else {
        panic!("{command}: {got} vs {want}");
    };
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        got.keys().collect::<Vec<_>>(),
        "{command}"
    );
    for (k, v) in want {
        if k == "reset_at" {
            let at = got[k].as_str().unwrap_or_default();
            assert!(
                chrono::DateTime::parse_from_rfc3339(at).is_ok() && at.contains("-01T00:00:00"),
                "{command}: {k} {at}"
            );
        } else {
            assert_eq!(&got[k], v, "{command}: {k}");
        }
    }
}

#[test]
fn the_readme_curl_session_answers_as_printed() {
    let silent_dns = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    replay(silent_dns.local_addr().unwrap());
}

/// A machine whose resolver lies (no internet behind it, a captive or filtering resolver)
/// prints the same session as one without DNS: the canaries unmask it, the table answers.
#[test]
fn the_readme_curl_session_answers_as_printed_under_a_lying_resolver() {
    for lie in [dns::Lie::NxDomain, dns::Lie::Empty, dns::Lie::ServFail] {
        let liar = dns::DnsServer::lying(lie);
        eprintln!("resolver: {lie:?}");
        replay(liar.addr);
    }
}

fn replay(dns: std::net::SocketAddr) {
    let dead = DeadPort::new();
    let gw = shipped_gateway(&dead, dns);
    let steps = session();
    assert!(steps.len() >= 12, "{steps:?}");
    let key = steps[0]
        .command
        .strip_prefix("KEY=")
        .expect("the session starts by setting KEY")
        .to_owned();
    let mut checked = 0;
    for step in &steps[1..] {
        if step.command.starts_with("alias ") {
            continue;
        }
        let out = run(&step.command, &key, &gw);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines.len(),
            step.expected.len(),
            "{}: printed {:?}, got {out:?}",
            step.command,
            step.expected
        );
        for (want, got) in step.expected.iter().zip(&lines) {
            if want.starts_with('{') {
                assert_json_like(want, got, &step.command);
            } else if let Some(policy) = want.strip_prefix("ratelimit-policy: ") {
                // The window is the month's length in seconds: it changes with the month.
                let q = policy.split(";w=").next().unwrap();
                assert!(
                    got.starts_with(&format!("ratelimit-policy: {q};w=")),
                    "{got}"
                );
            } else if let Some(limit) = want.strip_prefix("ratelimit: ") {
                // Seconds to the reset move with the clock; the remaining count does not.
                let r = limit.split(";t=").next().unwrap();
                assert!(
                    got.starts_with(&format!("ratelimit: {r};t=")),
                    "{want} vs {got}"
                );
            } else {
                assert_eq!(got.trim_end(), want, "{}", step.command);
            }
            checked += 1;
        }
    }
    assert!(checked >= 14, "{checked} lines checked");
}
