//! Each project's own webhooks: `POST /v1/webhooks` makes one (a URL the destination guard
//! accepts, the events it wants, a signing secret shown in that answer only), `GET` pages them,
//! `DELETE /v1/webhooks/{id}` removes one (`api.rs`, the body's checks in `body.rs`). Delivery
//! reads them through [`ProjectHooks`]: who is subscribed to an event, and where and with which
//! secret one is sent.
//!
//! Kept as records ([`drg_base::infra::records`]), like overrides: `webhooks.records.sqlite` in the state
//! folder or, with the Redis quota store, on Redis with a copy in the state folder; every gateway
//! reads a change within a poll, and a Redis that lost its data gets back what it no longer
//! holds. A removed webhook is a record with neither URL nor secret (no older copy revives it).
//! On when `gateway.webhooks` is set (`config.rs`); server keys only, not counted, bounded by the
//! plan's `max_webhooks`. A URL's path and query may hold a token: logs name its host only.

pub mod api;
pub mod body;
pub mod config;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use api::{Webhooks, WebhooksOp};
pub use body::Event;
pub use config::WebhooksConfig;
use drg_base::infra::records::snapshot::Snapshot;

/// One webhook of a project.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hook {
    pub project: String,
    /// `wh_` and 16 hex digits.
    pub id: String,
    /// Empty once removed.
    pub url: String,
    /// Event names ([`Event::as_str`]).
    pub events: Vec<String>,
    /// `whsec_` and 64 hex digits: what the project was given, and what messages are signed
    /// with. Empty once removed.
    pub secret: String,
    /// The id of the key that made it.
    pub created_by: String,
    /// Unix seconds.
    pub created_at: i64,
    pub stamp: u64,
    #[serde(default)]
    pub removed: bool,
}

drg_domain::record_fields!(Hook, key: id, writer: created_by);

/// Where one webhook's messages go, and what they are signed with.
#[derive(Clone, PartialEq, Eq)]
pub struct HookTarget {
    pub url: String,
    /// The bytes of the `whsec_...` text the project was given: the HMAC key.
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for HookTarget {
    // Neither the secret nor the URL's path or query (it may hold a token).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let host = body::host_of(&self.url);
        f.debug_struct("HookTarget")
            .field("host", &host.as_deref().unwrap_or("?"))
            .finish_non_exhaustive()
    }
}

/// The kind of record a project's webhooks are (their files and Redis keys are named by it).
pub const KIND: &str = "webhooks";

/// The projects' webhooks as this gateway holds them: a handle on their records, cheap to
/// clone. Open it once per gateway (its poll is [`snapshot`](Self::snapshot)'s
/// `Following` service); every clone reads the same records.
#[derive(Clone)]
pub struct ProjectHooks {
    snapshot: Arc<Snapshot<Hook>>,
}

impl ProjectHooks {
    /// Webhooks kept in the control store.
    pub fn open(control: &std::sync::Arc<drg_base::infra::control::Control>) -> ProjectHooks {
        let publish = Box::new(|_: &drg_base::infra::records::Merged<Hook>, _: &_| {});
        ProjectHooks {
            snapshot: Arc::new(Snapshot::open(KIND, control, publish)),
        }
    }

    /// The records and their poll (a background service keeps it: `Following`).
    pub fn snapshot(&self) -> &Arc<Snapshot<Hook>> {
        &self.snapshot
    }

