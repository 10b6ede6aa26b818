//! Domain age end to end: the gateway against a real RDAP server on loopback (HTTP/1.1 answering
//! RFC 9083 domain objects, 404s, 429s with `Retry-After`, slow answers and redirects).

use crate::common;
use crate::dns;
use crate::rdap_server;

use common::*;
use dns::{DnsServer, Zone};
pub use rdap_server::{RdapServer, Reply};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A gateway asking `server` for `.com` and `.net` names, with `extra` lines of `rdap:`.
fn gateway(server: &RdapServer, extra: &[&str]) -> GatewayBuilder {
    let mut b = Gateway::builder()
        .rdap_yaml(&format!(
            "servers: {{com: \"{0}\", net: \"{0}\"}}",
            server.base()
        ))
        .rdap_yaml("allow_plain_http: true")
        .rdap_yaml("min_interval_ms: 1");
    for line in extra {
        b = b.rdap_yaml(line);
    }
    b
}

fn explain(gw: &Gateway, name: &str) -> serde_json::Value {
    let r = gw.get(&format!("/v1/public/domain/{name}?explain=true"));
    assert_eq!(
        r.status,
        200,
        "{name}: {}",
        String::from_utf8_lossy(&r.body)
    );
    r.json()
}

#[test]
fn a_young_domain_is_raised_an_old_one_unchanged_and_the_cache_asks_once() {
    let server = RdapServer::start(HashMap::from([
        ("fresh-start.com", Reply::Registered(3)),
        ("old-corp.com", Reply::Registered(9_000)),
        ("gmail.com", Reply::Registered(7_000)),
    ]));
    let gw = gateway(&server, &["budget_ms: 3000"])
        .data("free_providers.txt", "gmail.com\n")
        .start();
    let young = explain(&gw, "www.fresh-start.com");
    assert_eq!(young["reason"], "safe", "{young}");
    assert_eq!(young["risk_score"], 40, "{young}");
    assert_eq!(young["evidence"]["age_days"], 3, "{young}");
    assert_eq!(young["evidence"]["young_domain"], "raised", "{young}");
    let registered = (chrono::Utc::now() - chrono::Duration::days(3))
        .format("%Y-%m-%d")
        .to_string();
    assert_eq!(young["evidence"]["registered"], registered.as_str());
    let old = explain(&gw, "old-corp.com");
    assert_eq!(
        (old["reason"].as_str(), old["risk_score"].as_u64()),
        (Some("safe"), Some(20))
    );
    assert_eq!(old["evidence"]["age_days"], 9_000, "{old}");
    assert!(old["evidence"].get("young_domain").is_none(), "{old}");
    // A free provider is the list's: never asked.
    let free = explain(&gw, "gmail.com");
    assert_eq!(free["risk_score"], 10);
    assert_eq!(server.asked("gmail.com"), 0);

    // Asked again, and by name under it: the cache answers, the registry is not asked.
    let plain = gw.get("/v1/public/domain/fresh-start.com").json();
    assert_eq!(plain["risk_score"], 40);
    assert_eq!(server.asked("fresh-start.com"), 1);
    assert!(gw.metric("drg_rdap_lookups_total{result=\"hit\"}").unwrap() >= 1.0);
    assert_eq!(
        gw.metric("drg_rdap_fetches_total{outcome=\"found\"}"),
        Some(2.0)
    );

    // The cache outlives a restart (the state file), so the registry is not asked again.
    let dir = gw.stop();
    let gw = gateway(&server, &["budget_ms: 3000"]).in_dir(dir).start();
    assert_eq!(explain(&gw, "fresh-start.com")["evidence"]["age_days"], 3);
    assert_eq!(server.asked("fresh-start.com"), 1);
}

#[test]
fn a_miss_answers_at_once_and_the_next_lookup_has_the_age() {
    let server = RdapServer::start(HashMap::from([(
        "later.com",
        Reply::Slow(Duration::from_millis(300), Box::new(Reply::Registered(1))),
    )]));
    // The default budget: a lookup never waits for a registry.
    let gw = gateway(&server, &[]).start();
    let first = explain(&gw, "later.com");
    assert_eq!(first["risk_score"], 20, "{first}");
    assert!(first["evidence"].get("registered").is_none(), "{first}");
    wait_until(Duration::from_secs(10), || {
        explain(&gw, "later.com")["risk_score"] == 40
    });
    assert_eq!(explain(&gw, "later.com")["evidence"]["age_days"], 1);
    assert_eq!(server.asked("later.com"), 1);
}

