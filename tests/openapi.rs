//! `GET /v1/openapi.json` on the real gateway: the embedded document, without a key, uncounted.
//! (scripts/schemathesis checks the gateway's answers against the document itself.)

use crate::common;
use common::*;

#[test]
fn openapi_document_is_served_without_a_key_and_not_counted() {
    let gw = Gateway::builder().start();
    let mut anonymous = gw.conn_as(None);
    for _ in 0..3 {
        let r = anonymous.get("/v1/openapi.json").unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("content-type"),
            Some("application/json; charset=utf-8")
        );
        assert_eq!(r.header("vary"), Some("Origin"));
        let expected: serde_json::Value =
            serde_yaml::from_str(drg_gateway::edge::openapi::YAML).unwrap();
        assert_eq!(r.json(), expected);
        assert_eq!(r.json()["openapi"], "3.1.0");
    }
    // A key, even a wrong one, changes nothing: the document is public.
    let r = gw
        .conn_as(Some("drg_wrong"))
        .get("/v1/openapi.json")
        .unwrap();
    assert_eq!(r.status, 200);

    let pre = anonymous
        .request(
            "OPTIONS",
            "/v1/openapi.json",
            &[("Origin", "https://a.example")],
        )
        .unwrap();
    assert_eq!(pre.status, 204);

    let r = gw.conn().get("/v1/openapi.json").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("ratelimit"), None, "the document is not counted");
    assert_eq!(gw.get("/v1/usage").json()["month_count"], 0);

    let r = anonymous.request("POST", "/v1/openapi.json", &[]).unwrap();
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET, OPTIONS"));
}
