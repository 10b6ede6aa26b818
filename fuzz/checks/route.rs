//! Fuzzes the router with arbitrary method bytes, path and query, checks what each answer
//! promises (route, method, parameters, which routes refuse a query), then decodes and screens
//! the path parameter as the gateway does.
//!
//! Input layout: method bytes, a NUL, then the request target (path, `?`, query).

use drg_domain::target::screen_target;
use drg_domain::top::MAX_TOP;
use drg_domain::DomainName;
use drg_gateway::edge::route::{
    route, KeysCall, OverridesCall, QueryOf, Route, RouteError, WebhooksCall, BATCH_PATH,
    KEYS_PATH, MAX_CURSOR_LEN, MAX_LOGS_LIMIT, OVERRIDES_ITEM_PREFIX, OVERRIDES_PATH, REPORTS_PATH,
    WEBHOOKS_ITEM_PREFIX, WEBHOOKS_PATH,
};
use http::Method;

/// The value of the first `name` parameter of a query, as the router reads it: names and values
/// percent-decoded (`?%65xplain=%74rue` is `explain=true`), invalid UTF-8 replaced.
fn param(query: Option<&str>, name: &str) -> Option<String> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8_lossy()
            .into_owned()
    };
    query?
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .find_map(|(k, v)| (decode(k) == name).then(|| decode(v)))
}