#[test]
fn a_slow_server_never_holds_a_lookup_past_its_budget() {
    let server = RdapServer::start(HashMap::from([(
        "slow-registry.com",
        Reply::Slow(Duration::from_secs(4), Box::new(Reply::Registered(2))),
    )]));
    let gw = gateway(&server, &["budget_ms: 300", "timeout_ms: 10000"]).start();
    let started = Instant::now();
    let r = explain(&gw, "slow-registry.com");
    let took = started.elapsed();
    assert_eq!(r["risk_score"], 20, "{r}");
    // The budget is 300 ms; the registry takes 4 s.
    assert!(took < Duration::from_millis(2_000), "{took:?}");
    wait_until(Duration::from_secs(15), || {
        explain(&gw, "slow-registry.com")["risk_score"] == 40
    });
}

#[test]
fn a_429_is_honoured_for_its_retry_after_and_then_the_name_is_fetched() {
    let server = RdapServer::start(HashMap::from([
        (
            "busy-registry.com",
            Reply::LaterOnce(429, 2, Box::new(Reply::Registered(5))),
        ),
        (
            "down-registry.net",
            Reply::LaterOnce(503, 1, Box::new(Reply::Registered(6))),
        ),
    ]));
    let gw = gateway(&server, &[]).start();
    explain(&gw, "busy-registry.com");
    wait_until(Duration::from_secs(20), || {
        explain(&gw, "busy-registry.com")["evidence"]["age_days"] == 5
    });
    // A 503 backs the server off the same way; the name is asked again after it.
    explain(&gw, "down-registry.net");
    wait_until(Duration::from_secs(20), || {
        explain(&gw, "down-registry.net")["evidence"]["age_days"] == 6
    });
    assert_eq!(server.asked("down-registry.net"), 2);
    assert_eq!(
        gw.metric("drg_rdap_errors_total{kind=\"unavailable\"}"),
        Some(1.0)
    );
    let times = server.times("busy-registry.com");
    assert_eq!(times.len(), 2, "asked once, refused with 429, asked again");
    let waited = times[1] - times[0];
    assert!(waited >= Duration::from_millis(1_900), "{waited:?}");
    assert_eq!(
        gw.metric("drg_rdap_errors_total{kind=\"rate_limited\"}"),
        Some(1.0)
    );
    assert_eq!(gw.metric("drg_rdap_backoffs_total"), Some(2.0));
}

