//! Mail provider recognition: which company runs a domain's MX hosts, from `mx_providers.csv`.
//!
//! Pure: a table of patterns (a host suffix or a regex) with a human label and a kind, and a
//! survey of a domain's MX hosts: the provider that labels it (its most preferred recognised
//! host), whether its most preferred hosts are at a business provider, and whether any host
//! belongs to a service that throwaway addresses use.

use std::collections::HashMap;

use super::error::SourceError;
use super::mail::{MxHost, ProviderKind};
use ProviderKind::{Consumer, Disposable, Forwarder, Mailbox, SecurityGateway};

#[derive(Debug, Clone)]
enum Pattern {
    /// The host itself or any host under it (`google.com` matches `aspmx.l.google.com`).
    Suffix(Box<str>),
    Regex(regex::Regex),
}

impl Pattern {
    fn matches(&self, host: &str) -> bool {
        match self {
            Pattern::Suffix(s) => {
                host == &**s
                    || (host.len() > s.len()
                        && host.ends_with(&**s)
                        && host.as_bytes()[host.len() - s.len() - 1] == b'.')
            }
            Pattern::Regex(r) => r.is_match(host),
        }
    }

    fn describe(&self) -> Box<str> {
        match self {
            Pattern::Suffix(s) => format!("suffix {s}").into(),
            Pattern::Regex(r) => format!("regex {}", r.as_str()).into(),
        }
    }
}

/// One provider row.
#[derive(Debug, Clone)]
pub struct Provider {
    pattern: Pattern,
    /// `pattern` in words, made once so that a match costs no formatting.
    described: Box<str>,
    pub label: Box<str>,
    pub kind: ProviderKind,
}

/// A recognised MX host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderMatch<'p> {
    pub label: &'p str,
    pub kind: ProviderKind,
    /// The MX host that matched.
    pub host: String,
    /// The pattern that matched it, for `lookup`.
    pub pattern: &'p str,
}

/// What a domain's MX hosts say, from one pass over them (see [`ProviderTable::survey`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MxSurvey<'p> {
    /// The provider of the most preferred recognised host: it labels the domain.
    pub provider: Option<ProviderMatch<'p>>,
    /// Every host at the lowest preference value (where mail goes first) is at a business
    /// mailbox provider or a security gateway.
    pub primary_business: bool,
    /// The kind of the most preferred host, at any preference, that is at a disposable,
    /// forwarding or consumer service (mail may end up there).
    pub risky: Option<ProviderKind>,
}

/// All provider patterns, in file order (the first matching row wins for a host).
#[derive(Debug, Clone, Default)]
pub struct ProviderTable {
    providers: Vec<Provider>,
    /// The first row of each suffix pattern: a host is matched with one lookup for each of its
    /// label boundaries, not a scan of every row (a survey ran ~50 comparisons a host).
    suffixes: HashMap<Box<str>, usize, foldhash::fast::RandomState>,
    /// The rows of the regex patterns, in file order.
    regexes: Vec<usize>,
}

/// The header `mx_providers.csv` starts with.
pub const PROVIDERS_HEADER: &str = "match,pattern,label,kind";

impl ProviderTable {
    /// Feeds every row (pattern, label, kind) to `h`, for the table's content hash.
    pub fn fingerprint(&self, h: &mut impl std::hash::Hasher) {
        use std::hash::Hash;
        for p in &self.providers {
            p.described.hash(h);
            p.label.hash(h);
            (p.kind as u8).hash(h);
        }
    }

    /// Parses `mx_providers.csv`: `match,pattern,label,kind` with `match` `suffix` or `regex`.
    pub fn parse(text: &str, origin: &str) -> Result<Self, SourceError> {
        let mut reader = csv::ReaderBuilder::new()
            .comment(Some(b'#'))
            .trim(csv::Trim::All)
            .from_reader(text.as_bytes());
        let header: Vec<String> = reader
            .headers()
            .map_err(|e| SourceError::new(origin, 1, format!("unreadable header: {e}")))?
            .iter()
            .map(str::to_owned)
            .collect();
        if header.join(",") != PROVIDERS_HEADER {
            return Err(SourceError::new(
                origin,
                1,
                format!(
                    "header is '{}'; expected '{PROVIDERS_HEADER}'",
                    header.join(",")
                ),
            ));
        }
        let mut providers = Vec::new();
        let mut row = csv::StringRecord::new();
        loop {
            let more = reader.read_record(&mut row).map_err(|e| {
                let line = e.position().map_or(0, |p| p.line() as usize);
                SourceError::new(origin, line, e.to_string())
            })?;
            if !more {
                break;
            }
            let line = row.position().map_or(0, |p| p.line() as usize);
            let fail = |m: String| SourceError::new(origin, line, m);
            let (how, pattern, label, kind) = (&row[0], &row[1], &row[2], &row[3]);
            let pattern = match how {
                "suffix" => {
                    Pattern::Suffix(pattern.trim_start_matches('.').to_ascii_lowercase().into())
                }
                "regex" => Pattern::Regex(
                    regex::Regex::new(pattern).map_err(|e| fail(format!("bad regex: {e}")))?,
                ),
                other => return Err(fail(format!("match '{other}' is neither suffix nor regex"))),
            };
            let kind = ProviderKind::parse(kind).ok_or_else(|| {
                fail(format!(
                    "kind '{kind}' is not mailbox, security_gateway, consumer, forwarder or disposable"
                ))
            })?;
            if label.is_empty() {
                return Err(fail("label is empty".into()));
            }
            providers.push(Provider {
                described: pattern.describe(),
                pattern,
                label: label.into(),
                kind,
            });
        }
        Ok(ProviderTable::indexed(providers))
    }

