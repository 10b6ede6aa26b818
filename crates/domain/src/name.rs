//! `DomainName`: a hostname parsed and normalised to its canonical ASCII form.
//!
//! Canonical means: UTS-46 mapped (case folded, Unicode as punycode A-labels), one trailing dot
//! removed, and checked against the hostname rules of the API contract. Every rejection says why,
//! because the reason is returned to the caller as the `detail` of a `422`.

use std::fmt;

/// Longest hostname in presentation form (RFC 1035 255 octets on the wire).
pub const MAX_NAME_LEN: usize = 253;
/// Longest label (RFC 1035).
pub const MAX_LABEL_LEN: usize = 63;

/// A hostname in canonical form: lowercase ASCII, punycode for IDN, no trailing dot.
///
/// Equality, order and hash are the name's: the registrable domain's position is a function of
/// it, found once when the name is made.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainName {
    name: Box<str>,
    /// Where the registrable domain starts in `name`, or [`NO_REGISTRABLE`]. A lookup asks for it
    /// several times (the table, the MX neighbourhood, the domain's age, the live top-domains),
    /// and the public suffix search was the costliest part of each: ~2.8 searches a request of
    /// the realistic mix, now one.
    registrable_at: u8,
}

/// `registrable_at` of a name that is itself a public suffix (names are at most 253 bytes, so
/// no offset reaches it).
const NO_REGISTRABLE: u8 = u8::MAX;

/// Why a string is not a hostname. The `Display` text is the `detail` of the `422` answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("domain is empty")]
    Empty,
    #[error("domain contains '@': send email addresses to /v1/check")]
    ContainsAt,
    #[error("domain is not a valid internationalised name (UTS-46)")]
    Idna,
    #[error("domain is {len} characters long; the maximum is {MAX_NAME_LEN}")]
    TooLong { len: usize },
    #[error("domain has an empty label")]
    EmptyLabel,
    #[error("label '{label}' is {len} characters long; the maximum is {MAX_LABEL_LEN}")]
    LabelTooLong { label: String, len: usize },
    #[error("domain contains {ch:?}: only letters, digits, hyphens and dots are allowed")]
    InvalidChar { ch: char },
    #[error("label '{label}' starts or ends with a hyphen")]
    HyphenEdge { label: String },
    #[error("domain has a single label; a registrable name such as example.com is expected")]
    SingleLabel,
    #[error("top-level label '{tld}' is numeric: IP addresses are not domains")]
    NumericTld { tld: String },
    /// Only from [`DomainName::parse_owned`]: a name many owners' domains sit under.
    #[error("'{name}' is a public suffix: it names many owners' domains, not one; name a domain under it")]
    PublicSuffix { name: String },
}

impl DomainName {
    /// Parses user input (ASCII or Unicode) into the canonical form.
    pub fn parse(input: &str) -> Result<Self, NameError> {
        // Already canonical and valid (most names sent): UTS-46 would give it back unchanged.
        let bare = input.strip_suffix('.').unwrap_or(input);
        if is_plain_and_valid(bare.as_bytes()) {
            return Ok(DomainName::new(bare.into()));
        }
        Self::parse_mapped(input)
    }

    /// Parses a name one owner holds: as [`parse`](Self::parse), and not a public suffix
    /// (`co.uk`, `github.io`), which no project may override or report for everyone under it.
    pub fn parse_owned(input: &str) -> Result<Self, NameError> {
        let name = Self::parse(input)?;
        match name.registrable() {
            Some(_) => Ok(name),
            None => Err(NameError::PublicSuffix {
                name: name.as_str().to_owned(),
            }),
        }
    }