    /// The ids of `project`'s webhooks in force subscribed to `event` (`verdict.changed`,
    /// `quota.threshold`), in order of creation.
    pub fn subscribed(&self, project: &str, event: &str) -> Vec<String> {
        let held = self.snapshot.held();
        let mut ids: Vec<String> = held
            .live(project)
            .filter(|h| h.events.iter().any(|e| e == event))
            .map(|h| h.id.clone())
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Where `project`'s webhook `id` sends, while it is in force.
    pub fn target(&self, project: &str, id: &str) -> Option<HookTarget> {
        match self.find(project, id) {
            Lookup::Live(target) => Some(target),
            Lookup::Removed | Lookup::Unknown => None,
        }
    }

    /// What this gateway knows of `project`'s webhook `id`: in force, removed (its record
    /// says so), or nothing (not read here yet, or a removal's record long forgotten).
    pub fn find(&self, project: &str, id: &str) -> Lookup {
        let held = self.snapshot.held();
        match held.get(project, id) {
            Some(hook) if hook.removed => Lookup::Removed,
            Some(hook) => Lookup::Live(HookTarget {
                url: hook.url.clone(),
                secret: hook.secret.as_bytes().to_vec(),
            }),
            None => Lookup::Unknown,
        }
    }
}

/// What a gateway knows of one webhook ([`ProjectHooks::find`]).
#[derive(Debug)]
pub enum Lookup {
    Live(HookTarget),
    Removed,
    Unknown,
}

/// A new webhook id: `wh_`, the creation second (8 hex digits, so that ids sort by creation,
/// which is the order the list pages in) and 8 random ones.
fn new_id(now: i64) -> Result<String, getrandom::Error> {
    let mut random = [0u8; 4];
    getrandom::fill(&mut random)?;
    let second = u32::try_from(now).unwrap_or(0);
    Ok(format!("wh_{second:08x}{}", hex::encode(random)))
}

/// A new signing secret: `whsec_` and 32 random bytes in hex.
fn new_secret() -> Result<String, getrandom::Error> {
    let mut random = [0u8; 32];
    getrandom::fill(&mut random)?;
    Ok(format!("whsec_{}", hex::encode(random)))
}

/// Whether `id` is one this API gives: `wh_` and 16 lowercase hex digits.
pub fn is_hook_id(id: &str) -> bool {
    id.strip_prefix("wh_").is_some_and(|hex| {
        hex.len() == 16 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A control store in `dir` (SQLite), for the tests of what keeps records.
    pub(crate) fn control_in(dir: &std::path::Path) -> Arc<drg_base::infra::control::Control> {
        drg_base::infra::control::Control::sqlite(&dir.join("control.sqlite")).unwrap()
    }

    fn hook(project: &str, id: &str, events: &[&str], removed: bool) -> Hook {
        Hook {
            project: project.into(),
            id: id.into(),
            url: "https://hooks.example.com/x?token=t".into(),
            events: events.iter().map(|e| e.to_string()).collect(),
            secret: "whsec_00".into(),
            created_by: "server".into(),
            created_at: 1,
            stamp: 1,
            removed,
        }
    }

    #[test]
    fn ids_and_secrets_have_their_shapes_and_ids_sort_by_creation() {
        let (a, b) = (
            new_id(1_800_000_000).unwrap(),
            new_id(1_800_000_001).unwrap(),
        );
        assert!(is_hook_id(&a) && is_hook_id(&b), "{a} {b}");
        assert!(a < b);
        let s = new_secret().unwrap();
        assert_eq!(s.len(), "whsec_".len() + 64);
        assert!(s.starts_with("whsec_"));
        assert_ne!(s, new_secret().unwrap());
        for bad in [
            "wh_0123",
            "wh_0123456789ABCDEF",
            "key_0123456789abcdef",
            "wh_0123456789abcdeg",
        ] {
            assert!(!is_hook_id(bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn delivery_reads_the_projects_live_hooks_by_event() {
        let dir = tempfile::tempdir().unwrap();
        let hooks = ProjectHooks::open(&control_in(dir.path()));
        let r = hooks.snapshot().clone();
        for h in [
            hook("acme", "wh_2", &["verdict.changed"], false),
            hook(
                "acme",
                "wh_1",
                &["verdict.changed", "quota.threshold"],
                false,
            ),
            hook("acme", "wh_3", &["quota.threshold"], true),
            hook("other", "wh_4", &["quota.threshold"], false),
        ] {
            r.put(h, 10).await.unwrap();
        }
        assert_eq!(
            hooks.subscribed("acme", "verdict.changed"),
            ["wh_1", "wh_2"]
        );
        assert_eq!(hooks.subscribed("acme", "quota.threshold"), ["wh_1"]);
        assert!(hooks.subscribed("nobody", "quota.threshold").is_empty());
        let t = hooks.target("acme", "wh_1").unwrap();
        assert_eq!(t.secret, b"whsec_00");
        assert_eq!(t.url, "https://hooks.example.com/x?token=t");
        let shown = format!("{t:?}");
        assert!(
            !shown.contains("token") && !shown.contains("whsec"),
            "{shown}"
        );
        assert_eq!(hooks.target("acme", "wh_3"), None, "removed");
        assert_eq!(hooks.target("other", "wh_1"), None, "another project's");
    }
}
