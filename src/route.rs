//! Routing: a request line (method, path, query) to the route it names, or why it names none.
//!
//! Pure, so the whole routing table is unit-tested without a socket.

use http::Method;

use crate::domain::top::MAX_TOP;

/// What a request asks for. Path parameters are still percent-encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// `GET /v1/public/domain/{domain}[?explain=true]`
    Domain { raw: &'a str, explain: bool },
    /// `GET /v1/public/top-domains[?limit=N]`
    TopDomains { limit: usize },
    /// `GET /v1/check/{email_or_domain}` (proxied)
    Check { raw: &'a str },
    /// `GET /v1/usage`
    Usage,
    /// `GET /v1/openapi.json`: the contract, no key needed, not counted.
    OpenApi,
    /// `OPTIONS /v1/...` on a known route: CORS preflight, no key needed.
    Preflight,
    /// `GET /healthz`
    Health,
    /// `GET /readyz`
    Ready,
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
    TopDomains,
}

/// Default `limit` of top-domains (the largest is [`MAX_TOP`]).
pub const DEFAULT_TOP_LIMIT: usize = 100;

const DOMAIN_PREFIX: &str = "/v1/public/domain/";
const CHECK_PREFIX: &str = "/v1/check/";

/// Finds the route of a request.
pub fn route<'a>(
    method: &Method,
    path: &'a str,
    query: Option<&'a str>,
) -> Result<Route<'a>, RouteError> {
    let route = if let Some(raw) = path.strip_prefix(DOMAIN_PREFIX) {
        Route::Domain {
            raw,
            explain: method == Method::GET && explain(query)?,
        }
    } else if let Some(raw) = path.strip_prefix(CHECK_PREFIX) {
        Route::Check { raw }
    } else {
        match path {
            "/v1/public/top-domains" if method == Method::GET => Route::TopDomains {
                limit: top_limit(query)?,
            },
            "/v1/public/top-domains" => Route::TopDomains {
                limit: DEFAULT_TOP_LIMIT,
            },
            "/v1/usage" => Route::Usage,
            "/v1/openapi.json" => Route::OpenApi,
            "/healthz" => Route::Health,
            "/readyz" => Route::Ready,
            _ => return Err(RouteError::NotFound),
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

/// The value of the first `name` parameter of a query (`""` when it has none).
fn query_param<'q>(query: Option<&'q str>, name: &str) -> Option<&'q str> {
    query
        .unwrap_or("")
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find_map(|(k, v)| (k == name).then_some(v))
}

/// `explain`: `true` or `false` (absent: false); anything else is a bad query, as a bad
/// `limit` is.
fn explain(query: Option<&str>) -> Result<bool, RouteError> {
    match query_param(query, "explain") {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(RouteError::BadQuery(
            QueryOf::Domain,
            format!("explain must be true or false; got '{other}'"),
        )),
    }
}

fn top_limit(query: Option<&str>) -> Result<usize, RouteError> {
    let Some(value) = query_param(query, "limit") else {
        return Ok(DEFAULT_TOP_LIMIT);
    };
    value
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=MAX_TOP).contains(n))
        .ok_or_else(|| {
            RouteError::BadQuery(
                QueryOf::TopDomains,
                format!("limit must be an integer from 1 to {MAX_TOP}; got '{value}'"),
            )
        })
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
    }
}
