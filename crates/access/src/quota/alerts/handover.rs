//! An alert as the webhook engine's outbox keeps it: one hold, the alert's only durable record
//! (its key names the project, month and threshold; its token is the alert's id, which is also
//! the Redis claim's), and one message per destination (the operator's URL, the project's
//! webhooks), each with that id and the same body bytes on every attempt.

use drg_webhook::outbox::Hold;
use drg_webhook::Message;

use super::Alert;

/// The topic of an alert's messages, and the scope of its holds.
pub const TOPIC: &str = "quota.threshold";

/// How long a hold is kept after its alert was taken in: as long as its Redis claim (`claim.rs`),
/// far past the alert's month, the only month a call can offer it in.
const KEEP_MS: i64 = 62 * 86_400_000;

/// An alert on its way out: what names it, and its id and body, fixed when it is taken in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub project: String,
    /// `YYYY-MM`.
    pub month: String,
    pub threshold: u32,
    /// Random: the Redis claim's token and the `X-Alert-Id` of every attempt.
    pub id: String,
    pub body: String,
}

/// A random alert id: 32 hex digits.
fn alert_id() -> String {
    let (a, b) = (
        getrandom::u64().unwrap_or_default(),
        getrandom::u64().unwrap_or_default(),
    );
    format!("{a:016x}{b:016x}")
}

/// The hold key of (project, month, threshold): the project last, the one part that may hold a
/// `:` (see [`parse_key`]).
pub fn hold_key(project: &str, month: &str, threshold: u32) -> String {
    format!("{TOPIC}:{month}:{threshold}:{project}")
}

/// The (project, month, threshold) of an alert's hold key.
pub fn parse_key(key: &str) -> Option<(&str, &str, u32)> {
    let rest = key.strip_prefix(TOPIC)?.strip_prefix(':')?;
    let mut parts = rest.splitn(3, ':');
    let (month, threshold, project) = (parts.next()?, parts.next()?, parts.next()?);
    Some((project, month, threshold.parse().ok()?))
}

impl Outgoing {
    /// `alert` taken in now: a new id, its body serialized once.
    pub fn new(alert: &Alert) -> Outgoing {
        Outgoing {
            project: alert.project.clone(),
            month: alert.month.clone(),
            threshold: alert.threshold,
            id: alert_id(),
            body: serde_json::to_string(alert).unwrap_or_default(),
        }
    }

    /// Its hold, held when a Redis claim must be won first; kept [`KEEP_MS`] after `now_ms`.
    pub fn hold(&self, held: bool, now_ms: i64) -> Hold {
        Hold {
            key: hold_key(&self.project, &self.month, self.threshold),
            scope: TOPIC.to_owned(),
            token: self.id.clone(),
            held,
            keep_until_ms: now_ms.saturating_add(KEEP_MS),
        }
    }

    /// One message per destination, keyed by the alert and the destination (the keys of the
    /// release before holds, so a message it handed over already is not taken twice).
    pub fn messages(&self, destinations: Vec<String>) -> Vec<Message> {
        let (project, month, threshold) = (&self.project, &self.month, self.threshold);
        destinations
            .into_iter()
            .map(|destination| Message {
                key: format!("{TOPIC}:{project}:{month}:{threshold}:{destination}"),
                topic: TOPIC.to_owned(),
                label: "quota alert".to_owned(),
                // One project's alerts in order; another project's beside them.
                lane: format!("{destination}|{project}"),
                destination,
                id_header: "X-Alert-Id".to_owned(),
                id: self.id.clone(),
                body: self.body.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_key_reads_back_whatever_the_project_holds() {
        for project in ["acme", "a:b:c", ""] {
            let key = hold_key(project, "2026-11", 80);
            assert_eq!(parse_key(&key), Some((project, "2026-11", 80)), "{key}");
        }
        assert_eq!(parse_key("verdict.changed:2026-11:80:acme"), None);
        assert_eq!(parse_key("quota.threshold:2026-11:x:acme"), None);
        assert_eq!(parse_key("quota.threshold:2026-11"), None);
    }

    #[test]
    fn every_destination_gets_the_same_id_and_bytes() {
        let outgoing = Outgoing {
            project: "acme".into(),
            month: "2026-11".into(),
            threshold: 90,
            id: "abc".into(),
            body: "{\"threshold\":90}".into(),
        };
        let messages = outgoing.messages(vec!["operator:x".into(), "project:acme:w1".into()]);
        assert_eq!(
            messages[0].key,
            "quota.threshold:acme:2026-11:90:operator:x"
        );
        assert_eq!(messages[1].lane, "project:acme:w1|acme");
        assert!(messages
            .iter()
            .all(|m| m.id == "abc" && m.body == outgoing.body));
        let hold = outgoing.hold(true, 1_000);
        assert_eq!(hold.key, "quota.threshold:2026-11:90:acme");
        assert_eq!((hold.token.as_str(), hold.held), ("abc", true));
        assert_eq!(hold.keep_until_ms, 1_000 + KEEP_MS);
    }
}
