//! Authorised origins: patterns `scheme://host[:port]` (host may start with `*.`) and the
//! origin a request comes from (`Origin`, else the origin part of `Referer`).

use std::fmt;

/// A parsed origin pattern from a key's `origins`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginPattern {
    scheme: Scheme,
    host: HostPattern,
    port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scheme {
    Http,
    Https,
}

impl Scheme {
    fn parse(s: &str) -> Option<Scheme> {
        match s.to_ascii_lowercase().as_str() {
            "http" => Some(Scheme::Http),
            "https" => Some(Scheme::Https),
            _ => None,
        }
    }

    fn default_port(self) -> u16 {
        match self {
            Scheme::Http => 80,
            Scheme::Https => 443,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    /// `*.example.com`: any subdomain of `example.com`, not the domain itself. Holds `.example.com`.
    Subdomains(String),
}

/// A concrete request origin, normalised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    scheme: Scheme,
    host: String,
    port: u16,
}

/// Why an origin or pattern could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not an origin (scheme://host[:port], scheme http or https)")]
pub struct BadOrigin(pub String);

/// Splits `scheme://host[:port]` (ignoring any path) into its parts, host normalised.
fn split(
    input: &str,
    allow_wildcard: bool,
    allow_path: bool,
) -> Option<(Scheme, String, Option<u16>)> {
    let (scheme, rest) = input.split_once("://")?;
    let scheme = Scheme::parse(scheme)?;
    let authority = match rest.find(['/', '?', '#']) {
        Some(i) if allow_path => &rest[..i],
        Some(_) => return None,
        None => rest,
    };
    if authority.contains('@') || authority.is_empty() {
        return None;
    }
    let (host, port) = if authority.starts_with('[') {
        let end = authority.find(']')?;
        let (host, rest) = authority.split_at(end + 1);
        match rest.strip_prefix(':') {
            Some(p) => (host, Some(p.parse::<u16>().ok()?)),
            None if rest.is_empty() => (host, None),
            None => return None,
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p.parse::<u16>().ok()?)),
            None => (authority, None),
        }
    };
    let (wild, bare) = match host.strip_prefix("*.") {
        Some(bare) if allow_wildcard => (true, bare),
        Some(_) => return None,
        None => (false, host),
    };
    let ascii = if bare.starts_with('[') {
        bare.to_ascii_lowercase()
    } else {
        let a = idna::domain_to_ascii_cow(bare.as_bytes(), idna::AsciiDenyList::URL).ok()?;
        let valid = !a.is_empty()
            && a.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
        if !valid {
            return None;
        }
        a.into_owned()
    };
    let host = if wild { format!("*.{ascii}") } else { ascii };
    Some((scheme, host, port))
}

impl OriginPattern {
    pub fn parse(pattern: &str) -> Result<Self, BadOrigin> {
        let bad = || BadOrigin(pattern.to_owned());
        let (scheme, host, port) = split(pattern.trim(), true, false).ok_or_else(bad)?;
        let host = match host.strip_prefix('*') {
            Some(suffix) => HostPattern::Subdomains(suffix.to_owned()),
            None => HostPattern::Exact(host),
        };
        Ok(OriginPattern {
            scheme,
            host,
            port: port.unwrap_or(scheme.default_port()),
        })
    }

    pub fn matches(&self, origin: &Origin) -> bool {
        self.scheme == origin.scheme
            && self.port == origin.port
            && match &self.host {
                HostPattern::Exact(h) => *h == origin.host,
                HostPattern::Subdomains(suffix) => {
                    origin.host.len() > suffix.len() && origin.host.ends_with(suffix.as_str())
                }
            }
    }
}

impl Origin {
    /// Parses an `Origin` header value (`null` and anything malformed give `None`).
    pub fn from_origin_header(value: &str) -> Option<Origin> {
        Self::build(split(value.trim(), false, false)?)
    }

    /// The origin part of a `Referer` header value.
    pub fn from_referer(value: &str) -> Option<Origin> {
        Self::build(split(value.trim(), false, true)?)
    }

    fn build((scheme, host, port): (Scheme, String, Option<u16>)) -> Option<Origin> {
        Some(Origin {
            scheme,
            host,
            port: port.unwrap_or(scheme.default_port()),
        })
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        write!(f, "{scheme}://{}", self.host)?;
        if self.port != self.scheme.default_port() {
            write!(f, ":{}", self.port)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> OriginPattern {
        OriginPattern::parse(s).unwrap()
    }
    fn o(s: &str) -> Origin {
        Origin::from_origin_header(s).unwrap()
    }

    #[test]
    fn exact_patterns_match_scheme_host_and_port() {
        let pat = p("https://App.Example.com");
        assert!(pat.matches(&o("https://app.example.com")));
        assert!(pat.matches(&o("https://app.example.com:443")));
        assert!(pat.matches(&o("HTTPS://APP.EXAMPLE.COM")));
        assert!(!pat.matches(&o("http://app.example.com")));
        assert!(!pat.matches(&o("https://app.example.com:8443")));
        assert!(!pat.matches(&o("https://evil-app.example.com")));
        assert!(!pat.matches(&o("https://app.example.com.evil.example")));
        assert!(p("http://localhost:3000").matches(&o("http://localhost:3000")));
        assert!(p("http://[::1]:3000").matches(&o("http://[::1]:3000")));
        assert!(!p("http://[::1]:3000").matches(&o("http://[::1]")));
    }

    #[test]
    fn wildcards_match_subdomains_only() {
        let pat = p("https://*.example.com");
        assert!(pat.matches(&o("https://a.example.com")));
        assert!(pat.matches(&o("https://a.b.example.com")));
        assert!(!pat.matches(&o("https://example.com")));
        assert!(!pat.matches(&o("https://badexample.com")));
    }

    #[test]
    fn idn_hosts_compare_as_punycode() {
        assert!(p("https://bücher.de").matches(&o("https://xn--bcher-kva.de")));
    }

    #[test]
    fn null_and_junk_are_not_origins() {
        for s in [
            "null",
            "",
            "example.com",
            "ftp://x.com",
            "https://",
            "https://a.com/path",
            "https://u@a.com",
        ] {
            assert_eq!(Origin::from_origin_header(s), None, "{s:?}");
        }
        for s in [
            "https://*.a.com/x",
            "*.a.com",
            "https://a.com:99999",
            "https://*",
        ] {
            assert!(OriginPattern::parse(s).is_err(), "{s:?}");
        }
    }

    #[test]
    fn referer_gives_its_origin() {
        let r = Origin::from_referer("https://app.example.com:8443/signup?x=1").unwrap();
        assert_eq!(r.to_string(), "https://app.example.com:8443");
        assert_eq!(
            Origin::from_referer("https://app.example.com/")
                .unwrap()
                .to_string(),
            "https://app.example.com"
        );
    }
}
