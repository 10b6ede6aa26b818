//! The command line: `check-config`, `lookup`, and `serve` refusing bad input at start.

use crate::common;
use common::*;
use std::process::Command;

fn run(args: &[&str]) -> (bool, String, String) {
    outcome(crate::common::command(BIN).args(args).output().unwrap())
}

fn write_conf(dir: &std::path::Path, gateway: &str) -> String {
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let conf = dir.join("gateway.yaml");
    std::fs::write(
        &conf,
        format!("version: 1\ngateway:\n  data:\n    dir: data\n{gateway}"),
    )
    .unwrap();
    conf.to_str().unwrap().to_owned()
}

#[test]
fn shipped_config_and_data_are_valid() {
    let root = env!("CARGO_MANIFEST_DIR");
    let conf = format!("{root}/conf/gateway.yaml");
    let (ok, out, err) = run(&["check-config", "-c", &conf]);
    assert!(ok, "{err}");
    assert!(out.contains(": ok;"), "{out}");
    // It builds the table, and names its dataset version (`--version` does not).
    assert!(out.contains(": dataset g1-"), "{out}");
    // The compiled free-provider list is large enough to matter.
    let free = std::fs::read_to_string(format!("{root}/data/free_providers.txt")).unwrap();
    let entries = free
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .count();
    assert!(entries >= 150, "only {entries} free providers");
}

#[test]
fn lookup_prints_the_record_and_the_rule() {
    let root = env!("CARGO_MANIFEST_DIR");
    let conf = format!("{root}/conf/gateway.yaml");
    let (ok, out, err) = run(&["lookup", "-c", &conf, "x.y.Mailinator.com"]);
    assert!(ok, "{err}");
    assert!(out.contains("\"reason\": \"disposable\""), "{out}");
    assert!(
        out.contains("rule: blocklist, via parent domain mailinator.com"),
        "{out}"
    );
    let (ok, out, _) = run(&["lookup", "-c", &conf, "gmail.com"]);
    assert!(ok);
    assert!(out.contains("\"is_free_provider\": true"), "{out}");
    let (ok, _, err) = run(&["lookup", "-c", &conf, "not_a_domain"]);
    assert!(!ok);
    assert!(err.contains("'_'"), "{err}");
}

#[test]
fn check_config_lists_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(
        dir.path(),
        "  listen: nowhere\n  colour: blue\n  scores:\n    disposable: 10\n",
    );
    let (ok, _, err) = run(&["check-config", "-c", &conf]);
    assert!(!ok);
    for needle in [
        "3 problem(s)",
        "gateway.listen",
        "gateway.colour: unknown key",
        "gateway.scores.disposable",
    ] {
        assert!(err.contains(needle), "missing {needle}: {err}");
    }
}

#[test]
fn serve_refuses_a_bad_data_file_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(dir.path(), "    builtin_disposable: false\n");
    std::fs::write(
        dir.path().join("data/disposable.txt"),
        "ok.com\nnot a domain\n",
    )
    .unwrap();
    let (ok, _, err) = run(&["serve", "-c", &conf, "--listen", "127.0.0.1:1"]);
    assert!(!ok);
    assert!(err.contains("disposable.txt:2:"), "{err}");
}

#[test]
fn serve_refuses_a_bad_listen_override() {
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(dir.path(), "");
    let (ok, _, err) = run(&["serve", "-c", &conf, "--listen", "localhost"]);
    assert!(!ok);
    assert!(err.contains("--listen"), "{err}");
}

#[test]
fn the_demo_key_is_refused_beyond_loopback_unless_allowed() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        format!("{root}/conf/keys.yaml"),
        dir.path().join("keys.yaml"),
    )
    .unwrap();
    for (listen, allow, ok_expected) in [
        ("127.0.0.1:8080", false, true),
        ("0.0.0.0:8080", false, false),
        ("0.0.0.0:8080", true, true),
    ] {
        let conf = write_conf(
            dir.path(),
            &format!(
                "    builtin_disposable: false\n  listen: {listen}\n  access:\n    allow_demo_key: {allow}\n"
            ),
        );
        let (ok, _, err) = run(&["check-config", "-c", &conf]);
        assert_eq!(ok, ok_expected, "{listen} allow={allow}: {err}");
        if !ok {
            assert!(err.contains("demo key"), "{err}");
        }
    }
}

