//! `POST /v1/keys/{id}/rotate`: a successor of an API-made key of the caller's project, its
//! secret shown once, and the old key kept working for an overlap (`overlap_hours`, default
//! `keys_api.rotate_overlap_hours`).
//!
//! The rules are revocation's (an API-made key of the caller's lineage: itself or a key it
//! made, recursively, any for an operator key; an operator key is `403`, another project's or
//! no key `404`), and a key may rotate itself. The old key's children are handed to the
//! successor, so deleting the old key after the overlap keeps them; the successor lives no
//! longer than its maker's lineage. What the rows
//! become is [`super::expiry`]'s. While the old key is in its overlap, the successor may take
//! the project one key over `max_keys`; the old key counts until it is deleted, so a further
//! rotation or make waits for that. A rotation is one transaction of the control store (the
//! successor, the old key's overlap, its children handed over, the audit entry): two gateways
//! rotating one key at once make one successor.

use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;
use serde::Serialize;

use super::{body, expiry, KeyItem, KeysApi, Refused};
use drg_access::keys::{generate_secret, id_problem, KeyEntry};
use drg_access::managed::ManagedKey;
use drg_base::answer::{Action, Answer, ApiError, Changed};

/// A rotation asked for: the old key's id, the overlap, the successor's secret.
pub(super) struct Rotation {
    pub id: String,
    pub overlap_hours: f64,
    pub secret: String,
}

impl KeysApi {
    /// `POST /v1/keys/{id}/rotate`: the successor of `id`, its secret in this answer only.
    pub async fn rotate(
        self: &Arc<Self>,
        caller: Arc<KeyEntry>,
        id: String,
        body: Bytes,
    ) -> Answer {
        if id_problem(&id).is_some() {
            return Refused::NotFound.answer();
        }
        if let Some(refused) = self.outside_lineage(&caller, &id) {
            return refused;
        }
        let default = f64::from(self.config.rotate_overlap_hours);
        let overlap_hours = match body::parse_overlap(&body, default) {
            Ok(h) => h,
            Err(a) => return a,
        };
        let secret = match generate_secret() {
            Ok(s) => s,
            Err(e) => return ApiError::Internal(e.to_string()).into(),
        };
        let r = Rotation {
            id,
            overlap_hours,
            secret,
        };
        let now = self.clock.now();
        let operator = self.operator_count(&caller.project);
        let max = caller.max_keys;
        let done = self.store.change(self, &caller, |file| {
            let Some(old) = file.keys.iter().find(|k| k.id == r.id).cloned() else {
                return Err(self.not_revocable(&caller, &r.id));
            };
            let old = &*old;
            let there =
                (old.rotated_to.as_ref()).is_some_and(|to| file.keys.iter().any(|k| k.id == *to));
            expiry::rotatable(old, there, now).map_err(Refused::NotRotatable)?;
            // Counting the old key: the successor may take the project one over, not more.
            if operator + file.keys.len() > max as usize {
                return Err(Refused::Full { max });
            }
            let mut new = expiry::successor(old, &r.secret, now);
            self.cap_successor(&mut new)?;
            new.id = self.free_id(file)?;
            let old = expiry::rotated(old, &new.id, now, r.overlap_hours);
            file.keys.replace(old.clone());
            expiry::hand_children(file.keys.values_mut(), &old.id, &new.id);
            file.keys.push(new.clone());
            let successor = format!("successor {}", new.id);
            let changed = Changed::new(Action::KeyRotated, &*old.id, successor);
            Ok(((new, old), changed))
        });
        match done.await {
            Ok(((new, old), changed)) => self.rotated_answer(&new, &r.secret, &old, changed),
            Err(refused) => refused.answer(),
        }
    }

    /// The `201` of a rotation: the successor as a made key (its secret shown this once), and
    /// the old key's id and the end of its overlap.
    pub(super) fn rotated_answer(
        &self,
        new: &ManagedKey,
        secret: &str,
        old: &ManagedKey,
        changed: Changed,
    ) -> Answer {
        self.rotated.inc();
        #[derive(Serialize)]
        struct Previous<'a> {
            id: &'a str,
            expires_at: Option<&'a str>,
        }
        #[derive(Serialize)]
        struct Body<'a> {
            #[serde(flatten)]
            item: KeyItem<'a>,
            key: &'a str,
            previous: Previous<'a>,
        }
        let previous = Previous {
            id: &old.id,
            expires_at: old.expires_at.as_deref(),
        };
        let body = Body {
            item: KeyItem::of_row(new),
            key: secret,
            previous,
        };
        Answer::json(StatusCode::CREATED, &body).changed(changed)
    }
}
