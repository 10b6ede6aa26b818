//! What the gateway sends to the analysis backend: a request it builds itself.
//!
//! The backend sits on an internal network and trusts what arrives from the gateway, so nothing
//! of the client's request is forwarded by default: the request line is rebuilt from the screened
//! target, `Host` comes from config, a short allowlist of client headers is copied, and the
//! gateway adds its own (`X-Api-Key-Id`, `X-Request-Id`, `X-Forwarded-For`, `X-Forwarded-Proto`).
//! Pure: no sockets and no Pingora, so the header set is unit-tested directly.

use std::net::IpAddr;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use ipnet::IpNet;

use crate::upstream::config::{is_reserved_header, parse_proxy, UpstreamConfig};

pub const X_API_KEY_ID: HeaderName = HeaderName::from_static("x-api-key-id");
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// How upstream requests are built; made once from config.
#[derive(Debug, Clone)]
pub struct UpstreamPolicy {
    host: HeaderValue,
    pass: Vec<HeaderName>,
    trusted: Vec<IpNet>,
    proto: HeaderValue,
}

impl UpstreamPolicy {
    /// From validated config (invalid entries were refused at load): the backend's settings,
    /// the trusted proxies' CIDRs, and whether the public listener speaks TLS.
    pub fn from_config(upstream: &UpstreamConfig, trusted_proxies: &[String], tls: bool) -> Self {
        UpstreamPolicy {
            host: HeaderValue::from_str(&upstream.host_header())
                .unwrap_or_else(|_| HeaderValue::from_static("localhost")),
            pass: upstream
                .pass_headers
                .iter()
                .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
                .filter(|n| !is_reserved_header(n))
                .collect(),
            trusted: trusted_proxies
                .iter()
                .filter_map(|p| parse_proxy(p))
                .collect(),
            proto: HeaderValue::from_static(if tls { "https" } else { "http" }),
        }
    }

    /// The `Host` header of every upstream request.
    pub fn host(&self) -> &HeaderValue {
        &self.host
    }

    /// Whether the socket peer is a configured trusted proxy.
    pub fn is_trusted(&self, peer: IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.trusted.iter().any(|net| net.contains(&peer))
    }

    /// Every header of the upstream request but `Host`: the allowed client headers, then ours.
    pub fn headers(
        &self,
        client: &HeaderMap,
        peer: Option<IpAddr>,
        key_id: &str,
        request_id: &str,
    ) -> Vec<(HeaderName, HeaderValue)> {
        let mut out = Vec::with_capacity(self.pass.len() + 4);
        for name in &self.pass {
            for value in client.get_all(name) {
                out.push((name.clone(), value.clone()));
            }
        }
        if let Ok(v) = HeaderValue::from_str(key_id) {
            out.push((X_API_KEY_ID, v));
        }
        if let Ok(v) = HeaderValue::from_str(request_id) {
            out.push((X_REQUEST_ID, v));
        }
        if let Some(peer) = peer.map(|p| p.to_canonical()) {
            let chain = match self.is_trusted(peer) {
                true => forwarded_chain(client),
                false => None,
            };
            let value = match chain {
                Some(chain) => format!("{chain}, {peer}"),
                None => peer.to_string(),
            };
            if let Ok(v) = HeaderValue::from_str(&value) {
                out.push((X_FORWARDED_FOR, v));
            }
        }
        out.push((X_FORWARDED_PROTO, self.proto.clone()));
        out
    }
}

