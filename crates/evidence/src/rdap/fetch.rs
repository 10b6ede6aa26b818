//! One RDAP fetch: `GET <server>domain/<name>` through ureq (the system's OpenSSL and trust
//! store, no proxy), the answer size-limited, redirects followed by hand and only to a server
//! the bootstrap names for the TLD. Blocking: run on the RDAP workers' own threads.

use std::io::Read;
use std::time::Duration;

use super::answer::{self, AnswerError, Registration};
use super::bootstrap::Bootstrap;
use super::queue::Job;
use drg_domain::age::DayNumber;

/// What a server said of a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetched {
    Found(Registration),
    /// 404: the registry does not know the name.
    NotFound,
}

/// Why a fetch told nothing.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// 429: the server asks to slow down.
    #[error("rate limited (429)")]
    RateLimited { retry_after: Option<Duration> },
    /// 503: the server is down for now.
    #[error("unavailable (503)")]
    Unavailable { retry_after: Option<Duration> },
    #[error("timed out")]
    Timeout,
    #[error("transport: {0}")]
    Transport(String),
    #[error("status {0}")]
    Status(u16),
    #[error("answer larger than {0} bytes")]
    TooLarge(u64),
    #[error("redirect to a server the bootstrap does not name for the TLD, or too many")]
    Redirect,
    #[error(transparent)]
    Answer(#[from] AnswerError),
}

impl FetchError {
    /// The `kind` label of `drg_rdap_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            FetchError::RateLimited { .. } => "rate_limited",
            FetchError::Unavailable { .. } => "unavailable",
            FetchError::Timeout => "timeout",
            FetchError::Transport(_) => "transport",
            FetchError::Status(_) => "status",
            FetchError::TooLarge(_) => "too_large",
            FetchError::Redirect => "redirect",
            FetchError::Answer(_) => "invalid_answer",
        }
    }

    /// Whether the server should be left alone for a while (it asked, or it is failing).
    pub fn backs_off(&self) -> bool {
        matches!(
            self,
            FetchError::RateLimited { .. }
                | FetchError::Unavailable { .. }
                | FetchError::Timeout
                | FetchError::Transport(_)
        )
    }

    /// The server's `Retry-After`, when it sent one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            FetchError::RateLimited { retry_after } | FetchError::Unavailable { retry_after } => {
                *retry_after
            }
            _ => None,
        }
    }
}

/// The HTTP side of the RDAP workers.
pub struct Fetcher {
    agent: ureq::Agent,
    max_body: u64,
    max_redirects: u32,
}

impl Fetcher {
    pub fn new(timeout: Duration, max_body: u64, max_redirects: u32) -> Self {
        let agent = ureq::Agent::config_builder()
            .tls_config(drg_base::infra::http::system_tls())
            .timeout_global(Some(timeout))
            // Followed here, each checked against the bootstrap.
            .max_redirects(0)
            .proxy(None)
            .http_status_as_error(false)
            // A compressed answer would not be bounded by `max_body` as sent.
            .accept_encoding("identity")
            .user_agent(concat!("domain-risk-gateway/", env!("CARGO_PKG_VERSION")))
            .build()
            .new_agent();
        Fetcher {
            agent,
            max_body,
            max_redirects,
        }
    }

