//! The compact forms of a batch's log entries of one project: binary for a row of SQLite's
//! `chunks`, a line of text a call for an entry of a Redis stream. One stored thing per call cost
//! either store more work per call than the lookup itself.

use super::Verdict;
use drg_domain::Reason;

/// One log entry as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub at_ms: i64,
    pub verdict: Verdict,
    pub domain: String,
}

/// Appends an entry: created_at (ms, i64 LE), score, reason (index in [`Reason::ALL`]), domain
/// length (a domain has at most 253 bytes; longer is cut) and bytes.
pub fn encode(out: &mut Vec<u8>, at_ms: i64, v: Verdict, domain: &str) {
    let domain = &domain.as_bytes()[..domain.len().min(255)];
    out.extend_from_slice(&at_ms.to_le_bytes());
    out.push(v.risk_score);
    out.push(Reason::ALL.iter().position(|r| *r == v.reason).unwrap_or(0) as u8);
    out.push(domain.len() as u8);
    out.extend_from_slice(domain);
}

/// The entries of a chunk, oldest first; `None` if the bytes are not a chunk.
pub fn decode(mut data: &[u8]) -> Option<Vec<Stored>> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let (head, rest) = data.split_at_checked(11)?;
        let at_ms = i64::from_le_bytes(head[..8].try_into().ok()?);
        // A score past 100 is no score of ours (Redis's bytes are read back too).
        if head[8] > 100 {
            return None;
        }
        let reason = *Reason::ALL.get(usize::from(head[9]))?;
        let (domain, rest) = rest.split_at_checked(usize::from(head[10]))?;
        out.push(Stored {
            at_ms,
            verdict: Verdict {
                risk_score: head[8],
                reason,
            },
            domain: String::from_utf8(domain.to_vec()).ok()?,
        });
        data = rest;
    }
    Some(out)
}

/// Appends an entry as a line of text, `<ms> <score> <reason> <domain>`: Redis's form, which
/// `XRANGE` shows as it is and an earlier build reading every field as UTF-8 can read past. A
/// space or a control character in the domain (the gateway accepts none) becomes `?`, so that
/// a line stays one entry.
pub fn encode_line(out: &mut String, at_ms: i64, v: Verdict, domain: &str) {
    // itoa and push_str rather than `write!`: the writer encodes every call of a busy gateway,
    // on the workers' core, and the formatting machinery cost more than the rest of a line.
    let mut number = itoa::Buffer::new();
    out.push_str(number.format(at_ms));
    out.push(' ');
    out.push_str(number.format(v.risk_score));
    out.push(' ');
    out.push_str(v.reason.as_str());
    out.push(' ');
    if domain.bytes().all(|b| b.is_ascii_graphic()) {
        out.push_str(domain);
    } else {
        out.extend(domain.chars().map(|c| {
            if c.is_whitespace() || c.is_control() {
                '?'
            } else {
                c
            }
        }));
    }
    out.push('\n');
}

/// The entries of a text chunk ([`encode_line`]), oldest first; `None` if it is not one.
pub fn decode_lines(text: &[u8]) -> Option<Vec<Stored>> {
    let text = std::str::from_utf8(text).ok()?;
    text.lines()
        .map(|line| {
            let mut parts = line.splitn(4, ' ');
            let at_ms = parts.next()?.parse().ok()?;
            let risk_score = parts.next()?.parse().ok().filter(|s| *s <= 100)?;
            let reason = parts.next()?.parse::<Reason>().ok()?;
            let domain = parts.next().filter(|d| !d.is_empty())?.to_owned();
            Some(Stored {
                at_ms,
                verdict: Verdict { risk_score, reason },
                domain,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A role account's verdict, as a line shows it.
    const ROLE: Verdict = Verdict {
        risk_score: 40,
        reason: Reason::RoleAccount,
    };

    #[test]
    fn text_chunks_round_trip_and_refuse_garbage() {
        let (v, mut text) = (ROLE, String::new());
        encode_line(&mut text, 7, v, "a.example");
        encode_line(&mut text, -1, v, "b c\nd.example");
        encode_line(&mut text, 9, v, "b\u{fc}\tx.example");
        assert_eq!(
            text,
            "7 40 role_account a.example\n-1 40 role_account b?c?d.example\n\
             9 40 role_account b\u{fc}?x.example\n"
        );
        let back = decode_lines(text.as_bytes()).unwrap();
        assert_eq!((back[0].at_ms, back[0].domain.as_str()), (7, "a.example"));
        assert_eq!(back[1].domain, "b?c?d.example");
        assert_eq!(back[1].verdict, v);
        for bad in [
            "7 101 safe a.example",
            "7 5 nope a.example",
            "x 5 safe a.example",
            "7 5 safe ",
            "7 5 safe",
        ] {
            assert_eq!(decode_lines(bad.as_bytes()), None, "{bad}");
        }
        assert_eq!(decode_lines(b"\xff"), None);
        assert_eq!(decode_lines(b"").unwrap(), vec![]);
    }

    #[test]
    fn chunks_round_trip_and_refuse_garbage() {
        let mut data = Vec::new();
        let v = Verdict {
            risk_score: 95,
            reason: Reason::RoleAccount,
        };
        encode(&mut data, -5, v, "a.example");
        encode(&mut data, 1_732_290_000_000, v, "");
        let back = decode(&data).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(
            back[0],
            Stored {
                at_ms: -5,
                verdict: v,
                domain: "a.example".into()
            }
        );
        assert_eq!(back[1].domain, "");
        assert_eq!(decode(&data[..data.len() - 1]), None);
        assert_eq!(decode(&[0; 10]), None);
        let mut bad_reason = data.clone();
        bad_reason[9] = 9;
        assert_eq!(decode(&bad_reason), None);
        let mut bad_score = data.clone();
        bad_score[8] = 101;
        assert_eq!(decode(&bad_score), None);
    }
}
