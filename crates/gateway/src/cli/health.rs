//! `health`: asks the running gateway's public listener for `/healthz` (the container image's
//! health check, which has no curl): exit 0 on `200`, an error otherwise.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use super::CommandError;
use crate::config::Settings;

/// How long the whole check may take.
const TIMEOUT: Duration = Duration::from_secs(3);

/// `GET /healthz` on the configured listener (a wildcard address asked on loopback); over TLS
/// when `gateway.tls` is set, without checking the certificate (it is our own).
pub fn health(conf: &Path) -> Result<String, CommandError> {
    let settings = Settings::load(conf)?;
    let mut addr: SocketAddr = settings.gateway.listen.parse()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    let stream = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    stream.set_read_timeout(Some(TIMEOUT))?;
    stream.set_write_timeout(Some(TIMEOUT))?;
    let request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let mut answer = Vec::new();
    if settings.gateway.tls.is_some() {
        let mut connector = openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls())?;
        connector.set_verify(openssl::ssl::SslVerifyMode::NONE);
        let mut tls = connector.build().connect("localhost", stream)?;
        tls.write_all(request)?;
        tls.read_to_end(&mut answer)?;
    } else {
        let mut stream = stream;
        stream.write_all(request)?;
        stream.read_to_end(&mut answer)?;
    }
    let status = answer.split(|&b| b == b'\r').next().unwrap_or_default();
    let status = String::from_utf8_lossy(status);
    if status.split_whitespace().nth(1) == Some("200") {
        Ok(format!("healthy: {addr} answered {status}"))
    } else {
        Err(format!("unhealthy: {addr} answered {status:?}").into())
    }
}