    /// The table of `providers` (in file order) with its suffix and regex indexes.
    fn indexed(providers: Vec<Provider>) -> Self {
        let mut suffixes = HashMap::with_hasher(foldhash::fast::RandomState::default());
        let mut regexes = Vec::new();
        for (row, p) in providers.iter().enumerate() {
            match &p.pattern {
                Pattern::Suffix(s) => {
                    suffixes.entry(s.clone()).or_insert(row);
                }
                Pattern::Regex(_) => regexes.push(row),
            }
        }
        ProviderTable {
            providers,
            suffixes,
            regexes,
        }
    }

    pub fn len(&self) -> usize {
        self.providers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.providers.is_empty()
    }

    /// The provider of a single host.
    fn provider_of(&self, host: &str) -> Option<&Provider> {
        // The earliest suffix row among the host and each name after one of its dots...
        let mut best: Option<usize> = None;
        let mut rest = host;
        loop {
            if let Some(&row) = self.suffixes.get(rest) {
                best = Some(best.map_or(row, |b| b.min(row)));
            }
            // A byte search: `str::find` with a `char` ran its generic searcher (~25
            // instructions a dot, a survey of a company's MX hosts asks a dozen).
            match memchr::memchr(b'.', rest.as_bytes()) {
                Some(dot) => rest = &rest[dot + 1..],
                None => break,
            }
        }
        // ...unless a regex row above it matches.
        let limit = best.unwrap_or(usize::MAX);
        self.regexes
            .iter()
            .copied()
            .take_while(|&row| row < limit)
            .find(|&row| self.providers[row].pattern.matches(host))
            .or(best)
            .map(|row| &self.providers[row])
    }

    /// The kind of service that runs `host`, if a row recognises it.
    pub fn kind_of(&self, host: &str) -> Option<ProviderKind> {
        self.provider_of(host).map(|p| p.kind)
    }

