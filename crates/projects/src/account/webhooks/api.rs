//! `/v1/webhooks` for the caller's project: the list (no secret, ever), a new webhook (its
//! secret in the `201` only) and a removal, each an answer as a value.

use std::collections::BTreeMap;

use bytes::Bytes;
use drg_webhook::guard::Policy;
use http::StatusCode;
use serde::Serialize;

use super::{body, is_hook_id, new_id, new_secret, Hook, ProjectHooks, WebhooksConfig};
use crate::account::once::{self, Asked};
use drg_access::keys::KeyEntry;
use drg_access::plan::{PlanConfig, DEFAULT_MAX_WEBHOOKS};
use drg_base::answer::{error_answer, Action, Answer, ApiError, Changed};
use drg_base::infra::records::{Put, RecordsError};
use drg_base::infra::units::unix_rfc3339 as rfc3339;

/// Largest body of `POST /v1/webhooks`.
pub const MAX_BODY_BYTES: usize = 8_192;
/// Default and largest `limit` of `GET /v1/webhooks`.
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1_000;

/// A `/v1/webhooks` request, its id decoded and its body read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WebhooksOp {
    List {
        cursor: Option<String>,
        limit: usize,
    },
    Create(Bytes),
    Delete {
        id: String,
    },
}

/// One webhook as the list shows it: never its secret.
#[derive(Debug, Serialize)]
struct Item<'a> {
    id: &'a str,
    url: &'a str,
    events: &'a [String],
    /// RFC 3339, UTC.
    created_at: String,
    /// The id of the key that made it.
    created_by: &'a str,
}

impl<'a> Item<'a> {
    fn of(h: &'a Hook) -> Item<'a> {
        Item {
            id: &h.id,
            url: &h.url,
            events: &h.events,
            created_at: rfc3339(h.created_at),
            created_by: &h.created_by,
        }
    }
}

/// The answer to a new webhook: the one place its secret is shown.
#[derive(Serialize)]
struct Created<'a> {
    id: &'a str,
    url: &'a str,
    events: &'a [String],
    secret: &'a str,
    created_at: String,
    created_by: &'a str,
}

/// The routes: the records, where a URL may point, the plans that bound a project.
pub struct Webhooks {
    hooks: ProjectHooks,
    policy: Policy,
    plans: BTreeMap<String, PlanConfig>,
}

impl Webhooks {
    /// The routes over `hooks`, their URLs judged by `config`'s address ranges. The gateway's
    /// own listeners and backends are not judged here but when a message is sent (the engine's
    /// client holds them): a `422` for their addresses, and a `201` for any other, would let a
    /// project find where they are by trying addresses.
    pub fn new(
        hooks: ProjectHooks,
        config: &WebhooksConfig,
        plans: BTreeMap<String, PlanConfig>,
    ) -> Webhooks {
        Webhooks {
            hooks,
            policy: config.policy(&[]),
            plans,
        }
    }

    /// The records these routes write (what delivery reads).
    pub fn hooks(&self) -> &ProjectHooks {
        &self.hooks
    }

    /// The answer to `op` for the caller's `key`, at `now` (unix seconds); `once`: the
    /// write's `Idempotency-Key` (see [`crate::account::once`]).
    pub async fn answer(
        &self,
        op: WebhooksOp,
        key: &KeyEntry,
        now: i64,
        once: Option<&str>,
    ) -> Answer {
        match op {
            WebhooksOp::List { cursor, limit } => self.list(key, cursor.as_deref(), limit),
            WebhooksOp::Create(b) => match body::parse(&b, &self.policy) {
                Ok(new) => {
                    let asked = Asked {
                        method: "POST",
                        target: "webhooks",
                        body: &b,
                    };
                    self.create(key, new, now, once, asked).await
                }
                Err(e) => ApiError::Validation(e.to_string()).into(),
            },
            WebhooksOp::Delete { id } => self.remove(key, &id, now, once).await,
        }
    }

