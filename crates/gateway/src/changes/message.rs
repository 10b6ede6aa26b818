//! One message of a project's changes, as the webhook receiver gets it: the changes themselves
//! when they are few, else a summary (how many, per transition) with the first
//! `max_per_message` of them, the rest readable through `GET /v1/changes`. Its id names the
//! range of changes it covers, so a message sent again (a crash after the receiver's `2xx`)
//! carries the same id.

use std::collections::BTreeMap;

use serde::Serialize;

use super::store::Pending;
use super::Change;

/// The body of one message.
#[derive(Debug, Serialize)]
pub struct Message<'a> {
    pub project: &'a str,
    /// The changes, oldest first (all of them, or the first `max_per_message`).
    pub changes: &'a [Change],
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

/// The message for `project`'s `pending` changes, whose first ones are `first`.
pub fn build<'a>(project: &'a str, first: &'a [Change], pending: &'a Pending) -> Message<'a> {
    Message {
        project,
        changes: first,
        total: pending.total,
        truncated: (first.len() as u64) < pending.total,
        first_id: first.first().map_or(pending.last_id, |c| c.id),
        last_id: pending.last_id,
        summary: &pending.transitions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Reason;

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
            changed_at: "2026-11-25T00:00:00Z".into(),
            dataset_version: "g2-000001".into(),
        };
        let first: Vec<Change> = (5..8).map(change).collect();
        let pending = Pending {
            total: 50_000,
            last_id: 50_004,
            transitions: [("safe->disposable".to_owned(), 50_000)].into(),
        };
        let m = build("acme", &first, &pending);
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
        assert!(!build("acme", &first, &all).truncated);
    }
}
