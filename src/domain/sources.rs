//! Parsers for the data formats operators already publish, feeding a [`TableBuilder`].
//!
//! - domain lists (`disposable.txt`, `allowlist.txt`, `free_providers.txt`, and the third-party
//!   lists under `data/community/`): one domain a line, `#` starts a comment, blank lines
//!   ignored: the format of the community disposable-email-domains lists, so such a file can be
//!   dropped in as it is;
//! - explicit records (`domains.csv`): a header line, then
//!   `domain,reason,risk_score[,mx_provider_label[,flag_weight]]`.
//!
//! Parsing is strict: a bad line fails the whole source with its line number, so a broken file
//! never half-replaces a good table.

use serde::Deserialize;

use super::error::SourceError;
use super::name::DomainName;
use super::record::{Reason, MAX_SCORE};
use super::table::{ExplicitRecord, ListKind, Origin, TableBuilder};

/// The source name of the `mailchecker` crate's list, in evidence.
pub const BUILTIN_SOURCE: &str = "builtin (mailchecker)";

/// Adds every domain of a list to `builder`; returns how many lines held a domain. `origin`
/// names the list in errors and in evidence.
pub fn add_domain_list(
    builder: &mut TableBuilder,
    text: &str,
    origin: &str,
    kind: ListKind,
) -> Result<usize, SourceError> {
    add_domain_list_named(builder, text, origin, origin, kind)
}

/// [`add_domain_list`], with the name evidence shows (`source`, e.g. a path relative to the
/// data folder or a URL) apart from the one errors show (`origin`, e.g. the full path).
pub fn add_domain_list_named(
    builder: &mut TableBuilder,
    text: &str,
    origin: &str,
    source: &str,
    kind: ListKind,
) -> Result<usize, SourceError> {
    let source = builder.source(source);
    // One pass to size the index: growing a million-name table rehashes and doubles memory.
    builder.reserve(text.bytes().filter(|b| *b == b'\n').count() + 1, text.len());
    let mut count = 0;
    for (index, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let name = DomainName::parse(line).map_err(|e| {
            SourceError::new(origin, index + 1, format!("'{line}' is not a domain: {e}"))
        })?;
        let line = u32::try_from(index + 1).unwrap_or(0);
        builder.add_from(&name, kind, Origin { source, line });
        count += 1;
    }
    Ok(count)
}

/// Adds a relay list (`relays.txt`): one domain a line, the service it belongs to in the
/// line's comment (`duck.com  # DuckDuckGo Email Protection`); returns how many names it held.
pub fn add_relay_list_named(
    builder: &mut TableBuilder,
    text: &str,
    origin: &str,
    source: &str,
) -> Result<usize, SourceError> {
    let source = builder.source(source);
    let mut count = 0;
    for (index, raw) in text.lines().enumerate() {
        let (line, comment) = raw.split_once('#').unwrap_or((raw, ""));
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let name = DomainName::parse(line).map_err(|e| {
            SourceError::new(origin, index + 1, format!("'{line}' is not a domain: {e}"))
        })?;
        let service = Some(comment.trim()).filter(|c| !c.is_empty());
        let line = u32::try_from(index + 1).unwrap_or(0);
        builder.add_relay(&name, service, Origin { source, line });
        count += 1;
    }
    Ok(count)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordRow {
    domain: String,
    reason: String,
    risk_score: i64,
    #[serde(default)]
    mx_provider_label: Option<String>,
    #[serde(default)]
    flag_weight: Option<u32>,
}

/// The header `domains.csv` must start with (the last two columns are optional).
pub const RECORDS_HEADER: &str = "domain,reason,risk_score,mx_provider_label,flag_weight";

/// Adds every row of a `domains.csv` to `builder`; returns how many records it held.
pub fn add_records(
    builder: &mut TableBuilder,
    text: &str,
    origin: &str,
) -> Result<usize, SourceError> {
    add_records_named(builder, text, origin, origin)
}

/// [`add_records`], with the name evidence shows apart from the one errors show (see
/// [`add_domain_list_named`]).
pub fn add_records_named(
    builder: &mut TableBuilder,
    text: &str,
    origin: &str,
    source: &str,
) -> Result<usize, SourceError> {
    let source = builder.source(source);
    let mut reader = csv::ReaderBuilder::new()
        .comment(Some(b'#'))
        .trim(csv::Trim::All)
        .flexible(true)
        .from_reader(text.as_bytes());
    let headers = reader
        .headers()
        .map_err(|e| SourceError::new(origin, 1, format!("unreadable header: {e}")))?
        .clone();
    let expected: Vec<&str> = RECORDS_HEADER.split(',').collect();
    let given: Vec<&str> = headers.iter().collect();
    if given.len() < 3 || given.len() > expected.len() || given != expected[..given.len()] {
        return Err(SourceError::new(
            origin,
            1,
            format!(
                "header is '{}'; expected '{RECORDS_HEADER}' (the last two columns optional)",
                given.join(",")
            ),
        ));
    }
    let mut count = 0;
    let mut raw = csv::StringRecord::new();
    let mut lines = LineCounter::new(text);
    loop {
        let more = reader.read_record(&mut raw).map_err(|e| {
            let line = e.position().map_or(0, |p| p.line() as usize);
            SourceError::new(origin, line, csv_message(&e))
        })?;
        if !more {
            break;
        }
        // The reader's own line count skips comment lines, and a record's start position is
        // that of the comments before it: count the file's lines up to the record's last byte.
        let line = lines.line_at((reader.position().byte() as usize).saturating_sub(1));
        let row: RecordRow = raw
            .deserialize(Some(&headers))
            .map_err(|e| SourceError::new(origin, line, csv_message(&e)))?;
        let fail = |msg: String| SourceError::new(origin, line, msg);
        let name = DomainName::parse(&row.domain)
            .map_err(|e| fail(format!("'{}' is not a domain: {e}", row.domain)))?;
        let reason: Reason = row.reason.parse().map_err(|e| fail(format!("{e}")))?;
        let risk_score = u8::try_from(row.risk_score)
            .ok()
            .filter(|s| *s <= MAX_SCORE)
            .ok_or_else(|| fail(format!("risk_score {} is outside 0..=100", row.risk_score)))?;
        let record = ExplicitRecord {
            reason,
            risk_score,
            mx_provider_label: row
                .mx_provider_label
                .filter(|l| !l.is_empty())
                .map(Into::into),
            flag_weight: row.flag_weight.unwrap_or(0),
        };
        let origin = Origin {
            source,
            line: u32::try_from(line).unwrap_or(0),
        };
        builder
            .add_record_from(&name, record, origin)
            .map_err(|e| fail(e.to_string()))?;
        count += 1;
    }
    Ok(count)
}

/// Line numbers of byte offsets met in increasing order, in one pass over the text.
struct LineCounter<'t> {
    text: &'t [u8],
    byte: usize,
    line: usize,
}