#[test]
fn key_new_prints_a_secret_and_an_entry_for_a_known_plan() {
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(dir.path(), "");
    let (ok, out, err) = run(&[
        "key",
        "new",
        "-c",
        &conf,
        "--id",
        "web",
        "--plan",
        "pro",
        "--origin",
        "https://app.example.com",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("drg_"), "{out}");
    let secret = out
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("drg_"))
        .unwrap();
    // The entry carries the secret's non-secret prefix (listed by /v1/keys) and when it was made.
    assert!(
        out.contains(&format!("  - id: web\n    prefix: {}\n", &secret[..12])),
        "{out}"
    );
    assert!(
        !out.contains(&format!("prefix: {}", &secret[..13])),
        "{out}"
    );
    assert!(out.contains("    created_at: '20"), "{out}");
    assert!(out.contains("    sha256: "), "{out}");
    assert!(out.contains("      - https://app.example.com"), "{out}");
    let (ok, out, err) = run(&[
        "key",
        "new",
        "-c",
        &conf,
        "--id",
        "ci",
        "--plan",
        "pro",
        "--project",
        "acme",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("    project: acme\n"), "{out}");
    assert!(
        !dir.path().join("keys.yaml").exists(),
        "printed only, not appended"
    );
    let (ok, _, err) = run(&["key", "new", "-c", &conf, "--id", "x", "--plan", "gold"]);
    assert!(!ok);
    assert!(err.contains("unknown plan 'gold'"), "{err}");
}

#[test]
fn serve_refuses_an_empty_keys_file_and_names_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(dir.path(), "    builtin_disposable: false\n");
    let keys = dir.path().join("keys.yaml");
    for text in ["", "# every key was here\n", "keys:\n"] {
        std::fs::write(&keys, text).unwrap();
        let (ok, _, err) = run(&["serve", "-c", &conf, "--listen", "127.0.0.1:1"]);
        assert!(!ok, "{text:?}");
        assert!(err.contains(&keys.display().to_string()), "{err}");
        assert!(err.contains("write `keys: []`"), "{err}");
    }
    std::fs::write(&keys, "keys: []\n").unwrap();
    let (ok, out, err) = run(&["check-config", "-c", &conf]);
    assert!(ok, "{err}");
    assert!(out.contains("0 keys"), "{out}");
    assert!(err.contains("WARN") && err.contains("`keys: []`"), "{err}");
}

/// Kills the process on drop.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn serve_makes_a_private_runtime_dir_for_pid_file_and_upgrade_socket() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // No pid_file / upgrade_sock keys: they go to the runtime dir, by default ../state/run.
    let conf_dir = dir.path().join("conf");
    let conf = write_conf(
        &conf_dir,
        &format!(
            "    builtin_disposable: false\n  admin:\n    listen: unix:{}/admin.sock\n",
            dir.path().display()
        ),
    );
    std::fs::write(conf_dir.join("keys.yaml"), "keys: []\n").unwrap();
    let log = dir.path().join("gateway.log");
    let mut gw = Running(
        crate::common::command(BIN)
            .args(["-c", &conf, "serve", "--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "info")
            .env_remove("RUNTIME_DIRECTORY")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let read_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until(std::time::Duration::from_secs(20), || {
        read_log().contains("listening on") || gw.0.try_wait().unwrap().is_some()
    });
    assert!(gw.0.try_wait().unwrap().is_none(), "{}", read_log());
    let run_dir = dir.path().join("state/run");
    let meta = std::fs::symlink_metadata(&run_dir).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    drop(gw);

    // A runtime dir others can write to stops the start, naming the fix.
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o770)).unwrap();
    let out = crate::common::command(BIN)
        .args(["-c", &conf, "serve", "--listen", "127.0.0.1:0"])
        .env_remove("RUNTIME_DIRECTORY")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("gateway.runtime_dir"), "{err}");
    assert!(err.contains("/conf/../state/run"), "{err}");
    assert!(err.contains("writable by its group"), "{err}");
    assert!(err.contains("chmod 700"), "{err}");
}

