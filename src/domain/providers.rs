//! Mail provider recognition: which company runs a domain's MX hosts, from `mx_providers.csv`.
//!
//! Pure: a table of patterns (a host suffix or a regex) with a human label and a kind, and a
//! lookup that labels a domain by its most preferred recognised MX host.

use super::mail::{MxHost, ProviderKind};
use super::sources::SourceError;

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

    fn describe(&self) -> String {
        match self {
            Pattern::Suffix(s) => format!("suffix {s}"),
            Pattern::Regex(r) => format!("regex {}", r.as_str()),
        }
    }
}

/// One provider row.
#[derive(Debug, Clone)]
pub struct Provider {
    pattern: Pattern,
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
    pub pattern: String,
}

/// All provider patterns, in file order (the first matching row wins for a host).
#[derive(Debug, Clone, Default)]
pub struct ProviderTable {
    providers: Vec<Provider>,
}

/// The header `mx_providers.csv` starts with.
pub const PROVIDERS_HEADER: &str = "match,pattern,label,kind";

impl ProviderTable {
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
                pattern,
                label: label.into(),
                kind,
            });
        }
        Ok(ProviderTable { providers })
    }

    pub fn len(&self) -> usize {
        self.providers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.providers.is_empty()
    }

    /// The provider of a single host.
    fn provider_of(&self, host: &str) -> Option<&Provider> {
        self.providers.iter().find(|p| p.pattern.matches(host))
    }

    /// The provider of the most preferred recognised MX host (lowest preference value).
    pub fn recognise(&self, hosts: &[MxHost]) -> Option<ProviderMatch<'_>> {
        let mut sorted: Vec<&MxHost> = hosts.iter().collect();
        sorted.sort_by_key(|h| h.preference);
        sorted.into_iter().find_map(|h| {
            self.provider_of(&h.host).map(|p| ProviderMatch {
                label: &p.label,
                kind: p.kind,
                host: h.host.to_string(),
                pattern: p.pattern.describe(),
            })
        })
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