impl<'t> LineCounter<'t> {
    fn new(text: &'t str) -> Self {
        LineCounter {
            text: text.as_bytes(),
            byte: 0,
            line: 1,
        }
    }

    /// The line (from 1) of the byte at `offset`.
    fn line_at(&mut self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        if end > self.byte {
            self.line += self.text[self.byte..end]
                .iter()
                .filter(|b| **b == b'\n')
                .count();
            self.byte = end;
        }
        self.line
    }
}

fn csv_message(e: &csv::Error) -> String {
    match e.kind() {
        csv::ErrorKind::Deserialize { err, .. } => match err.field() {
            Some(field) => format!(
                "column '{}': {}",
                RECORDS_HEADER.split(',').nth(field as usize).unwrap_or("?"),
                err.kind()
            ),
            None => err.to_string(),
        },
        csv::ErrorKind::UnequalLengths { .. } => "wrong number of columns".to_owned(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::scores::Scores;
    use crate::domain::table::TableRule;

    fn n(s: &str) -> DomainName {
        DomainName::parse(s).unwrap()
    }

    #[test]
    fn lists_allow_comments_blank_lines_and_case() {
        let mut b = TableBuilder::new();
        let text = "# header\n\nMailinator.com  # inline\n  yopmail.com\r\n";
        assert_eq!(
            add_domain_list(&mut b, text, "disposable.txt", ListKind::Disposable),
            Ok(2)
        );
        let t = b.build(Scores::default());
        assert!(matches!(
            t.lookup(&n("mailinator.com")).rule,
            TableRule::Blocklist { .. }
        ));
        assert!(matches!(
            t.lookup(&n("yopmail.com")).rule,
            TableRule::Blocklist { .. }
        ));
    }

    #[test]
    fn a_bad_line_names_file_and_line() {
        let mut b = TableBuilder::new();
        let err = add_domain_list(
            &mut b,
            "ok.com\n404: not found\n",
            "free_providers.txt",
            ListKind::FreeProvider,
        )
        .unwrap_err();
        assert_eq!(err.line, 2);
        assert_eq!(err.origin, "free_providers.txt");
        assert!(err
            .to_string()
            .starts_with("free_providers.txt:2: '404: not found'"));
    }

    #[test]
    fn records_parse_with_optional_columns() {
        let mut b = TableBuilder::new();
        let text = "domain,reason,risk_score,mx_provider_label,flag_weight\n\
                    # comment\n\
                    team.example,role_account,60,,3\n\
                    dead.example,undeliverable,90\n\
                    corp.example,safe,1,\"Google Workspace\",\n";
        assert_eq!(add_records(&mut b, text, "domains.csv"), Ok(3));
        let t = b.build(Scores::default());
        let top: Vec<_> = t.top().entries(5).iter().map(|e| &*e.domain).collect();
        assert_eq!(top, ["team.example", "dead.example"]);
    }

    #[test]
    fn record_errors_name_the_line_and_column() {
        let cases = [
            ("domain,reason\n", 1, "header is"),
            (
                "domain,reason,risk_score\na.com,safe,1\nb.com,spam,1\n",
                3,
                "unknown reason 'spam'",
            ),
            (
                "domain,reason,risk_score\na.com,safe,101\n",
                2,
                "outside 0..=100",
            ),
            (
                "domain,reason,risk_score\na.com,safe,x\n",
                2,
                "column 'risk_score'",
            ),
            (
                "domain,reason,risk_score\nnot a domain,safe,1\n",
                2,
                "is not a domain",
            ),
            (
                "domain,reason,risk_score\na.com,safe,1\na.com,safe,2\n",
                3,
                "given already",
            ),
        ];
        for (text, line, needle) in cases {
            let mut b = TableBuilder::new();
            let err = add_records(&mut b, text, "domains.csv").unwrap_err();
            assert_eq!(err.line, line, "{text:?}: {err}");
            assert!(err.message.contains(needle), "{text:?}: {err}");
        }
    }
}
