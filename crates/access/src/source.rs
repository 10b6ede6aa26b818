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
    /// [`drg_base::reload::Reloadable::publish_lock`]).
    pub publish_lock: Arc<std::sync::Mutex<()>>,
    /// Record in the managed file when keys without `created_at` were first seen (the serving
    /// gateway; not `check-config` or `key new`, which change no state).
    pub record_first_seen: bool,
    /// Where a corrupt managed file was set aside, said until a managed file exists again.
    pub set_aside: Arc<std::sync::Mutex<Option<String>>>,
    /// With the shared Redis store (`managed` is then its cache): the pending revocations file,
    /// where keys whose maker is gone are queued for Redis (see [`super::shared_keys`]).
    pub shared_pending: Option<PathBuf>,
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
            Some(path) => self.with_managed(path, store),
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

impl KeysSource {
    /// The operator's keys with the managed file's merged in. Whatever state the managed file
    /// is in, the operator's keys (and so their revocations) apply: an unreadable one, one
    /// written by a newer gateway, or a corrupt one (set aside with a timestamp by the serving
    /// gateway) switches the API-made keys off (fail closed for them) with an ERROR line, and
    /// the store says why (`/readyz` on the admin listener, `drg_keys_managed_file_ok`).
    fn with_managed(&self, path: &std::path::Path, operator: KeyStore) -> KeyStore {
        use super::managed::{self, ManagedError, ManagedFile};
        let mut operator = operator;
        if self.record_first_seen {
            let now = drg_base::infra::units::now_rfc3339();
            if let Err(e) = managed::fill_first_seen(path, &mut operator, &now) {
                log::warn!("keys: first-seen times not recorded: {e}");
            }
        }
        let (file, problem) = match managed::read(path) {
            Ok(file) => (file, None),
            Err(e @ ManagedError::Format { .. }) if self.record_first_seen => {
                let aside = set_aside(path);
                log::error!(
                    "keys: {e}; set aside as {aside}; API-made keys are off until made again \
                     (the operator's keys work)"
                );
                let note = format!("corrupt, set aside as {aside}; API-made keys are gone");
                *self.note() = Some(note.clone());
                (ManagedFile::default(), Some(note))
            }
            Err(e) => {
                log::error!(
                    "keys: {e}; API-made keys are off meanwhile (the operator's keys work)"
                );
                (ManagedFile::default(), Some(e.to_string()))
            }
        };
        let merged = managed::merge(operator, &file, &self.plans);
        for w in &merged.warnings {
            log::warn!("{}: {w}", path.display());
        }
        if self.record_first_seen && !merged.revoked.is_empty() {
            if let Some(pending) = &self.shared_pending {
                let now = drg_base::infra::units::now_rfc3339();
                let queued = super::shared_keys::pending::queue_revoked(
                    pending,
                    &file,
                    &merged.revoked,
                    &now,
                );
                if let Err(e) = queued {
                    log::error!("keys: revocations of keys whose maker is gone not queued: {e}");
                }
            }
            match managed::remove_revoked(path, &merged.revoked) {
                Ok(n) => log::info!("keys: {n} API-made keys revoked with the key that made them"),
                Err(e) => log::error!("keys: revoked keys not removed from the file: {e}"),
            }
        }
        // Once a file exists again (a key made anew), the set-aside note has been read.
        if path.exists() {
            self.note().take();
        }
        let mut store = merged.store;
        store.set_managed_problem(problem.or_else(|| self.note().clone()));
        store
    }

    fn note(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.set_aside.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Renames a corrupt managed file to `<name>.corrupt-<UTC time>` (kept for the operator to
/// read); says where it went, or why it could not.
fn set_aside(path: &std::path::Path) -> String {
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".corrupt-{stamp}"));
    let aside = PathBuf::from(name);
    match std::fs::rename(path, &aside) {
        Ok(()) => aside.display().to_string(),
        Err(e) => format!("(not moved: {e})"),
    }
}

impl drg_base::reload::Reloadable for KeysSource {
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