#[test]
fn key_new_appends_to_an_explicitly_empty_keys_file() {
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(dir.path(), "");
    let keys = dir.path().join("keys.yaml");
    std::fs::write(&keys, "# revoked everything\nkeys: []\n").unwrap();
    let (ok, out, err) = run(&[
        "key", "new", "-c", &conf, "--id", "web", "--plan", "pro", "--append",
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("entry added to"), "{out}");
    let text = std::fs::read_to_string(&keys).unwrap();
    assert!(
        text.starts_with("# revoked everything\nkeys:\n  - id: web\n"),
        "{text}"
    );
    let (ok, out, err) = run(&["check-config", "-c", &conf]);
    assert!(ok, "{err}");
    assert!(out.contains("1 keys"), "{out}");
}

/// `key new` run under `umask`.
fn run_with_umask(umask: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
        .arg(BIN)
        .args(args)
        .output()
        .unwrap();
    outcome(out)
}

#[test]
fn key_new_append_replaces_the_file_whole_keeping_its_mode_whatever_the_umask() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(dir.path(), "");
    let keys = dir.path().join("keys.yaml");
    let args = |id: &'static str| {
        vec![
            "key", "new", "-c", &conf, "--id", id, "--plan", "pro", "--append",
        ]
    };
    // No keys file yet: created owner-only, even under a permissive umask.
    let (ok, out, err) = run_with_umask("000", &args("first"));
    assert!(ok, "{err}");
    assert!(out.contains("entry appended to"), "{out}");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&keys), 0o600);
    // The operator's mode is kept, even under a umask that would strip it.
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o640)).unwrap();
    let inode = std::fs::metadata(&keys).unwrap().ino();
    let (ok, _, err) = run_with_umask("077", &args("second"));
    assert!(ok, "{err}");
    assert_eq!(mode(&keys), 0o640);
    // Replaced (a new file renamed over the old one), not written in place.
    assert_ne!(std::fs::metadata(&keys).unwrap().ino(), inode);
    let text = std::fs::read_to_string(&keys).unwrap();
    assert!(
        text.contains("  - id: first\n") && text.contains("  - id: second\n"),
        "{text}"
    );
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(names.is_empty(), "temporary files left: {names:?}");
    let (ok, out, err) = run(&["check-config", "-c", &conf]);
    assert!(ok, "{err}");
    assert!(out.contains("2 keys"), "{out}");
}

/// `--version` reads the config, never the data: a data file that blocks every reader (a FIFO
/// nobody writes) does not hold it up. Before, it built the whole table to print its dataset
/// version (3M names: seconds and gigabytes), and here it hung. `check-config` prints the
/// dataset version instead.
#[test]
fn version_reads_the_config_never_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let conf = write_conf(dir.path(), "");
    let fifo = dir.path().join("data/disposable.txt");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let mut child = crate::common::command(BIN)
        .args(["--version", "-c", &conf])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("--version read the data (it blocks on the FIFO)");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success());
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("domain-risk-gateway "), "{out}");
    assert!(lines[1].starts_with("data in "), "{out}");
    assert!(lines[1].contains(&conf), "{out}");
}

/// Runs the binary, killing it after `within` (a serve that started would never return); its
/// stderr goes to a file, so that a talkative child never blocks on a full pipe.
fn run_within(args: &[&str], within: std::time::Duration) -> (bool, String) {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = crate::common::command(BIN)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            let err = std::fs::read_to_string(log.path()).unwrap();
            panic!("`{}` still runs after {within:?}: {err}", args.join(" "));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    (
        status.success(),
        std::fs::read_to_string(log.path()).unwrap(),
    )
}

