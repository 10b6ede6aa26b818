//! Where API-made keys are kept, behind one trait like the quota and call stores: the managed
//! file alone (`FileKeys`: one host, or gateways sharing its folder), or the shared Redis store
//! with the file as its cache (`shared::Shared`, with the Redis quota store).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use http::StatusCode;

use super::rotate::Rotation;
use super::shared::Shared;
use super::{KeysApi, NewKey};
use drg_access::keys::KeyEntry;
use drg_access::managed::ManagedFile;
use drg_base::answer::{Action, Answer, ApiError, Changed};

/// The store behind `/v1/keys`: making, revoking and rotating a key, saving when keys were
/// last used.
#[async_trait]
pub(super) trait KeysStore: Send + Sync {
    /// `POST /v1/keys`: `new` made in `caller`'s project, `secret` its secret.
    async fn create(
        &self,
        api: &Arc<KeysApi>,
        caller: Arc<KeyEntry>,
        new: NewKey,
        secret: String,
    ) -> Answer;
    /// `DELETE /v1/keys/{id}` (the id already checked for shape and self-revocation).
    async fn revoke(&self, api: &Arc<KeysApi>, caller: Arc<KeyEntry>, id: String) -> Answer;
    /// `POST /v1/keys/{id}/rotate` (the id checked for shape, the body read).
    async fn rotate(&self, api: &Arc<KeysApi>, caller: Arc<KeyEntry>, r: Rotation) -> Answer;
    /// Saves when the API-made keys were last used.
    async fn save_last_used(&self, api: &Arc<KeysApi>);
    /// A snapshot was published from `file`; `revoked`: keys whose maker is gone.
    fn published(&self, _file: &ManagedFile, _revoked: &[String]) {}
    /// The store's state for the admin `/readyz` (`None`: nothing to report).
    fn status(&self) -> Option<serde_json::Value> {
        None
    }
}

/// The managed file alone: every change under the publishing lock, on a blocking thread.
pub(super) struct FileKeys;

#[async_trait]
impl KeysStore for FileKeys {
    async fn create(
        &self,
        api: &Arc<KeysApi>,
        caller: Arc<KeyEntry>,
        new: NewKey,
        secret: String,
    ) -> Answer {
        let worker = api.clone();
        let made = tokio::task::spawn_blocking(move || {
            worker
                .create_blocking(&caller, new, &secret)
                .map(|k| (k, secret))
        })
        .await;
        match made {
            Ok(Ok((key, secret))) => api.created(&key, &secret),
            Ok(Err(refused)) => refused.answer(),
            Err(e) => ApiError::Internal(e.to_string()).into(),
        }
    }

    async fn revoke(&self, api: &Arc<KeysApi>, caller: Arc<KeyEntry>, id: String) -> Answer {
        let worker = api.clone();
        let target = id.clone();
        match tokio::task::spawn_blocking(move || worker.revoke_blocking(&caller, &id)).await {
            Ok(Ok(())) => {
                api.revoked.inc();
                Answer::raw(StatusCode::NO_CONTENT, Bytes::new()).changed(Changed::new(
                    Action::KeyRevoked,
                    target,
                    "",
                ))
            }
            Ok(Err(refused)) => refused.answer(),
            Err(e) => ApiError::Internal(e.to_string()).into(),
        }
    }

    async fn rotate(&self, api: &Arc<KeysApi>, caller: Arc<KeyEntry>, r: Rotation) -> Answer {
        let worker = api.clone();
        let made = tokio::task::spawn_blocking(move || {
            worker
                .rotate_blocking(&caller, &r)
                .map(|(new, old)| (new, old, r.secret))
        })
        .await;
        match made {
            Ok(Ok((new, old, secret))) => api.rotated_answer(&new, &secret, &old),
            Ok(Err(refused)) => refused.answer(),
            Err(e) => ApiError::Internal(e.to_string()).into(),
        }
    }

    async fn save_last_used(&self, api: &Arc<KeysApi>) {
        let api = api.clone();
        let _ = tokio::task::spawn_blocking(move || api.save_last_used()).await;
    }
}

/// The shared Redis store (`shared.rs` holds what each call does).
#[async_trait]
impl KeysStore for Arc<Shared> {
    async fn create(
        &self,
        api: &Arc<KeysApi>,
        caller: Arc<KeyEntry>,
        new: NewKey,
        secret: String,
    ) -> Answer {
        api.create_shared(self, &caller, new, &secret).await
    }

    async fn revoke(&self, api: &Arc<KeysApi>, caller: Arc<KeyEntry>, id: String) -> Answer {
        api.revoke_shared(self, &caller, &id).await
    }

    async fn rotate(&self, api: &Arc<KeysApi>, caller: Arc<KeyEntry>, r: Rotation) -> Answer {
        api.rotate_shared(self, &caller, r).await
    }

    async fn save_last_used(&self, api: &Arc<KeysApi>) {
        api.save_last_used_shared(self).await;
    }

    fn published(&self, file: &ManagedFile, revoked: &[String]) {
        // Keys whose maker is gone are revoked in Redis too (the cache only follows it).
        self.queue_orphans(file, revoked);
    }

    fn status(&self) -> Option<serde_json::Value> {
        Some(Shared::status(self))
    }
}
