//! Routing: a request line (method, path, query) to the route it names, or why it names none.
//!
//! Pure, so the whole routing table is unit-tested without a socket.

use std::borrow::Cow;

use http::Method;

use drg_domain::top::MAX_TOP;

use drg_telemetry::metrics::RouteClass;

/// What a request asks for. Path parameters are still percent-encoded; query values are
/// decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route<'a> {
    /// `GET /v1/public/domain/{domain}[?explain=true]`
    Domain { raw: &'a str, explain: bool },
    /// `POST /v1/public/domains[?explain=true]`: many lookups in one request (a JSON body).
    Batch { explain: bool },
    /// `GET /v1/public/top-domains[?limit=N]`
    TopDomains { limit: usize },
    /// `GET /v1/check/{email_or_domain}` (proxied)
    Check { raw: &'a str },
    /// `GET /v1/usage`
    Usage,
    /// `GET /v1/logs[?cursor=C&limit=N]`: the project's recent calls (not counted). `cursor`
    /// is percent-decoded, its characters checked, still opaque (the handler reads it); an
    /// empty one is the first page.
    Logs {
        cursor: Option<Cow<'a, str>>,
        limit: usize,
    },
    /// `GET /v1/stats`: the project's calls per day (not counted).
    Stats,
    /// `GET /v1/changes[?since=T&cursor=C&limit=N]`: the project's verdict changes after id
    /// `cursor` (0: from the first kept), made at or after `since` (unix seconds), oldest first
    /// (not counted).
    Changes {
        after: u64,
        since: i64,
        limit: usize,
    },
    /// `/v1/keys[/{id}]`: the project's keys (not counted).
    Keys(KeysCall<'a>),
    /// `/v1/overrides[/{domain}]`: the project's own verdicts (not counted).
    Overrides(OverridesCall<'a>),
    /// `/v1/webhooks[/{id}]`: the project's own webhooks (not counted).
    Webhooks(WebhooksCall<'a>),
    /// `GET /v1/reports` (the project's reports) or `POST /v1/reports` (a small JSON body: a
    /// new report), not counted.
    Reports { post: bool },
    /// `GET /v1/audit[?cursor=C&limit=N]`: the project's audit trail, newest first (not
    /// counted); the cursor is percent-decoded, still opaque.
    Audit {
        cursor: Option<Cow<'a, str>>,
        limit: usize,
    },
    /// `GET /v1/openapi.json`: the contract, no key needed, not counted.
    OpenApi,
    /// `OPTIONS /v1/...` on a known route: CORS preflight, no key needed.
    Preflight,
    /// `GET /healthz`
    Health,
    /// `GET /readyz`
    Ready,
    /// `GET /dashboard[/app.js|/app.css]`: the browser dashboard's files, no key, not counted.
    Dashboard(crate::edge::dashboard::Asset),
}

/// What a `/v1/keys` request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeysCall<'a> {
    /// `GET /v1/keys`
    List,
    /// `POST /v1/keys` (a small JSON body)
    Create,
    /// `DELETE /v1/keys/{id}`; the id is still percent-encoded.
    Revoke { id: &'a str },
    /// `POST /v1/keys/{id}/rotate` (an optional small JSON body); the id is still
    /// percent-encoded.
    Rotate { id: &'a str },
}

/// What a `/v1/overrides` request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverridesCall<'a> {
    /// `GET /v1/overrides[?cursor=D&limit=N]`; the cursor is percent-decoded.
    List {
        cursor: Option<Cow<'a, str>>,
        limit: usize,
    },
    /// `PUT /v1/overrides/{domain}` (a small JSON body); the name is still percent-encoded.
    Put { domain: &'a str },
    /// `DELETE /v1/overrides/{domain}`; the name is still percent-encoded.
    Delete { domain: &'a str },
}

/// What a `/v1/webhooks` request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhooksCall<'a> {
    /// `GET /v1/webhooks[?cursor=ID&limit=N]`; the cursor is percent-decoded.
    List {
        cursor: Option<Cow<'a, str>>,
        limit: usize,
    },
    /// `POST /v1/webhooks` (a small JSON body).
    Create,
    /// `DELETE /v1/webhooks/{id}`; the id is still percent-encoded.
    Delete { id: &'a str },
}

/// The collection of a project's webhooks: `GET` and `POST`.
pub const WEBHOOKS_PATH: &str = "/v1/webhooks";
/// Where one webhook is: `DELETE` on `/v1/webhooks/{id}`.
pub const WEBHOOKS_ITEM_PREFIX: &str = "/v1/webhooks/";

/// `/v1/webhooks` and `/v1/webhooks/{id}`. Preflight answered as on every `/v1/` route (the
/// dashboard's own page may ask; the server key decides on the real request).
fn webhooks_route<'a>(
    method: &Method,
    path: &'a str,
    query: Option<&'a str>,
) -> Result<Route<'a>, RouteError> {
    if path == WEBHOOKS_PATH {
        return match *method {
            Method::GET => {
                let limit = limit(
                    query,
                    QueryOf::Webhooks,
                    drg_projects::account::webhooks::api::DEFAULT_LIMIT,
                    drg_projects::account::webhooks::api::MAX_LIMIT,
                )?;
                let cursor = query_param(query, "cursor").filter(|c| !c.is_empty());
                if cursor.as_ref().is_some_and(|c| c.len() > 64) {
                    return Err(RouteError::BadQuery(
                        QueryOf::Webhooks,
                        "cursor is not one this API gave (use next_cursor of the previous page)"
                            .into(),
                    ));
                }
                Ok(Route::Webhooks(WebhooksCall::List { cursor, limit }))
            }
            Method::POST => Ok(Route::Webhooks(WebhooksCall::Create)),
            Method::OPTIONS => Ok(Route::Preflight),
            _ => Err(RouteError::MethodNotAllowed {
                allow: "GET, POST, OPTIONS",
            }),
        };
    }
    match path.strip_prefix(WEBHOOKS_ITEM_PREFIX) {
        Some(id) if !id.is_empty() && !id.contains('/') => match *method {
            Method::DELETE => Ok(Route::Webhooks(WebhooksCall::Delete { id })),
            Method::OPTIONS => Ok(Route::Preflight),
            _ => Err(RouteError::MethodNotAllowed {
                allow: "DELETE, OPTIONS",
            }),
        },
        _ => Err(RouteError::NotFound),
    }
}

/// A project's reports to the operator.
pub const REPORTS_PATH: &str = "/v1/reports";

/// `/v1/reports`: the project's reports (`GET`), a new one (`POST`), and their preflight.
fn reports_route<'a>(method: &Method) -> Result<Route<'a>, RouteError> {
    match *method {
        Method::GET => Ok(Route::Reports { post: false }),
        Method::POST => Ok(Route::Reports { post: true }),
        Method::OPTIONS => Ok(Route::Preflight),
        _ => Err(RouteError::MethodNotAllowed {
            allow: "GET, POST, OPTIONS",
        }),
    }
}

/// The collection of a project's overrides.
pub const OVERRIDES_PATH: &str = "/v1/overrides";
/// Where one override is: `PUT` and `DELETE` on `/v1/overrides/{domain}`.
pub const OVERRIDES_ITEM_PREFIX: &str = "/v1/overrides/";

/// `/v1/overrides` and `/v1/overrides/{domain}`, with their preflight.
fn overrides_route<'a>(
    method: &Method,
    path: &'a str,
    query: Option<&'a str>,
) -> Result<Route<'a>, RouteError> {
    if path == OVERRIDES_PATH {
        return match *method {
            Method::GET => {
                let limit = limit(
                    query,
                    QueryOf::Overrides,
                    drg_projects::account::overrides::DEFAULT_LIMIT,
                    drg_projects::account::overrides::MAX_LIMIT,
                )?;
                let cursor = query_param(query, "cursor").filter(|c| !c.is_empty());
                if cursor.as_ref().is_some_and(|c| c.len() > 253) {
                    return Err(RouteError::BadQuery(
                        QueryOf::Overrides,
                        "cursor is not one this API gave (use next_cursor of the previous page)"
                            .into(),
                    ));
                }
                Ok(Route::Overrides(OverridesCall::List { cursor, limit }))
            }
            Method::OPTIONS => Ok(Route::Preflight),
            _ => Err(RouteError::MethodNotAllowed {
                allow: "GET, OPTIONS",
            }),
        };
    }
    match path.strip_prefix(OVERRIDES_ITEM_PREFIX) {
        Some(domain) if !domain.is_empty() && !domain.contains('/') => match *method {
            Method::PUT => Ok(Route::Overrides(OverridesCall::Put { domain })),
            Method::DELETE => Ok(Route::Overrides(OverridesCall::Delete { domain })),
            Method::OPTIONS => Ok(Route::Preflight),
            _ => Err(RouteError::MethodNotAllowed {
                allow: "PUT, DELETE, OPTIONS",
            }),
        },
        _ => Err(RouteError::NotFound),
    }
}

/// The collection of a project's keys.
pub const KEYS_PATH: &str = "/v1/keys";
const KEYS_ITEM_PREFIX: &str = "/v1/keys/";
const ROTATE_SUFFIX: &str = "/rotate";

/// Whether `path` is a keys route that takes a body (`POST /v1/keys`, a rotation), whose limit
/// is `keys_api.max_body_bytes`.
pub fn takes_keys_body(path: &str) -> bool {
    path == KEYS_PATH || rotated_id(path).is_some()
}

/// The id of `/v1/keys/{id}/rotate`, still percent-encoded.
fn rotated_id(path: &str) -> Option<&str> {
    let id = path
        .strip_prefix(KEYS_ITEM_PREFIX)?
        .strip_suffix(ROTATE_SUFFIX)?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

/// `/v1/keys` and `/v1/keys/{id}`: the only routes with methods besides GET.
fn keys_route<'a>(method: &Method, path: &'a str) -> Result<Route<'a>, RouteError> {
    if path == KEYS_PATH {
        return match *method {
            Method::GET => Ok(Route::Keys(KeysCall::List)),
            Method::POST => Ok(Route::Keys(KeysCall::Create)),
            Method::OPTIONS => Ok(Route::Preflight),
            _ => Err(RouteError::MethodNotAllowed {
                allow: "GET, POST, OPTIONS",
            }),
        };
    }
    if let Some(id) = rotated_id(path) {
        return match *method {
            Method::POST => Ok(Route::Keys(KeysCall::Rotate { id })),
            Method::OPTIONS => Ok(Route::Preflight),
            _ => Err(RouteError::MethodNotAllowed {
                allow: "POST, OPTIONS",
            }),
        };
    }
    match path.strip_prefix(KEYS_ITEM_PREFIX) {
        Some(id) if !id.is_empty() && !id.contains('/') => match *method {
            Method::DELETE => Ok(Route::Keys(KeysCall::Revoke { id })),
            Method::OPTIONS => Ok(Route::Preflight),
            _ => Err(RouteError::MethodNotAllowed {
                allow: "DELETE, OPTIONS",
            }),
        },
        _ => Err(RouteError::NotFound),
    }
}

/// A request that names no route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    NotFound,
    MethodNotAllowed {
        allow: &'static str,
    },
    /// The route exists but its query is wrong (422): which route, and why.
    BadQuery(QueryOf, String),
}

