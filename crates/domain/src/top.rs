//! `TopDomains`: the most prominent flagged entries of a table, ranked and rendered as JSON once
//! per build, so `GET /v1/public/top-domains` (a hot path) answers with a copy of bytes made at
//! load, never a ranking or a serialisation per request.

use bytes::Bytes;

use super::record::{FlaggedEntry, Reason, RiskScore};

/// How many flagged entries are kept ranked: the largest `limit` of top-domains.
pub const MAX_TOP: usize = 1000;

/// The `limit` of a top-domains request that gives none: its whole body is rendered at build.
pub const DEFAULT_LIMIT: usize = 100;

/// A flagged name offered for ranking.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    /// `flag_weight` of an explicit record (0 for a blocklist entry); higher ranks first.
    pub weight: u32,
    pub score: RiskScore,
    pub reason: Reason,
    pub name: &'a str,
}

/// The ranking of [`TopDomains::rank`]: weight, then risk score (both highest first), then name.
fn order(a: &Candidate<'_>, b: &Candidate<'_>) -> std::cmp::Ordering {
    b.weight
        .cmp(&a.weight)
        .then(b.score.cmp(&a.score))
        .then(a.name.cmp(b.name))
}

/// Leaves in `candidates` only the [`MAX_TOP`] that rank first (in no order), and gives back the
/// room of the rest. The best of a whole table are the best of the best of its parts, so a
/// build keeps only these of each part instead of a candidate for each of millions of names.
pub fn keep_best(candidates: &mut Vec<Candidate<'_>>) {
    if candidates.len() > MAX_TOP {
        // Partial selection: a blocklist of a million names is not sorted whole.
        candidates.select_nth_unstable_by(MAX_TOP - 1, order);
        candidates.truncate(MAX_TOP);
        candidates.shrink_to_fit();
    }
}

/// The ranked entries and their rendering.
#[derive(Debug)]
pub struct TopDomains {
    entries: Vec<FlaggedEntry>,
    /// Every entry as JSON, comma-separated, in rank order.
    json: String,
    /// `json[..ends[i]]` holds the first `i + 1` entries, so any `limit` is one slice.
    ends: Vec<usize>,
    /// The whole body for [`DEFAULT_LIMIT`]: the answer to nearly every request, shared by
    /// reference rather than copied.
    default_body: Bytes,
}

impl Default for TopDomains {
    fn default() -> Self {
        TopDomains::from_ranked(Vec::new())
    }
}

impl TopDomains {
    /// Orders candidates by weight, then risk score (both highest first), then name, and keeps
    /// the first [`MAX_TOP`].
    pub fn rank(mut candidates: Vec<Candidate<'_>>) -> Self {
        keep_best(&mut candidates);
        candidates.sort_unstable_by(order);
        TopDomains::from_ranked(
            candidates
                .into_iter()
                .map(|c| FlaggedEntry {
                    domain: c.name.into(),
                    risk_score: c.score,
                    reason: c.reason,
                })
                .collect(),
        )
    }

    /// Entries already in rank order (the live ranking of
    /// [`heavy_hitters`](super::heavy_hitters)), rendered; beyond [`MAX_TOP`] they are dropped.
    pub fn from_ranked(mut entries: Vec<FlaggedEntry>) -> Self {
        entries.truncate(MAX_TOP);
        let mut json = String::new();
        let mut ends = Vec::with_capacity(entries.len());
        for e in &entries {
            if !json.is_empty() {
                json.push(',');
            }
            json.push_str(&serde_json::to_string(e).expect("a FlaggedEntry always serialises"));
            ends.push(json.len());
        }
        let mut top = TopDomains {
            entries,
            json,
            ends,
            default_body: Bytes::new(),
        };
        top.default_body = Bytes::from(top.json(DEFAULT_LIMIT));
        top
    }

    /// The first `limit` entries (all of them when fewer).
    pub fn entries(&self, limit: usize) -> &[FlaggedEntry] {
        &self.entries[..limit.min(self.entries.len())]
    }

    /// The body of `GET /v1/public/top-domains?limit=N`: `{"domains":[...],"count":N}`.
    pub fn json(&self, limit: usize) -> String {
        let count = limit.min(self.ends.len());
        let domains = match count {
            0 => "",
            n => &self.json[..self.ends[n - 1]],
        };
        let mut out = String::with_capacity(domains.len() + 32);
        out.push_str("{\"domains\":[");
        out.push_str(domains);
        out.push_str("],\"count\":");
        out.push_str(&count.to_string());
        out.push('}');
        out
    }

    /// [`json`](Self::json) as a body; the default `limit`'s without copying a byte.
    pub fn body(&self, limit: usize) -> Bytes {
        if limit == DEFAULT_LIMIT {
            self.default_body.clone()
        } else {
            Bytes::from(self.json(limit))
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(name: &str, weight: u32, score: RiskScore) -> Candidate<'_> {
        Candidate {
            weight,
            score,
            reason: Reason::Disposable,
            name,
        }
    }

    #[test]
    fn ranks_by_weight_then_score_then_name() {
        let top = TopDomains::rank(vec![
            candidate("b.com", 0, 100),
            candidate("a.com", 0, 100),
            candidate("low.com", 0, 90),
            candidate("heavy.com", 5, 60),
        ]);
        let names: Vec<_> = top.entries(10).iter().map(|e| &*e.domain).collect();
        assert_eq!(names, ["heavy.com", "a.com", "b.com", "low.com"]);
        assert_eq!(top.entries(2).len(), 2);
    }

    #[test]
    fn keeps_the_first_max_top() {
        let names: Vec<String> = (0..MAX_TOP + 50).map(|i| format!("d{i:05}.com")).collect();
        let mut candidates: Vec<_> = names.iter().map(|n| candidate(n, 0, 100)).collect();
        candidates.reverse();
        let top = TopDomains::rank(candidates);
        assert_eq!(top.len(), MAX_TOP);
        assert_eq!(&*top.entries(1)[0].domain, "d00000.com");
        assert_eq!(&*top.entries(usize::MAX)[MAX_TOP - 1].domain, "d00999.com");
    }

    #[test]
    fn the_body_is_the_entries_as_serde_renders_them() {
        let top = TopDomains::rank(vec![
            candidate("a.com", 1, 100),
            Candidate {
                reason: Reason::RoleAccount,
                ..candidate("role.example", 0, 60)
            },
        ]);
        for limit in [0, 1, 2, 3, DEFAULT_LIMIT, usize::MAX] {
            let shown = top.entries(limit);
            let expected = serde_json::json!({ "domains": shown, "count": shown.len() });
            let body: serde_json::Value = serde_json::from_str(&top.json(limit)).unwrap();
            assert_eq!(body, expected, "limit {limit}");
            assert_eq!(top.body(limit), top.json(limit), "limit {limit}");
        }
        assert_eq!(
            top.json(1),
            r#"{"domains":[{"domain":"a.com","risk_score":100,"reason":"disposable"}],"count":1}"#
        );
        assert_eq!(
            TopDomains::default().json(10),
            r#"{"domains":[],"count":0}"#
        );
    }
}
