//! One message of a project's changes, as the webhook receiver gets it: the changes themselves
//! when they are few, else a summary (how many, per transition) with the first
//! `max_per_message` of them, the rest readable through `GET /v1/changes`. A domain whose
//! changes in the message cancel out (back where the project was told, within `quiet_hours`)
//! is left out: a flip and its flip back are not sent. Its id names the range of changes it
//! covers, so a retry, or a message sent again after a crash, carries the same id.

use std::collections::BTreeMap;

use serde::Serialize;

use super::store::Pending;
use super::{Change, Told};

/// The body of one message.
#[derive(Debug, Serialize)]
pub struct Message<'a> {
    pub project: &'a str,
    /// The changes, oldest first (all of them, or the first `max_per_message`), but those that
    /// cancel out.
    pub changes: Vec<&'a Change>,
    /// Changes covered but left out because they cancel out (`GET /v1/changes` has them).
    pub cancelled: u64,
    /// How many changes this message covers (`changes` holds all of them unless `truncated`).
    pub total: u64,
    /// `changes` holds only the first of them: read the rest with `GET /v1/changes`.
    pub truncated: bool,
    /// Ids covered, inclusive: `first_id..=last_id`.
    pub first_id: u64,
    pub last_id: u64,
    /// Counts per transition (`from->to`), over every change covered.
    pub summary: &'a BTreeMap<String, u64>,
}

impl Message<'_> {
    /// `X-Change-Id`: fixed for the range of changes the message covers.
    pub fn id(&self) -> String {
        format!("{}-{}", self.first_id, self.last_id)
    }
}

/// The message for `project`'s `pending` changes, whose first ones are `first`; a domain's
/// changes within `quiet` seconds that end where they began are left out.
pub fn build<'a>(
    project: &'a str,
    first: &'a [Change],
    pending: &'a Pending,
    quiet: i64,
) -> Message<'a> {
    let truncated = (first.len() as u64) < pending.total;
    // A summary of a storm lists its first changes as they are.
    let keep: Vec<&Change> = if truncated {
        first.iter().collect()
    } else {
        first
            .iter()
            .filter(|c| !cancels_out(first, &c.domain, quiet))
            .collect()
    };
    Message {
        project,
        cancelled: (first.len() - keep.len()) as u64,
        changes: keep,
        total: pending.total,
        truncated,
        first_id: first.first().map_or(pending.last_id, |c| c.id),
        last_id: pending.last_id,
        summary: &pending.transitions,
    }
}

/// Whether `domain`'s changes among `changes` end where they began (reason and score band),
/// all within `quiet` seconds.
fn cancels_out(changes: &[Change], domain: &str, quiet: i64) -> bool {
    let mine: Vec<&Change> = changes.iter().filter(|c| c.domain == domain).collect();
    let (Some(first), Some(last)) = (mine.first(), mine.last()) else {
        return false;
    };
    let at = |c: &Change| {
        chrono::DateTime::parse_from_rfc3339(&c.changed_at).map_or(0, |t| t.timestamp())
    };
    let from = Told {
        reason: first.from,
        score: first.score_from,
    };
    let to = Told {
        reason: last.to,
        score: last.score_to,
    };
    mine.len() > 1 && !from.differs(to) && at(last) - at(first) <= quiet
}

#[cfg(test)]
mod tests {
    use super::*;
    use drg_domain::Reason;

    #[test]
    fn a_storm_becomes_a_summary_with_a_fixed_id() {
        let change = |id| Change {
            id,
            domain: format!("d{id}.com"),
            from: Reason::Safe,
            to: Reason::Disposable,
            score_from: 10,
            score_to: 100,
            rule: "blocklist".into(),
            basis: "table".into(),
            changed_at: "2026-11-25T00:00:00Z".into(),
            dataset_version: "g2-000001".into(),
        };
        let first: Vec<Change> = (5..8).map(change).collect();
        let pending = Pending {
            total: 50_000,
            last_id: 50_004,
            transitions: [("safe->disposable".to_owned(), 50_000)].into(),
        };
        let m = build("acme", &first, &pending, 86_400);
        assert!(m.truncated);
        assert_eq!(m.id(), "5-50004");
        let body = serde_json::to_value(&m).unwrap();
        assert_eq!(body["summary"]["safe->disposable"], 50_000);
        assert_eq!(body["changes"].as_array().unwrap().len(), 3);
        let all = Pending {
            total: 3,
            last_id: 7,
            transitions: Default::default(),
        };
        assert!(!build("acme", &first, &all, 86_400).truncated);
    }

    #[test]
    fn a_flip_and_its_flip_back_are_left_out() {
        let change = |id, domain: &str, from, to| Change {
            id,
            domain: domain.into(),
            from,
            to,
            score_from: if from == Reason::Safe { 20 } else { 100 },
            score_to: if to == Reason::Safe { 20 } else { 100 },
            rule: "blocklist".into(),
            basis: "table".into(),
            changed_at: format!("2026-11-25T00:00:0{id}Z"),
            dataset_version: "g2-000001".into(),
        };
        let changes = [
            change(1, "a.com", Reason::Safe, Reason::Disposable),
            change(2, "b.com", Reason::Safe, Reason::Disposable),
            change(3, "a.com", Reason::Disposable, Reason::Safe),
        ];
        let pending = Pending {
            total: 3,
            last_id: 3,
            transitions: Default::default(),
        };
        let m = build("acme", &changes, &pending, 86_400);
        assert_eq!(m.changes.len(), 1);
        assert_eq!(m.changes[0].domain, "b.com");
        assert_eq!(m.cancelled, 2);
        assert_eq!(m.id(), "1-3");
        // Further apart than the quiet time: both are sent.
        assert_eq!(build("acme", &changes, &pending, 1).changes.len(), 3);
    }
}