#[test]
fn one_projects_misses_never_delay_anothers() {
    let mut replies: HashMap<&str, Reply> = HashMap::new();
    // The flood ends with a name the other project will ask for too: planted in front of it.
    let mut names: Vec<String> = (0..59).map(|i| format!("flood-{i}.com")).collect();
    names.push("planted-start.com".to_owned());
    let slow = |days| {
        Reply::Slow(
            Duration::from_millis(150),
            Box::new(Reply::Registered(days)),
        )
    };
    for n in &names {
        replies.insert(n.as_str(), slow(400));
    }
    replies.insert("quiet-start.com", slow(2));
    let server = RdapServer::start(replies);
    let gw = gateway(&server, &["concurrency: 1", "budget_ms: 5000"])
        .key_in_project("flooder", "sk_flood_0123456789abcdef", "test", "flood")
        .key_in_project("quiet", "sk_quiet_0123456789abcdef", "test", "quiet")
        .start();
    // 60 new names at once from one project: its share of the queue (64) holds them all. The
    // batch waits for their ages as a lookup of each would (`budget_ms`, all at once): the
    // other project asks meanwhile.
    let batch = std::thread::scope(|s| {
        let flood = s.spawn(|| post_batch(&gw, "sk_flood_0123456789abcdef", &names));
        wait_until(Duration::from_secs(10), || !server.order().is_empty());
        let quiet = send(
            &gw,
            "GET",
            "/v1/public/domain/quiet-start.com?explain=true",
            Some("sk_quiet_0123456789abcdef"),
            &[],
            None,
        );
        (flood.join().unwrap(), quiet)
    });
    assert_eq!(batch.0.status, 200);
    let r = batch.1;
    assert_eq!(r.json()["evidence"]["age_days"], 2, "{:?}", r.json());
    // Served in turn: the other project's name went right after the fetch in flight, not
    // behind the 60 queued before it.
    let order = server.order();
    let at = order.iter().position(|n| n == "quiet-start.com").unwrap();
    assert!(at <= 3, "fetched {at}th: {order:?}");
    // A name the flooding project queued first moves to the asker's line: not behind the flood.
    let before = server.order().len();
    let r = send(
        &gw,
        "GET",
        "/v1/public/domain/planted-start.com?explain=true",
        Some("sk_quiet_0123456789abcdef"),
        &[],
        None,
    );
    assert_eq!(r.json()["evidence"]["age_days"], 400, "{:?}", r.json());
    let order = server.order();
    let planted = order.iter().position(|n| n == "planted-start.com").unwrap();
    // At most the fetch in flight when it was asked, and one that started between reading the
    // order and the request's arrival (a loaded machine): never the ~25 flood names still queued.
    assert!(
        planted <= before + 2,
        "fetched {planted}th of {before}: {order:?}"
    );
}

#[test]
fn answers_no_server_vouches_for_give_no_age() {
    let stranger = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let elsewhere = format!(
        "http://{}/rdap/domain/moved.com",
        stranger.local_addr().unwrap()
    );
    let server = RdapServer::start(HashMap::from([
        (
            "moved.com",
            Reply::Raw(302, vec![("Location".into(), elsewhere)], String::new()),
        ),
        (
            "other-object.com",
            Reply::Raw(
                200,
                vec![],
                serde_json::json!({"objectClassName": "domain", "ldhName": "someone-else.com",
                    "events": [{"eventAction": "registration", "eventDate": chrono::Utc::now().to_rfc3339()}]})
                .to_string(),
            ),
        ),
        ("huge.com", Reply::Raw(200, vec![], "x".repeat(300_000))),
        (
            "moved-home.com",
            Reply::Raw(302, vec![("Location".into(), "/rdap/v2/domain/moved-home-target".into())], String::new()),
        ),
        (
            "moved-home-target",
            Reply::Raw(
                200,
                vec![],
                serde_json::json!({"objectClassName": "domain", "ldhName": "moved-home.com",
                    "events": [{"eventAction": "registration", "eventDate": "2001-02-03T04:05:06Z"}]})
                .to_string(),
            ),
        ),
    ]));
    let gw = gateway(&server, &["budget_ms: 3000"]).start();
    for name in [
        "moved.com",
        "other-object.com",
        "huge.com",
        "unknown-here.com",
    ] {
        let r = explain(&gw, name);
        assert_eq!(r["risk_score"], 20, "{name}: {r}");
        assert!(r["evidence"].get("registered").is_none(), "{name}: {r}");
    }
    assert_eq!(
        gw.metric("drg_rdap_errors_total{kind=\"redirect\"}"),
        Some(1.0)
    );
    assert_eq!(
        gw.metric("drg_rdap_errors_total{kind=\"invalid_answer\"}"),
        Some(1.0)
    );
    assert_eq!(
        gw.metric("drg_rdap_errors_total{kind=\"too_large\"}"),
        Some(1.0)
    );
    assert_eq!(
        gw.metric("drg_rdap_fetches_total{outcome=\"not_found\"}"),
        Some(1.0)
    );
    // A TLD the bootstrap names no server for is never asked.
    let r = explain(&gw, "fresh.org");
    assert!(r["evidence"].get("registered").is_none());
    assert_eq!(
        gw.metric("drg_rdap_lookups_total{result=\"no_server\"}"),
        Some(1.0)
    );
    drop(stranger);
}