    /// The provider of the most preferred recognised MX host (lowest preference value).
    pub fn recognise(&self, hosts: &[MxHost]) -> Option<ProviderMatch<'_>> {
        self.survey(hosts).provider
    }

    /// One pass over `hosts` in preference order (ties in the order given). It stops once the
    /// most preferred hosts are all at business providers, since nothing further can change
    /// the verdict; it allocates nothing beyond the match when `hosts` come sorted, as the
    /// resolver stores them.
    pub fn survey(&self, hosts: &[MxHost]) -> MxSurvey<'_> {
        let mut out = MxSurvey::default();
        let Some(lowest) = hosts.iter().map(|h| h.preference).min() else {
            return out;
        };
        out.primary_business = true;
        let mut visit = |h: &MxHost| {
            if h.preference > lowest && out.primary_business {
                return false;
            }
            let provider = self.provider_of(&h.host);
            let kind = provider.map(|p| p.kind);
            if h.preference == lowest && !matches!(kind, Some(Mailbox | SecurityGateway)) {
                out.primary_business = false;
            }
            if out.risky.is_none() && matches!(kind, Some(Disposable | Forwarder | Consumer)) {
                out.risky = kind;
            }
            if let (None, Some(p)) = (&out.provider, provider) {
                out.provider = Some(ProviderMatch {
                    label: &p.label,
                    kind: p.kind,
                    // Not `to_string`: through `Display` it formats (padding and all).
                    host: String::from(&*h.host),
                    pattern: &p.described,
                });
            }
            true
        };
        if hosts.is_sorted_by_key(|h| h.preference) {
            for h in hosts {
                if !visit(h) {
                    break;
                }
            }
        } else {
            let mut sorted: Vec<&MxHost> = hosts.iter().collect();
            sorted.sort_by_key(|h| h.preference);
            for h in sorted {
                if !visit(h) {
                    break;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &[(u16, &str)]) -> Vec<MxHost> {
        list.iter()
            .map(|(p, h)| MxHost {
                preference: *p,
                host: (*h).into(),
            })
            .collect()
    }

    const CSV: &str = "match,pattern,label,kind\n\
        # comment\n\
        suffix,mail.protection.outlook.com,Microsoft 365,mailbox\n\
        suffix,aspmx.l.google.com,Google Workspace,mailbox\n\
        regex,^mx[0-9]*\\.mailinator\\.com$,Mailinator,disposable\n\
        suffix,pphosted.com,Proofpoint,security_gateway\n";

    #[test]
    fn the_most_preferred_recognised_host_wins() {
        let t = ProviderTable::parse(CSV, "mx_providers.csv").unwrap();
        assert_eq!(t.len(), 4);
        let m = t
            .recognise(&hosts(&[
                (20, "alt1.aspmx.l.google.com"),
                (10, "mx.own.example"),
                (5, "mx1.pphosted.com"),
            ]))
            .unwrap();
        assert_eq!(
            (m.label, m.kind),
            ("Proofpoint", ProviderKind::SecurityGateway)
        );
        let m = t
            .recognise(&hosts(&[(0, "corp-com.mail.protection.outlook.com")]))
            .unwrap();
        assert_eq!(m.label, "Microsoft 365");
        assert_eq!(
            t.recognise(&hosts(&[(1, "mx2.mailinator.com")]))
                .unwrap()
                .kind,
            ProviderKind::Disposable
        );
        assert!(t.recognise(&hosts(&[(1, "mx.own.example")])).is_none());
        // A suffix matches whole labels only.
        assert!(t.recognise(&hosts(&[(1, "evilpphosted.com")])).is_none());
    }

    #[test]
    fn the_first_matching_row_wins_as_in_a_scan_of_the_file() {
        const ROWS: &str = "match,pattern,label,kind\n\
            suffix,b.example.com,First,mailbox\n\
            regex,^mx[0-9]\\.a\\.example\\.com$,Second,disposable\n\
            suffix,example.com,Third,consumer\n\
            suffix,a.example.com,Fourth,forwarder\n\
            suffix,b.example.com,Fifth,forwarder\n\
            regex,^relay\\.,Sixth,forwarder\n";
        let t = ProviderTable::parse(ROWS, "p.csv").unwrap();
        let scan = |host: &str| {
            t.providers
                .iter()
                .find(|p| p.pattern.matches(host))
                .map(|p| &*p.label)
        };
        for (host, label) in [
            ("b.example.com", Some("First")),
            ("x.b.example.com", Some("First")),
            ("mx1.a.example.com", Some("Second")),
            ("mx.a.example.com", Some("Third")),
            ("a.example.com", Some("Third")),
            ("example.com", Some("Third")),
            ("relay.example.com", Some("Third")),
            ("relay.other.org", Some("Sixth")),
            ("xexample.com", None),
            ("example.com.evil", None),
            ("", None),
        ] {
            assert_eq!(t.kind_of(host).is_some(), label.is_some(), "{host}");
            assert_eq!(t.provider_of(host).map(|p| &*p.label), label, "{host}");
            assert_eq!(scan(host), label, "{host}");
        }
    }

    #[test]
    fn a_survey_sees_where_mail_goes_first_and_any_risky_host() {
        const RISKY: &str = "match,pattern,label,kind\n\
            suffix,aspmx.l.google.com,Google Workspace,mailbox\n\
            suffix,pphosted.com,Proofpoint,security_gateway\n\
            suffix,improvmx.com,ImprovMX,forwarder\n\
            suffix,gmail-smtp-in.l.google.com,Gmail,consumer\n";
        let t = ProviderTable::parse(RISKY, "p.csv").unwrap();
        let s = t.survey(&hosts(&[(1, "aspmx.l.google.com"), (5, "mx.own.example")]));
        assert!(s.primary_business);
        assert_eq!(s.provider.unwrap().pattern, "suffix aspmx.l.google.com");
        // Every host at the lowest preference must be a business's.
        let s = t.survey(&hosts(&[(1, "mx1.pphosted.com"), (1, "mx.own.example")]));
        assert!(!s.primary_business);
        assert_eq!(s.provider.unwrap().label, "Proofpoint");
        let s = t.survey(&hosts(&[(1, "mx1.pphosted.com"), (1, "mx2.pphosted.com")]));
        assert!(s.primary_business);
        // A recognised backup labels the domain without making it a business's; the first
        // risky host at any preference is reported, in whatever order the hosts come.
        let s = t.survey(&hosts(&[
            (30, "mx1.improvmx.com"),
            (20, "gmail-smtp-in.l.google.com"),
            (10, "mx.own.example"),
        ]));
        assert!(!s.primary_business);
        assert_eq!(s.provider.as_ref().unwrap().label, "Gmail");
        assert_eq!(s.risky, Some(ProviderKind::Consumer));
        assert_eq!(t.survey(&[]), MxSurvey::default());
        assert!(t
            .survey(&hosts(&[(1, "mx.own.example")]))
            .provider
            .is_none());
    }

    #[test]
    fn bad_rows_name_their_line() {
        for (text, needle) in [
            ("match,pattern,label\n", "header"),
            (
                "match,pattern,label,kind\nprefix,a,b,mailbox\n",
                "neither suffix nor regex",
            ),
            ("match,pattern,label,kind\nregex,(,b,mailbox\n", "bad regex"),
            (
                "match,pattern,label,kind\nsuffix,a.com,A,spam\n",
                "kind 'spam'",
            ),
        ] {
            let e = ProviderTable::parse(text, "p.csv").unwrap_err();
            assert!(e.to_string().contains(needle), "{e}");
            assert!(e.line >= 1);
        }
    }
}