/// The route whose query was refused (metrics and logs count it under that route).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryOf {
    Domain,
    Batch,
    TopDomains,
    Logs,
    Changes,
    Overrides,
    Webhooks,
    Audit,
}

/// Default `limit` of top-domains (the largest is [`MAX_TOP`]).
pub const DEFAULT_TOP_LIMIT: usize = drg_domain::top::DEFAULT_LIMIT;
/// Default and largest `limit` of `/v1/logs`.
pub const DEFAULT_LOGS_LIMIT: usize = 50;
pub const MAX_LOGS_LIMIT: usize = 100;
/// Default and largest `limit` of `/v1/changes`.
pub const DEFAULT_CHANGES_LIMIT: usize = 100;
pub const MAX_CHANGES_LIMIT: usize = 1_000;
/// Longest `cursor` of `/v1/logs` (the cursors the gateway gives are far shorter).
pub const MAX_CURSOR_LEN: usize = 128;

const DOMAIN_PREFIX: &str = "/v1/public/domain/";
/// The batch lookup: the one route besides `POST /v1/keys` that takes a body.
pub const BATCH_PATH: &str = "/v1/public/domains";

/// `/v1/public/domains`: POST (and its preflight) only.
fn batch_route<'a>(method: &Method, query: Option<&'a str>) -> Result<Route<'a>, RouteError> {
    match *method {
        Method::POST => Ok(Route::Batch {
            explain: explain(query, QueryOf::Batch)?,
        }),
        Method::OPTIONS => Ok(Route::Preflight),
        _ => Err(RouteError::MethodNotAllowed {
            allow: "POST, OPTIONS",
        }),
    }
}
const CHECK_PREFIX: &str = "/v1/check/";