/// Checks one input; panics on a broken promise.
pub fn check(data: &[u8]) {
    let Some(nul) = data.iter().position(|&b| b == 0) else {
        return;
    };
    let Ok(method) = Method::from_bytes(&data[..nul]) else {
        return;
    };
    let Ok(target) = std::str::from_utf8(&data[nul + 1..]) else {
        return;
    };
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    match route(&method, path, query) {
        Ok(Route::Domain { raw, explain }) => {
            assert_eq!(method, Method::GET);
            assert_eq!(path.strip_prefix("/v1/public/domain/"), Some(raw));
            assert_eq!(explain, param(query, "explain").as_deref() == Some("true"));
            if let Ok(decoded) = percent_encoding::percent_decode_str(raw).decode_utf8() {
                let _ = DomainName::parse(&decoded);
            }
        }
        Ok(Route::Check { raw }) => {
            assert_eq!(method, Method::GET);
            assert_eq!(path.strip_prefix("/v1/check/"), Some(raw));
            if let Ok(decoded) = percent_encoding::percent_decode_str(raw).decode_utf8() {
                let _ = screen_target(&decoded);
            }
        }
        Ok(Route::TopDomains { limit }) => {
            assert_eq!(method, Method::GET);
            assert!((1..=MAX_TOP).contains(&limit), "{limit}");
        }
        Ok(Route::Logs { cursor, limit }) => {
            assert_eq!(method, Method::GET);
            assert_eq!(path, "/v1/logs");
            assert!((1..=MAX_LOGS_LIMIT).contains(&limit), "{limit}");
            if let Some(c) = cursor {
                assert!(!c.is_empty() && c.len() <= MAX_CURSOR_LEN, "{c}");
                assert!(
                    c.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                    "{c}"
                );
            }
        }
        // The only routes with methods besides GET: create, revoke (never a path of its own).
        Ok(Route::Keys(call)) => match call {
            KeysCall::List => assert_eq!((&method, path), (&Method::GET, KEYS_PATH)),
            KeysCall::Create => assert_eq!((&method, path), (&Method::POST, KEYS_PATH)),
            KeysCall::Revoke { id } => {
                assert_eq!(method, Method::DELETE);
                assert_eq!(path.strip_prefix("/v1/keys/"), Some(id));
                assert!(!id.is_empty() && !id.contains('/'), "{id}");
            }
            KeysCall::Rotate { id } => {
                assert_eq!(method, Method::POST);
                assert_eq!(path, format!("/v1/keys/{id}/rotate"));
                assert!(!id.is_empty() && !id.contains('/'), "{id}");
            }
        },
        // A project's overrides: listed with GET, each set with PUT and removed with DELETE.
        Ok(Route::Overrides(call)) => match call {
            OverridesCall::List { limit, .. } => {
                assert_eq!((&method, path), (&Method::GET, OVERRIDES_PATH));
                assert!((1..=1_000).contains(&limit), "{limit}");
            }
            OverridesCall::Put { domain } | OverridesCall::Delete { domain } => {
                assert!(
                    method == Method::PUT || method == Method::DELETE,
                    "{method}"
                );
                assert_eq!(path.strip_prefix(OVERRIDES_ITEM_PREFIX), Some(domain));
                assert!(!domain.is_empty() && !domain.contains('/'), "{domain}");
            }
        },
        // A project's webhooks: listed with GET, made with POST, each removed with DELETE.
        Ok(Route::Webhooks(call)) => match call {
            WebhooksCall::List { limit, .. } => {
                assert_eq!((&method, path), (&Method::GET, WEBHOOKS_PATH));
                assert!((1..=1_000).contains(&limit), "{limit}");
            }
            WebhooksCall::Create => assert_eq!((&method, path), (&Method::POST, WEBHOOKS_PATH)),
            WebhooksCall::Delete { id } => {
                assert_eq!(method, Method::DELETE);
                assert_eq!(path.strip_prefix(WEBHOOKS_ITEM_PREFIX), Some(id));
                assert!(!id.is_empty() && !id.contains('/'), "{id}");
            }
        },
        // A project's reports: listed with GET, sent with POST.
        Ok(Route::Reports { post }) => {
            assert_eq!(path, REPORTS_PATH);
            assert_eq!(method, if post { Method::POST } else { Method::GET });
        }
        // The batch lookup takes a body, so it is a POST, and its `explain` is read as the
        // single lookup's.
        Ok(Route::Batch { explain }) => {
            assert_eq!((&method, path), (&Method::POST, BATCH_PATH));
            assert_eq!(explain, param(query, "explain").as_deref() == Some("true"));
        }
        Ok(Route::Preflight) => {
            assert_eq!(method, Method::OPTIONS);
            assert!(path.starts_with("/v1/"));
        }
        Ok(_) => assert_eq!(method, Method::GET),
        // The answer's `Allow` never lists the method refused (GET included: `/v1/keys/{id}`
        // takes DELETE only).
        Err(RouteError::MethodNotAllowed { allow }) => {
            assert!(!allow.split(", ").any(|m| m == method.as_str()), "{allow}");
        }
        // A query is read only by the five routes that take one: the domain route and the batch
        // (`explain`), top-domains (`limit`), logs (`limit`, `cursor`) and changes (`limit`,
        // `cursor`, `since`).
        Err(RouteError::BadQuery(of, why)) => {
            let want = if of == QueryOf::Batch {
                Method::POST
            } else {
                Method::GET
            };
            assert_eq!(method, want);
            assert!(query.is_some(), "{why}");
            match of {
                QueryOf::Domain => {
                    assert!(path.starts_with("/v1/public/domain/"), "{path}");
                    assert!(
                        !matches!(
                            param(query, "explain").as_deref(),
                            None | Some("true" | "false")
                        ),
                        "{why}"
                    );
                }
                QueryOf::Batch => {
                    assert_eq!(path, BATCH_PATH);
                    assert!(
                        !matches!(
                            param(query, "explain").as_deref(),
                            None | Some("true" | "false")
                        ),
                        "{why}"
                    );
                }
                QueryOf::TopDomains => assert_eq!(path, "/v1/public/top-domains"),
                QueryOf::Logs => assert_eq!(path, "/v1/logs"),
                QueryOf::Changes => assert_eq!(path, "/v1/changes"),
                QueryOf::Overrides => assert_eq!(path, OVERRIDES_PATH),
                QueryOf::Webhooks => assert_eq!(path, WEBHOOKS_PATH),
                QueryOf::Audit => assert_eq!(path, "/v1/audit"),
            }
        }
        Err(RouteError::NotFound) => {}
    }
}
