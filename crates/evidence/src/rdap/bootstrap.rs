//! The RDAP bootstrap registry for domain names (RFC 9224, IANA's `dns.json`): which servers
//! answer for a TLD. Pure: parsed from text, merged with the operator's overrides.
//!
//! It is also the trust rule: an RDAP answer is evidence for a name only when it comes from a
//! server this registry (or the operator) names for the name's TLD.

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;

/// Why a bootstrap file was refused.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("not an RDAP bootstrap file: {0}")]
    Json(#[from] serde_json::Error),
    #[error("names no server for any TLD")]
    Empty,
}

/// The servers of each TLD.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bootstrap {
    /// TLD (lowercase, A-label) to base URLs, each ending in `/`, `https://` first.
    servers: HashMap<Box<str>, Vec<Box<str>>>,
    /// The file's `publication` time, as it says it.
    publication: Option<String>,
}

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    publication: Option<String>,
    services: Vec<(Vec<String>, Vec<String>)>,
}

/// Checks a base URL: `https://` (or `http://` when allowed), a host, no query or fragment.
pub fn check_base_url(url: &str, allow_plain_http: bool) -> Result<(), String> {
    let uri: http::Uri = url.parse().map_err(|_| format!("'{url}' is not a URL"))?;
    match uri.scheme_str() {
        Some("https") => {}
        Some("http") if allow_plain_http => {}
        Some("http") => {
            return Err(format!(
                "'{url}' is plain HTTP (set allow_plain_http for a private registry)"
            ))
        }
        _ => return Err(format!("'{url}' is neither https:// nor http://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("'{url}' names no host"));
    }
    if uri.query().is_some() || url.contains('#') {
        return Err(format!("'{url}' has a query or fragment"));
    }
    Ok(())
}

/// `url` ending in `/`, so that `domain/<name>` appends to its path.
fn with_slash(url: &str) -> Box<str> {
    if url.ends_with('/') {
        url.into()
    } else {
        format!("{url}/").into()
    }
}

impl Bootstrap {
    /// Parses IANA's `dns.json`: servers that fail [`check_base_url`] are left out, and a
    /// TLD's `https://` servers come first.
    pub fn parse(text: &str, allow_plain_http: bool) -> Result<Self, BootstrapError> {
        let file: File = serde_json::from_str(text)?;
        let mut servers: HashMap<Box<str>, Vec<Box<str>>> = HashMap::new();
        for (tlds, urls) in file.services {
            let mut urls: Vec<Box<str>> = urls
                .iter()
                .filter(|u| check_base_url(u, allow_plain_http).is_ok())
                .map(|u| with_slash(u))
                .collect();
            urls.sort_by_key(|u| !u.starts_with("https://"));
            if urls.is_empty() {
                continue;
            }
            for tld in tlds {
                let tld = tld.trim_end_matches('.').to_ascii_lowercase();
                if !tld.is_empty() {
                    servers.entry(tld.into()).or_default().extend(urls.clone());
                }
            }
        }
        if servers.is_empty() {
            return Err(BootstrapError::Empty);
        }
        Ok(Bootstrap {
            servers,
            publication: file.publication,
        })
    }

    /// This bootstrap with the operator's `servers` (checked by the config) in place of the
    /// file's for their TLDs.
    pub fn with_overrides(mut self, overrides: &BTreeMap<String, String>) -> Self {
        for (tld, url) in overrides {
            self.servers
                .insert(tld.as_str().into(), vec![with_slash(url)]);
        }
        self
    }

    /// The servers for `tld`, the preferred first (empty: the TLD runs no RDAP service).
    pub fn servers(&self, tld: &str) -> &[Box<str>] {
        self.servers.get(tld).map_or(&[], Vec::as_slice)
    }

    /// Whether `url` lies under one of `tld`'s servers: where a redirect may lead.
    pub fn vouches(&self, tld: &str, url: &str) -> bool {
        self.servers(tld)
            .iter()
            .any(|base| url.starts_with(&**base))
    }

    /// TLDs with a server.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    pub fn publication(&self) -> Option<&str> {
        self.publication.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"{"version":"1.0","publication":"2026-08-24T00:00:00Z","services":[
        [["com","net"],["http://rdap.verisign.com/com/v1/","https://rdap.verisign.com/com/v1/"]],
        [["uz"],["http://cctld.uz:9000/"]],
        [["example"],["https://rdap.example/base"]]]}"#;

    #[test]
    fn https_servers_are_taken_first_and_plain_http_only_when_allowed() {
        let b = Bootstrap::parse(SAMPLE, false).unwrap();
        assert_eq!(
            b.servers("com"),
            [Box::<str>::from("https://rdap.verisign.com/com/v1/")]
        );
        assert!(b.servers("uz").is_empty());
        assert_eq!(
            b.servers("example"),
            [Box::<str>::from("https://rdap.example/base/")]
        );
        let b = Bootstrap::parse(SAMPLE, true).unwrap();
        assert_eq!(b.servers("com").len(), 2);
        assert!(b.servers("com")[0].starts_with("https://"));
        assert_eq!(b.publication(), Some("2026-08-24T00:00:00Z"));
    }

    #[test]
    fn overrides_replace_a_tlds_servers_and_redirects_stay_under_them() {
        let b = Bootstrap::parse(SAMPLE, false)
            .unwrap()
            .with_overrides(&[("com".to_owned(), "http://127.0.0.1:9/r".to_owned())].into());
        assert_eq!(
            b.servers("com"),
            [Box::<str>::from("http://127.0.0.1:9/r/")]
        );
        assert!(b.vouches("com", "http://127.0.0.1:9/r/domain/a.com"));
        assert!(!b.vouches("com", "https://rdap.verisign.com/com/v1/domain/a.com"));
        assert!(!b.vouches("net", "http://127.0.0.1:9/r/domain/a.net"));
    }

    #[test]
    fn a_file_that_is_not_a_bootstrap_is_refused() {
        assert!(Bootstrap::parse("{}", false).is_err());
        assert!(Bootstrap::parse(r#"{"services":[]}"#, false).is_err());
        assert!(Bootstrap::parse(r#"{"services":[[["x"],["ftp://a/"]]]}"#, false).is_err());
    }

    #[test]
    fn the_shipped_bootstrap_parses() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../data/community/rdap-bootstrap/dns.json"
        );
        let b = Bootstrap::parse(&std::fs::read_to_string(path).unwrap(), false).unwrap();
        assert!(b.len() > 500, "{}", b.len());
        assert!(b.servers("com")[0].starts_with("https://"));
    }
}
