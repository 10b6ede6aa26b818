//! Fuzzes the router with arbitrary method bytes, path and query, then decodes and screens the
//! path parameter as the gateway does.
//!
//! Input layout: method bytes, a NUL, then the request target (path, `?`, query).
#![no_main]

use domain_risk_gateway::domain::top::MAX_TOP;
use domain_risk_gateway::domain::target::screen_target;
use domain_risk_gateway::domain::DomainName;
use domain_risk_gateway::route::{route, Route, RouteError};
use http::Method;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
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
        Ok(Route::Domain { raw, .. }) => {
            assert_eq!(method, Method::GET);
            assert_eq!(path.strip_prefix("/v1/public/domain/"), Some(raw));
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
        Ok(Route::Preflight) => {
            assert_eq!(method, Method::OPTIONS);
            assert!(path.starts_with("/v1/"));
        }
        Ok(_) => assert_eq!(method, Method::GET),
        Err(RouteError::MethodNotAllowed { .. }) => assert_ne!(method, Method::GET),
        Err(RouteError::BadQuery(..)) => {
            assert_eq!(method, Method::GET);
            assert_eq!(path, "/v1/public/top-domains");
        }
        Err(RouteError::NotFound) => {}
    }
});
