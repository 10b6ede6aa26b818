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

use super::builder::{ParsedPiece, TableBuilder};
use super::error::SourceError;
use super::name::DomainName;
use super::parallel::{for_each_split, line_runs};
use super::record::{Reason, MAX_SCORE};
use super::table::{ExplicitRecord, ListKind, Origin};

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
    if kind == ListKind::FreeProvider {
        // The curated list is short, and its order matters (typo suggestions): one by one.
        return add_in_order(builder, text, origin, source, kind);
    }
    // Several runs a thread, so that a thread that got the short lines does not wait idle.
    let parts = if text.len() < PARALLEL_FROM_BYTES {
        1
    } else {
        builder.threads() * 4
    };
    add_in_runs(builder, text, origin, source, kind, parts)
}

/// [`add_domain_list_named`] on `parts` runs of the list's lines.
fn add_in_runs(
    builder: &mut TableBuilder,
    text: &str,
    origin: &str,
    source: &str,
    kind: ListKind,
    parts: usize,
) -> Result<usize, SourceError> {
    let source = builder.source(source);
    let threads = builder.threads();
    let mut runs = line_runs(text, parts);
    let shared: &TableBuilder = builder;
    let parsed = for_each_split(&mut runs, threads, |_, run| parse_run(text, run, shared));
    let mut pieces = Vec::with_capacity(parsed.len());
    let mut lines_before = 0;
    for piece in parsed {
        match piece {
            Ok(piece) => {
                lines_before += piece.lines;
                pieces.push(piece);
            }
            // The runs are in order: the first failed run holds the first bad line.
            Err((line, message)) => {
                return Err(SourceError::new(origin, lines_before + line, message))
            }
        }
    }
    builder.add_pieces(text, &pieces, kind, source);
    Ok(pieces.iter().map(|p| p.count).sum())
}

/// Lists shorter than this are parsed in one run (threads cost more than they save).
const PARALLEL_FROM_BYTES: usize = 256 * 1024;

/// How many lines a run parses between two yields of the core (about a millisecond).
const YIELD_EVERY_LINES: usize = 8192;

/// Parses one run of a list's lines; a bad line fails it with its line in the run and why.
fn parse_run(
    text: &str,
    run: &str,
    builder: &TableBuilder,
) -> Result<ParsedPiece, (usize, String)> {
    let mut piece = ParsedPiece::for_lines(memchr::memchr_iter(b'\n', run.as_bytes()).count() + 1);
    for (index, raw) in run.lines().enumerate() {
        piece.lines = index + 1;
        if index % YIELD_EVERY_LINES == YIELD_EVERY_LINES - 1 {
            // A run is ~100 ms of work with millions of names: in pieces, as the rest of a build.
            std::thread::yield_now();
        }
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let name = DomainName::canonical(line)
            .map_err(|e| (index + 1, format!("'{line}' is not a domain: {e}")))?;
        piece.push(text, &name, index + 1, builder);
    }
    Ok(piece)
}

