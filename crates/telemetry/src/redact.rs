//! Email addresses out of logs: finds `local@domain` in any text, percent-encoded (`%40`,
//! `%2540`, ...) or not, URL userinfo included, and masks the local part to its first two
//! characters (`jo****@example.com`).
//!
//! Every function is pure, linear in its input (no regex, no backtracking: each byte is looked
//! at a bounded number of times) and returns its input, unallocated, when a fast pre-check
//! ([`may_hold_address`]: `memchr` for `@`, `memmem` for `%40` and `%25`) finds nothing; nearly
//! every line stops there. The logger runs [`mask_emails`] over every line, ours and Pingora's;
//! the access log uses [`mask_address`] for the one-value target and [`mask_emails`] for the
//! free-text fields.

use std::borrow::Cow;

use memchr::memmem;

/// What replaces a local part after its kept characters.
const MASK: &str = "****";
/// Characters of a local part that stay visible (when it has more than this).
const KEPT_CHARS: usize = 2;
/// How far back a quoted local part (`"john doe"@example.com`) is looked for: RFC 5321 allows
/// 64 octets; twice that covers escapes.
const MAX_QUOTED_BYTES: usize = 128;

/// Whether `bytes` may hold an address, plain or percent-encoded. A `false` is certain; a `true`
/// only means the slower path must look.
pub fn may_hold_address(bytes: &[u8]) -> bool {
    memchr::memchr(b'@', bytes).is_some()
        || memmem::find(bytes, b"%40").is_some()
        || memmem::find(bytes, b"%25").is_some()
}

/// `text` with every address's local part masked (`see jo****@example.com`). Percent-encoded
/// `@` and `%` (`%40`, `%2540`, ...) are decoded first, and only those: decoding anything else
/// could put a line break or a control character in a log line. Free text: a local part ends
/// at whitespace, quotes, brackets and URL delimiters (`/ ? & =`), so `https://john@host`,
/// `email=john@host` and `"john doe"@host` all lose the name and keep the rest.
pub fn mask_emails(text: &str) -> Cow<'_, str> {
    if !may_hold_address(text.as_bytes()) {
        return Cow::Borrowed(text);
    }
    let decoded = decode_at_signs(text);
    match mask_decoded(&decoded) {
        Some(masked) => Cow::Owned(masked),
        None => decoded,
    }
}

/// A value that is one address (a path parameter, an email field): everything before its last
/// `@` (plain or percent-encoded) is the local part, whatever it contains, so `john doe@host`
/// keeps no more than `jo`. A value without `@` is returned as it is.
pub fn mask_address(value: &str) -> Cow<'_, str> {
    if !may_hold_address(value.as_bytes()) {
        return Cow::Borrowed(value);
    }
    let decoded = decode_at_signs(value);
    let Some((local, domain)) = decoded.rsplit_once('@') else {
        // Only `%25`s, no `@`: the value as received.
        return Cow::Borrowed(value);
    };
    if is_masked(local) {
        return decoded;
    }
    let mut out = String::with_capacity(KEPT_CHARS * 4 + MASK.len() + 1 + domain.len());
    push_masked(&mut out, local);
    out.push('@');
    out.push_str(domain);
    Cow::Owned(out)
}

/// `text` with `%25` and `%40` decoded at every depth (`%252540` is `@`) and nothing else
/// decoded: the result holds no byte the input did not, but `@` and `%`. One pass: a decoded `%`
/// is joined again with what follows it, so the nesting costs no extra round, and the result
/// holds no `%25` or `%40` (decoding it again changes nothing).
pub fn decode_at_signs(text: &str) -> Cow<'_, str> {
    let bytes = text.as_bytes();
    let Some(first) = memchr::memchr(b'%', bytes) else {
        return Cow::Borrowed(text);
    };
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
    out.extend_from_slice(&bytes[..first]);
    let mut changed = false;
    for &b in &bytes[first..] {
        out.push(b);
        // Only a `5` or a `0` can end `%25` or `%40`; a decoded `%` ends neither, so one look
        // at the tail after each byte is enough.
        let decoded = match out.as_slice() {
            [.., b'%', b'2', b'5'] => b'%',
            [.., b'%', b'4', b'0'] => b'@',
            _ => continue,
        };
        out.truncate(out.len() - 3);
        out.push(decoded);
        changed = true;
    }
    if !changed {
        return Cow::Borrowed(text);
    }
    // ASCII trigrams replaced by ASCII bytes: still UTF-8.
    match String::from_utf8(out) {
        Ok(s) => Cow::Owned(s),
        Err(e) => Cow::Owned(String::from_utf8_lossy(e.as_bytes()).into_owned()),
    }
}

