//! The OpenAPI document of the contract: `openapi.yaml`, embedded, served as JSON.
//!
//! The YAML is what people edit; clients and tools want JSON. It is converted once, on the first
//! request for it (a start need not pay for it: a quarter of a debug gateway's start, measured),
//! so serving it is then a copy of the same bytes.

use bytes::Bytes;
use std::sync::OnceLock;

/// The document as written (OpenAPI 3.1, YAML).
pub const YAML: &str = include_str!("openapi.yaml");

/// Why the embedded document could not be served.
#[derive(Debug, thiserror::Error)]
pub enum OpenApiError {
    #[error("the embedded OpenAPI document is not valid YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error("the embedded OpenAPI document does not convert to JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The document served at `GET /v1/openapi.json`, rendered on the first call and kept; `None`
/// (answered 500, and logged once) if the embedded document were broken, which a unit test rules
/// out.
pub fn served() -> Option<Bytes> {
    static DOCUMENT: OnceLock<Option<Bytes>> = OnceLock::new();
    DOCUMENT
        .get_or_init(|| json().map_err(|e| log::error!("{e}")).ok())
        .clone()
}

/// The document rendered as compact JSON.
pub fn json() -> Result<Bytes, OpenApiError> {
    let value: serde_json::Value = serde_yaml::from_str(YAML)?;
    Ok(Bytes::from(serde_json::to_vec(&value)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge::route::{route, KeysCall, OverridesCall, Route, WebhooksCall};
    use http::Method;

    fn document() -> serde_json::Value {
        serde_json::from_slice(&json().expect("the embedded document converts")).unwrap()
    }

    /// A request path (path parameters filled in) for every route the router knows. The match
    /// is exhaustive, so a new route does not compile until it has a line here, and the test
    /// below then wants it in the document.
    fn example_path(r: Route<'_>) -> Option<&'static str> {
        match r {
            Route::Domain { .. } => Some("/v1/public/domain/{domain}"),
            Route::Batch { .. } => Some("/v1/public/domains"),
            Route::TopDomains { .. } => Some("/v1/public/top-domains"),
            Route::Check { .. } => Some("/v1/check/{email_or_domain}"),
            Route::Usage => Some("/v1/usage"),
            Route::Logs { .. } => Some("/v1/logs"),
            Route::Stats => Some("/v1/stats"),
            Route::Changes { .. } => Some("/v1/changes"),
            Route::Keys(KeysCall::Revoke { .. }) => Some("/v1/keys/{id}"),
            Route::Keys(KeysCall::Rotate { .. }) => Some("/v1/keys/{id}/rotate"),
            Route::Keys(_) => Some("/v1/keys"),
            Route::Overrides(OverridesCall::List { .. }) => Some("/v1/overrides"),
            Route::Overrides(_) => Some("/v1/overrides/{domain}"),
            Route::Webhooks(WebhooksCall::Delete { .. }) => Some("/v1/webhooks/{id}"),
            Route::Webhooks(_) => Some("/v1/webhooks"),
            Route::Reports { .. } => Some("/v1/reports"),
            Route::Audit { .. } => Some("/v1/audit"),
            Route::OpenApi => Some("/v1/openapi.json"),
            Route::Health => Some("/healthz"),
            Route::Ready => Some("/readyz"),
            // Not a path of its own: the `options` operation of every /v1/ path.
            Route::Preflight => None,
            // Pages for people, not operations of the API (docs/operations.md, "Dashboard").
            Route::Dashboard(_) => None,
        }
    }

    #[test]
    fn document_is_openapi_3_1_and_lists_every_route() {
        let doc = document();
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().unwrap();
        let mut routed = Vec::new();
        for template in paths.keys() {
            let concrete = template
                .replace("{domain}", "gmail.com")
                .replace("{email_or_domain}", "user@example.com")
                .replace("{id}", "key_0123");
            let item = &paths[template];
            // `/v1/keys/{id}` and the batch are the paths without a GET.
            let method = if item["get"].is_object() {
                Method::GET
            } else if item["post"].is_object() {
                Method::POST
            } else {
                Method::DELETE
            };
            let r = route(&method, &concrete, None)
                .unwrap_or_else(|e| panic!("{template} in the document is not routed: {e:?}"));
            assert_eq!(example_path(r), Some(template.as_str()), "{template}");
            routed.push(template.as_str());
            assert!(
                ["get", "post", "delete"]
                    .iter()
                    .any(|m| item[*m].is_object()),
                "{template} has no operation"
            );
            // Revoking and rotating a key, the overrides and the webhooks need a server key,
            // which browsers never hold: no preflight.
            let server_only = template.starts_with("/v1/keys/")
                || template.starts_with("/v1/overrides")
                || template.starts_with("/v1/webhooks")
                || template == "/v1/reports";
            if template.starts_with("/v1/") && !server_only {
                assert_eq!(
                    route(&Method::OPTIONS, &concrete, None),
                    Ok(Route::Preflight)
                );
                assert!(item["options"].is_object(), "{template} has no preflight");
            }
        }
        // Every route of the router is in the document.
        for r in [
            Route::Domain {
                raw: "",
                explain: false,
            },
            Route::Batch { explain: false },
            Route::TopDomains { limit: 1 },
            Route::Check { raw: "" },
            Route::Usage,
            Route::Logs {
                cursor: None,
                limit: 1,
            },
            Route::Stats,
            Route::Changes {
                after: 0,
                since: 0,
                limit: 1,
            },
            Route::Keys(KeysCall::List),
            Route::Keys(KeysCall::Revoke { id: "" }),
            Route::Keys(KeysCall::Rotate { id: "" }),
            Route::Overrides(OverridesCall::List {
                cursor: None,
                limit: 1,
            }),
            Route::Overrides(OverridesCall::Delete { domain: "" }),
            Route::Webhooks(WebhooksCall::Create),
            Route::Webhooks(WebhooksCall::Delete { id: "" }),
            Route::Reports { post: true },
            Route::Audit {
                cursor: None,
                limit: 1,
            },
            Route::OpenApi,
            Route::Health,
            Route::Ready,
        ] {
            let path = example_path(r).unwrap();
            assert!(
                routed.contains(&path),
                "{path} is missing from the document"
            );
        }
    }

    #[test]
    fn key_free_operations_say_so() {
        let doc = document();
        assert_eq!(doc["security"][0]["bearer"], serde_json::json!([]));
        for path in ["/healthz", "/readyz", "/v1/openapi.json"] {
            assert_eq!(
                doc["paths"][path]["get"]["security"],
                serde_json::json!([]),
                "{path}"
            );
        }
        assert!(doc["paths"]["/v1/usage"]["get"]["security"].is_null());
    }

    #[test]
    fn every_ref_resolves() {
        fn walk<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a str>) {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(r) = m.get("$ref").and_then(|r| r.as_str()) {
                        out.push(r);
                    }
                    m.values().for_each(|v| walk(v, out));
                }
                serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
                _ => {}
            }
        }
        let doc = document();
        let mut refs = Vec::new();
        walk(&doc, &mut refs);
        assert!(!refs.is_empty());
        for r in refs {
            let pointer = r.strip_prefix('#').expect("local refs only");
            assert!(doc.pointer(pointer).is_some(), "{r} does not resolve");
        }
    }
}