#[test]
fn a_young_domain_is_raised_never_flagged_and_weak_mail_raises_it_a_little_more() {
    let server = RdapServer::start(HashMap::from([
        ("pop-up-mail.com", Reply::Registered(2)),
        ("new-startup.com", Reply::Registered(2)),
    ]));
    let zone = |host: &str| Zone {
        mx: vec![(10, host.to_owned())],
        ttl: 300,
        ..Zone::default()
    };
    let dns = DnsServer::start(HashMap::from([
        ("pop-up-mail.com".to_owned(), zone("mx.pop-up-mail.com")),
        ("new-startup.com".to_owned(), zone("aspmx.l.google.com")),
    ]));
    let gw = gateway(&server, &["budget_ms: 3000"])
        .dns(dns.addr)
        .data("mx_providers.csv", &dns::shipped_providers())
        .start();
    // Age is a modifier: a company two days old on its own mail host is `safe`, at the top
    // of the low band, where a form may look closer.
    let own = explain(&gw, "pop-up-mail.com");
    assert_eq!(own["reason"], "safe", "{own}");
    assert_eq!(own["risk_score"], 45, "{own}");
    assert_eq!(own["evidence"]["rule"], "unknown", "{own}");
    assert_eq!(own["evidence"]["young_domain"], "raised", "{own}");
    let startup = explain(&gw, "new-startup.com");
    assert_eq!(startup["reason"], "safe", "{startup}");
    assert_eq!(startup["risk_score"], 40, "{startup}");
    assert_eq!(startup["evidence"]["young_domain"], "raised", "{startup}");
}

#[test]
fn the_bootstrap_is_refreshed_from_its_url_and_a_bad_download_is_refused() {
    let mut server = RdapServer::start(HashMap::from([(
        "fresh-from-bootstrap.com",
        Reply::Registered(4),
    )]));
    let bootstrap = serde_json::json!({
        "version": "1.0",
        "publication": "2026-11-24T00:00:00Z",
        "services": [[["com"], [server.base()]]],
    });
    server.serve("dns.json", Reply::Raw(200, vec![], bootstrap.to_string()));
    server.serve(
        "broken.json",
        Reply::Raw(200, vec![], "{\"services\": 7}".into()),
    );
    let url = |file: &str| format!("bootstrap_url: \"http://{}/{file}\"", server.addr);
    // No `servers`: the registry is known from the fetched bootstrap alone.
    let gw = Gateway::builder()
        .rdap_yaml(&url("dns.json"))
        .rdap_yaml("allow_plain_http: true")
        .rdap_yaml("budget_ms: 3000")
        .start();
    gw.wait_metric("drg_rdap_bootstrap_tlds", 1.0);
    let r = explain(&gw, "fresh-from-bootstrap.com");
    assert_eq!(r["evidence"]["age_days"], 4, "{r}");
    // The copy is kept in the state folder: the next start uses it before any download.
    let dir = gw.stop();
    assert!(dir.path().join("state/rdap_dns.json").exists());
    let gw = Gateway::builder()
        .rdap_yaml(&url("broken.json"))
        .rdap_yaml("allow_plain_http: true")
        .in_dir(dir)
        .start();
    wait_until(Duration::from_secs(10), || {
        gw.log().contains("was not taken")
    });
    assert!(gw.log().contains("was not taken"), "{}", gw.log());
    assert_eq!(gw.metric("drg_rdap_bootstrap_tlds"), Some(1.0));
}

/// A registry that sends its answer's header and the first byte of its body, then nothing: the
/// fetch's read timeout fires while the body is read. Each connection is held until the gateway
/// closes it.
fn stalling_registry() -> std::net::SocketAddr {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                while reader.read_line(&mut line).unwrap_or(0) > 0 && line != "\r\n" {
                    line.clear();
                }
                let head = "HTTP/1.1 200 OK\r\nContent-Type: application/rdap+json\r\n\
                            Content-Length: 1000\r\n\r\n{";
                let _ = reader.get_mut().write_all(head.as_bytes());
                // Until the gateway gives up and closes the connection.
                let _ = reader.read_to_end(&mut Vec::new());
            });
        }
    });
    addr
}

