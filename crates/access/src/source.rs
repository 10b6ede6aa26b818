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
    /// The API-made keys as the control store last gave them (`None` until the first read: the
    /// cache file `managed` is read meanwhile). Set by the keys API, read here, so that a reload
    /// of the keys file never serves a cache older than what this gateway holds.
    pub held: Arc<arc_swap::ArcSwapOption<super::managed::ManagedFile>>,
    /// Where keys whose maker is gone (an operator key removed from the keys file) are told, so
    /// that the control store drops them too (the serving gateway only).
    /// Set by the keys API once it runs (the source is made before it).
    pub orphans: Arc<std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<Vec<String>>>>,
    /// What a maker absent from the keys file means: gone (one gateway's own store), or
    /// perhaps another gateway's (a shared store; see [`super::managed::Makers`]).
    pub makers: super::managed::Makers,
    /// Until when (unix seconds) API-made keys are vouched for (see
    /// [`super::keys::KeyStore::unverified_at`]): set from the cache's `read_at` until the
    /// control store is read, then by the keys API at each read.
    pub verified_until: Arc<std::sync::atomic::AtomicI64>,
    /// How long a read of the control store vouches for API-made keys, in seconds.
    pub trust_seconds: i64,
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
        let (mut file, problem) = match managed::read(path) {
            Ok(file) => (file, None),
            // What the control store gave stands whatever state its cache is in.
            Err(e) if self.held.load().is_some() => {
                log::warn!("keys: {e}; the keys the control store gave are served");
                (ManagedFile::default(), None)
            }
            Err(e @ ManagedError::Format { .. }) if self.record_first_seen => {
                let aside = set_aside(path);
                log::error!(
                    "keys: {e}; set aside as {aside}; API-made keys are off until the control \
                     store is read (the operator's keys work)"
                );
                let note = format!("corrupt, set aside as {aside}");
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
        match self.held.load_full() {
            Some(held) => {
                file.keys.clone_from(&held.keys);
                file.retired.clone_from(&held.retired);
            }
            // The cache vouches for its keys only as long after the store last answered.
            None if self.record_first_seen => {
                let until = managed::read_at(path, &file).map_or(0, |t| t + self.trust_seconds);
                (self.verified_until).store(until, std::sync::atomic::Ordering::Relaxed);
            }
            None => {}
        }
        let merged = managed::merge(operator, &file, &self.plans, self.makers);
        for w in &merged.warnings {
            log::warn!("{}: {w}", path.display());
        }
        if self.record_first_seen && !merged.revoked.is_empty() {
            // Gone from what is held at once: a maker added back before the control store drops
            // them brings none of them back.
            self.held.rcu(|held| {
                held.as_ref().map(|f| {
                    let mut f = super::managed::ManagedFile::clone(f);
                    super::managed::without_descendants(&mut f, &merged.revoked);
                    Arc::new(f)
                })
            });
            if let Some(orphans) = self.orphans.get() {
                // The receiver gone (shutting down): the next start finds them again.
                let _ = orphans.send(merged.revoked.clone());
            }
        }
        // Once the cache is written again (the control store read), the set-aside note is old.
        if path.exists() || self.held.load().is_some() {
            self.note().take();
        }
        let mut store = merged.store;
        store.set_managed_problem(problem.or_else(|| self.note().clone()));
        store.share_verified(&self.verified_until);
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
    // Its key files go with it (one of them may be what does not read).
    let keys = super::managed::key_files::folder(path);
    if keys.exists() {
        if let Err(e) = std::fs::rename(&keys, super::managed::key_files::folder(&aside)) {
            log::warn!("keys: {} not set aside: {e}", keys.display());
        }
    }
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

    /// The operator's file only: the API-made keys' cache is read, not watched (the keys API
    /// publishes what the control store gives as it holds it).
    fn watched_files(&self) -> Vec<PathBuf> {
        vec![self.path.clone()]
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
