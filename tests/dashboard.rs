//! The browser dashboard against the real binary, in a real headless Chromium (Debian's
//! `chromium` and `chromium-driver`, Selenium from PyPI pointed at /usr/bin/chromedriver):
//! tests/dashboard/browser.py signs in, checks each panel against the API's own answers, pages
//! through calls, makes, rotates and revokes a key, sets and removes an override, sends a
//! report, makes and removes a webhook, looks a domain up, and takes the screenshots; then signs in to a second gateway on
//! the shipped defaults, where the page must not ask for what is off. Here: the set-up, that
//! `features` of `/v1/usage` says which routes answer, what the page's files are served with,
//! and what the page cost the month.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const SERVER: &str = "drg_dash_server_key_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const BROWSER: &str = "drg_dash_browser_key_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

fn selenium() -> PathBuf {
    python_venv("selenium-venv", &["selenium==4.45.0"], "import selenium")
}

/// The routes behind each part `features` of `/v1/usage` names.
const PARTS: [(&str, &[&str]); 7] = [
    ("logs", &["/v1/logs", "/v1/stats"]),
    ("changes", &["/v1/changes"]),
    ("keys", &["/v1/keys"]),
    ("overrides", &["/v1/overrides"]),
    ("reports", &["/v1/reports"]),
    ("webhooks", &["/v1/webhooks"]),
    ("audit", &["/v1/audit"]),
];

/// `features` of `/v1/usage` says exactly which parts' routes answer (the page asks only for
/// those): a part is on when its routes answer anything but 404. Returns the features.
fn features_match_routes(gw: &Gateway) -> serde_json::Value {
    let mut c = gw.conn_as(Some(SERVER));
    let features = c.get("/v1/usage").unwrap().json()["features"].clone();
    assert_eq!(
        features.as_object().map(|f| f.len()),
        Some(PARTS.len()),
        "{features}"
    );
    for (part, routes) in PARTS {
        for route in routes {
            let status = c.get(route).unwrap().status;
            assert_eq!(
                features[part].as_bool(),
                Some(status != 404),
                "{part}: GET {route} answered {status}, features say {features}"
            );
        }
    }
    features
}

