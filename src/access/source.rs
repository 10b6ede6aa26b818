//! The keys file as a hot-reloadable source: the operator's file read and checked, the
//! managed file of API-made keys merged in, and the demo key refused where it must be.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::keys::{parse_keys, KeyStore, KeysError};
use super::plan::PlanConfig;

/// The keys file as a hot-reloadable source.
#[derive(Debug, Clone)]
pub struct KeysSource {
    pub path: PathBuf,
    pub plans: BTreeMap<String, PlanConfig>,
    /// Refuse files that enable the demo key (set when listening beyond loopback).
    pub refuse_demo_key: bool,
    /// The gateway-managed file of API-made keys, merged in (see [`super::managed`]).
    pub managed: Option<PathBuf>,
    /// Shared with the keys API, which publishes snapshots too (see
    /// [`crate::data::reload::Reloadable::publish_lock`]).
    pub publish_lock: Arc<std::sync::Mutex<()>>,
    /// Record in the managed file when keys without `created_at` were first seen (the serving
    /// gateway; not `check-config` or `key new`, which change no state).
    pub record_first_seen: bool,
}

impl KeysSource {
    pub fn load(&self) -> Result<KeyStore, KeysError> {
        let origin = self.path.display().to_string();
        let text = std::fs::read_to_string(&self.path).map_err(|e| KeysError {
            origin: origin.clone(),
            problems: vec![format!("cannot read: {e}")],
        })?;
        let store = parse_keys(&text, &origin, &self.plans)?;
        let store = match &self.managed {
            Some(path) if self.record_first_seen => {
                let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                super::managed::fill_first_seen(path, store, &now)?
            }
            _ => store,
        };
        let store = match &self.managed {
            Some(path) => {
                let file = super::managed::read(path)?;
                let (store, warnings) = super::managed::merge(store, &file, &self.plans);
                for w in warnings {
                    log::warn!("{}: {w}", path.display());
                }
                store
            }
            None => store,
        };
        if self.refuse_demo_key && store.has_enabled_demo_key() {
            return Err(KeysError {
                origin,
                problems: vec![
                    "the public demo key is enabled while the gateway listens beyond loopback; \
                     disable or remove it, or set gateway.access.allow_demo_key: true"
                        .into(),
                ],
            });
        }
        if store.is_empty() {
            log::warn!(
                "{origin}: `keys: []`: no key is accepted, every call to /v1/ gets 401 until \
                 keys are added"
            );
        }
        Ok(store)
    }
}

impl crate::data::reload::Reloadable for KeysSource {
    type Snapshot = KeyStore;
    type Error = KeysError;

    fn name(&self) -> &str {
        "keys"
    }

    fn watched_files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.path.clone()];
        files.extend(self.managed.clone());
        files
    }

    fn succeed(&self, current: &KeyStore, next: &mut KeyStore) {
        next.carry_last_used(current);
    }

    fn publish_lock(&self) -> Option<&std::sync::Mutex<()>> {
        Some(&self.publish_lock)
    }

    fn build(&self) -> Result<KeyStore, KeysError> {
        self.load()
    }

    fn published(&self, store: &KeyStore) {
        if store.is_empty() {
            log::warn!("keys reloaded: 0 keys (the file says `keys: []`)");
        } else {
            log::info!("keys reloaded: {} keys", store.len());
        }
    }
}
