//! The account routes' dispatch: `/v1/usage`, `/v1/logs`, `/v1/stats` and `/v1/keys` answered
//! for the calling key from the parts that hold a project's data. The edge routes the request,
//! admits the key (reading its month) and reads a body; this picks and builds the answer.

use std::sync::Arc;

use crate::account::calls::Calls;
use crate::account::keys_api::{KeysApi, KeysOp};
use crate::account::usage::{self, Features};
use drg_access::keys::KeyEntry;
use drg_access::quota::{Clock, Usage};
use drg_base::answer::{Answer, ApiError};

/// An account route, as the edge routed it.
#[derive(Debug)]
pub enum AccountRoute<'r> {
    Usage,
    Logs {
        cursor: Option<&'r str>,
        limit: usize,
    },
    Stats,
    Keys(KeysOp),
}

/// What the account routes answer from; a part that is `None` is off, and its routes 404.
pub struct Account<'a> {
    /// Call logs, for `/v1/logs` and `/v1/stats`.
    pub calls: Option<&'a Calls>,
    /// `/v1/keys`.
    pub keys_api: Option<&'a Arc<KeysApi>>,
    /// What is on, for `/v1/usage`.
    pub features: Features,
    pub clock: &'a dyn Clock,
}

impl Account<'_> {
    /// The answer to `route` for the caller's `key` (`None`: no key passed, which the edge
    /// never lets through), whose month `usage` was read when the call was admitted.
    pub async fn answer(
        &self,
        route: AccountRoute<'_>,
        key: Option<&Arc<KeyEntry>>,
        usage: Option<&Usage>,
    ) -> Answer {
        match route {
            AccountRoute::Usage => match (key, usage) {
                (Some(key), Some(u)) => usage::usage(&key.plan, u, self.features),
                _ => ApiError::Internal("usage without a principal".into()).into(),
            },
            // `GET /v1/logs`: a page of the project's calls, newest first, within its retention.
            AccountRoute::Logs { cursor, limit } => match (self.calls, key) {
                (Some(calls), Some(key)) => {
                    usage::logs(calls, key, self.clock.now(), cursor, limit).await
                }
                _ => ApiError::NotFound.into(),
            },
            // `GET /v1/stats`: the project's calls per UTC day, the last 30 days.
            AccountRoute::Stats => match (self.calls, key) {
                (Some(calls), Some(key)) => {
                    let today = self.clock.now().date_naive();
                    usage::stats(calls, &key.project, today).await
                }
                _ => ApiError::NotFound.into(),
            },
            AccountRoute::Keys(op) => {
                let (Some(api), Some(caller)) = (self.keys_api, key) else {
                    return ApiError::NotFound.into();
                };
                let caller = caller.clone();
                match op {
                    KeysOp::List => api.list(&caller),
                    KeysOp::Create(body) => api.create(caller, body).await,
                    KeysOp::Revoke(id) => api.revoke(caller, id).await,
                    KeysOp::Rotate { id, body } => api.rotate(caller, id, body).await,
                }
            }
        }
    }
}
