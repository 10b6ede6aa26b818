//! Access control (the `drg-access` crate): who is
//! calling (API key, 401), from where (origin, 403), and how much (per-second rate and monthly
//! quota, 429, with the quota's alerts through the webhook engine).
//!
//! It must never import another gateway part or Pingora (the compiler's): the host decides what
//! a request is and answers it; this crate says who may make it and how often.
//!
//! [`decide`] is the pure part: request headers and a key snapshot in, a [`Principal`] or a
//! [`Rejection`] out. The plan's limits are applied afterwards ([`policy::admit`]), through
//! [`quota::QuotaStore`].

// Its docs link private items freely: they are for the next engineer, not a public API.
#![allow(rustdoc::private_intra_doc_links)]

pub mod config;
pub mod keys;
pub mod managed;
pub mod origin;
pub mod plan;
pub mod policy;
pub mod quota;
pub mod rate;
pub mod source;
pub mod token_memo;

use std::sync::Arc;

use keys::{KeyEntry, KeyStore, MAX_TOKEN_LEN};
use origin::Origin;
use token_memo::TokenMemo;

/// A caller that passed the key and origin checks.
#[derive(Debug, Clone)]
pub struct Principal {
    pub key: Arc<KeyEntry>,
    /// The origin to echo in `Access-Control-Allow-Origin` (keys with origins only).
    pub allowed_origin: Option<String>,
}

/// Why a request was refused before reaching its handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejection {
    /// No `Authorization` header (401).
    MissingKey,
    /// Malformed, unknown or disabled key (401, `error="invalid_token"`).
    InvalidKey,
    /// A key past its `expires_at` (401, naming when, unix seconds): its holder is told why,
    /// since they hold the secret.
    Expired { at: i64 },
    /// The key is not authorised for this origin (403); holds what the request said.
    Forbidden { origin: String },
    /// An API-made key the control store has not vouched for within the bound the gateway
    /// trusts its last read (503: it may have been revoked meanwhile).
    Unverified,
}

/// The request headers the decision reads (raw bytes, as received).
#[derive(Debug, Clone, Copy, Default)]
pub struct Credentials<'a> {
    pub authorization: Option<&'a [u8]>,
    pub origin: Option<&'a [u8]>,
    pub referer: Option<&'a [u8]>,
}

/// Key, then origin: the access decision for one request at `now` (unix seconds).
pub fn decide(keys: &KeyStore, creds: Credentials<'_>, now: i64) -> Result<Principal, Rejection> {
    decide_lazily(keys, creds.authorization, now, || {
        (creds.origin, creds.referer)
    })
}

/// [`decide`], the `Origin` and `Referer` headers looked up only for a key with origins (most
/// keys are server keys, which ignore them).
pub fn decide_lazily<'a>(
    keys: &KeyStore,
    authorization: Option<&[u8]>,
    now: i64,
    origin_and_referer: impl FnOnce() -> (Option<&'a [u8]>, Option<&'a [u8]>),
) -> Result<Principal, Rejection> {
    decide_remembering(keys, None, authorization, || now, origin_and_referer)
}

/// [`decide_lazily`], the token's digest taken from its connection's `memo` when that
/// connection sent the same `Authorization` header before ([`TokenMemo`]): the same decision,
/// without reading and hashing the token again. `now` is asked once a key is found.
pub fn decide_remembering<'a>(
    keys: &KeyStore,
    memo: Option<&TokenMemo>,
    authorization: Option<&[u8]>,
    now: impl FnOnce() -> i64,
    origin_and_referer: impl FnOnce() -> (Option<&'a [u8]>, Option<&'a [u8]>),
) -> Result<Principal, Rejection> {
    let header = authorization.ok_or(Rejection::MissingKey)?;
    let key = match memo {
        Some(memo) => keys.find_hash(
            &memo
                .digest(header, bearer_token)
                .ok_or(Rejection::InvalidKey)?,
        ),
        None => keys.find_bytes(bearer_token(header).ok_or(Rejection::InvalidKey)?),
    }
    .ok_or(Rejection::InvalidKey)?;
    if key.disabled {
        return Err(Rejection::InvalidKey);
    }
    let now = now();
    if key.source == keys::KeyOrigin::Api && keys.unverified_at(now) {
        return Err(Rejection::Unverified);
    }
    // Before the origin: an expired key is refused wherever it is sent from.
    if let Some(at) = key.expired_at(now) {
        return Err(Rejection::Expired { at });
    }
    let Some(patterns) = &key.origins else {
        return Ok(Principal {
            key: key.clone(),
            allowed_origin: None,
        });
    };
    let (raw, origin) = match origin_and_referer() {
        (Some(o), _) => (
            o,
            std::str::from_utf8(o)
                .ok()
                .and_then(Origin::from_origin_header),
        ),
        (None, Some(r)) => (
            r,
            std::str::from_utf8(r).ok().and_then(Origin::from_referer),
        ),
        (None, None) => (&b""[..], None),
    };
    match origin {
        Some(origin) if patterns.iter().any(|p| p.matches(&origin)) => Ok(Principal {
            key: key.clone(),
            allowed_origin: Some(origin.to_string()),
        }),
        _ => Err(Rejection::Forbidden {
            origin: if raw.is_empty() {
                "(none)".to_owned()
            } else {
                String::from_utf8_lossy(raw).chars().take(200).collect()
            },
        }),
    }
}

