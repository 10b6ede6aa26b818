//! A receiver as the operator configures one (`gateway.quota.alerts`, `gateway.changes.webhook`):
//! the URL, the secret file, whether private addresses may receive, an attempt's budget and how
//! many attempts. The checks every webhook's configuration shares.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds};

use crate::guard::{Listener, Policy, Refused};

/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;

/// One configured receiver. Where it may be: the URL's host and, when a message is sent, every
/// address its name resolves to must be public. Loopback, private (10/8, 172.16/12,
/// 192.168/16, fc00::/7), carrier-grade NAT (100.64/10), documentation, benchmarking and
/// reserved ranges are refused unless `allow_private: true`; link-local (169.254/16,
/// fe80::/10: cloud metadata services), unspecified, multicast and broadcast addresses, and
/// the gateway's own listeners, always.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiverConfig {
    /// `http://` or `https://`.
    pub url: String,
    /// Let the receiver be on loopback or a private network (link-local addresses and the
    /// gateway's own listeners stay refused). Default `false`.
    #[serde(default)]
    pub allow_private: bool,
    /// A file holding the HMAC-SHA256 secret (its first line, at least 16 bytes). Relative to
    /// the config file.
    pub secret_file: PathBuf,
    /// One attempt's budget, connection included, in milliseconds.
    #[serde(rename = "timeout_ms", default = "default_timeout")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub timeout: Duration,
    /// Attempts per message before it is given up; the waits between them double from one
    /// second, up to ten minutes.
    #[serde(default = "default_attempts")]
    pub max_attempts: u32,
}

pub fn default_timeout() -> Duration {
    Duration::from_millis(5_000)
}

pub fn default_attempts() -> u32 {
    12
}

impl ReceiverConfig {
    /// Problems of the receiver configured at `at`, each naming its key; `listeners` are the
    /// gateway's own.
    pub fn problems(&self, at: &str, listeners: &[Listener]) -> Vec<String> {
        let mut out = Vec::new();
        out.extend(url_problem(at, &self.url, &self.policy(listeners)));
        out.extend(delivery_problems(at, self.timeout, self.max_attempts));
        out
    }

    /// What may receive its messages.
    pub fn policy(&self, listeners: &[Listener]) -> Policy {
        Policy {
            allow_private: self.allow_private,
            listeners: listeners.to_vec(),
        }
    }

    /// Makes the secret file's path relative to `base` (the config file's folder).
    pub fn resolve_paths(&mut self, base: &Path) {
        self.secret_file = base.join(&self.secret_file);
    }

    /// The secret: the file's first line, trimmed, at least [`MIN_SECRET_BYTES`].
    pub fn read_secret(&self, at: &str) -> Result<Vec<u8>, String> {
        read_secret_file(&format!("{at}.secret_file"), &self.secret_file)
    }
}

/// Problems of an attempt's budget (`{at}.timeout_ms`, 100 ms to a minute) and of the attempts
/// (`{at}.max_attempts`, 1 to 100).
pub fn delivery_problems(at: &str, timeout: Duration, max_attempts: u32) -> Vec<String> {
    let mut out = Vec::new();
    let ms = timeout.as_millis();
    if !(100..=60_000).contains(&ms) {
        out.push(format!("{at}.timeout_ms: {ms} is outside 100..=60000"));
    }
    if !(1..=100).contains(&max_attempts) {
        out.push(format!(
            "{at}.max_attempts: {max_attempts} is outside 1..=100"
        ));
    }
    out
}

/// The problem of a webhook `url` configured at `at` (`{at}.url`): not http(s), or a host
/// `policy` refuses (an address in any spelling is judged now; a name only when a message is
/// sent). Names the host only: the path or query may hold a token.
pub fn url_problem(at: &str, url: &str, policy: &Policy) -> Option<String> {
    let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
    match url.parse::<http::Uri>() {
        Ok(uri) if scheme_ok && uri.host().is_some() => {
            authority_problem(at, &uri).or_else(|| host_problem(at, &uri, policy))
        }
        _ => Some(format!(
            "{at}.url: '{url}' is not an http:// or https:// URL"
        )),
    }
}

/// What is wrong with `uri`'s authority besides its host: user info (`user:pass@`, which the
/// client would send as credentials: a URL is no place for them, and its percent-encoding
/// would have to be guessed), or a port outside 1-65535 (`:0`, `:99999`, `:` alone), which
/// `http::Uri` keeps as text and the client would replace with the scheme's.
fn authority_problem(at: &str, uri: &http::Uri) -> Option<String> {
    let authority = uri.authority()?.as_str();
    if authority.contains('@') {
        return Some(format!(
            "{at}.url: user info (user:password@) is not accepted: receivers authenticate a \
             message by its signature"
        ));
    }
    // After the host: `]` closes an IPv6 literal, else the first `:`.
    let rest = match authority.rfind(']') {
        Some(end) => &authority[end + 1..],
        None => authority.find(':').map_or("", |i| &authority[i..]),
    };
    let port = rest.strip_prefix(':')?;
    match port.parse::<u16>() {
        Ok(p) if p >= 1 && port.bytes().all(|b| b.is_ascii_digit()) => None,
        _ => Some(format!(
            "{at}.url: port '{port}' is not one from 1 to 65535"
        )),
    }
}

/// The problem a project's webhook `url` has, in words that name its field and host only: the
/// same checks as [`url_problem`], with every refused address said in one sentence. A project
/// is told that an address is refused, never why in the operator's terms (a range's setting, a
/// backend's key), and `policy` should hold no listeners: a `422` for the gateway's own
/// backends would show a project where they are (they are refused when a message is sent).
pub fn receiver_url_problem(url: &str, policy: &Policy) -> Option<String> {
    let scheme_ok = url.starts_with("http://") || url.starts_with("https://");
    let uri = match url.parse::<http::Uri>() {
        Ok(uri) if scheme_ok && uri.host().is_some() => uri,
        _ => return url_problem("url", url, policy),
    };
    if let Some(problem) = authority_problem("url", &uri) {
        return Some(problem);
    }
    let host = uri.host().unwrap_or_default();
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("https") {
            443
        } else {
            80
        });
    match policy.check_host(host, port, &crate::resolve::this_host_has) {
        Ok(_) => None,
        Err(Refused::NotAHost(_)) => Some(format!(
            "url: host '{host}' is neither a DNS name nor an IP address"
        )),
        Err(_) if policy.allow_private => {
            Some(format!("url: host '{host}' may not receive webhooks"))
        }
        Err(_) => Some(format!(
            "url: host '{host}' may not receive webhooks: a public address is needed"
        )),
    }
}

/// The problem of `uri`'s host under `policy`, if any.
fn host_problem(at: &str, uri: &http::Uri, policy: &Policy) -> Option<String> {
    let host = uri.host().unwrap_or_default();
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let is_local = crate::resolve::this_host_has;
    let refused = policy.check_host(host, port, &is_local).err()?;
    Some(format!("{at}.url: host '{host}': {refused}"))
}

/// A webhook secret: the first line of `path`, trimmed, at least [`MIN_SECRET_BYTES`]; errors
/// name the key `at` and the file.
pub fn read_secret_file(at: &str, path: &Path) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{at} {shown}: {e}"))?;
    let secret = text.lines().next().unwrap_or("").trim();
    if secret.len() < MIN_SECRET_BYTES {
        return Err(format!(
            "{at} {shown}: the secret (first line) has {} bytes, at least {MIN_SECRET_BYTES} are needed",
            secret.len()
        ));
    }
    Ok(secret.as_bytes().to_vec())
}