/// Masks each `@`'s local part in text whose `@`s are decoded; `None` if there was none to mask.
fn mask_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out: Option<String> = None;
    // Bytes of `text` already in `out` (or, with `out` unset, up to which nothing changed).
    let mut copied = 0;
    for at in memchr::memchr_iter(b'@', bytes) {
        let start = local_start(bytes, copied, at);
        let local = &text[start..at];
        if local.is_empty() || is_masked(local) {
            continue;
        }
        let out = out.get_or_insert_with(|| String::with_capacity(text.len()));
        out.push_str(&text[copied..start]);
        push_masked(out, local);
        copied = at;
    }
    let mut out = out?;
    out.push_str(&text[copied..]);
    Some(out)
}

/// Where the local part before the `@` at `at` starts (at most back to `floor`): a quoted one
/// from its opening quote, else the run of local-part characters before `at`.
fn local_start(bytes: &[u8], floor: usize, at: usize) -> usize {
    if at > floor && bytes[at - 1] == b'"' {
        let from = floor.max(at.saturating_sub(MAX_QUOTED_BYTES));
        if let Some(open) = memchr::memrchr(b'"', &bytes[from..at - 1]) {
            return from + open;
        }
    }
    let mut start = at;
    while start > floor && is_local_byte(bytes[start - 1]) {
        start -= 1;
    }
    start
}

/// Bytes a local part is made of in free text: RFC 5322 `atext` but the characters that
/// delimit it in URLs and logs (`/ = ? & | { } ' \``), plus `:` (URL userinfo
/// `user:password@`) and any non-ASCII byte (internationalised addresses; a UTF-8 sequence is
/// all such bytes, so a run of them never ends inside a character).
fn is_local_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'.' | b'!' | b'#' | b'$' | b'%' | b'*' | b'+' | b'-' | b'^' | b'_' | b'~' | b':'
        )
        || b >= 0x80
}

/// Whether `local` is already a mask (`jo****`, `****`, or only stars, as in a Redis URL the
/// gateway logs as `redis://***@host`): masking is idempotent, so a line masked twice (by the
/// access log, then by the logger) reads the same.
fn is_masked(local: &str) -> bool {
    (!local.is_empty() && local.bytes().all(|b| b == b'*'))
        || local
            .strip_suffix(MASK)
            .is_some_and(|kept| kept.chars().count() <= KEPT_CHARS)
}