    /// The canonical form of `input`, as [`parse`](Self::parse) makes it, borrowed from the input
    /// when it is already canonical (most list lines): no allocation a name for lists of millions.
    pub fn canonical(input: &str) -> Result<std::borrow::Cow<'_, str>, NameError> {
        let bare = input.strip_suffix('.').unwrap_or(input);
        if is_plain_and_valid(bare.as_bytes()) {
            return Ok(std::borrow::Cow::Borrowed(bare));
        }
        Self::parse_mapped(input).map(|name| std::borrow::Cow::Owned(name.name.into_string()))
    }

    /// [`parse`](Self::parse) through the UTS-46 mapping, whatever the input.
    fn parse_mapped(input: &str) -> Result<Self, NameError> {
        if input.contains('@') {
            return Err(NameError::ContainsAt);
        }
        if input.is_empty() {
            return Err(NameError::Empty);
        }
        if let Some(ch) = input.chars().find(|c| c.is_control() || c.is_whitespace()) {
            return Err(NameError::InvalidChar { ch });
        }
        let ascii = idna::domain_to_ascii_cow(input.as_bytes(), idna::AsciiDenyList::EMPTY)
            .map_err(|_| NameError::Idna)?;
        let name = ascii.strip_suffix('.').unwrap_or(&ascii);
        validate_ascii(name)?;
        Ok(DomainName::new(name.into()))
    }

    /// A canonical, validated `name` with its registrable domain found.
    fn new(name: Box<str>) -> Self {
        // Only the registrable part's length is needed: `psl::domain_str` would check its
        // bytes as UTF-8 again (~80 instructions a lookup) for a name checked already.
        let registrable_at = psl::domain(name.as_bytes())
            // At most 253 bytes in: never NO_REGISTRABLE.
            .and_then(|r| u8::try_from(name.len() - r.trim().as_bytes().len()).ok())
            .unwrap_or(NO_REGISTRABLE);
        DomainName {
            name,
            registrable_at,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The name as a boxed string, without copying it.
    pub fn into_boxed_str(self) -> Box<str> {
        self.name
    }

    /// The name and each parent, most specific first: `a.b.c` -> `a.b.c`, `b.c`, `c`.
    pub fn suffixes(&self) -> impl Iterator<Item = &str> {
        let s = self.as_str();
        std::iter::once(s).chain(memchr::memchr_iter(b'.', s.as_bytes()).map(move |i| &s[i + 1..]))
    }

    /// The registrable domain (public suffix plus one label), if the name has one.
    ///
    /// `None` for names that are themselves public suffixes, such as `co.uk`.
    pub fn registrable(&self) -> Option<&str> {
        (self.registrable_at != NO_REGISTRABLE)
            .then(|| &self.name[usize::from(self.registrable_at)..])
    }
}

/// Only lowercase ASCII letters, digits, hyphens and dots, and no A-label (`xn--`, whose
/// punycode UTS-46 checks): what the mapping leaves as it is.
#[cfg(test)]
fn is_plain(name: &str) -> bool {
    let bytes = name.as_bytes();
    bytes
        .iter()
        .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !bytes.starts_with(b"xn--")
        && memchr::memmem::find(bytes, b".xn--").is_none()
}

/// `is_plain(name) && validate_ascii(name).is_ok()` in one pass over the bytes (the lookup
/// path's shortcut; a property test holds it to that expression): no UTF-8 decoding, no
/// substring search, no error built for a name the mapping then parses anyway.
fn is_plain_and_valid(name: &[u8]) -> bool {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return false;
    }
    let mut labels = 0;
    let mut numeric_tld = false;
    for label in name.split(|&b| b == b'.') {
        let (Some(&first), Some(&last)) = (label.first(), label.last()) else {
            return false;
        };
        if label.len() > MAX_LABEL_LEN
            || first == b'-'
            || last == b'-'
            || label.starts_with(b"xn--")
            || !label
                .iter()
                .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return false;
        }
        labels += 1;
        numeric_tld = label.iter().all(u8::is_ascii_digit);
    }
    labels >= 2 && !numeric_tld
}

