//! Cheap screening of `/v1/check/{email_or_domain}` targets before they reach the upstream.
//!
//! The upstream owns the real analysis; this only refuses what can never be valid, so that such
//! calls cost the backend nothing. Anything that passes is forwarded unchanged.

use std::net::IpAddr;

/// Longest email address we forward (RFC 3696 errata: 320 = 64 + 1 + 255).
pub const MAX_TARGET_LEN: usize = 320;
/// Longest local part (RFC 5321 section 4.5.3.1.1).
pub const MAX_LOCAL_LEN: usize = 64;

/// Why a check target can never be valid. The `Display` text is the `detail` of the `422`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("target is empty")]
    Empty,
    #[error("target is {len} characters long; the maximum is {MAX_TARGET_LEN}")]
    TooLong { len: usize },
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
    #[error("target contains whitespace or control characters")]
    InvalidChar,
}

/// Screens an (already percent-decoded) check target.
pub fn screen_target(target: &str) -> Result<(), TargetError> {
    if target.is_empty() {
        return Err(TargetError::Empty);
    }
    let len = target.chars().count();
    if len > MAX_TARGET_LEN {
        return Err(TargetError::TooLong { len });
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
    let domain = match target.split_once('@') {
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
            domain
        }
        None => target,
    };
    if domain.is_empty() {
        return Err(TargetError::EmptyDomain);
    }
    let bare = domain.strip_suffix('.').unwrap_or(domain);
    let unbracketed = bare
        .strip_prefix('[')
        .and_then(|d| d.strip_suffix(']'))
        .map(|d| d.strip_prefix("IPv6:").unwrap_or(d));
    if unbracketed.is_some() || bare.parse::<IpAddr>().is_ok() {
        return Err(TargetError::IpLiteral);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plausible_targets_pass() {
        for t in [
            "user@example.com",
            "example.com",
            "first.last+tag@sub.example.co.uk",
            "jörg@bücher.de",
            &format!("{}@example.com", "a".repeat(64)),
        ] {
            assert_eq!(screen_target(t), Ok(()), "{t}");
        }
    }

    #[test]
    fn impossible_targets_are_refused_with_a_reason() {
        use TargetError::*;
        let long = format!("{}@example.com", "a".repeat(310));
        let cases: [(&str, TargetError); 13] = [
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
        ];
        for (t, want) in cases {
            assert_eq!(screen_target(t), Err(want), "{t}");
        }
        let local = format!("{}@example.com", "a".repeat(65));
        assert_eq!(screen_target(&local), Err(LocalTooLong { len: 65 }));
    }
}