/// Finds the route of a request.
pub fn route<'a>(
    method: &Method,
    path: &'a str,
    query: Option<&'a str>,
) -> Result<Route<'a>, RouteError> {
    if path.starts_with(KEYS_PATH)
        && (path.len() == KEYS_PATH.len() || path[KEYS_PATH.len()..].starts_with('/'))
    {
        return keys_route(method, path);
    }
    if path.starts_with(OVERRIDES_PATH)
        && (path.len() == OVERRIDES_PATH.len() || path[OVERRIDES_PATH.len()..].starts_with('/'))
    {
        return overrides_route(method, path, query);
    }
    if path.starts_with(WEBHOOKS_PATH)
        && (path.len() == WEBHOOKS_PATH.len() || path[WEBHOOKS_PATH.len()..].starts_with('/'))
    {
        return webhooks_route(method, path, query);
    }
    if path == BATCH_PATH {
        return batch_route(method, query);
    }
    if path == REPORTS_PATH {
        return reports_route(method);
    }
    let route = if let Some(raw) = path.strip_prefix(DOMAIN_PREFIX) {
        Route::Domain {
            raw,
            explain: method == Method::GET && explain(query, QueryOf::Domain)?,
        }
    } else if let Some(raw) = path.strip_prefix(CHECK_PREFIX) {
        Route::Check { raw }
    } else {
        match path {
            "/v1/public/top-domains" if method == Method::GET => Route::TopDomains {
                limit: limit(query, QueryOf::TopDomains, DEFAULT_TOP_LIMIT, MAX_TOP)?,
            },
            "/v1/public/top-domains" => Route::TopDomains {
                limit: DEFAULT_TOP_LIMIT,
            },
            "/v1/usage" => Route::Usage,
            "/v1/logs" if method == Method::GET => logs(query)?,
            "/v1/logs" => Route::Logs {
                cursor: None,
                limit: DEFAULT_LOGS_LIMIT,
            },
            "/v1/stats" => Route::Stats,
            "/v1/audit" => audit(method, query)?,
            "/v1/changes" if method == Method::GET => changes(query)?,
            "/v1/changes" => Route::Changes {
                after: 0,
                since: i64::MIN,
                limit: DEFAULT_CHANGES_LIMIT,
            },
            "/v1/openapi.json" => Route::OpenApi,
            "/healthz" => Route::Health,
            "/readyz" => Route::Ready,
            _ => match crate::edge::dashboard::Asset::at(path) {
                Some(asset) => Route::Dashboard(asset),
                None => return Err(RouteError::NotFound),
            },
        }
    };
    let api = path.starts_with("/v1/");
    match *method {
        Method::GET => Ok(route),
        Method::OPTIONS if api => Ok(Route::Preflight),
        _ if api => Err(RouteError::MethodNotAllowed {
            allow: "GET, OPTIONS",
        }),
        _ => Err(RouteError::MethodNotAllowed { allow: "GET" }),
    }
}