/// Whether `b` may be in a token68 (RFC 9110 11.2). Comparisons only, no table: a key's bytes
/// are all checked in one pass the compiler turns into vector code.
fn token68(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/' | b'=')
}

/// The token of `Authorization: Bearer <token>` (scheme case-insensitive), if well formed.
/// Read as bytes: a token is ASCII, so no UTF-8 check of the whole header, no `char` search.
/// The scheme is the header's first six bytes, then a space: where the first space must be.
fn bearer_token(header: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = header.split_at_checked(6)?;
    let token = rest.strip_prefix(b" ")?.trim_ascii();
    // Every byte is checked (no early exit): a branch-free loop is the fast one for a valid
    // key, the only kind worth being fast for.
    let valid = token.iter().fold(true, |ok, &b| ok & token68(b));
    (scheme.eq_ignore_ascii_case(b"bearer")
        && !token.is_empty()
        && token.len() <= MAX_TOKEN_LEN
        && valid)
        .then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keys::{key_entry_yaml, parse_keys};
    use std::collections::BTreeMap;

    const SERVER: &str = "drg_server_secret_aaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const WEB: &str = "drg_web_secret_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const OFF: &str = "drg_off_secret_cccccccccccccccccccccccccccccccc";

    fn store() -> KeyStore {
        let plans: BTreeMap<String, u64> = [("free".to_owned(), 100)].into();
        let yaml = format!(
            "keys:\n{}{}{}    disabled: true\n",
            key_entry_yaml("server", SERVER, "free", &[]),
            key_entry_yaml("web", WEB, "free", &["https://*.example.com".into()]),
            key_entry_yaml("off", OFF, "free", &[]),
        );
        parse_keys(&yaml, "keys.yaml", &plans).unwrap()
    }

    /// The time of the decisions (unix seconds).
    const NOW: i64 = 1_790_000_000;

    fn creds<'a>(
        auth: Option<&'a str>,
        origin: Option<&'a str>,
        referer: Option<&'a str>,
    ) -> Credentials<'a> {
        Credentials {
            authorization: auth.map(str::as_bytes),
            origin: origin.map(str::as_bytes),
            referer: referer.map(str::as_bytes),
        }
    }

    #[test]
    fn keys_are_required_well_formed_known_and_enabled() {
        let s = store();
        let auth =
            |h: &str| decide(&s, creds(Some(h), None, None), NOW).map(|p| p.key.id.to_string());
        assert_eq!(
            decide(&s, creds(None, None, None), NOW).unwrap_err(),
            Rejection::MissingKey
        );
        assert_eq!(auth(&format!("Bearer {SERVER}")), Ok("server".into()));
        assert_eq!(auth(&format!("bearer  {SERVER} ")), Ok("server".into()));
        for bad in [
            SERVER.to_owned(),
            format!("Basic {SERVER}"),
            "Bearer ".to_owned(),
            "Bearer drg_unknown".to_owned(),
            format!("Bearer {SERVER}x"),
            format!("Bearer {OFF}"),
            format!("Bearer {}", "a".repeat(300)),
            "Bearer a\"b".to_owned(),
        ] {
            assert_eq!(auth(&bad), Err(Rejection::InvalidKey), "{bad}");
        }
    }

    #[test]
    fn origins_are_checked_for_browser_keys_only() {
        let s = store();
        let web = format!("Bearer {WEB}");
        let ok = decide(
            &s,
            creds(Some(&web), Some("https://app.example.com"), None),
            NOW,
        )
        .unwrap();
        assert_eq!(
            ok.allowed_origin.as_deref(),
            Some("https://app.example.com")
        );
        let via_referer = decide(
            &s,
            creds(Some(&web), None, Some("https://a.example.com/signup")),
            NOW,
        )
        .unwrap();
        assert_eq!(
            via_referer.allowed_origin.as_deref(),
            Some("https://a.example.com")
        );
        for (origin, referer, shown) in [
            (Some("https://evil.example"), None, "https://evil.example"),
            (Some("null"), Some("https://a.example.com/"), "null"),
            (None, None, "(none)"),
            (Some("https://example.com"), None, "https://example.com"),
        ] {
            assert_eq!(
                decide(&s, creds(Some(&web), origin, referer), NOW).unwrap_err(),
                Rejection::Forbidden {
                    origin: shown.into()
                }
            );
        }
        let server = format!("Bearer {SERVER}");
        let any = decide(
            &s,
            creds(Some(&server), Some("https://evil.example"), None),
            NOW,
        )
        .unwrap();
        assert_eq!(any.allowed_origin, None);
    }

    #[test]
    fn a_key_is_refused_from_the_second_it_expires_whatever_its_origin() {
        let mut s = store();
        let mut web = (**s.find(WEB).unwrap()).clone();
        web.expires_at = Some(NOW);
        let mut server = (**s.find(SERVER).unwrap()).clone();
        server.expires_at = Some(NOW + 1);
        let mut fresh = KeyStore::default();
        fresh.insert(web);
        fresh.insert(server);
        fresh.index_projects();
        s = fresh;
        let server = format!("Bearer {SERVER}");
        let at = |now| decide(&s, creds(Some(&server), None, None), now).map(|p| p.key.id.clone());
        assert_eq!(
            at(NOW).unwrap().as_ref(),
            "server",
            "a second before it expires"
        );
        assert_eq!(at(NOW + 1).unwrap_err(), Rejection::Expired { at: NOW + 1 });
        assert_eq!(
            at(NOW + 1_000).unwrap_err(),
            Rejection::Expired { at: NOW + 1 }
        );
        // Expired is said before the origin is judged: also from an origin it never had.
        let web = format!("Bearer {WEB}");
        for origin in ["https://app.example.com", "https://evil.example"] {
            assert_eq!(
                decide(&s, creds(Some(&web), Some(origin), None), NOW).unwrap_err(),
                Rejection::Expired { at: NOW }
            );
        }
        // An unknown secret stays unknown: nothing about any expiry.
        assert_eq!(
            decide(&s, creds(Some("Bearer drg_unknown"), None, None), NOW + 5).unwrap_err(),
            Rejection::InvalidKey
        );
    }

    #[test]
    fn a_remembered_token_is_decided_on_each_requests_snapshot() {
        let memo = TokenMemo::default();
        let s = store();
        let server = format!("Bearer {SERVER}");
        let web = format!("Bearer {WEB}");
        let off = format!("Bearer {OFF}");
        let remembering = |keys: &KeyStore, auth: &str, origin: Option<&'static str>, now| {
            decide_remembering(
                keys,
                Some(&memo),
                Some(auth.as_bytes()),
                || now,
                || (origin.map(str::as_bytes), None),
            )
        };
        // The same answers as without the memo, token after token on one connection.
        for (auth, origin) in [
            (&server, None),
            (&server, None),
            (&web, Some("https://app.example.com")),
            (&web, Some("https://evil.example")),
            (&off, None),
            (&server, None),
        ] {
            assert_eq!(
                remembering(&s, auth, origin, NOW).map(|p| p.key.id.clone()),
                decide_lazily(&s, Some(auth.as_bytes()), NOW, || (
                    origin.map(str::as_bytes),
                    None
                ))
                .map(|p| p.key.id.clone()),
                "{auth} {origin:?}"
            );
        }
        // The key gone from a newer snapshot (revoked), then expired in another: the token
        // remembered is refused as a fresh one would be.
        assert_eq!(
            remembering(&KeyStore::default(), &server, None, NOW).unwrap_err(),
            Rejection::InvalidKey
        );
        let mut expiring = (**s.find(SERVER).unwrap()).clone();
        expiring.expires_at = Some(NOW);
        let mut later = KeyStore::default();
        later.insert(expiring);
        later.index_projects();
        assert_eq!(
            remembering(&later, &server, None, NOW).unwrap_err(),
            Rejection::Expired { at: NOW }
        );
        assert!(remembering(&later, &server, None, NOW - 1).is_ok());
    }

    /// The reading before it went byte-wise: the header as UTF-8, split at its first space, the
    /// token trimmed of whitespace.
    fn bearer_token_as_str(header: &[u8]) -> Option<&str> {
        let header = std::str::from_utf8(header).ok()?;
        let (scheme, token) = header.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let token = token.trim();
        let token68 = |b: u8| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b);
        (!token.is_empty() && token.len() <= MAX_TOKEN_LEN && token.bytes().all(token68))
            .then_some(token)
    }

    proptest::proptest! {
        /// The byte-wise reading takes exactly the tokens the `str` one did. (Only a token
        /// padded with non-ASCII or vertical-tab "whitespace", which `str::trim` dropped, is
        /// refused now: no client sends one, and it is no valid token.)
        #[test]
        fn bearer_tokens_read_as_before(
            h in "(Bearer|bearer|BEARER|Basic|Bearer\\.)?( |\t){0,2}[A-Za-z0-9._~+/=\"\\- ]{0,40}( |\t|\r){0,2}"
        ) {
            proptest::prop_assert_eq!(
                bearer_token(h.as_bytes()),
                bearer_token_as_str(h.as_bytes()).map(str::as_bytes)
            );
        }

        #[test]
        fn bearer_token_bytes_never_widen(
            scheme in "(Bearer|bearer)? ?",
            rest in proptest::collection::vec(proptest::num::u8::ANY, 0..60),
        ) {
            let h = [scheme.as_bytes(), &rest].concat();
            if let Some(t) = bearer_token(&h) {
                proptest::prop_assert_eq!(bearer_token_as_str(&h).map(str::as_bytes), Some(t));
            }
        }
    }
}
