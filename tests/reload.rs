//! Hot reload of the domain table under load: no failed request, new data within 2 s, a broken
//! file keeps the old table, SIGHUP forces a reload; a reload never takes away what the operator
//! did not mean to (an emptied keys file, a data file that lost most of its entries).

use crate::common;
use common::*;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

fn reason(gw: &Gateway, domain: &str) -> String {
    let r = gw.get(&format!("/v1/public/domain/{domain}"));
    assert_eq!(r.status, 200);
    r.json()["reason"].as_str().unwrap().to_owned()
}

/// Rewrites `file` (visibly: a comment line more) and waits for `reloaded` to be logged once
/// more, `times` times over. Each round needs a new poll of that file's reloader, so this lets
/// several poll intervals pass, bounded by what the log shows rather than by a sleep.
fn let_polls_pass(gw: &Gateway, file: &Path, reloaded: &str, times: usize) {
    for i in 0..times {
        let before = gw.log().matches(reloaded).count();
        let text = std::fs::read_to_string(file).unwrap();
        write_atomic(file, &format!("{text}# poll {i}\n"));
        wait_until(Duration::from_secs(5), || {
            gw.log().matches(reloaded).count() > before
        });
    }
}

/// The log line that contains `needle`, if any.
fn log_line(gw: &Gateway, needle: &str) -> Option<String> {
    gw.log()
        .lines()
        .find(|l| l.contains(needle))
        .map(str::to_owned)
}

/// Polls until `domain` has `want` as its reason; returns how long it took.
fn wait_for_reason(gw: &Gateway, domain: &str, want: &str, within: Duration) -> Duration {
    let started = Instant::now();
    while started.elapsed() < within {
        if reason(gw, domain) == want {
            return started.elapsed();
        }
        thread::sleep(Duration::from_millis(10));
    }
    panic!("{domain} never became {want}; log:\n{}", gw.log());
}

#[test]
fn reload_under_load_fails_no_request_and_shows_new_data_within_2s() {
    let gw = Gateway::builder()
        .data("disposable.txt", "old-dispo.com\n")
        .start();
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(Mutex::new(Vec::<String>::new()));
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
            let addr = gw.addr;
            thread::spawn(move || {
                let mut conn = Conn::open(addr).unwrap();
                let path = if i % 2 == 0 {
                    "/v1/public/domain/old-dispo.com"
                } else {
                    "/v1/public/top-domains?limit=5"
                };
                let deadline = Instant::now() + Duration::from_secs(20);
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let failure = match conn.get(path) {
                        Ok(r) if r.status == 200 => {
                            ok.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        Ok(r) => {
                            format!("{path}: {} {}", r.status, String::from_utf8_lossy(&r.body))
                        }
                        Err(e) => format!("{path}: {e}"),
                    };
                    failed.lock().unwrap().push(failure);
                    conn = Conn::open(addr).unwrap();
                }
            })
        })
        .collect();

    // The clients are under way before the first swap.
    wait_until(Duration::from_secs(10), || ok.load(Ordering::Relaxed) >= 20);
    let file = gw.data_path("disposable.txt");
    write_atomic(&file, "old-dispo.com\nnew-dispo.com\n");
    let took = wait_for_reason(&gw, "new-dispo.com", "disposable", Duration::from_secs(2));
    eprintln!("new data visible after {took:?}");
    // A storm of swaps while the clients keep going: each one served before the next.
    for i in 0..20 {
        write_atomic(
            &file,
            &format!("old-dispo.com\nnew-dispo.com\nstorm{i}.com\n"),
        );
        wait_for_reason(
            &gw,
            &format!("storm{i}.com"),
            "disposable",
            Duration::from_secs(2),
        );
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    eprintln!("requests answered: {}", ok.load(Ordering::Relaxed));
    let failed = failed.lock().unwrap();
    assert!(
        failed.is_empty(),
        "failed requests during reloads: {failed:?}"
    );
    assert!(
        ok.load(Ordering::Relaxed) > 100,
        "too few requests to mean anything"
    );
    assert!(
        gw.log().matches("domain table reloaded").count() >= 10,
        "{}",
        gw.log()
    );
}

#[test]
fn a_broken_file_keeps_the_old_table_and_names_file_and_line() {
    let gw = Gateway::builder()
        .data("disposable.txt", "dispo-a.com\n")
        .data(
            "domains.csv",
            "domain,reason,risk_score\nrole.example,role_account,60\n",
        )
        .start();
    assert_eq!(reason(&gw, "role.example"), "role_account");
    write_atomic(
        &gw.data_path("domains.csv"),
        "domain,reason,risk_score\nrole.example,safe,1\nbroken.example,spam,1\n",
    );
    write_atomic(
        &gw.data_path("disposable.txt"),
        "dispo-a.com\ndispo-b.com\n",
    );
    wait_until(Duration::from_secs(10), || {
        gw.log().contains("reload failed")
    });
    let log = gw.log();
    assert!(
        log.contains("domains.csv:3: unknown reason 'spam'"),
        "log does not name file and line:\n{log}"
    );
    // Nothing of the new files was taken: neither the good change in the same file nor the
    // change in the other file.
    assert_eq!(reason(&gw, "role.example"), "role_account");
    assert_eq!(reason(&gw, "dispo-b.com"), "safe");
    assert_eq!(reason(&gw, "dispo-a.com"), "disposable");
    // Fixing the file brings everything in.
    write_atomic(
        &gw.data_path("domains.csv"),
        "domain,reason,risk_score\nrole.example,safe,1\n",
    );
    wait_for_reason(&gw, "dispo-b.com", "disposable", Duration::from_secs(2));
    assert_eq!(reason(&gw, "role.example"), "safe");
}