    /// Asks `job.server` for `job.name` as of `today`.
    pub fn fetch(
        &self,
        bootstrap: &Bootstrap,
        job: &Job,
        today: DayNumber,
    ) -> Result<Fetched, FetchError> {
        let mut url = format!("{}domain/{}", job.server, job.name);
        for _ in 0..=self.max_redirects {
            let response = self
                .agent
                .get(&url)
                .header("Accept", "application/rdap+json, application/json")
                .call()
                .map_err(transport)?;
            let status = response.status().as_u16();
            let header = |name: &str| drg_base::infra::http::header(&response, name);
            match status {
                200 => {
                    let announced = header("content-length").and_then(|l| l.parse::<u64>().ok());
                    if announced.is_some_and(|l| l > self.max_body) {
                        return Err(FetchError::TooLarge(self.max_body));
                    }
                    let mut body = Vec::new();
                    response
                        .into_body()
                        .into_reader()
                        .take(self.max_body + 1)
                        .read_to_end(&mut body)
                        .map_err(|e| transport_io(&e))?;
                    if body.len() as u64 > self.max_body {
                        return Err(FetchError::TooLarge(self.max_body));
                    }
                    return Ok(Fetched::Found(answer::parse(&body, &job.name, today)?));
                }
                404 => return Ok(Fetched::NotFound),
                301 | 302 | 303 | 307 | 308 => {
                    let next = header("location")
                        .and_then(|l| absolute(&url, &l))
                        .filter(|l| bootstrap.vouches(&job.tld, l))
                        .ok_or(FetchError::Redirect)?;
                    url = next;
                }
                429 => {
                    return Err(FetchError::RateLimited {
                        retry_after: header("retry-after").and_then(|v| retry_after(&v)),
                    })
                }
                503 => {
                    return Err(FetchError::Unavailable {
                        retry_after: header("retry-after").and_then(|v| retry_after(&v)),
                    })
                }
                other => return Err(FetchError::Status(other)),
            }
        }
        Err(FetchError::Redirect)
    }
}

fn transport(e: ureq::Error) -> FetchError {
    match e {
        ureq::Error::Timeout(_) => FetchError::Timeout,
        ureq::Error::Io(io) => transport_io(&io),
        other => FetchError::Transport(other.to_string()),
    }
}

/// An I/O error of the body's reader. ureq hands its own errors (its timeout, when the answer's
/// body does not come in time) to the reader wrapped in an `io::Error` of kind `Other`: they are
/// unwrapped, so a read timeout counts as `timeout`, not `transport`.
fn transport_io(e: &std::io::Error) -> FetchError {
    if let Some(inner) = e.get_ref().and_then(|i| i.downcast_ref::<ureq::Error>()) {
        return match inner {
            ureq::Error::Timeout(_) => FetchError::Timeout,
            ureq::Error::Io(io) => transport_io(io),
            other => FetchError::Transport(other.to_string()),
        };
    }
    match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => FetchError::Timeout,
        _ => FetchError::Transport(e.to_string()),
    }
}

/// `location` made absolute against `base` (a path alone keeps `base`'s scheme and host).
fn absolute(base: &str, location: &str) -> Option<String> {
    if location.starts_with("https://") || location.starts_with("http://") {
        return Some(location.to_owned());
    }
    if !location.starts_with('/') || location.starts_with("//") {
        return None;
    }
    let uri: http::Uri = base.parse().ok()?;
    Some(format!(
        "{}://{}{location}",
        uri.scheme_str()?,
        uri.authority()?
    ))
}

/// A `Retry-After` value: seconds, or an HTTP date (RFC 9110), as a wait from now.
pub fn retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = at.timestamp() - chrono::Utc::now().timestamp();
    Some(Duration::from_secs(u64::try_from(wait).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        assert_eq!(retry_after(" 120 "), Some(Duration::from_secs(120)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        let soon = (chrono::Utc::now() + chrono::Duration::seconds(90)).to_rfc2822();
        let wait = retry_after(&soon).unwrap().as_secs();
        assert!((85..=90).contains(&wait), "{wait}");
        assert_eq!(retry_after("soon"), None);
    }

    #[test]
    fn a_relative_location_keeps_the_server() {
        assert_eq!(
            absolute("http://127.0.0.1:9/r/domain/a.com", "/r2/domain/a.com").as_deref(),
            Some("http://127.0.0.1:9/r2/domain/a.com")
        );
        assert_eq!(absolute("http://a/x", "//evil/x"), None);
        assert_eq!(absolute("http://a/x", "x"), None);
    }
}
