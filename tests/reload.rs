//! Hot reload of the domain table under load: no failed request, new data within 2 s, a broken
//! file keeps the old table, SIGHUP forces a reload.

mod common;
use common::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

fn reason(gw: &Gateway, domain: &str) -> String {
    let r = gw.get(&format!("/v1/public/domain/{domain}"));
    assert_eq!(r.status, 200);
    r.json()["reason"].as_str().unwrap().to_owned()
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
    let failed = Arc::new(AtomicUsize::new(0));
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
                    match conn.get(path) {
                        Ok(r) if r.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                        Ok(_) | Err(_) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            conn = Conn::open(addr).unwrap();
                            0
                        }
                    };
                }
            })
        })
        .collect();

    thread::sleep(Duration::from_millis(200));
    let file = gw.data_path("disposable.txt");
    write_atomic(&file, "old-dispo.com\nnew-dispo.com\n");
    let took = wait_for_reason(&gw, "new-dispo.com", "disposable", Duration::from_secs(2));
    eprintln!("new data visible after {took:?}");
    // A storm of swaps while the clients keep going.
    for i in 0..20 {
        write_atomic(
            &file,
            &format!("old-dispo.com\nnew-dispo.com\nstorm{i}.com\n"),
        );
        thread::sleep(Duration::from_millis(120));
    }
    wait_for_reason(&gw, "storm19.com", "disposable", Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "failed requests during reloads"
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
    let deadline = Instant::now() + Duration::from_secs(3);
    while !gw.log().contains("reload failed") && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
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
fn sighup_reloads_even_when_the_file_looks_unchanged() {
    let gw = Gateway::builder()
        .data("disposable.txt", "aaaa-dispo.com\n")
        .start();
    assert_eq!(reason(&gw, "aaaa-dispo.com"), "disposable");
    let file = gw.data_path("disposable.txt");
    let mtime: SystemTime = std::fs::metadata(&file).unwrap().modified().unwrap();
    // Same length and modification time: the poller cannot see this change.
    std::fs::write(&file, "bbbb-dispo.com\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    thread::sleep(Duration::from_millis(400));
    assert_eq!(
        reason(&gw, "bbbb-dispo.com"),
        "safe",
        "poller saw an invisible change"
    );
    gw.signal("HUP");
    wait_for_reason(&gw, "bbbb-dispo.com", "disposable", Duration::from_secs(2));
    assert_eq!(reason(&gw, "aaaa-dispo.com"), "safe");
    assert_eq!(
        gw.get("/healthz").status,
        200,
        "SIGHUP must not stop the gateway"
    );
}