#[test]
fn a_same_size_rewrite_with_the_same_mtime_is_seen_and_sighup_reloads_anyway() {
    let gw = Gateway::builder()
        .data("disposable.txt", "aaaa-dispo.com\n")
        .start();
    assert_eq!(reason(&gw, "aaaa-dispo.com"), "disposable");
    let file = gw.data_path("disposable.txt");
    let mtime: SystemTime = std::fs::metadata(&file).unwrap().modified().unwrap();
    // Same length and modification time: only the content tells this change.
    std::fs::write(&file, "bbbb-dispo.com\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    wait_for_reason(&gw, "bbbb-dispo.com", "disposable", Duration::from_secs(5));
    assert_eq!(reason(&gw, "aaaa-dispo.com"), "safe");
    // SIGHUP rebuilds though nothing changed.
    let reloads = || gw.log().matches("domain table reloaded").count();
    let before = reloads();
    gw.signal("HUP");
    wait_until(Duration::from_secs(5), || reloads() > before);
    assert!(gw.log().contains("domain table: SIGHUP, reloading"));
    assert_eq!(reason(&gw, "bbbb-dispo.com"), "disposable");
    assert_eq!(
        gw.get("/healthz").status,
        200,
        "SIGHUP must not stop the gateway"
    );
}

const LOOKUP: &str = "/v1/public/domain/example.org";

#[test]
fn an_emptied_keys_file_is_refused_and_the_old_keys_kept() {
    let gw = Gateway::builder().start();
    assert_eq!(gw.get(LOOKUP).status, 200);
    let keys = gw.dir.path().join("keys.yaml");
    // `: > keys.yaml`
    std::fs::File::create(&keys).unwrap();
    wait_until(Duration::from_secs(5), || {
        gw.log().contains("keys: reload failed")
    });
    let line = log_line(&gw, "keys: reload failed").unwrap();
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains(&keys.display().to_string()), "{line}");
    assert!(line.contains("write `keys: []`"), "{line}");
    assert_eq!(gw.get(LOOKUP).status, 200, "the old key must still work");
    // Several more polls pass (the data reloader polls at the same interval): still the old
    // keys, and the refusal is logged once, not at every poll.
    std::fs::write(gw.data_path("allowlist.txt"), "a.example\n").unwrap();
    let_polls_pass(
        &gw,
        &gw.data_path("allowlist.txt"),
        "domain table reloaded",
        3,
    );
    assert_eq!(gw.get(LOOKUP).status, 200, "the old key must still work");
    assert_eq!(gw.log().matches("keys: reload failed").count(), 1);
    // A truncated file (cut inside an entry) is refused the same way.
    let full = format!(
        "keys:\n{}",
        drg_access::keys::key_entry_yaml("test", TEST_SECRET, "test", &[])
    );
    write_atomic(&keys, &full[..full.len() - 12]);
    wait_until(Duration::from_secs(5), || {
        gw.log().matches("keys: reload failed").count() == 2
    });
    assert_eq!(gw.get(LOOKUP).status, 200, "the old key must still work");
}

#[test]
fn keys_empty_list_is_taken_at_its_word() {
    let gw = Gateway::builder().start();
    assert_eq!(gw.get(LOOKUP).status, 200);
    write_atomic(&gw.dir.path().join("keys.yaml"), "keys: []\n");
    wait_until(Duration::from_secs(5), || gw.get(LOOKUP).status == 401);
    gw.get(LOOKUP).assert_error(401, "unauthorized");
    let line = log_line(&gw, "keys reloaded: 0 keys").unwrap();
    assert!(line.contains("WARN"), "{line}");
    assert!(!gw.log().contains("keys: reload failed"), "{}", gw.log());
}

fn domains(range: std::ops::Range<usize>) -> String {
    range.map(|i| format!("d{i}.example\n")).collect()
}

#[test]
fn a_data_file_that_lost_most_of_its_entries_is_refused() {
    let gw = Gateway::builder()
        .data("disposable.txt", &domains(0..100))
        .data("allowlist.txt", "keep.example\nalso-keep.example\n")
        .start();
    assert_eq!(reason(&gw, "d50.example"), "disposable");
    let file = gw.data_path("disposable.txt");
    // Cut to 10%: refused, the whole old table is kept.
    write_atomic(&file, &domains(0..10));
    wait_until(Duration::from_secs(5), || {
        gw.log().contains("domain table: reload refused")
    });
    let line = log_line(&gw, "domain table: reload refused").unwrap();
    assert!(line.contains("WARN"), "{line}");
    for needle in [
        format!("{} went from 100 to 10 entries", file.display()),
        "gateway.reload.max_shrink_percent".to_owned(),
    ] {
        assert!(line.contains(&needle), "missing {needle}: {line}");
    }
    assert_eq!(reason(&gw, "d50.example"), "disposable");
    assert_eq!(reason(&gw, "d5.example"), "disposable");
    // Cut by 30% (from the table in service): taken.
    write_atomic(&file, &domains(0..70));
    wait_for_reason(&gw, "d80.example", "safe", Duration::from_secs(5));
    assert_eq!(reason(&gw, "d60.example"), "disposable");
    assert!(gw.log().contains("domain table reloaded"), "{}", gw.log());
    // A deleted file has lost all its entries.
    let score = |d: &str| gw.get(&format!("/v1/public/domain/{d}")).json()["risk_score"].clone();
    assert_eq!(score("keep.example"), 5, "allowlisted");
    std::fs::remove_file(gw.data_path("allowlist.txt")).unwrap();
    wait_until(Duration::from_secs(5), || {
        gw.log().contains("allowlist.txt went from 2 to 0 entries")
    });
    assert_eq!(score("keep.example"), 5, "still allowlisted");
}
