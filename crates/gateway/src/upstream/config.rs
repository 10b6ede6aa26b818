//! Configuration of the `/v1/check` backend: address, timeouts, TLS, mode.

use std::time::Duration;

use drg_base::infra::units::ms;
use std::net::IpAddr;

use http::header::HeaderName;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds};

/// The email-analysis backend behind `/v1/check`.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct UpstreamConfig {
    /// `host:port` of the backend.
    pub address: String,
    /// Speak TLS to the backend.
    pub tls: bool,
    /// TLS server name; defaults to the host of `address`.
    pub sni: Option<String>,
    /// Verify the backend's certificate and host name (only with `tls`).
    pub verify_cert: bool,
    /// Time allowed to establish a connection (TCP and TLS), in milliseconds.
    #[serde(rename = "connect_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub connect_timeout: Duration,
    /// Time allowed between reads from the backend (including its response header).
    #[serde(rename = "read_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub read_timeout: Duration,
    /// `Host` sent to the backend; defaults to the host of `address` (with its port unless it is
    /// the scheme's default).
    pub host: Option<String>,
    /// Client headers passed on to the backend (case-insensitive); every other client header is
    /// dropped. The gateway's own headers (`X-Api-Key-Id`, `X-Request-Id`, `X-Forwarded-For`,
    /// `X-Forwarded-Proto`, `Host`) and hop-by-hop or credential headers cannot be listed.
    pub pass_headers: Vec<String>,
    /// How `/v1/check` reaches the backend: `proxy` (Pingora's generic proxy, streaming the
    /// answer) or `relay` (the gateway's own exchange, [`crate::upstream::relay`]: the answer is read
    /// whole, up to `max_body_bytes`, and written to the client in one go).
    pub mode: UpstreamMode,
    /// `relay` only: the largest answer body taken from the backend; a larger one is answered
    /// 502. 1 to 67108864.
    pub max_body_bytes: usize,
}

/// `gateway.upstream.mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamMode {
    /// Pingora's generic duplex proxy (`ProxyHttp` upstream phases).
    Proxy,
    /// The purpose-built relay of [`crate::upstream::relay`]: the default, measured cheaper (a quarter
    /// fewer instructions per call, benches/RESULTS.md).
    #[default]
    Relay,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            address: "127.0.0.1:9090".into(),
            tls: false,
            sni: None,
            verify_cert: true,
            connect_timeout: Duration::from_millis(1_000),
            read_timeout: Duration::from_millis(5_000),
            host: None,
            pass_headers: ["accept", "accept-language", "user-agent"]
                .map(str::to_owned)
                .to_vec(),
            mode: UpstreamMode::default(),
            max_body_bytes: 1024 * 1024,
        }
    }
}

impl UpstreamConfig {
    /// Problems of `gateway.upstream`, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let up = self;
        match up.address.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
            _ => out.push(format!(
                "gateway.upstream.address: '{}' is not host:port",
                up.address
            )),
        }
        for (key, ms) in [
            ("connect_timeout_ms", ms(up.connect_timeout)),
            ("read_timeout_ms", ms(up.read_timeout)),
        ] {
            if !(1..=300_000).contains(&ms) {
                out.push(format!(
                    "gateway.upstream.{key}: {ms} is outside 1..=300000"
                ));
            }
        }
        if !(1..=64 * 1024 * 1024).contains(&up.max_body_bytes) {
            out.push(format!(
                "gateway.upstream.max_body_bytes: {} is outside 1..=67108864",
                up.max_body_bytes
            ));
        }
        if let Some(host) = &up.host {
            if host.is_empty()
                || http::HeaderValue::from_str(host).is_err()
                || host.contains(['@', '/', ' '])
            {
                out.push(format!(
                    "gateway.upstream.host: '{host}' is not a host[:port]"
                ));
            }
        }
        for name in &up.pass_headers {
            match http::HeaderName::from_bytes(name.as_bytes()) {
                Ok(h) if is_reserved_header(&h) => out.push(format!(
                    "gateway.upstream.pass_headers: '{name}' is set by the gateway or is hop-by-hop; it cannot be passed on"
                )),
                Ok(_) => {}
                Err(_) => out.push(format!(
                    "gateway.upstream.pass_headers: '{name}' is not a header name"
                )),
            }
        }
        out
    }

    /// The `Host` header sent upstream: `host`, else `address` without a default port.
    pub fn host_header(&self) -> String {
        if let Some(host) = &self.host {
            return host.clone();
        }
        let default_port = if self.tls { "443" } else { "80" };
        match self.address.rsplit_once(':') {
            Some((host, port)) if port == default_port => host.to_owned(),
            _ => self.address.clone(),
        }
    }

    /// The TLS server name: `sni`, else the host part of `address`.
    pub fn server_name(&self) -> String {
        self.sni.clone().unwrap_or_else(|| {
            let host = self
                .address
                .rsplit_once(':')
                .map_or(self.address.as_str(), |(h, _)| h);
            host.trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned()
        })
    }
}

/// Problems of `gateway.trusted_proxies`: each entry an IP address or a CIDR.
pub fn trusted_proxy_problems(trusted_proxies: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for cidr in trusted_proxies {
        if parse_proxy(cidr).is_none() {
            out.push(format!(
                "gateway.trusted_proxies: '{cidr}' is not an IP address or CIDR (e.g. 10.0.0.0/8)"
            ));
        }
    }
    out
}

/// Headers no client may set on the upstream request besides [`HOP_BY_HOP`]: ours and
/// credentials meant for the gateway.
const RESERVED: &[&str] = &[
    "host",
    "authorization",
    "proxy-authorization",
    "cookie",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-real-ip",
    "x-api-key-id",
    "x-request-id",
    "x-original-url",
    "x-rewrite-url",
    "expect",
    // Trace context: ours (tracing on), never a client's.
    "traceparent",
    "tracestate",
];

/// Headers that describe one connection, not the message (RFC 9110 7.6.1), and the framing the
/// gateway sets itself: never passed on, to the backend or back to the client.
pub const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// Whether a header is one the gateway sets itself or that must never cross it.
pub fn is_reserved_header(name: &HeaderName) -> bool {
    RESERVED.contains(&name.as_str()) || HOP_BY_HOP.contains(&name.as_str())
}

/// A trusted proxy: a CIDR (`10.0.0.0/8`) or a single address.
pub fn parse_proxy(text: &str) -> Option<IpNet> {
    let text = text.trim();
    text.parse::<IpNet>()
        .ok()
        .or_else(|| text.parse::<IpAddr>().ok().map(IpNet::from))
}