#[test]
fn the_dashboard_shows_what_the_api_says_in_a_real_browser() {
    for tool in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        assert!(
            Path::new(tool).exists(),
            "{tool} is missing: scripts/test installs Debian's chromium and chromium-driver"
        );
    }
    let origins = drg_access::keys::EntryExtras {
        project: Some("acme"),
        ..Default::default()
    };
    // A registry on loopback that knows one young domain, for the lookup's age line.
    let registry = crate::rdap::RdapServer::start(std::collections::HashMap::from([(
        "young-shop.com",
        crate::rdap::Reply::Registered(3),
    )]));
    let gw = Gateway::builder()
        .rdap_yaml(&format!("servers: {{com: \"{}\"}}", registry.base()))
        .rdap_yaml("allow_plain_http: true")
        .rdap_yaml("budget_ms: 3000")
        .plan("pro", 100)
        .gateway_yaml("changes: { watch_days: { pro: 30 }, stable_seconds: 0 }")
        .gateway_yaml("webhooks: {}")
        .data("disposable.txt", "mailinator.com\nthrowaway.example\n")
        .key_in_project("server", SERVER, "pro", "acme")
        .key_entry(&drg_access::keys::key_entry_yaml_with(
            "web",
            BROWSER,
            "pro",
            &["https://app.example.com".to_owned()],
            &origins,
        ))
        .start();
    // 25 lookups (a page of 20 and one more), some of them flagged.
    let mut c = gw.conn_as(Some(SERVER));
    for i in 0..25 {
        let domain = if i % 5 == 0 {
            "throwaway.example".to_owned()
        } else {
            format!("site{i}.example.org")
        };
        let r = c.get(&format!("/v1/public/domain/{domain}")).unwrap();
        assert_eq!(r.status, 200);
    }
    wait_until(Duration::from_secs(5), || {
        let r = c.get("/v1/logs?limit=100").unwrap();
        r.json()["items"].as_array().map_or(0, Vec::len) == 25
    });
    // A list refresh makes one of the looked-up names a throwaway: the page lists the change.
    wait_until(Duration::from_secs(5), || {
        gw.metric("drg_changes_total{event=\"watched\"}") >= Some(21.0)
    });
    write_atomic(
        &gw.data_path("disposable.txt"),
        "mailinator.com\nthrowaway.example\nsite1.example.org\n",
    );
    wait_until(Duration::from_secs(10), || {
        let r = c.get("/v1/changes").unwrap();
        r.json()["changes"].as_array().map_or(0, Vec::len) == 1
    });

    // The same project on a gateway of the shipped defaults: verdict changes and webhooks off.
    let shipped = Gateway::builder()
        .plan("pro", 100)
        .key_in_project("server", SERVER, "pro", "acme")
        .start();
    let on = features_match_routes(&gw);
    let defaults = features_match_routes(&shipped);
    assert_eq!(on["changes"], true);
    assert_eq!(defaults["changes"], false);
    assert_eq!(on["webhooks"], true);
    assert_eq!(defaults["webhooks"], false);

    // The files need no key and cost nothing.
    let month = |c: &mut Conn| c.get("/v1/usage").unwrap().json()["month_count"].as_u64();
    let before = month(&mut c);
    let mut anon = gw.conn_as(None);
    for (path, kind) in [
        ("/dashboard", "text/html"),
        ("/dashboard/app.js", "text/javascript"),
        ("/dashboard/app.css", "text/css"),
    ] {
        let r = anon.get(path).unwrap();
        assert_eq!(r.status, 200, "{path}");
        assert!(
            r.header("content-type").unwrap().starts_with(kind),
            "{path}"
        );
        let csp = r.header("content-security-policy").unwrap();
        assert!(
            csp.contains("default-src 'self'") && !csp.contains("unsafe"),
            "{csp}"
        );
        assert_eq!(r.header("x-frame-options"), Some("DENY"));
        assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(r.header("referrer-policy"), Some("no-referrer"));
        assert_eq!(r.header("cache-control"), Some("no-cache"));
    }
    assert_eq!(month(&mut c), before, "the page's files are not counted");

    let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-screenshots");
    let out = Command::new(selenium())
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard/browser.py"))
        .arg(format!("http://{}", gw.addr))
        .args([SERVER, BROWSER])
        .arg(&shots)
        .arg(format!("http://{}", shipped.addr))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "browser test failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(
        out.stdout
            .split(|b| *b == b'\n')
            .rfind(|l| l.starts_with(b"{"))
            .unwrap(),
    )
    .unwrap();
    // Counted: one top-domains call per opening of the dashboard (two, and one more when parts
    // the gateway does not serve were checked against stand-ins), its three lookups, the
    // script's own top-domains call and its three lookups of the overridden domain; usage,
    // stats, logs, keys, overrides and reports are not counted.
    let faked = report["faked"].as_array().unwrap().len();
    let spent = report["month_count_after"].as_u64().unwrap()
        - report["month_count_before"].as_u64().unwrap();
    assert_eq!(spent, 9 + u64::from(faked > 0), "{report}");
    let panels = [
        "usage",
        "chart",
        "calls",
        "changes",
        "keys",
        "lookup",
        "top",
        "overrides",
        "reports",
    ];
    let names = [
        "dashboard-desktop",
        "dashboard-mobile",
        "sign-in-browser-key",
    ]
    .map(String::from)
    .into_iter()
    .chain(
        panels
            .iter()
            .flat_map(|p| ["desktop", "mobile"].map(|w| format!("panel-{p}-{w}"))),
    )
    // Checked against the gateway or against their stand-ins: either way, drawn.
    .chain(["webhooks", "audit"].map(|p| format!("panel-{p}-desktop")));
    for name in names {
        let png = shots.join(format!("{name}.png"));
        assert!(
            std::fs::metadata(&png).is_ok_and(|m| m.len() > 1_000),
            "{}",
            png.display()
        );
    }
}