/// The client's `X-Forwarded-For` chain, when every entry of it is an IP address (a trusted
/// proxy's chain is kept; a malformed one is dropped rather than passed on).
fn forwarded_chain(client: &HeaderMap) -> Option<String> {
    let mut entries = Vec::new();
    for value in client.get_all(&X_FORWARDED_FOR) {
        for entry in value.to_str().ok()?.split(',') {
            let ip: IpAddr = entry.trim().parse().ok()?;
            entries.push(ip.to_string());
        }
    }
    (!entries.is_empty()).then(|| entries.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(trusted: &[&str]) -> UpstreamPolicy {
        let upstream = UpstreamConfig {
            address: "backend.internal:8080".into(),
            ..UpstreamConfig::default()
        };
        let trusted: Vec<String> = trusted.iter().map(|s| s.to_string()).collect();
        UpstreamPolicy::from_config(&upstream, &trusted, false)
    }

    fn client(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        m
    }

    fn names(h: &[(HeaderName, HeaderValue)]) -> Vec<String> {
        h.iter()
            .map(|(k, v)| format!("{k}: {}", v.to_str().unwrap()))
            .collect()
    }

    #[test]
    fn only_allowed_client_headers_and_ours_go_upstream() {
        let p = policy(&[]);
        assert_eq!(p.host(), "backend.internal:8080");
        let c = client(&[
            ("accept", "application/json"),
            ("user-agent", "sdk/1"),
            ("cookie", "s=1"),
            ("authorization", "Bearer drg_secret"),
            ("x-api-key-id", "spoofed"),
            ("x-forwarded-for", "6.6.6.6"),
            ("forwarded", "for=6.6.6.6"),
            ("x-original-url", "/admin"),
            ("host", "evil.internal"),
        ]);
        let h = p.headers(&c, Some("192.0.2.7".parse().unwrap()), "key-1", "rid-1");
        assert_eq!(
            names(&h),
            [
                "accept: application/json",
                "user-agent: sdk/1",
                "x-api-key-id: key-1",
                "x-request-id: rid-1",
                "x-forwarded-for: 192.0.2.7",
                "x-forwarded-proto: http",
            ]
        );
    }

    #[test]
    fn a_trusted_proxy_keeps_a_well_formed_chain() {
        let p = policy(&["10.0.0.0/8", "::1"]);
        let c = client(&[("x-forwarded-for", "203.0.113.9, 198.51.100.2")]);
        let h = p.headers(&c, Some("10.1.2.3".parse().unwrap()), "k", "r");
        assert!(names(&h).contains(&"x-forwarded-for: 203.0.113.9, 198.51.100.2, 10.1.2.3".into()));
        // IPv4-mapped IPv6 peers match IPv4 ranges.
        let h = p.headers(&c, Some("::ffff:10.0.0.1".parse().unwrap()), "k", "r");
        assert!(names(&h).contains(&"x-forwarded-for: 203.0.113.9, 198.51.100.2, 10.0.0.1".into()));
        // A malformed chain is dropped, not passed on.
        let c = client(&[("x-forwarded-for", "203.0.113.9, <script>")]);
        let h = p.headers(&c, Some("::1".parse().unwrap()), "k", "r");
        assert!(names(&h).contains(&"x-forwarded-for: ::1".into()));
        // An untrusted peer's chain is ignored.
        let c = client(&[("x-forwarded-for", "203.0.113.9")]);
        let h = p.headers(&c, Some("192.0.2.1".parse().unwrap()), "k", "r");
        assert!(names(&h).contains(&"x-forwarded-for: 192.0.2.1".into()));
    }

    #[test]
    fn reserved_headers_and_proxies_are_recognised() {
        for h in ["cookie", "x-api-key-id", "connection", "host", "forwarded"] {
            assert!(is_reserved_header(&HeaderName::from_static(h)), "{h}");
        }
        assert!(!is_reserved_header(&HeaderName::from_static("accept")));
        assert!(is_reserved_header(&HeaderName::from_static("traceparent")));
        assert!(parse_proxy("10.0.0.0/8").is_some());
        assert!(parse_proxy("192.0.2.1").is_some());
        assert!(parse_proxy("fd00::/8").is_some());
        assert!(parse_proxy("10.0.0.0/33").is_none());
        assert!(parse_proxy("proxy.internal").is_none());
    }

    #[test]
    fn host_defaults_to_the_address_without_a_default_port() {
        let mut u = UpstreamConfig {
            address: "backend.internal:80".into(),
            ..UpstreamConfig::default()
        };
        assert_eq!(u.host_header(), "backend.internal");
        u.address = "backend.internal:9090".into();
        assert_eq!(u.host_header(), "backend.internal:9090");
        u.host = Some("api.example".into());
        assert_eq!(u.host_header(), "api.example");
    }
}