/// The value of the first `name` parameter of a query (`""` when it has none), names and values
/// percent-decoded (`?limit=%31%30` is `limit=10`; borrowed when nothing was encoded). Bytes that
/// decode to no UTF-8 become U+FFFD, which no parameter accepts. `+` stays a `+`: no value of
/// this API has a space.
fn query_param<'q>(query: Option<&'q str>, name: &str) -> Option<Cow<'q, str>> {
    let decode = |s: &'q str| percent_encoding::percent_decode_str(s).decode_utf8_lossy();
    // No query (most calls): nothing to split or decode.
    query
        .filter(|q| !q.is_empty())?
        .split('&')
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
        .find_map(|(k, v)| (decode(k) == name).then(|| decode(v)))
}

/// `explain`: `true` or `false` (absent: false); anything else is a bad query, as a bad
/// `limit` is.
fn explain(query: Option<&str>, of: QueryOf) -> Result<bool, RouteError> {
    match query_param(query, "explain").as_deref() {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(RouteError::BadQuery(
            of,
            format!("explain must be true or false; got '{other}'"),
        )),
    }
}

/// The `limit` of a route's query: `default` when absent, else an integer from 1 to `max`.
fn limit(
    query: Option<&str>,
    of: QueryOf,
    default: usize,
    max: usize,
) -> Result<usize, RouteError> {
    let Some(value) = query_param(query, "limit") else {
        return Ok(default);
    };
    value
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| {
            RouteError::BadQuery(
                of,
                format!("limit must be an integer from 1 to {max}; got '{value}'"),
            )
        })
}

/// `/v1/logs`: `limit` 1..=100 (default 50); `cursor` base64url (an empty one: none).
fn logs(query: Option<&str>) -> Result<Route<'_>, RouteError> {
    let limit = limit(query, QueryOf::Logs, DEFAULT_LOGS_LIMIT, MAX_LOGS_LIMIT)?;
    let cursor = match query_param(query, "cursor") {
        None => None,
        Some(c) if c.is_empty() => None,
        Some(c)
            if c.len() <= MAX_CURSOR_LEN
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') =>
        {
            Some(c)
        }
        Some(_) => {
            return Err(RouteError::BadQuery(
                QueryOf::Logs,
                "cursor is not one this API gave (use next_cursor of the previous page)".into(),
            ))
        }
    };
    Ok(Route::Logs { cursor, limit })
}

/// `/v1/changes`: `limit` 1..=1000 (default 100); `cursor` a change id (digits); `since` an
/// RFC 3339 time.
fn changes(query: Option<&str>) -> Result<Route<'_>, RouteError> {
    let bad = |msg: &str| RouteError::BadQuery(QueryOf::Changes, msg.to_owned());
    let limit = limit(
        query,
        QueryOf::Changes,
        DEFAULT_CHANGES_LIMIT,
        MAX_CHANGES_LIMIT,
    )?;
    let after = match query_param(query, "cursor") {
        None => 0,
        Some(c) if c.is_empty() => 0,
        Some(c) => c
            .parse::<u64>()
            .ok()
            .filter(|_| c.len() <= 20 && c.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| {
                bad("cursor is not one this API gave (use next_cursor of the previous page)")
            })?,
    };
    let since = match query_param(query, "since") {
        None => i64::MIN,
        Some(s) => chrono::DateTime::parse_from_rfc3339(&s)
            .map(|t| t.timestamp())
            .map_err(|_| bad("since must be an RFC 3339 time, e.g. 2026-11-01T00:00:00Z"))?,
    };
    Ok(Route::Changes {
        after,
        since,
        limit,
    })
}

