//! Screening of `/v1/check/{email_or_domain}` targets, and their canonical form.
//!
//! The upstream owns the real analysis; this refuses what can never be valid (so such calls cost
//! the backend nothing) and gives what passes one canonical form: the domain part parsed like any
//! looked-up domain (lowercase, IDN as punycode), the local part kept as sent. The upstream
//! request line is re-encoded from that form, never copied from the client's bytes.

use std::net::IpAddr;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::name::{DomainName, NameError};

/// Longest email address we forward (RFC 3696 errata: 320 = 64 + 1 + 255).
pub const MAX_TARGET_LEN: usize = 320;
/// Longest local part (RFC 5321 section 4.5.3.1.1).
pub const MAX_LOCAL_LEN: usize = 64;

/// Bytes of a local part left as they are in the upstream path: RFC 3986 unreserved characters
/// plus `+` (common in addresses, and literal in a path). Everything else is percent-encoded.
const LOCAL_PART_KEEP: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'+');

/// Why a check target can never be valid. The `Display` text is the `detail` of the `422`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("target is empty")]
    Empty,
    #[error("target is {len} characters long; the maximum is {MAX_TARGET_LEN}")]
    TooLong { len: usize },
    #[error("target is a dot segment ('.' or '..')")]
    DotSegment,
    #[error("target contains a backslash")]
    Backslash,
    #[error("target contains whitespace, control characters or NUL")]
    InvalidChar,
    #[error("target looks like a URL; send an email address or a domain")]
    UrlPrefix,
    #[error("target contains more than one '@'")]
    ManyAts,
    #[error("local part is empty")]
    EmptyLocal,
    #[error("local part is {len} characters long; the maximum is {MAX_LOCAL_LEN}")]
    LocalTooLong { len: usize },
    #[error("domain part is empty")]
    EmptyDomain,
    #[error("target is an IP address literal, not a domain")]
    IpLiteral,
    #[error("domain part: {0}")]
    Domain(NameError),
}

/// A check target that passed screening, in canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckTarget {
    /// The local part of an email address, as sent; `None` for a bare domain.
    pub local: Option<String>,
    pub domain: DomainName,
}

impl CheckTarget {
    /// The path of the upstream request: `/v1/check/` and the canonical target, the local part
    /// percent-encoded so no byte of it can change how the path is read.
    pub fn upstream_path(&self) -> String {
        let mut path = String::from("/v1/check/");
        if let Some(local) = &self.local {
            path.extend(utf8_percent_encode(local, LOCAL_PART_KEEP));
            path.push('@');
        }
        path.push_str(self.domain.as_str());
        path
    }
}

/// Screens an (already percent-decoded) check target and returns its canonical form.
pub fn screen_target(target: &str) -> Result<CheckTarget, TargetError> {
    if target.is_empty() {
        return Err(TargetError::Empty);
    }
    let len = target.chars().count();
    if len > MAX_TARGET_LEN {
        return Err(TargetError::TooLong { len });
    }
    if target == "." || target == ".." {
        return Err(TargetError::DotSegment);
    }
    if target.contains('\\') {
        return Err(TargetError::Backslash);
    }
    if target.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(TargetError::InvalidChar);
    }
    let is_mailto = target
        .get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case("mailto:"));
    if target.contains("://") || is_mailto || target.contains('/') {
        return Err(TargetError::UrlPrefix);
    }
    let (local, domain) = match target.split_once('@') {
        Some((local, domain)) => {
            if domain.contains('@') {
                return Err(TargetError::ManyAts);
            }
            if local.is_empty() {
                return Err(TargetError::EmptyLocal);
            }
            let local_len = local.chars().count();
            if local_len > MAX_LOCAL_LEN {
                return Err(TargetError::LocalTooLong { len: local_len });
            }
            (Some(local), domain)
        }
        None => (None, target),
    };
    if domain.is_empty() {
        return Err(TargetError::EmptyDomain);
    }
    let bare = domain.strip_suffix('.').unwrap_or(domain);
    let bracketed = bare.starts_with('[') && bare.ends_with(']');
    if bracketed || bare.parse::<IpAddr>().is_ok() {
        return Err(TargetError::IpLiteral);
    }
    let domain = DomainName::parse(domain).map_err(TargetError::Domain)?;
    Ok(CheckTarget {
        local: local.map(str::to_owned),
        domain,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(t: &str) -> String {
        screen_target(t).unwrap().upstream_path()
    }

    #[test]
    fn plausible_targets_pass_in_canonical_form() {
        assert_eq!(path("user@example.com"), "/v1/check/user@example.com");
        assert_eq!(path("Example.COM."), "/v1/check/example.com");
        assert_eq!(
            path("First.Last+tag@Sub.Example.co.uk"),
            "/v1/check/First.Last+tag@sub.example.co.uk"
        );
        // IDN domain as punycode, a Unicode local part percent-encoded as UTF-8.
        assert_eq!(
            path("jörg@bücher.de"),
            "/v1/check/j%C3%B6rg@xn--bcher-kva.de"
        );
        let long_local = "a".repeat(64);
        assert_eq!(
            path(&format!("{long_local}@example.com")),
            format!("/v1/check/{long_local}@example.com")
        );
    }

    #[test]
    fn local_part_bytes_cannot_change_the_path() {
        for (t, want) in [
            ("a?b@example.com", "/v1/check/a%3Fb@example.com"),
            ("a#b@example.com", "/v1/check/a%23b@example.com"),
            ("a%2e@example.com", "/v1/check/a%252e@example.com"),
            ("..@example.com", "/v1/check/..@example.com"),
            ("\"x;y\"@example.com", "/v1/check/%22x%3By%22@example.com"),
        ] {
            assert_eq!(path(t), want, "{t}");
        }
    }

    #[test]
    fn impossible_targets_are_refused_with_a_reason() {
        use TargetError::*;
        let long = format!("{}@example.com", "a".repeat(310));
        let cases: [(&str, TargetError); 21] = [
            ("example.com/path", UrlPrefix),
            ("", Empty),
            (&long, TooLong { len: 322 }),
            ("https://example.com", UrlPrefix),
            ("mailto:a@example.com", UrlPrefix),
            ("a@b@example.com", ManyAts),
            ("@example.com", EmptyLocal),
            ("user@", EmptyDomain),
            ("user@[192.168.0.1]", IpLiteral),
            ("user@[IPv6:::1]", IpLiteral),
            ("10.0.0.1", IpLiteral),
            ("::1", IpLiteral),
            ("a b@example.com", InvalidChar),
            ("a\0b@example.com", InvalidChar),
            ("a@exa\u{7f}mple.com", InvalidChar),
            (".", DotSegment),
            ("..", DotSegment),
            ("..\\..\\admin", Backslash),
            ("a\\b@example.com", Backslash),
            ("user@localhost", Domain(NameError::SingleLabel)),
            (
                "user@exa_mple.com",
                Domain(NameError::InvalidChar { ch: '_' }),
            ),
        ];
        for (t, want) in cases {
            assert_eq!(screen_target(t), Err(want), "{t:?}");
        }
        let local = format!("{}@example.com", "a".repeat(65));
        assert_eq!(screen_target(&local), Err(LocalTooLong { len: 65 }));
    }

    #[test]
    fn the_detail_names_the_domain_part() {
        let e = screen_target("a@-x.com").unwrap_err();
        assert!(e.to_string().starts_with("domain part: "), "{e}");
    }
}
