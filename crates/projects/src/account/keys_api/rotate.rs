//! `POST /v1/keys/{id}/rotate`: a successor of an API-made key of the caller's project, its
//! secret shown once, and the old key kept working for an overlap (`overlap_hours`, default
//! `keys_api.rotate_overlap_hours`), on the managed file or the shared Redis store.
//!
//! The rules are revocation's (an API-made key of the caller's lineage: itself or a key it
//! made, recursively, any for an operator key; an operator key is `403`, another project's or
//! no key `404`), and a key may rotate itself. The old key's children are handed to the
//! successor, so deleting the old key after the overlap keeps them; the successor lives no
//! longer than its maker's lineage. What the rows
//! become is [`super::expiry`]'s. While the old key is in its overlap, the successor may take
//! the project one key over `max_keys`; the old key counts until it is deleted, so a further
//! rotation or make waits for that. On Redis a rotation is one script that compares the old
//! row with what was read: two gateways rotating one key at once make one successor.

use std::sync::Arc;

use bytes::Bytes;
use http::StatusCode;
use serde::Serialize;

use super::shared::Shared;
use super::{body, expiry, new_id, KeyItem, KeysApi, Refused};
use drg_access::keys::{generate_secret, id_problem, KeyEntry};
use drg_access::managed::{self, ManagedFile, ManagedKey};
use drg_access::shared_keys::Rotated;
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
        let rotation = Rotation {
            id,
            overlap_hours,
            secret,
        };
        self.store.rotate(self, caller, rotation).await
    }

    /// The `201` of a rotation: the successor as a made key (its secret shown this once), and
    /// the old key's id and the end of its overlap.
    pub(super) fn rotated_answer(
        &self,
        new: &ManagedKey,
        secret: &str,
        old: &ManagedKey,
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
        let successor = format!("successor {}", new.id);
        Answer::json(StatusCode::CREATED, &body).changed(Changed::new(
            Action::KeyRotated,
            &*old.id,
            successor,
        ))
    }

    /// A rotation in the managed file, under the publishing lock: the successor and the old
    /// key as rotated.
    pub(super) fn rotate_blocking(
        &self,
        caller: &KeyEntry,
        r: &Rotation,
    ) -> Result<(ManagedKey, ManagedKey), Refused> {
        let now = self.clock.now();
        let _publishing = self.publishing();
        managed::update(&self.file, |file: &mut ManagedFile| {
            let ours = |k: &ManagedKey| k.id == r.id && *k.project == *caller.project;
            let Some(at) = file.keys.iter().position(ours) else {
                return Err(self.not_revocable(caller, &r.id));
            };
            let old = &file.keys[at];
            let there = old
                .rotated_to
                .as_ref()
                .is_some_and(|to| file.keys.iter().any(|k| k.id == *to));
            expiry::rotatable(old, there, now).map_err(Refused::NotRotatable)?;
            // Counting the old key: the successor may take the project one over, not more.
            if self.held(caller, file) > caller.max_keys as usize {
                return Err(Refused::Full {
                    max: caller.max_keys,
                });
            }
            let mut new = expiry::successor(old, &r.secret, now);
            self.cap_successor(&mut new)?;
            new.id = self.free_id(file)?;
            let old = expiry::rotated(old, &new.id, now, r.overlap_hours);
            file.keys[at] = old.clone();
            expiry::hand_children(&mut file.keys, &old.id, &new.id);
            file.keys.push(new.clone());
            Ok((true, (new, old)))
        })
        .inspect(|_| self.publish())
    }

    /// A rotation on the shared store: the old row read, then one script that rotates it only
    /// if it is still as read (else read again).
    pub(super) async fn rotate_shared(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        caller: &KeyEntry,
        r: Rotation,
    ) -> Answer {
        let operator = self.operator_count(&caller.project);
        // Another rotation between the read and the script, or an id drawn twice, is rare;
        // a few rounds make a refusal for it unheard of.
        for _ in 0..8 {
            let now = self.clock.now();
            let (read, old) = match self.shared_row(shared, caller, &r.id).await {
                Ok(row) => row,
                Err(refused) => return refused.answer(),
            };
            let there = match &old.rotated_to {
                Some(to) => match shared.store.row(to).await {
                    Ok(row) => row.is_some(),
                    Err(e) => return unavailable(shared, &e),
                },
                None => false,
            };
            if let Err(why) = expiry::rotatable(&old, there, now) {
                return Refused::NotRotatable(why).answer();
            }
            let mut new = expiry::successor(&old, &r.secret, now);
            if let Err(refused) = self.cap_successor(&mut new) {
                return refused.answer();
            }
            new.id = match new_id() {
                Ok(id) => id,
                Err(e) => return ApiError::Internal(e.to_string()).into(),
            };
            if self.keys.load().by_id(&new.id).is_some() {
                continue;
            }
            let old = expiry::rotated(&old, &new.id, now, r.overlap_hours);
            let max = caller.max_keys;
            match shared.store.rotate(&read, &old, &new, operator, max).await {
                Ok(Rotated::Rotated) => {
                    return self.rotated_shared(shared, new, &r.secret, old).await
                }
                Ok(Rotated::Full) => return Refused::Full { max }.answer(),
                Ok(Rotated::IdTaken | Rotated::Changed) => continue,
                Ok(Rotated::Gone) => return self.not_revocable(caller, &r.id).answer(),
                Err(e) => {
                    shared.down(&e);
                    // A script whose reply did not come may still run: its successor, whose
                    // secret nobody was shown, is revoked as soon as Redis answers.
                    self.undo_create(shared, &new.project, &new.id).await;
                    return Refused::Unavailable.answer();
                }
            }
        }
        ApiError::Internal("no rotation in 8 rounds".into()).into()
    }

    /// The row of `id` in the shared store, as stored and as read, if it is an API-made key of
    /// the caller's project.
    async fn shared_row(
        &self,
        shared: &Shared,
        caller: &KeyEntry,
        id: &str,
    ) -> Result<(String, ManagedKey), Refused> {
        let read = match shared.store.row(id).await {
            Ok(read) => read,
            Err(e) => {
                shared.down(&e);
                return Err(Refused::Unavailable);
            }
        };
        shared.up();
        let row = read
            .as_deref()
            .and_then(|r| serde_json::from_str::<ManagedKey>(r).ok())
            .filter(|row| *row.project == *caller.project);
        match (read, row) {
            (Some(read), Some(row)) => Ok((read, row)),
            _ => Err(self.not_revocable(caller, id)),
        }
    }

    /// A rotation Redis made, written to the cache and published at once (others see it
    /// within a poll).
    async fn rotated_shared(
        self: &Arc<Self>,
        shared: &Arc<Shared>,
        new: ManagedKey,
        secret: &str,
        old: ManagedKey,
    ) -> Answer {
        shared.up();
        let (o, n) = (old.clone(), new.clone());
        let local = self
            .change_locally(shared, move |file| {
                file.keys.retain(|k| k.id != o.id && k.id != n.id);
                // As the script did in Redis.
                expiry::hand_children(&mut file.keys, &o.id, &n.id);
                file.keys.push(o);
                file.keys.push(n);
                Ok(true)
            })
            .await;
        if let Err(e) = local {
            // Redis has it: this gateway serves it from its next poll.
            log::warn!("keys API: a rotation is not in the cache yet: {e}");
        }
        self.rotated_answer(&new, secret, &old)
    }
}

/// The shared store did not answer: nothing changed.
fn unavailable(shared: &Shared, e: &drg_access::shared_keys::SharedKeysError) -> Answer {
    shared.down(e);
    Refused::Unavailable.answer()
}