    fn list(&self, key: &KeyEntry, cursor: Option<&str>, limit: usize) -> Answer {
        if !self.hooks.snapshot().read_once() {
            return drg_base::answer::not_read_yet("The webhook store");
        }
        #[derive(Serialize)]
        struct Page<'a> {
            items: Vec<Item<'a>>,
            next_cursor: Option<&'a str>,
        }
        let held = self.hooks.snapshot().held();
        let mut live: Vec<&Hook> = held.live(&key.project).collect();
        // Ids begin with their creation second: by id is by creation.
        live.sort_by(|a, b| a.id.cmp(&b.id));
        let page: Vec<&Hook> = live
            .into_iter()
            .filter(|h| cursor.is_none_or(|c| h.id.as_str() > c))
            .take(limit)
            .collect();
        let next_cursor = (page.len() == limit)
            .then(|| page.last().map(|h| h.id.as_str()))
            .flatten();
        Answer::json(
            StatusCode::OK,
            &Page {
                items: page.iter().map(|h| Item::of(h)).collect(),
                next_cursor,
            },
        )
    }

    /// The plan's bound on `key`'s project.
    fn max(&self, key: &KeyEntry) -> u32 {
        (self.plans.get(&*key.plan)).map_or(DEFAULT_MAX_WEBHOOKS, PlanConfig::max_webhooks)
    }

    async fn create(
        &self,
        key: &KeyEntry,
        new: body::NewHook,
        now: i64,
        once: Option<&str>,
        asked: Asked<'_>,
    ) -> Answer {
        let max = self.max(key);
        // The stores read a bound of 0 as none.
        if max == 0 {
            return full(max);
        }
        let (id, secret) = match (new_id(now), new_secret()) {
            (Ok(id), Ok(secret)) => (id, secret),
            (Err(e), _) | (_, Err(e)) => {
                return ApiError::Internal(format!("no randomness for a webhook: {e}")).into()
            }
        };
        let hook = Hook {
            project: key.project.to_string(),
            id,
            url: new.url,
            events: new.events.iter().map(|e| e.as_str().to_owned()).collect(),
            secret,
            created_by: key.id.to_string(),
            created_at: now,
            stamp: self.hooks.snapshot().stamp(0),
            removed: false,
        };
        // The host only: a webhook URL's path or query may hold a token.
        let made = Changed::new(
            Action::WebhookCreated,
            &hook.id,
            super::body::host_of(&hook.url).unwrap_or_default(),
        );
        let answer = |put| match put {
            Ok(Put::Done { .. }) => Answer::json(
                StatusCode::CREATED,
                &Created {
                    id: &hook.id,
                    url: &hook.url,
                    events: &hook.events,
                    secret: &hook.secret,
                    created_at: rfc3339(hook.created_at),
                    created_by: &hook.created_by,
                },
            )
            .changed(made.clone()),
            Ok(Put::Full) => full(max),
            Ok(Put::Stale | Put::Absent) => stale(),
            Err(e) => unavailable(&e),
        };
        let who = once::Who::new(key, now, &self.plans);
        let written = once::write_keeping(
            self.hooks.snapshot(),
            hook.clone(),
            (max, once),
            asked,
            &who,
            answer,
            without_secret,
        )
        .await;
        match once::is_replay(&written) {
            true => self.with_secret(written, &key.project).await,
            false => written,
        }
    }

    /// A replayed creation (its answer kept without the secret) with the webhook's secret as
    /// the webhook holds it now; a webhook removed since has no secret to give: `404`.
    async fn with_secret(&self, replay: Answer, project: &str) -> Answer {
        let mut body: serde_json::Value = serde_json::from_slice(&replay.body).unwrap_or_default();
        let id = body["id"].as_str().unwrap_or_default().to_owned();
        let snapshot = self.hooks.snapshot();
        // A creation committed through another gateway a moment ago may not be in this copy
        // yet: the store is read first, never a `404` from the copy alone.
        if snapshot.held().get(project, &id).is_none() {
            // Boxed: a whole read, rare, that every request's future would otherwise hold.
            Box::pin(snapshot.sync()).await;
        }
        let held = snapshot.held();
        let Some(hook) = held.get(project, &id).filter(|h| !h.removed) else {
            return error_answer(
                StatusCode::NOT_FOUND,
                "not_found",
                "The webhook this request made was removed since; its secret is not kept.",
                Some(&format!("id: {id}")),
            );
        };
        body["secret"] = serde_json::Value::String(hook.secret.clone());
        Answer {
            body: Bytes::from(body.to_string()),
            ..replay
        }
    }

    async fn remove(&self, key: &KeyEntry, id: &str, now: i64, once: Option<&str>) -> Answer {
        let none = || {
            error_answer(
                StatusCode::NOT_FOUND,
                "not_found",
                "No webhook of this id in the project.",
                None,
            )
        };
        if !is_hook_id(id) {
            let asked = Asked {
                method: "DELETE",
                target: id,
                body: b"",
            };
            return once::replay_or(self.hooks.snapshot(), key, once, asked, none()).await;
        }
        // A webhook the copy does not hold still goes to the store: another gateway may have
        // made it a moment ago, and the store decides (`Put::Absent`: 404).
        let held = self.hooks.snapshot().held();
        let hook = held.get(&key.project, id).cloned().unwrap_or_else(|| Hook {
            project: key.project.to_string(),
            id: id.to_owned(),
            url: String::new(),
            events: Vec::new(),
            secret: String::new(),
            created_by: String::new(),
            created_at: 0,
            stamp: 0,
            removed: true,
        });
        let gone = Hook {
            url: String::new(),
            secret: String::new(),
            stamp: self.hooks.snapshot().stamp(hook.stamp),
            removed: true,
            ..hook
        };
        let answer = |put| match put {
            Ok(Put::Done { .. }) => Answer::raw(StatusCode::NO_CONTENT, Bytes::new())
                .changed(Changed::new(Action::WebhookRemoved, id, "")),
            Ok(Put::Absent) => none(),
            Ok(Put::Full | Put::Stale) => stale(),
            Err(e) => unavailable(&e),
        };
        let asked = Asked {
            method: "DELETE",
            target: id,
            body: b"",
        };
        let who = once::Who::new(key, now, &self.plans);
        once::write(
            self.hooks.snapshot(),
            gone,
            self.max(key),
            once,
            asked,
            &who,
            answer,
        )
        .await
    }
}

