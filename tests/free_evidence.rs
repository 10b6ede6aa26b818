//! Company domains on a broad free-webmail list, against the real binary and a real DNS server:
//! with MX lookups on, a broad-list name whose mail goes first to a business mailbox provider is
//! not a free provider (evidence `not_free_because: business_mx`); with or without MX, a name on
//! `free_exclusions.txt` is not one either; a webmail provider on its own hosts stays free.

use crate::common;
use crate::dns;

use std::collections::HashMap;

use common::*;
use dns::{DnsServer, Zone};
use serde_json::Value;

const BROAD: &str = "acme-corp.test\nsmallmail.test\nlisted-org.test\n";

fn zones() -> HashMap<String, Zone> {
    let mx = |host: &str| Zone {
        mx: vec![(1, host.to_owned())],
        a: None,
        ttl: 300,
    };
    let mut z = HashMap::new();
    z.insert("acme-corp.test".into(), mx("aspmx.l.google.com"));
    z.insert("smallmail.test".into(), mx("mx.smallmail.test"));
    z.insert("listed-org.test".into(), mx("mx.listed-org.test"));
    z
}

fn builder() -> GatewayBuilder {
    Gateway::builder()
        .data("broad.txt", BROAD)
        .data(
            "free_exclusions.txt",
            "listed-org.test   # an organisation\n",
        )
        .data(
            "mx_providers.csv",
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/data/mx_providers.csv"
            ))
            .unwrap(),
        )
        .data_yaml("broad_free_lists: [broad.txt]")
}

fn explain(gw: &Gateway, domain: &str) -> Value {
    let r = gw.get(&format!("/v1/public/domain/{domain}?explain=true"));
    assert_eq!(r.status, 200, "{domain}");
    r.json()
}

#[test]
fn business_mail_on_a_broad_list_is_not_free_with_mx_on() {
    let server = DnsServer::start(zones());
    let gw = builder().dns(server.addr).start();
    let acme = explain(&gw, "acme-corp.test");
    assert_eq!(acme["is_free_provider"], false, "{acme}");
    assert_eq!(acme["is_corporate_email"], true, "{acme}");
    assert_eq!(acme["reason"], "safe");
    assert_eq!(
        acme["evidence"]["not_free_because"], "business_mx",
        "{acme}"
    );
    assert_eq!(acme["evidence"]["mx_provider"]["label"], "Google Workspace");
    // A webmail provider runs its own hosts: still free.
    let small = explain(&gw, "smallmail.test");
    assert_eq!(small["is_free_provider"], true, "{small}");
    assert_eq!(small["evidence"]["rule"], "broad_free_provider");
    assert!(small["evidence"].get("not_free_because").is_none());
    let listed = explain(&gw, "listed-org.test");
    assert_eq!(listed["is_free_provider"], false, "{listed}");
    assert_eq!(listed["evidence"]["not_free_because"], "free_exclusions");
}

#[test]
fn the_shipped_exclusions_hold_with_mx_off() {
    let gw = builder().start();
    let listed = explain(&gw, "listed-org.test");
    assert_eq!(listed["is_free_provider"], false, "{listed}");
    assert_eq!(listed["evidence"]["not_free_because"], "free_exclusions");
    // Without DNS, the broad list's word stands for the others.
    assert_eq!(explain(&gw, "acme-corp.test")["is_free_provider"], true);
    assert!(
        gw.log().contains("organisation over broad free"),
        "{}",
        gw.log()
    );
}