#[test]
fn serve_exits_when_an_address_is_taken_and_names_the_flag_that_moves_it() {
    let dir = tempfile::tempdir().unwrap();
    let held = std::net::TcpListener::bind(("127.0.0.1", free_port())).unwrap();
    let taken = held.local_addr().unwrap().to_string();
    let free = format!("127.0.0.1:{}", free_port());
    let conf = write_conf(
        dir.path(),
        &format!(
            "    builtin_disposable: false\n  mx:\n    enabled: false\n  admin:\n    listen: {taken}\n"
        ),
    );
    std::fs::write(dir.path().join("keys.yaml"), "keys: []\n").unwrap();
    // Pingora alone retries a taken address, then loses that listener and serves on without it:
    // each start must end, refused, within seconds.
    let refused = |listen: &str, admin: Option<&str>| {
        let mut args = vec!["serve", "-c", &conf, "--listen", listen];
        args.extend(admin.map(|a| ["--admin-listen", a]).into_iter().flatten());
        let (ok, err) = run_within(&args, std::time::Duration::from_secs(10));
        assert!(!ok, "{err}");
        err
    };
    let err = refused(&taken, Some(&free));
    let public = format!("cannot listen on {taken} (gateway.listen): Address already in use");
    assert!(
        err.contains(&public) && err.contains("with --listen"),
        "{err}"
    );
    let err = refused(&free, None);
    let admin = format!("cannot listen on {taken} (gateway.admin.listen)");
    assert!(
        err.contains(&admin) && err.contains("with --admin-listen"),
        "{err}"
    );
    // The flag is checked like the key: never the public port, and a listener address.
    let err = refused(&free, Some(&free));
    let expected = format!("--admin-listen {free}: gateway.admin.listen: must differ");
    assert!(err.contains(&expected), "{err}");
    let err = refused(&free, Some("nowhere"));
    assert!(
        err.contains("'nowhere' is not ip:port or unix:/path"),
        "{err}"
    );
}

#[test]
fn a_second_gateway_on_one_config_runs_beside_the_first_with_its_own_listeners() {
    let first = Gateway::builder().start();
    let conf = first.conf.to_str().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    // The first's admin socket answers: a second would have taken its path over (Pingora removes
    // a socket file before binding), leaving the first without an admin listener.
    let within = std::time::Duration::from_secs(10);
    let (ok, err) = run_within(&["serve", "-c", conf, "--listen", &listen], within);
    assert!(!ok);
    let sock = first.dir.path().join("admin.sock");
    let expected = format!(
        "cannot listen on unix:{} (gateway.admin.listen)",
        sock.display()
    );
    assert!(err.contains(&expected), "{err}");
    // With its own admin socket it runs; killed, it leaves the socket file behind, which a
    // start then replaces (nothing answers on it).
    let second_sock = first.dir.path().join("second.sock");
    for _ in 0..2 {
        run_second(conf, &listen, &second_sock);
        assert!(second_sock.exists());
    }
    assert_eq!(first.admin_get("/readyz").status, 200);
    assert_eq!(first.get("/healthz").status, 200);
}

/// Starts a gateway on `conf` with its own listeners, waits until both answer, and kills it.
fn run_second(conf: &str, listen: &str, sock: &std::path::Path) {
    let admin = format!("unix:{}", sock.display());
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = crate::common::command(BIN)
        .args([
            "-c",
            conf,
            "serve",
            "--listen",
            listen,
            "--admin-listen",
            &admin,
        ])
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let mut second = KillOnDrop(child);
    let addr: std::net::SocketAddr = listen.parse().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let public = Conn::open(addr).and_then(|mut c| c.get("/healthz"));
        let admin = std::os::unix::net::UnixStream::connect(sock);
        if public.is_ok_and(|r| r.status == 200) && admin.is_ok() {
            return;
        }
        let ended = second.0.try_wait().unwrap();
        if ended.is_some() || std::time::Instant::now() > deadline {
            let err = std::fs::read_to_string(log.path()).unwrap();
            panic!("the second gateway does not serve ({ended:?}): {err}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A child process killed when the test ends, also when it fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