/// `/v1/audit[?cursor=&limit=]` (only a GET reads the query: other methods get their 405).
fn audit<'a>(method: &Method, query: Option<&'a str>) -> Result<Route<'a>, RouteError> {
    use drg_projects::account::audit::{DEFAULT_LIMIT, MAX_LIMIT};
    if method != Method::GET {
        return Ok(Route::Audit {
            cursor: None,
            limit: DEFAULT_LIMIT,
        });
    }
    let cursor = query_param(query, "cursor").filter(|c| !c.is_empty());
    if cursor.as_ref().is_some_and(|c| !is_audit_cursor(c)) {
        return Err(RouteError::BadQuery(
            QueryOf::Audit,
            "cursor is not one this API gave (use next_cursor of the previous page)".into(),
        ));
    }
    Ok(Route::Audit {
        cursor,
        limit: limit(query, QueryOf::Audit, DEFAULT_LIMIT, MAX_LIMIT)?,
    })
}

/// Whether `c` is of the form the audit trail's cursors take: an entry's id, a whole number
/// of the control store's.
fn is_audit_cursor(c: &str) -> bool {
    (1..=19).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_digit()) && c.parse::<i64>().is_ok()
}

/// The metrics class of a routing result.
pub fn class_of(routed: &Result<Route<'_>, RouteError>) -> RouteClass {
    match routed {
        Ok(Route::Domain { .. }) | Err(RouteError::BadQuery(QueryOf::Domain, _)) => {
            RouteClass::Domain
        }
        Ok(Route::Batch { .. }) | Err(RouteError::BadQuery(QueryOf::Batch, _)) => RouteClass::Batch,
        Ok(Route::TopDomains { .. }) | Err(RouteError::BadQuery(QueryOf::TopDomains, _)) => {
            RouteClass::TopDomains
        }
        Ok(Route::Check { .. }) => RouteClass::Check,
        Ok(Route::Usage) => RouteClass::Usage,
        Ok(Route::Logs { .. }) | Err(RouteError::BadQuery(QueryOf::Logs, _)) => RouteClass::Logs,
        Ok(Route::Stats) => RouteClass::Stats,
        Ok(Route::Changes { .. }) | Err(RouteError::BadQuery(QueryOf::Changes, _)) => {
            RouteClass::Changes
        }
        Ok(Route::Keys(_)) => RouteClass::Keys,
        Ok(Route::Overrides(_)) | Err(RouteError::BadQuery(QueryOf::Overrides, _)) => {
            RouteClass::Overrides
        }
        Ok(Route::Webhooks(_)) | Err(RouteError::BadQuery(QueryOf::Webhooks, _)) => {
            RouteClass::Webhooks
        }
        Ok(Route::Reports { .. }) => RouteClass::Reports,
        Ok(Route::Audit { .. }) | Err(RouteError::BadQuery(QueryOf::Audit, _)) => RouteClass::Audit,
        Ok(Route::OpenApi) => RouteClass::OpenApi,
        Ok(Route::Preflight) => RouteClass::Preflight,
        Ok(Route::Health) => RouteClass::Health,
        Ok(Route::Ready) => RouteClass::Ready,
        Ok(Route::Dashboard(_)) => RouteClass::Dashboard,
        Err(RouteError::NotFound) => RouteClass::NotFound,
        Err(RouteError::MethodNotAllowed { .. }) => RouteClass::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str, query: Option<&str>) -> Result<Route<'static>, RouteError> {
        let path: &'static str = Box::leak(path.to_owned().into_boxed_str());
        let query = query.map(|q| &*Box::leak(q.to_owned().into_boxed_str()));
        route(&Method::GET, path, query)
    }

    #[test]
    fn an_audit_cursor_is_one_the_api_gave() {
        for good in ["1732700000123456", "0"] {
            assert!(matches!(
                get("/v1/audit", Some(&format!("cursor={good}"))),
                Ok(Route::Audit {
                    cursor: Some(_),
                    ..
                })
            ));
        }
        for bad in [
            "abc",
            "12-",
            "-1",
            "1732700000123-0",
            "1.5",
            &"9".repeat(19),
        ] {
            assert!(
                matches!(
                    get("/v1/audit", Some(&format!("cursor={bad}"))),
                    Err(RouteError::BadQuery(QueryOf::Audit, _))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn overrides_are_listed_set_and_removed() {
        assert_eq!(
            get("/v1/overrides", Some("limit=5&cursor=a.com")),
            Ok(Route::Overrides(OverridesCall::List {
                cursor: Some("a.com".into()),
                limit: 5
            }))
        );
        assert_eq!(
            route(&Method::PUT, "/v1/overrides/a.com", None),
            Ok(Route::Overrides(OverridesCall::Put { domain: "a.com" }))
        );
        assert_eq!(
            route(&Method::DELETE, "/v1/overrides/a.com", None),
            Ok(Route::Overrides(OverridesCall::Delete { domain: "a.com" }))
        );
        assert!(matches!(
            get("/v1/overrides", Some("limit=0")),
            Err(RouteError::BadQuery(QueryOf::Overrides, _))
        ));
        assert_eq!(
            route(&Method::OPTIONS, "/v1/overrides/a.com", None),
            Ok(Route::Preflight)
        );
        assert_eq!(
            route(&Method::OPTIONS, "/v1/overrides", None),
            Ok(Route::Preflight)
        );
        for p in ["/v1/overrides/", "/v1/overrides/a/b", "/v1/overridesx"] {
            assert!(route(&Method::PUT, p, None).is_err(), "{p}");
        }
    }

    #[test]
    fn webhooks_are_listed_made_and_removed() {
        assert_eq!(
            get("/v1/webhooks", Some("limit=5&cursor=wh_1")),
            Ok(Route::Webhooks(WebhooksCall::List {
                cursor: Some("wh_1".into()),
                limit: 5
            }))
        );
        assert_eq!(
            route(&Method::POST, "/v1/webhooks", None),
            Ok(Route::Webhooks(WebhooksCall::Create))
        );
        assert_eq!(
            route(&Method::DELETE, "/v1/webhooks/wh_1", None),
            Ok(Route::Webhooks(WebhooksCall::Delete { id: "wh_1" }))
        );
        assert!(matches!(
            get("/v1/webhooks", Some("limit=1001")),
            Err(RouteError::BadQuery(QueryOf::Webhooks, _))
        ));
        for path in [
            "/v1/webhooks",
            "/v1/webhooks/wh_1",
            "/v1/reports",
            "/v1/keys/k1",
        ] {
            assert_eq!(route(&Method::OPTIONS, path, None), Ok(Route::Preflight));
        }
        assert_eq!(
            route(&Method::OPTIONS, "/v1/keys/k1/rotate", None),
            Ok(Route::Preflight)
        );
        for (method, path) in [
            (Method::PUT, "/v1/webhooks"),
            (Method::GET, "/v1/webhooks/wh_1"),
        ] {
            assert!(
                matches!(
                    route(&method, path, None),
                    Err(RouteError::MethodNotAllowed { .. })
                ),
                "{method} {path}"
            );
        }
        for p in ["/v1/webhooks/", "/v1/webhooks/a/b", "/v1/webhooksx"] {
            assert_eq!(
                route(&Method::DELETE, p, None),
                Err(RouteError::NotFound),
                "{p}"
            );
        }
    }

    #[test]
    fn the_batch_route_takes_post_and_its_preflight() {
        assert_eq!(
            route(&Method::POST, BATCH_PATH, Some("explain=true")),
            Ok(Route::Batch { explain: true })
        );
        assert_eq!(
            route(&Method::POST, BATCH_PATH, None),
            Ok(Route::Batch { explain: false })
        );
        assert_eq!(
            route(&Method::OPTIONS, BATCH_PATH, None),
            Ok(Route::Preflight)
        );
        assert_eq!(
            route(&Method::GET, BATCH_PATH, None),
            Err(RouteError::MethodNotAllowed {
                allow: "POST, OPTIONS"
            })
        );
        let bad = route(&Method::POST, BATCH_PATH, Some("explain=yes"));
        assert!(matches!(bad, Err(RouteError::BadQuery(QueryOf::Batch, _))));
        assert_eq!(class_of(&bad), RouteClass::Batch);
        // The single lookup's prefix does not swallow it, nor it a longer path.
        assert_eq!(
            route(&Method::POST, "/v1/public/domains/x", None),
            Err(RouteError::NotFound)
        );
    }

    #[test]
    fn known_routes() {
        assert_eq!(
            get("/v1/public/domain/a%2Eb.com", None),
            Ok(Route::Domain {
                raw: "a%2Eb.com",
                explain: false
            })
        );
        assert_eq!(
            get("/v1/public/domain/", None),
            Ok(Route::Domain {
                raw: "",
                explain: false
            })
        );
        for (q, explain) in [("explain=true", true), ("x=1&explain=false", false)] {
            assert_eq!(
                get("/v1/public/domain/a.com", Some(q)),
                Ok(Route::Domain {
                    raw: "a.com",
                    explain
                })
            );
        }
        assert_eq!(
            get("/v1/check/a@b.com", None),
            Ok(Route::Check { raw: "a@b.com" })
        );
        assert_eq!(
            get("/v1/public/top-domains", None),
            Ok(Route::TopDomains { limit: 100 })
        );
        assert_eq!(
            get("/v1/public/top-domains", Some("x=1&limit=7")),
            Ok(Route::TopDomains { limit: 7 })
        );
        assert_eq!(get("/healthz", None), Ok(Route::Health));
        assert_eq!(get("/v1/usage", None), Ok(Route::Usage));
        assert_eq!(
            route(&Method::OPTIONS, "/v1/public/top-domains", Some("limit=x")),
            Ok(Route::Preflight)
        );
        assert_eq!(get("/readyz", None), Ok(Route::Ready));
        assert_eq!(get("/v1/openapi.json", None), Ok(Route::OpenApi));
        assert_eq!(
            route(&Method::OPTIONS, "/v1/openapi.json", None),
            Ok(Route::Preflight)
        );
        assert_eq!(
            route(&Method::HEAD, "/v1/openapi.json", None),
            Err(RouteError::MethodNotAllowed {
                allow: "GET, OPTIONS"
            })
        );
    }

    #[test]
    fn unknown_routes_and_methods() {
        for p in [
            "/",
            "/v1",
            "/v1/public/domain",
            "/v1/public/top-domains/",
            "/v2/check/x",
            "/v1/openapi.yaml",
            "/openapi.json",
        ] {
            assert_eq!(get(p, None), Err(RouteError::NotFound), "{p}");
        }
        assert_eq!(
            route(&Method::POST, "/v1/public/domain/a.com", None),
            Err(RouteError::MethodNotAllowed {
                allow: "GET, OPTIONS"
            })
        );
        assert_eq!(
            route(&Method::OPTIONS, "/healthz", None),
            Err(RouteError::MethodNotAllowed { allow: "GET" })
        );
        assert_eq!(
            route(&Method::DELETE, "/nowhere", None),
            Err(RouteError::NotFound)
        );
    }

    #[test]
    fn bad_explain_values_are_named() {
        for q in [
            "explain=1",
            "explain=",
            "explain",
            "explain=TRUE",
            "explain=yes",
        ] {
            match get("/v1/public/domain/a.com", Some(q)) {
                Err(RouteError::BadQuery(QueryOf::Domain, msg)) => {
                    assert!(msg.contains("explain must be true or false"), "{q}")
                }
                other => panic!("{q}: {other:?}"),
            }
        }
        // A preflight is not a lookup: its query is not read.
        assert_eq!(
            route(
                &Method::OPTIONS,
                "/v1/public/domain/a.com",
                Some("explain=x")
            ),
            Ok(Route::Preflight)
        );
    }

    #[test]
    fn changes_queries() {
        assert_eq!(
            get("/v1/changes", None),
            Ok(Route::Changes {
                after: 0,
                since: i64::MIN,
                limit: DEFAULT_CHANGES_LIMIT
            })
        );
        assert_eq!(
            get(
                "/v1/changes",
                Some("cursor=17&since=2026-11-01T00:00:00Z&limit=1000")
            ),
            Ok(Route::Changes {
                after: 17,
                since: 1_793_491_200,
                limit: 1_000
            })
        );
        for q in [
            "cursor=-1",
            "cursor=1e3",
            "since=yesterday",
            "since=",
            "limit=1001",
            "cursor=000000000000000000001",
        ] {
            assert!(
                matches!(
                    get("/v1/changes", Some(q)),
                    Err(RouteError::BadQuery(QueryOf::Changes, _))
                ),
                "{q}"
            );
        }
    }

    #[test]
    fn logs_and_stats_queries() {
        assert_eq!(
            get("/v1/logs", None),
            Ok(Route::Logs {
                cursor: None,
                limit: 50
            })
        );
        assert_eq!(
            get("/v1/logs", Some("cursor=&limit=100")),
            Ok(Route::Logs {
                cursor: None,
                limit: 100
            })
        );
        assert_eq!(
            get("/v1/logs", Some("limit=1&cursor=MTc-_x")),
            Ok(Route::Logs {
                cursor: Some("MTc-_x".into()),
                limit: 1
            })
        );
        // Values are percent-decoded before they are read.
        assert_eq!(
            get("/v1/logs", Some("%6Cimit=%31%30&cursor=MTc%2D_x")),
            Ok(Route::Logs {
                cursor: Some("MTc-_x".into()),
                limit: 10
            })
        );
        assert_eq!(get("/v1/stats", Some("x=1")), Ok(Route::Stats));
        let long = format!("cursor={}", "a".repeat(MAX_CURSOR_LEN + 1));
        for q in [
            "limit=0",
            "limit=101",
            "limit=x",
            "cursor=a%3D",
            "cursor=a.b",
            "cursor=a%FF",
            "limit=%",
            "limit=1%30%30%30",
            &long,
        ] {
            match get("/v1/logs", Some(q)) {
                Err(RouteError::BadQuery(QueryOf::Logs, msg)) => {
                    assert!(
                        msg.contains("limit must be") || msg.contains("cursor"),
                        "{q}"
                    )
                }
                other => panic!("{q}: {other:?}"),
            }
        }
        assert_eq!(
            route(&Method::POST, "/v1/stats", None),
            Err(RouteError::MethodNotAllowed {
                allow: "GET, OPTIONS"
            })
        );
    }

    #[test]
    fn bad_limits_are_named() {
        for q in ["limit=0", "limit=1001", "limit=", "limit=ten", "limit=-1"] {
            match get("/v1/public/top-domains", Some(q)) {
                Err(RouteError::BadQuery(QueryOf::TopDomains, msg)) => {
                    assert!(msg.contains("limit must be"), "{q}")
                }
                other => panic!("{q}: {other:?}"),
            }
        }
        assert_eq!(
            get("/v1/public/top-domains", Some("limit=1000")),
            Ok(Route::TopDomains { limit: 1000 })
        );
        assert_eq!(
            get("/v1/public/top-domains", Some("limit=%31%30")),
            Ok(Route::TopDomains { limit: 10 })
        );
        assert_eq!(
            get("/v1/public/top-domains", Some("limit=%3")),
            Err(RouteError::BadQuery(
                QueryOf::TopDomains,
                "limit must be an integer from 1 to 1000; got '%3'".into()
            ))
        );
    }

    #[test]
    fn query_values_are_percent_decoded() {
        assert_eq!(
            query_param(Some("a=%41%42c&b"), "a").as_deref(),
            Some("ABc")
        );
        assert_eq!(query_param(Some("a=1&b"), "b").as_deref(), Some(""));
        assert_eq!(query_param(Some("a+b=1"), "a+b").as_deref(), Some("1"));
        assert!(matches!(
            query_param(Some("a=plain"), "a"),
            Some(Cow::Borrowed("plain"))
        ));
        assert_eq!(query_param(Some("a=%FF"), "a").as_deref(), Some("\u{FFFD}"));
        assert_eq!(query_param(None, "a"), None);
        for q in ["explain=%74rue", "explain=tru%65"] {
            assert_eq!(
                get("/v1/public/domain/a.com", Some(q)),
                Ok(Route::Domain {
                    raw: "a.com",
                    explain: true
                }),
                "{q}"
            );
        }
    }

    #[test]
    fn keys_routes_take_their_methods() {
        assert_eq!(get("/v1/keys", None), Ok(Route::Keys(KeysCall::List)));
        assert_eq!(
            route(&Method::POST, "/v1/keys", None),
            Ok(Route::Keys(KeysCall::Create))
        );
        assert_eq!(
            route(&Method::DELETE, "/v1/keys/k_1", None),
            Ok(Route::Keys(KeysCall::Revoke { id: "k_1" }))
        );
        assert_eq!(
            route(&Method::OPTIONS, "/v1/keys/k_1", None),
            Ok(Route::Preflight)
        );
        assert_eq!(
            route(&Method::DELETE, "/v1/keys", None),
            Err(RouteError::MethodNotAllowed {
                allow: "GET, POST, OPTIONS"
            })
        );
        assert_eq!(
            get("/v1/keys/k_1", None),
            Err(RouteError::MethodNotAllowed {
                allow: "DELETE, OPTIONS"
            })
        );
        assert_eq!(
            route(&Method::POST, "/v1/keys/k_1/rotate", None),
            Ok(Route::Keys(KeysCall::Rotate { id: "k_1" }))
        );
        for m in [Method::GET, Method::DELETE, Method::PUT] {
            assert_eq!(
                route(&m, "/v1/keys/k_1/rotate", None),
                Err(RouteError::MethodNotAllowed {
                    allow: "POST, OPTIONS"
                }),
                "{m}"
            );
        }
        assert!(takes_keys_body("/v1/keys") && takes_keys_body("/v1/keys/k_1/rotate"));
        for p in [
            "/v1/keys/k_1",
            "/v1/keys//rotate",
            "/v1/keys/a/b/rotate",
            "/v1/public/domains",
        ] {
            assert!(!takes_keys_body(p), "{p}");
        }
        for p in [
            "/v1/keys/",
            "/v1/keys/a/b",
            "/v1/keysx",
            "/v1/keys//",
            "/v1/keys//rotate",
            "/v1/keys/a/b/rotate",
            "/v1/keys/rotate/x",
        ] {
            assert_eq!(
                route(&Method::DELETE, p, None),
                Err(RouteError::NotFound),
                "{p}"
            );
        }
    }
}