/// Appends the mask of `local`: its first [`KEPT_CHARS`] characters when it has more, then
/// [`MASK`]. A short local part shows nothing: two characters of three would be most of it.
fn push_masked(out: &mut String, local: &str) {
    if local.chars().nth(KEPT_CHARS).is_some() {
        let end = local
            .char_indices()
            .nth(KEPT_CHARS)
            .map_or(local.len(), |(i, _)| i);
        out.push_str(&local[..end]);
    }
    out.push_str(MASK);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plain_addresses_in_free_text() {
        let cases = [
            ("john.doe@example.com", "jo****@example.com"),
            (
                "GET /v1/check/john.doe@example.com, Host: gw",
                "GET /v1/check/jo****@example.com, Host: gw",
            ),
            ("to jo@example.com.", "to ****@example.com."),
            ("a@b and x.y.z@c", "****@b and x.****@c"),
            ("élodie@exemple.fr", "él****@exemple.fr"),
            ("\"john doe\"@example.com", "\"j****@example.com"),
            ("\\\"john.doe\\\"@x", "\\\"j****@x"),
            ("@example.com", "@example.com"),
            ("no address here", "no address here"),
        ];
        for (text, want) in cases {
            assert_eq!(mask_emails(text), want, "{text}");
        }
    }

    #[test]
    fn percent_encoded_at_signs_at_any_depth() {
        let deep = format!("john%{}40x", "25".repeat(100));
        let cases = [
            (
                "/v1/check/john.doe%40example.com",
                "/v1/check/jo****@example.com",
            ),
            (
                "/v1/check/john.doe%2540example.com",
                "/v1/check/jo****@example.com",
            ),
            ("john.doe%252540example.com", "jo****@example.com"),
            (
                "\"target\":\"john.doe%40example.com\"",
                "\"target\":\"jo****@example.com\"",
            ),
            ("john%2Edoe%40example.com", "jo****@example.com"),
            // Nothing but `%25` and `%40` is decoded: no new line from `%0A`.
            ("a%250Ab", "a%0Ab"),
            ("100%25 sure", "100% sure"),
            // Nesting deeper than any decoder would go is still decoded, in one pass.
            (deep.as_str(), "jo****@x"),
        ];
        for (text, want) in cases {
            assert_eq!(mask_emails(text), want, "{text}");
        }
    }

    #[test]
    fn url_userinfo_and_query_values() {
        let cases = [
            ("https://john.doe@example.com", "https://jo****@example.com"),
            (
                "Origin: https://john.doe@example.com",
                "Origin: https://jo****@example.com",
            ),
            (
                "https://john:secret@example.com/x",
                "https://jo****@example.com/x",
            ),
            (
                "/p?email=john.doe%40example.com&x=1",
                "/p?email=jo****@example.com&x=1",
            ),
            ("mailto:john@example.com", "ma****@example.com"),
        ];
        for (text, want) in cases {
            assert_eq!(mask_emails(text), want, "{text}");
        }
    }

    #[test]
    fn one_value_addresses_mask_everything_before_the_last_at() {
        let cases = [
            ("john.doe@example.com", "jo****@example.com"),
            ("john doe@example.com", "jo****@example.com"),
            ("jo@example.com", "****@example.com"),
            ("@example.com", "****@example.com"),
            ("\"a@b\"@example.com", "\"a****@example.com"),
            ("john%40example.com", "jo****@example.com"),
            ("john%2540example.com", "jo****@example.com"),
            ("example.com", "example.com"),
            ("a%25b", "a%25b"),
        ];
        for (value, want) in cases {
            assert_eq!(mask_address(value), want, "{value}");
        }
    }

    #[test]
    fn masks_are_left_alone_and_clean_text_is_not_copied() {
        for text in [
            "jo****@example.com",
            "****@example.com",
            "x: é****@a",
            "redis://***@10.0.0.1:6379",
        ] {
            assert_eq!(mask_emails(text), text);
        }
        assert!(matches!(mask_emails("plain line"), Cow::Borrowed(_)));
        assert!(matches!(mask_emails("only @ sign"), Cow::Borrowed(_)));
    }

    #[test]
    fn a_long_hostile_line_is_linear() {
        // Many `@`s, quotes and escapes: each is looked at a bounded number of times.
        let hostile = "\"a@".repeat(50_000) + &"%2525".repeat(50_000) + "@";
        let started = std::time::Instant::now();
        let masked = mask_emails(&hostile);
        assert!(!masked.contains("\"a@\"a@"));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    /// A local part of 3-20 characters, any the generator likes, `@` excluded.
    fn local_part() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9._+-]{3,20}"
    }

    proptest! {
        #[test]
        fn never_panics_and_is_idempotent(text in any::<String>()) {
            let once = mask_emails(&text).into_owned();
            prop_assert_eq!(mask_emails(&once), once.as_str());
            let value = mask_address(&text).into_owned();
            prop_assert_eq!(mask_address(&value), value.as_str());
        }

        #[test]
        fn an_address_anywhere_loses_its_local_part(
            before in "[ -~]{0,40}",
            local in local_part(),
            encoding in 0usize..4,
            after in "[ -~]{0,40}",
        ) {
            // A local part that happens to be in the rest of the text cannot be told apart.
            let rest = format!("{before} https://example.com/ {after}");
            prop_assume!(!rest.contains(&local));
            let at = ["@", "%40", "%2540", "%252540"][encoding];
            let text = format!("{before} {local}{at}example.com {after}");
            let masked = mask_emails(&text);
            prop_assert!(!masked.contains(&local), "{} -> {}", text, masked);
            let userinfo = format!("https://{local}{at}example.com/{after}");
            prop_assert!(!mask_emails(&userinfo).contains(&local));
            let value = format!("{local}{at}example.com");
            prop_assert!(!mask_address(&value).contains(&local));
        }
    }
}