/// A creation's answer as kept for a replay: its secret left out (a stored answer is no second
/// home for a signing secret; the replay takes it from the webhook, while it exists).
fn without_secret(a: &Answer) -> Option<drg_base::infra::records::once::Remembered> {
    let mut kept = once::remembered(a)?;
    if let Ok(mut body) = serde_json::from_str::<serde_json::Value>(&kept.body) {
        if let Some(secret) = body.get_mut("secret") {
            *secret = serde_json::Value::Null;
            kept.body = body.to_string();
        }
    }
    Some(kept)
}

fn full(max: u32) -> Answer {
    error_answer(
        StatusCode::CONFLICT,
        "conflict",
        "The project has as many webhooks as its plan allows; remove one first.",
        Some(&format!("max_webhooks: {max}")),
    )
}

fn stale() -> Answer {
    error_answer(
        StatusCode::CONFLICT,
        "conflict",
        "Another change to this webhook came first; read the list and try again.",
        None,
    )
}

fn unavailable(e: &RecordsError) -> Answer {
    log::warn!("webhooks: {e}");
    drg_base::answer::unavailable("The webhook store", None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(dir: &std::path::Path, max: Option<u32>) -> Webhooks {
        let plans = [(
            "free".to_owned(),
            PlanConfig {
                max_webhooks: max,
                ..PlanConfig::limit(100)
            },
        )];
        Webhooks::new(
            ProjectHooks::open(&super::super::tests::control_in(dir)),
            &WebhooksConfig::default(),
            plans.into(),
        )
    }

    fn json(a: &Answer) -> serde_json::Value {
        serde_json::from_slice(&a.body).unwrap()
    }

    /// Made at `1_800_000_000 + at` (ids sort by the second).
    async fn create_at(api: &Webhooks, key: &KeyEntry, url: &str, at: i64) -> Answer {
        let body = serde_json::json!({"url": url, "events": ["quota.threshold"]});
        let op = WebhooksOp::Create(Bytes::from(body.to_string()));
        api.answer(op, key, 1_800_000_000 + at, None).await
    }

    async fn create(api: &Webhooks, key: &KeyEntry, url: &str) -> Answer {
        create_at(api, key, url, 0).await
    }

    async fn list(api: &Webhooks, key: &KeyEntry, cursor: Option<&str>) -> serde_json::Value {
        // What the gateway's follower does before its lists answer.
        assert!(api.hooks.snapshot().sync().await);
        let op = WebhooksOp::List {
            cursor: cursor.map(str::to_owned),
            limit: 1,
        };
        json(&api.answer(op, key, 0, None).await)
    }

    #[tokio::test]
    async fn made_listed_without_secret_bounded_and_removed_per_project() {
        let dir = tempfile::tempdir().unwrap();
        let api = api(dir.path(), Some(2));
        let (acme, other) = (
            KeyEntry::for_tests("server", "acme"),
            KeyEntry::for_tests("theirs", "other"),
        );
        let made = create(&api, &acme, "https://a.example/h?token=t").await;
        assert_eq!(made.status, StatusCode::CREATED);
        let first = json(&made);
        let secret = first["secret"].as_str().unwrap().to_owned();
        assert!(secret.starts_with("whsec_"));
        assert_eq!(first["created_by"], "server");
        assert_eq!(first["created_at"], "2027-01-15T08:00:00Z");
        assert_eq!(first["events"], serde_json::json!(["quota.threshold"]));
        let id = first["id"].as_str().unwrap().to_owned();
        let second = json(&create_at(&api, &acme, "https://b.example/", 1).await);
        let full = create(&api, &acme, "https://c.example/").await;
        assert_eq!(full.status, StatusCode::CONFLICT);
        assert!(String::from_utf8_lossy(&full.body).contains("max_webhooks: 2"));

        let page = list(&api, &acme, None).await;
        assert_eq!(page["items"][0]["id"], id.as_str());
        assert_eq!(page["next_cursor"], id.as_str());
        assert!(page["items"][0].get("secret").is_none());
        let rest = list(&api, &acme, Some(&id)).await;
        assert_eq!(rest["items"][0]["id"], second["id"]);
        assert!(!serde_json::to_string(&rest).unwrap().contains(&secret));
        assert_eq!(
            list(&api, &other, None).await["items"],
            serde_json::json!([])
        );

        for (key, id, status) in [
            (&other, id.as_str(), StatusCode::NOT_FOUND),
            (&acme, "wh_nope", StatusCode::NOT_FOUND),
            (&acme, &id, StatusCode::NO_CONTENT),
            (&acme, &id, StatusCode::NOT_FOUND),
        ] {
            let op = WebhooksOp::Delete { id: id.into() };
            assert_eq!(api.answer(op, key, 0, None).await.status, status, "{id}");
        }
        assert_eq!(api.hooks().target("acme", &id), None);
        let gone = api
            .hooks()
            .snapshot()
            .held()
            .get("acme", &id)
            .cloned()
            .unwrap();
        assert!(gone.secret.is_empty() && gone.url.is_empty(), "{gone:?}");
        assert_eq!(
            create(&api, &acme, "https://c.example/").await.status,
            StatusCode::CREATED,
            "room again"
        );
    }

    #[tokio::test]
    async fn a_plan_of_no_webhooks_refuses_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let key = KeyEntry::for_tests("server", "acme");
        let refused = create(&api(dir.path(), Some(0)), &key, "https://a.example/").await;
        assert_eq!(refused.status, StatusCode::CONFLICT);
        let refused = create(&api(dir.path(), None), &key, "http://10.0.0.1/").await;
        assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
        let body = String::from_utf8_lossy(&refused.body);
        assert!(body.contains("a public address is needed"), "{body}");
    }
}