/// A registry whose answer's body stops coming is a timeout, not a transport failure: ureq hands
/// its timeout to the body's reader wrapped in an `io::Error`, which was counted as `transport`.
#[test]
fn a_read_timeout_is_counted_as_a_timeout() {
    let addr = stalling_registry();
    let gw = Gateway::builder()
        .rdap_yaml(&format!("servers: {{com: \"http://{addr}/rdap/\"}}"))
        .rdap_yaml("allow_plain_http: true")
        .rdap_yaml("timeout_ms: 300")
        .start();
    let r = explain(&gw, "stalls.com");
    assert!(r["evidence"].get("registered").is_none(), "{r}");
    wait_until(Duration::from_secs(10), || {
        gw.metric("drg_rdap_errors_total{kind=\"timeout\"}") == Some(1.0)
    });
    assert_eq!(gw.metric("drg_rdap_errors_total{kind=\"transport\"}"), None);
}

const OTHER_SECRET: &str = "drg_other_project_key_0123456789abcdefghijklm";

/// Every project is answered the same for the same asks: its first lookup of a name has no age
/// (a lookup never waits by default), its next ones have it, whether or not another project's
/// lookup had it fetched already. Before, a project's first lookup showed the age as soon as
/// another project had asked: answers differed by who else asked, and showed that they had.
#[test]
fn an_age_reaches_a_project_by_its_own_lookups_never_by_anothers() {
    let server = RdapServer::start(HashMap::from([("shared-age.com", Reply::Registered(3))]));
    let gw = gateway(&server, &[])
        .key_in_project("other", OTHER_SECRET, "test", "other")
        .start();
    let first = gw.explain_as(TEST_SECRET, "shared-age.com");
    assert!(first["evidence"].get("registered").is_none(), "{first}");
    assert_eq!(first["risk_score"], 20, "{first}");
    wait_until(Duration::from_secs(10), || {
        gw.explain_as(TEST_SECRET, "shared-age.com")["risk_score"] == 40
    });
    // The other project's first lookup: answered as the first project's was.
    let theirs = gw.explain_as(OTHER_SECRET, "www.shared-age.com");
    assert!(theirs["evidence"].get("registered").is_none(), "{theirs}");
    assert_eq!(theirs["risk_score"], 20, "{theirs}");
    // Its next: the age, from the cache (the registry was asked once).
    let again = gw.explain_as(OTHER_SECRET, "shared-age.com");
    assert_eq!(again["evidence"]["age_days"], 3, "{again}");
    assert_eq!(again["risk_score"], 40, "{again}");
    assert_eq!(server.asked("shared-age.com"), 1);
}

/// `?explain=true` says what the registry did when an answer has no age: its fetch is on its
/// way (`queued`), failed (`failed`, a timeout here) or was refused (`refused`, a 403 here).
/// Before, all three looked like a registry never asked.
#[test]
fn explain_says_when_the_registry_failed_or_refused() {
    let stalling = stalling_registry();
    let server = RdapServer::start(HashMap::from([
        ("forbidden.net", Reply::Raw(403, vec![], String::new())),
        ("answered.net", Reply::Registered(9_000)),
    ]));
    let gw = Gateway::builder()
        .rdap_yaml(&format!(
            "servers: {{com: \"http://{stalling}/rdap/\", net: \"{}\"}}",
            server.base()
        ))
        .rdap_yaml("allow_plain_http: true")
        .rdap_yaml("min_interval_ms: 1")
        .rdap_yaml("timeout_ms: 300")
        .start();
    let registry = |name: &str| explain(&gw, name)["evidence"]["registry"].clone();
    assert_eq!(
        registry("stalls.com"),
        serde_json::json!({"status": "queued"})
    );
    wait_until(Duration::from_secs(10), || {
        registry("stalls.com") == serde_json::json!({"status": "failed", "kind": "timeout"})
    });
    let _ = registry("forbidden.net");
    wait_until(Duration::from_secs(10), || {
        registry("forbidden.net") == serde_json::json!({"status": "refused", "kind": "status"})
    });
    // A registry that answered: the age, and no note.
    let _ = registry("answered.net");
    wait_until(Duration::from_secs(10), || {
        explain(&gw, "answered.net")["evidence"]["age_days"] == 9_000
    });
    assert_eq!(registry("answered.net"), serde_json::Value::Null);
}