fn validate_ascii(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong { len: name.len() });
    }
    let mut labels = 0;
    for label in name.split('.') {
        labels += 1;
        if label.is_empty() {
            return Err(NameError::EmptyLabel);
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(NameError::LabelTooLong {
                label: label.to_owned(),
                len: label.len(),
            });
        }
        if let Some(ch) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
        {
            return Err(NameError::InvalidChar { ch });
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(NameError::HyphenEdge {
                label: label.to_owned(),
            });
        }
    }
    if labels < 2 {
        return Err(NameError::SingleLabel);
    }
    let tld = name.rsplit('.').next().unwrap_or(name);
    if tld.bytes().all(|b| b.is_ascii_digit()) {
        return Err(NameError::NumericTld {
            tld: tld.to_owned(),
        });
    }
    Ok(())
}

impl fmt::Display for DomainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl fmt::Debug for DomainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DomainName({})", self.name)
    }
}

impl AsRef<str> for DomainName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(s: &str) -> String {
        DomainName::parse(s).unwrap().as_str().to_owned()
    }

    #[test]
    fn plain_names_take_the_shortcut_only_when_the_mapping_would_keep_them() {
        for s in [
            "d4242.com",
            "a-b.example",
            "xn--bcher-kva.example",
            "a.xn--bcher-kva",
            "xn--a.com",
            "ab--cd.com",
            "a..b",
            "-a.com",
            "a.com.",
            "a.com..",
            "123.456",
            "com",
            "",
            ".",
        ] {
            assert_eq!(DomainName::parse(s), DomainName::parse_mapped(s), "{s}");
        }
    }

    #[test]
    fn the_shortcut_stops_at_the_length_limits() {
        let name = |lens: &[usize]| {
            let labels: Vec<String> = lens.iter().map(|&n| "a".repeat(n)).collect();
            labels.join(".")
        };
        for (lens, valid) in [
            (&[63, 63, 63, 61][..], true),
            (&[63, 63, 63, 62], false),
            (&[63, 3], true),
            (&[64, 3], false),
        ] {
            let s = name(lens);
            assert_eq!(is_plain_and_valid(s.as_bytes()), valid, "{lens:?}");
            assert_eq!(
                is_plain(&s) && validate_ascii(&s).is_ok(),
                valid,
                "{lens:?}"
            );
        }
    }

    #[test]
    fn normalises_case_trailing_dot_and_idn() {
        assert_eq!(ok("Example.COM"), "example.com");
        assert_eq!(ok("example.com."), "example.com");
        assert_eq!(ok("bücher.de"), "xn--bcher-kva.de");
        assert_eq!(ok("BÜCHER.DE"), "xn--bcher-kva.de");
        assert_eq!(ok("xn--bcher-kva.de"), "xn--bcher-kva.de");
        assert_eq!(ok("例え.テスト"), "xn--r8jz45g.xn--zckzah");
        // Ideographic full stop is a label separator under UTS-46.
        assert_eq!(ok("mailinator。com"), "mailinator.com");
    }

    #[test]
    fn rejects_with_a_reason() {
        use NameError::*;
        let err = |s: &str| DomainName::parse(s).unwrap_err();
        assert_eq!(err(""), Empty);
        assert_eq!(err("."), Empty);
        assert_eq!(err("user@example.com"), ContainsAt);
        assert_eq!(err("localhost"), SingleLabel);
        assert_eq!(err("a..com"), EmptyLabel);
        assert_eq!(err("example.com.."), EmptyLabel);
        assert_eq!(err("-a.com"), HyphenEdge { label: "-a".into() });
        assert_eq!(err("a-.com"), HyphenEdge { label: "a-".into() });
        assert_eq!(err("a_b.com"), InvalidChar { ch: '_' });
        assert_eq!(err("a b.com"), InvalidChar { ch: ' ' });
        assert_eq!(err("192.168.0.1"), NumericTld { tld: "1".into() });
        assert!(matches!(
            err(&format!("{}.com", "a".repeat(64))),
            LabelTooLong { len: 64, .. }
        ));
        let long = format!("{}.com", vec!["a".repeat(60); 5].join("."));
        assert!(matches!(err(&long), TooLong { .. }));
        assert_eq!(err("xn--a.com"), Idna);
    }

    #[test]
    fn an_owned_name_is_not_a_public_suffix() {
        for suffix in ["co.uk", "github.io", "CO.UK."] {
            assert!(
                matches!(
                    DomainName::parse_owned(suffix),
                    Err(NameError::PublicSuffix { .. })
                ),
                "{suffix}"
            );
        }
        for owned in [
            "example.co.uk",
            "me.github.io",
            "example.com",
            "a.b.example.com",
        ] {
            assert!(DomainName::parse_owned(owned).is_ok(), "{owned}");
        }
    }

    #[test]
    fn details_are_human_sentences() {
        let e = DomainName::parse("a_b.com").unwrap_err();
        assert_eq!(
            e.to_string(),
            "domain contains '_': only letters, digits, hyphens and dots are allowed"
        );
    }

    #[test]
    fn suffixes_and_registrable() {
        let d = DomainName::parse("x.y.mailinator.com").unwrap();
        let s: Vec<_> = d.suffixes().collect();
        assert_eq!(
            s,
            [
                "x.y.mailinator.com",
                "y.mailinator.com",
                "mailinator.com",
                "com"
            ]
        );
        assert_eq!(d.registrable(), Some("mailinator.com"));
        assert_eq!(DomainName::parse("co.uk").unwrap().registrable(), None);
        assert_eq!(
            DomainName::parse("a.b.co.uk").unwrap().registrable(),
            Some("b.co.uk")
        );
    }

    proptest! {
        /// The shortcut for canonical names agrees with the mapping on everything it takes,
        /// refusals and their reasons included.
        #[test]
        fn plain_names_parse_as_the_mapping_does(
            s in "(xn--|[a-z0-9]|-|\\.|--){0,40}\\.?"
        ) {
            prop_assert_eq!(DomainName::parse(&s), DomainName::parse_mapped(&s));
        }

        /// The registrable domain found at parse is the public suffix list's, on names with
        /// and without one (suffixes of several labels, wildcards, unlisted top labels).
        #[test]
        fn the_registrable_domain_is_the_lists(
            labels in proptest::collection::vec("[a-z0-9]{1,3}|www|co|uk|com|jp|kawasaki|ck|github|io|s3|amazonaws|blogspot|zz", 1..6)
        ) {
            let s = labels.join(".");
            if let Ok(name) = DomainName::parse(&s) {
                prop_assert_eq!(name.registrable(), psl::domain_str(name.as_str()), "{}", s);
            }
        }

        /// The one-pass shortcut is exactly "plain and valid", on names near every edge: label
        /// and name lengths, hyphens, A-labels, numeric top labels, letters it must refuse.
        #[test]
        fn the_shortcut_is_plain_and_valid(
            labels in proptest::collection::vec(
                prop_oneof![
                    "[a-z0-9]{1,3}",
                    "[0-9]{1,3}",
                    "[a-z][a-z0-9-]{0,4}[a-z0-9]",
                    "[a-z]{60,66}",
                    "xn--[a-z]{1,4}",
                    "-[a-z]{1,2}",
                    "[a-z]{1,2}-",
                    "[a-zA-Z_\u{e9}]{1,3}",
                    "",
                ],
                1..6,
            )
        ) {
            let s = labels.join(".");
            prop_assert_eq!(
                is_plain_and_valid(s.as_bytes()),
                is_plain(&s) && validate_ascii(&s).is_ok(),
                "{}", s
            );
        }

        #[test]
        fn parse_never_panics(s in "\\PC{0,300}") {
            let _ = DomainName::parse(&s);
        }

        #[test]
        fn hostname_like_inputs_are_canonical_and_bounded(
            s in "[a-zA-Z0-9\u{e0}-\u{ff}\u{4e00}-\u{4e10}.-]{1,270}"
        ) {
            if let Ok(d) = DomainName::parse(&s) {
                prop_assert!(d.as_str().len() <= MAX_NAME_LEN);
                let again = DomainName::parse(d.as_str()).unwrap();
                prop_assert_eq!(again.as_str(), d.as_str());
                prop_assert!(d.as_str().bytes().all(|b| b.is_ascii_lowercase()
                    || b.is_ascii_digit() || b == b'.' || b == b'-'));
            }
        }
    }
}