/// [`add_domain_list_named`] one name after another, through [`TableBuilder::add_from`].
fn add_in_order(
    builder: &mut TableBuilder,
    text: &str,
    origin: &str,
    source: &str,
    kind: ListKind,
) -> Result<usize, SourceError> {
    let source = builder.source(source);
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
    use crate::scores::Scores;
    use crate::table::TableRule;
    use proptest::prelude::*;

    fn n(s: &str) -> DomainName {
        DomainName::parse(s).unwrap()
    }

    /// A list line for the property test: names with parents, public suffixes, case, a
    /// trailing dot, comments and blank lines.
    fn list_line() -> impl Strategy<Value = String> {
        let label = prop_oneof!["a", "b", "c", "ab", "xn--bcher-kva", "B"];
        let suffix = prop_oneof!["com", "co.uk", "github.io", "net"];
        (
            proptest::collection::vec(label, 1..4),
            suffix,
            prop_oneof!["", ".", "  # note", "\r"],
            0..12u8,
        )
            .prop_map(|(labels, suffix, tail, blank)| match blank {
                0 => String::new(),
                1 => "# a comment".into(),
                2 => "co.uk".into(),
                _ => {
                    let mut name: Vec<&str> = labels.iter().map(|l| &**l).collect();
                    name.push(&suffix);
                    format!("{}{tail}", name.join("."))
                }
            })
    }

    fn kind() -> impl Strategy<Value = ListKind> {
        prop_oneof![
            Just(ListKind::Disposable),
            Just(ListKind::Allow),
            Just(ListKind::BroadFree),
            Just(ListKind::NotFree),
            Just(ListKind::Relay),
            Just(ListKind::Disposable),
        ]
    }

    /// Everything a table answers for `names` and says of itself, to compare two tables.
    fn answers(t: &crate::DomainTable, names: &[DomainName]) -> Vec<String> {
        let mut out: Vec<String> = names
            .iter()
            .map(|name| {
                let m = t.lookup(name);
                format!("{name}: {m:?} {:?}", t.provenance(name, &m.rule))
            })
            .collect();
        out.push(format!("{:?}", t.stats()));
        out.push(format!("{} {}", t.len(), t.version().as_str()));
        out.push(format!("{:?}", t.top().entries(1000)));
        out
    }

    proptest! {
        /// Lists parsed in runs on several threads and inserted shard by shard make the table
        /// that adding each name in turn makes: the same answers, provenance, overlaps, counts,
        /// public suffixes, top-domains and dataset hash.
        #[test]
        fn lists_added_in_runs_make_the_table_of_names_added_one_by_one(
            lists in proptest::collection::vec(
                (proptest::collection::vec(list_line(), 0..40), kind()), 1..5),
            parts in 1usize..7,
            threads in 1usize..4,
        ) {
            let mut runs = TableBuilder::new().with_threads(threads);
            let mut one_by_one = TableBuilder::new();
            let mut names = Vec::new();
            for (i, (lines, kind)) in lists.iter().enumerate() {
                let text = lines.join("\n");
                let source = format!("list{i}");
                let a = add_in_runs(&mut runs, &text, &source, &source, *kind, parts);
                let b = add_in_order(&mut one_by_one, &text, &source, &source, *kind);
                prop_assert_eq!(&a, &b);
                if a.is_err() {
                    // A list that fails fails the build: what it added before is never used.
                    return Ok(());
                }
                for line in text.lines() {
                    let line = line.split('#').next().unwrap_or("").trim();
                    if let Ok(name) = DomainName::parse(line) {
                        for level in name.suffixes() {
                            names.extend(DomainName::parse(level).ok());
                        }
                        names.extend(DomainName::parse(&format!("x.{name}")).ok());
                    }
                }
            }
            runs.add_from(&n("gmail.com"), ListKind::FreeProvider, Origin::default());
            one_by_one.add_from(&n("gmail.com"), ListKind::FreeProvider, Origin::default());
            let (runs, one_by_one) = (runs.build(Scores::default()), one_by_one.build(Scores::default()));
            prop_assert_eq!(answers(&runs, &names), answers(&one_by_one, &names));
        }

        /// A bad line fails the list with its own line number, whichever run it fell in.
        #[test]
        fn a_bad_line_is_named_by_its_line_in_any_run(
            good in proptest::collection::vec("[a-c]{1,3}\\.com", 0..50),
            at in 0usize..50,
            parts in 1usize..7,
        ) {
            let mut lines = good.clone();
            let at = at.min(lines.len());
            lines.insert(at, "not a domain".into());
            let text = lines.join("\n");
            let err = add_in_runs(
                &mut TableBuilder::new().with_threads(2), &text, "f.txt", "f.txt",
                ListKind::Disposable, parts,
            ).unwrap_err();
            prop_assert!(err.to_string().starts_with(&format!("f.txt:{}:", at + 1)), "{}", err);
        }
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
