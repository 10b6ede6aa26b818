//! `/v1/keys`: a project lists its keys, makes new ones (the secret shown once) and revokes
//! those it made, within its plan's `max_keys`.
//!
//! API-made keys live in the control store ([`control`]: SQLite in the state folder, or
//! PostgreSQL for several gateways), never in the operator's keys file; operator keys are
//! listed but cannot be deleted here (403). After each change this gateway swaps its key
//! snapshot at once (a revoked key stops working on the next request); other gateways follow
//! the store's revision (within a second on PostgreSQL, its `NOTIFY`; a poll behind it).
//!
//! A key may be made to expire (`expires_in_days`) and be rotated ([`rotate`]): a successor
//! made, the old key working for an overlap. Expiry is judged at each call on each gateway's
//! clock from the row's `expires_at` ([`expiry`]), so it needs no sync.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::{ArcSwap, ArcSwapOption};
use bytes::Bytes;
use http::StatusCode;
use prometheus::IntCounter;
use serde::Serialize;

use crate::account::config::KeysApiConfig;
use body::{parse_new_key, NewKey};
use drg_access::keys::{
    generate_secret, hash_secret, id_problem, key_prefix, KeyEntry, KeyOrigin, KeyStore,
};
use drg_access::managed::{self, ManagedFile, ManagedKey};
use drg_access::plan::PlanConfig;
use drg_access::quota::Clock;
use drg_base::answer::{Action, Answer, Changed};
use drg_base::infra::control::Control;
use drg_base::infra::units::utc_seconds;

pub mod body;
pub mod control;
pub mod expiry;
pub mod legacy;
pub mod lineage;
pub mod retire;
pub mod revived;
mod rotate;

/// A `/v1/keys` request, its id decoded and its body read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeysOp {
    List,
    Create(Bytes),
    Revoke(String),
    /// `POST /v1/keys/{id}/rotate`, with its (maybe empty) body.
    Rotate {
        id: String,
        body: Bytes,
    },
}

/// How often, in seconds, the cache notes that the control store answered.
const NOTE_READ_EVERY: i64 = 30;

/// The keys API's state: the snapshot it swaps, the store it writes, its counters.
pub struct KeysApi {
    keys: Arc<ArcSwap<KeyStore>>,
    /// The API-made keys as the control store last gave them (shared with the keys reloader).
    held: Arc<ArcSwapOption<ManagedFile>>,
    /// Their cache in the state folder (read at start until the store answers).
    file: PathBuf,
    plans: BTreeMap<String, PlanConfig>,
    pub config: KeysApiConfig,
    /// Shared with the keys reloader: what is held is replaced and its snapshot stored under
    /// it, so no snapshot built before a change is stored after it (a revoked key never comes
    /// back).
    publishing: Arc<std::sync::Mutex<()>>,
    created: IntCounter,
    revoked: IntCounter,
    rotated: IntCounter,
    /// The gateway's clock (the one every call's expiry is judged on): when keys are made and
    /// when they expire.
    clock: Arc<dyn Clock>,
    /// Where the API-made keys are kept.
    store: control::ControlKeys,
    /// Until when the store's last read vouches for API-made keys (shared with the keys
    /// reloader; see [`KeyStore::unverified_at`]), and when that was last noted in the cache.
    verified_until: Arc<std::sync::atomic::AtomicI64>,
    noted_read: std::sync::atomic::AtomicI64,
    /// Told when what is held moved: [`CacheSaver`] writes it to the cache.
    cache_due: tokio::sync::Notify,
    /// What the cache was last written from (`None`: not yet by this run).
    cached: std::sync::Mutex<Option<Arc<ManagedFile>>>,
}

/// One key as `/v1/keys` shows it (field names are the ones existing clients read).
#[derive(Debug, Serialize)]
pub struct KeyItem<'a> {
    pub id: &'a str,
    pub label: Option<&'a str>,
    pub key_prefix: Option<&'a str>,
    pub created_at: Option<&'a str>,
    pub last_used_at: Option<String>,
    pub origins: &'a [String],
    /// `operator` (the keys file: revoked by editing it) or `api` (made through `/v1/keys`).
    pub source: &'static str,
    /// The key that made it (API-made keys; revoking that key revokes this one).
    pub created_by: Option<&'a str>,
    /// When it stops (or stopped) working, RFC 3339 UTC; `null`: never.
    pub expires_at: Option<String>,
    /// The key that replaced it (`POST /v1/keys/{id}/rotate`).
    pub rotated_to: Option<&'a str>,
}

impl<'a> KeyItem<'a> {
    fn of(k: &'a KeyEntry) -> Self {
        KeyItem {
            id: &k.id,
            label: k.label.as_deref(),
            key_prefix: k.key_prefix.as_deref(),
            created_at: k.created_at.as_deref(),
            last_used_at: (k.last_used_at())
                .and_then(|unix| utc_seconds(i64::try_from(unix).ok()?)),
            origins: &k.origin_list,
            source: match k.source {
                KeyOrigin::Operator => "operator",
                KeyOrigin::Api => "api",
            },
            created_by: k.created_by.as_deref(),
            expires_at: k.expires_at.and_then(utc_seconds),
            rotated_to: k.rotated_to.as_deref(),
        }
    }

    /// An API-made key's row as listed (the key of a `201`).
    fn of_row(key: &'a ManagedKey) -> Self {
        KeyItem {
            id: &key.id,
            label: key.label.as_deref(),
            key_prefix: Some(&key.prefix),
            created_at: Some(&key.created_at),
            last_used_at: None,
            origins: &key.origins,
            source: "api",
            created_by: key.created_by.as_deref(),
            expires_at: key.expires_at.clone(),
            rotated_to: key.rotated_to.as_deref(),
        }
    }
}

/// An error answer in the contract's shape, for the statuses only this API uses (409) or
/// with its own message.
fn error(status: StatusCode, code: &str, message: &str, detail: Option<&str>) -> Answer {
    #[derive(Serialize)]
    struct Body<'a> {
        error: &'a str,
        message: &'a str,
        detail: Option<&'a str>,
    }
    Answer::json(
        status,
        &Body {
            error: code,
            message,
            detail,
        },
    )
}

/// Why a change could not be made (each is an answer).
enum Refused {
    /// The project holds `max_keys` keys already.
    Full {
        max: u32,
    },
    NotFound,
    Operator,
    /// The caller is an operator key `key sync` retired (this gateway's keys file is behind).
    Retired,
    /// Rotating a key already rotated, or expired.
    NotRotatable(expiry::NotRotatable),
    /// No id could be drawn (the system's random source failed).
    Internal(String),
    /// The control store did not answer: nothing was changed, then or later.
    Unavailable,
}

impl Refused {
    fn answer(self) -> Answer {
        match self {
            Refused::Full { max } => error(
                StatusCode::CONFLICT,
                "conflict",
                "The project has as many keys as its plan allows; revoke one first.",
                Some(&format!("max_keys: {max}")),
            ),
            Refused::NotFound => error(
                StatusCode::NOT_FOUND,
                "not_found",
                "No key with this id in the project.",
                None,
            ),
            Refused::Operator => error(
                StatusCode::FORBIDDEN,
                "forbidden",
                "This key is managed by the operator (keys file); it cannot be revoked or rotated through the API.",
                None,
            ),
            Refused::Retired => error(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "This key was retired from the key store (`key sync`).",
                None,
            ),
            Refused::NotRotatable(expiry::NotRotatable::Rotated { to }) => error(
                StatusCode::CONFLICT,
                "conflict",
                "This key was rotated already; rotate its successor instead.",
                Some(&format!("rotated_to: {to}")),
            ),
            Refused::NotRotatable(expiry::NotRotatable::Expired { at }) => error(
                StatusCode::CONFLICT,
                "conflict",
                "This key has expired; make a new key instead.",
                Some(&format!("expired at {at}")),
            ),
            Refused::Internal(e) => {
                log::error!("keys API: {e}");
                drg_base::answer::ApiError::Internal("no key id could be drawn".into()).into()
            }
            Refused::Unavailable => drg_base::answer::unavailable("The key store", None),
        }
    }
}

impl KeysApi {
    /// The keys API on `control`, holding what it reads in `held` (shared with the keys
    /// reloader) and its cache in `file`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        keys: Arc<ArcSwap<KeyStore>>,
        (held, verified_until): (
            Arc<ArcSwapOption<ManagedFile>>,
            Arc<std::sync::atomic::AtomicI64>,
        ),
        file: PathBuf,
        control: &Arc<Control>,
        plans: BTreeMap<String, PlanConfig>,
        config: KeysApiConfig,
        publishing: Arc<std::sync::Mutex<()>>,
        clock: Arc<dyn Clock>,
        metrics: &drg_telemetry::metrics::Metrics,
    ) -> Result<Self, prometheus::Error> {
        let changes = metrics.counter_vec(
            "drg_keys_api_changes_total",
            "Keys made (created), revoked (revoked) and rotated (rotated) through /v1/keys.",
            &["action"],
        )?;
        Ok(KeysApi {
            keys,
            held,
            file,
            plans,
            config,
            publishing,
            created: changes.with_label_values(&["created"]),
            revoked: changes.with_label_values(&["revoked"]),
            rotated: changes.with_label_values(&["rotated"]),
            clock,
            store: control::ControlKeys::new(control),
            verified_until,
            noted_read: std::sync::atomic::AtomicI64::new(0),
            cache_due: tokio::sync::Notify::new(),
            cached: std::sync::Mutex::new(None),
        })
    }

    /// The control store answered now: it vouches for the API-made keys held for
    /// `keys_api.unverified_after_seconds` more, noted in the cache (at most every
    /// [`NOTE_READ_EVERY`] seconds) for a start while the store is away.
    async fn vouched(self: &Arc<Self>) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = self.clock.now().timestamp();
        let trust = i64::try_from(self.config.unverified_after.as_secs()).unwrap_or(i64::MAX);
        self.verified_until
            .store(now.saturating_add(trust), Relaxed);
        if now - self.noted_read.load(Relaxed) < NOTE_READ_EVERY {
            return;
        }
        self.noted_read.store(now, Relaxed);
        let api = self.clone();
        let noted = tokio::task::spawn_blocking(move || {
            let _publishing = api.publishing();
            managed::note_read(&api.file, now)
        });
        if let Ok(Err(e)) = noted.await {
            log::warn!("keys API: when the control store last answered was not noted: {e}");
        }
    }

    /// Where keys whose maker is gone are told (for the keys reloader).
    pub fn orphans(&self) -> tokio::sync::mpsc::UnboundedSender<Vec<String>> {
        self.store.orphans()
    }

    /// The key store's state for the admin `/readyz`: the engine and the revision held.
    pub fn store_status(&self) -> serde_json::Value {
        self.store.status()
    }

    /// The last time the store's revision of keys went back, if it did in this run.
    pub fn went_back(&self) -> Option<drg_base::infra::records::snapshot::WentBack> {
        self.store.went_back()
    }

    /// How long `plan` keeps its audit trail.
    fn audit_days(&self, plan: &str) -> u32 {
        (self.plans.get(plan)).map_or(drg_access::plan::DEFAULT_AUDIT_DAYS, |p| {
            p.audit_retention_days()
        })
    }

    /// The cache of the API-made keys.
    pub fn file(&self) -> &std::path::Path {
        &self.file
    }

    /// `GET /v1/keys`: the caller's project's keys, by id.
    pub fn list(&self, caller: &KeyEntry) -> Answer {
        #[derive(Serialize)]
        struct List<'a> {
            items: Vec<KeyItem<'a>>,
        }
        let keys = self.keys.load();
        let items = keys
            .project_keys(&caller.project)
            .iter()
            .map(|k| KeyItem::of(k))
            .collect();
        Answer::json(StatusCode::OK, &List { items })
    }

    /// `POST /v1/keys`: a new key in the caller's project, its secret in this answer only.
    pub async fn create(self: &Arc<Self>, caller: Arc<KeyEntry>, body: Bytes) -> Answer {
        let mut new = match parse_new_key(&body) {
            Ok(new) => new,
            Err(a) => return a,
        };
        match self.lineage_end(&caller, new.expires_in_days) {
            Ok(until) => new.until = until,
            Err(refused) => return refused,
        }
        let secret = match generate_secret() {
            Ok(s) => s,
            Err(e) => return drg_base::answer::ApiError::Internal(e.to_string()).into(),
        };
        let mut key = self.new_row(&caller, new, &secret);
        let operator = self.operator_count(&caller.project);
        let max = caller.max_keys;
        let made = self.store.change(self, &caller, |file| {
            // Expired keys count until they are deleted.
            if operator + file.keys.len() >= max as usize {
                return Err(Refused::Full { max });
            }
            key.id = self.free_id(file)?;
            file.keys.push(key.clone());
            let changed = Changed::new(Action::KeyCreated, &*key.id, "");
            Ok((key, changed))
        });
        match made.await {
            Ok((key, changed)) => self.created(&key, &secret, changed),
            Err(refused) => refused.answer(),
        }
    }

    /// When a key `caller` makes for `days` days ends (unix seconds; `None`: never): never after
    /// the caller's lineage ends ([`lineage`]); asked for longer, `422`; a lineage that ended
    /// makes no key (`403`).
    fn lineage_end(&self, caller: &KeyEntry, days: Option<u32>) -> Result<Option<i64>, Answer> {
        let keys = self.keys.load();
        let end = lineage::earliest(caller.expires_at, lineage::end_of(&**keys, &caller.id));
        let now = self.clock.now().timestamp();
        lineage::new_key_end(now, days, end).map_err(|why| {
            let at = |t: i64| utc_seconds(t).unwrap_or_default();
            match why {
                lineage::TooLong::Ended(t) => error(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    "This key's lineage has expired: an expired key makes no keys.",
                    Some(&format!("expired at {}", at(t))),
                ),
                lineage::TooLong::Outlives(t) => {
                    drg_base::answer::ApiError::Validation(format!(
                        "expires_in_days: this key's lineage ends at {}; a key it makes cannot outlive it (leave expires_in_days out to inherit that end)",
                        at(t)
                    ))
                    .into()
                }
            }
        })
    }

    /// Whether `caller` may rotate or revoke `id`: `None` if so (or if the store must say
    /// whose `id` is), else the refusal. A key manages itself and the keys it made, recursively;
    /// an operator key every API-made key of its project ([`lineage::manages`]). A key not in
    /// this gateway's snapshot is no API-made key's to manage (`404`): only an operator key's
    /// call goes on to the store.
    fn outside_lineage(&self, caller: &KeyEntry, id: &str) -> Option<Answer> {
        let keys = self.keys.load();
        match keys.by_id(id) {
            Some(t) if t.project == caller.project => (!lineage::manages(&**keys, caller, id))
                .then(|| {
                    error(
                        StatusCode::FORBIDDEN,
                        "forbidden",
                        "A key may manage only itself and the keys it made (and theirs).",
                        None,
                    )
                }),
            _ if caller.source == KeyOrigin::Operator => None,
            _ => Some(Refused::NotFound.answer()),
        }
    }

    /// Caps `new`'s expiry at the end of its maker's lineage (a rotation's successor lives no
    /// longer than the key that made its predecessor); a lineage that ended refuses it.
    fn cap_successor(&self, new: &mut ManagedKey) -> Result<(), Refused> {
        let keys = self.keys.load();
        let Some(end) = (new.created_by.as_deref()).and_then(|m| lineage::end_of(&**keys, m))
        else {
            return Ok(());
        };
        let asked = (new.expires_at.as_deref())
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp());
        let capped = lineage::earliest(asked, Some(end)).unwrap_or(end);
        let at = utc_seconds(capped).unwrap_or_default();
        if capped <= self.clock.now().timestamp() {
            return Err(Refused::NotRotatable(expiry::NotRotatable::Expired { at }));
        }
        new.expires_at = Some(at);
        Ok(())
    }

    /// The `201` of a key made, its secret in it (shown this once).
    fn created(&self, key: &ManagedKey, secret: &str, changed: Changed) -> Answer {
        self.created.inc();
        #[derive(Serialize)]
        struct Created<'a> {
            #[serde(flatten)]
            item: KeyItem<'a>,
            key: &'a str,
        }
        let item = KeyItem::of_row(key);
        Answer::json(StatusCode::CREATED, &Created { item, key: secret }).changed(changed)
    }

    /// A new key's row (its id still to be drawn), made by `caller` now.
    fn new_row(&self, caller: &KeyEntry, new: NewKey, secret: &str) -> ManagedKey {
        let NewKey {
            label,
            origins,
            expires_in_days,
            until,
        } = new;
        let now = self.clock.now();
        ManagedKey {
            id: String::new(),
            project: caller.project.to_string(),
            plan: caller.plan.to_string(),
            label,
            sha256: hex::encode(hash_secret(secret)),
            prefix: key_prefix(secret).to_owned(),
            created_at: drg_base::infra::units::rfc3339(now),
            last_used: None,
            origins,
            created_by: Some(caller.id.to_string()),
            expires_at: until.and_then(utc_seconds),
            expires_in_days,
            rotated_to: None,
            unknown: Default::default(),
        }
    }

    /// The operator's keys of `project` in service (what `max_keys` counts besides the
    /// API-made ones).
    fn operator_count(&self, project: &str) -> usize {
        self.keys
            .load()
            .project_keys(project)
            .iter()
            .filter(|k| k.source == KeyOrigin::Operator)
            .count()
    }

    /// An id no key has, in the snapshot or the project's rows (the store's key refuses one
    /// another project holds, a chance of 2^-48).
    fn free_id(&self, file: &ManagedFile) -> Result<String, Refused> {
        let current = self.keys.load();
        loop {
            let id = new_id().map_err(|e| Refused::Internal(e.to_string()))?;
            if current.by_id(&id).is_none() && !file.keys.iter().any(|k| k.id == id) {
                return Ok(id);
            }
        }
    }

    /// `DELETE /v1/keys/{id}`: revokes an API-made key of the caller's project.
    pub async fn revoke(self: &Arc<Self>, caller: Arc<KeyEntry>, id: String) -> Answer {
        if *caller.id == *id {
            return error(
                StatusCode::CONFLICT,
                "conflict",
                "A key cannot revoke itself; use another key of the project.",
                None,
            );
        }
        if id_problem(&id).is_some() {
            return Refused::NotFound.answer();
        }
        if let Some(refused) = self.outside_lineage(&caller, &id) {
            return refused;
        }
        let done = self.store.change(self, &caller, |file| {
            // The key and every key it made, recursively (all of the caller's project).
            let ours = file.keys.iter().any(|k| k.id == id);
            if ours && managed::without_descendants(file, std::slice::from_ref(&id)) > 0 {
                return Ok(((), Changed::new(Action::KeyRevoked, &*id, "")));
            }
            Err(self.not_revocable(&caller, &id))
        });
        match done.await {
            Ok(((), changed)) => {
                self.revoked.inc();
                Answer::raw(StatusCode::NO_CONTENT, Bytes::new()).changed(changed)
            }
            Err(refused) => refused.answer(),
        }
    }

    /// Why `id` is not an API-made key of the caller's project to revoke: an operator key of
    /// it is 403, anything else (another project's key, no such key) is 404 and says nothing
    /// about other projects.
    fn not_revocable(&self, caller: &KeyEntry, id: &str) -> Refused {
        match self.keys.load().by_id(id) {
            Some(k) if k.project == caller.project && k.source == KeyOrigin::Operator => {
                Refused::Operator
            }
            _ => Refused::NotFound,
        }
    }

    /// The publishing lock (see the field). A poisoned one guards no data of its own.
    fn publishing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.publishing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds `rows` (the store's, read or changed here): in what the keys reloader merges, in
    /// the cache file, and in a snapshot swapped in at once. Blocking (the cache is written
    /// under the publishing lock). The keys file is not re-read: a broken edit of it in
    /// progress must not stop a revocation from taking effect.
    fn hold_blocking(&self, rows: control::Rows) -> Vec<String> {
        let _publishing = self.publishing();
        let held = self.held.load_full();
        // What is served now was made from what was held, or before the first read from the
        // cache.
        let served = held
            .clone()
            .or_else(|| managed::read(&self.file).ok().map(Arc::new));
        let mut seen = served
            .as_ref()
            .map_or_else(Default::default, |f| f.revoked_seen.clone());
        let now = self.clock.now().timestamp();
        let Sifted {
            keys,
            retired,
            revived,
            moved: keys_moved,
            changed,
        } = sift_rows(rows, held.as_deref(), served.as_deref(), &mut seen, now);
        let file = Arc::new(ManagedFile {
            revoked_seen: seen,
            ..ManagedFile::of_store(keys, retired)
        });
        // The same keys need no new snapshot (nor a rebuild by the keys reloader).
        let same = !keys_moved
            && served
                .as_ref()
                .is_some_and(|f| f.revoked_seen == file.revoked_seen);
        self.held.store(Some(file.clone()));
        if !same {
            // Written behind the change (see `CacheSaver`): the database has it already.
            self.cache_due.notify_one();
        }
        if !keys_moved {
            return revived;
        }
        let current = self.keys.load_full();
        // A store made from what was held (not one whose API-made keys are off) takes the
        // projects read alone; anything else is merged whole.
        let by_project = changed
            .filter(|_| current.managed_problem().is_none())
            .and_then(|(read, rows)| {
                let read: HashSet<&str> = read.iter().map(String::as_str).collect();
                let makers = self.store.makers();
                managed::merge_projects(&current, &read, &rows, &self.plans, makers)
            });
        let whole = by_project.is_none();
        let merged = by_project.unwrap_or_else(|| {
            managed::merge(
                current.operator_keys(),
                &file,
                &self.plans,
                self.store.makers(),
            )
        });
        for w in &merged.warnings {
            log::warn!("keys API: {w}");
        }
        if !merged.revoked.is_empty() {
            // The receiver gone (shutting down): the next start finds them again.
            let _ = self.store.orphans().send(merged.revoked);
        }
        let mut next = merged.store;
        next.set_managed_problem(None);
        next.share_verified(&self.verified_until);
        if whole {
            next.carry_last_used(&current);
        }
        self.keys.store(Arc::new(next));
        revived
    }
}

/// What rows read or changed make of what is held (see [`sift_rows`]).
struct Sifted {
    /// The keys to hold, and the operator keys retired.
    keys: managed::Rows,
    retired: Vec<String>,
    /// Keys kept out as seen revoked (a restore brought them back).
    revived: Vec<String>,
    /// Whether the keys or the retired ids differ from what is served.
    moved: bool,
    /// The projects read and their rows, when the rest is as held: only they are merged again.
    changed: Option<(HashSet<String>, Vec<Arc<ManagedKey>>)>,
}

/// Sifts `rows` against what is `held` (or, before the first read, `served` from the cache):
/// keys seen revoked are kept out, keys gone since are noted in `seen`. Rows of some projects
/// read onto what is held touch those projects alone.
fn sift_rows(
    rows: control::Rows,
    held: Option<&ManagedFile>,
    served: Option<&ManagedFile>,
    seen: &mut BTreeMap<String, i64>,
    now: i64,
) -> Sifted {
    let (mut keys, retired, restored) = match (rows, held) {
        (control::Rows::Projects(projects), Some(held)) => {
            let order: Vec<String> = projects.iter().map(|(p, _)| p.clone()).collect();
            let mut rows: Vec<Arc<ManagedKey>> =
                projects.into_iter().flat_map(|(_, r)| r).collect();
            // The other projects' keys are as held (shared, not copied): only the projects
            // read are sifted.
            let before: Vec<Arc<ManagedKey>> = (order.iter())
                .flat_map(|p| held.keys.project(p))
                .cloned()
                .collect();
            let revived = revived::sift(&before, &mut rows, seen, false, now);
            let moved = before != rows;
            let read: HashSet<String> = order.into_iter().collect();
            return Sifted {
                keys: held.keys.with_projects(&read, &rows),
                retired: held.retired.clone(),
                revived,
                moved,
                changed: Some((read, rows)),
            };
        }
        (control::Rows::All(keys, retired, restored), _) => (keys, retired, restored),
        // Before the first whole read (not made by the follower): as a whole read.
        (control::Rows::Projects(projects), None) => {
            let rows = projects.into_iter().flat_map(|(_, r)| r).collect();
            (rows, Vec::new(), false)
        }
    };
    let before: Vec<Arc<ManagedKey>> =
        served.map_or(Vec::new(), |f| f.keys.iter().cloned().collect());
    let revived = revived::sift(&before, &mut keys, seen, restored, now);
    let keys: managed::Rows = keys.into_iter().collect();
    let moved = served.is_none_or(|f| f.keys != keys || f.retired != retired);
    Sifted {
        keys,
        retired,
        revived,
        moved,
        changed: None,
    }
}

/// Writes the cache of the keys held once they moved, at most every [`CACHE_EVERY`], and once
/// more at shutdown: the shards of projects whose keys moved since the last write (see
/// `managed::key_files`), so a write costs the keys that moved's shards, not every key
/// stored; behind the change, a burst of changes is one write. What it risks: a gateway killed within that
/// moment and started again while the database is away serves the cache from before the
/// change (within `keys_api.unverified_after_seconds`), as one killed before its write did.
pub struct CacheSaver(pub Arc<KeysApi>);

/// How long a change waits for others before the cache is written, at least.
pub const CACHE_EVERY: std::time::Duration = std::time::Duration::from_millis(200);

/// How long a change waits at most: the bound on [`CACHE_EVERY`] grown by the write's time.
const CACHE_EVERY_MOST: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a change waits before the cache is written after one that took `took`: nine
/// times that, so that under a stream of changes writing the cache takes about a tenth of
/// a core however many keys it holds (about 0.5 s at 100,000 keys), within the bounds above.
fn cache_wait(took: std::time::Duration) -> std::time::Duration {
    (took * 9).clamp(CACHE_EVERY, CACHE_EVERY_MOST)
}

#[async_trait::async_trait]
impl drg_base::service::Service for CacheSaver {
    async fn run(&self, mut shutdown: drg_base::service::Shutdown) {
        let mut wait = CACHE_EVERY;
        loop {
            tokio::select! {
                _ = self.0.cache_due.notified() => {}
                _ = shutdown.changed() => break,
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.changed() => break,
            }
            wait = cache_wait(self.save().await);
        }
        self.save().await;
    }
}

impl CacheSaver {
    /// Writes the cache; how long that took.
    async fn save(&self) -> std::time::Duration {
        let api = self.0.clone();
        let start = std::time::Instant::now();
        let _ = tokio::task::spawn_blocking(move || api.save_cache()).await;
        start.elapsed()
    }
}

impl KeysApi {
    /// Writes what is held to the cache, unless it was written from it already.
    fn save_cache(&self) {
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        let Some(held) = self.held.load_full() else {
            return;
        };
        if cached.as_ref().is_some_and(|c| Arc::ptr_eq(c, &held)) {
            return;
        }
        let written = cached.as_ref().map(|c| &c.keys);
        match managed::cache(&self.file, &held, written) {
            Ok(_) => *cached = Some(held),
            Err(e) => {
                // Some key files may hold keys newer than the last written: write them all next.
                *cached = None;
                log::warn!("keys API: the cache of the keys held was not written: {e}");
            }
        }
    }
}

/// Saves the last use of API-made keys every `keys_api.last_used_flush_seconds`, and once more
/// at shutdown.
pub struct LastUsedSaver(pub Arc<KeysApi>);

#[async_trait::async_trait]
impl drg_base::service::Service for LastUsedSaver {
    async fn run(&self, mut shutdown: drg_base::service::Shutdown) {
        let mut ticks = drg_base::periodic::Ticks::new(self.0.config.last_used_flush);
        while ticks.next(&mut shutdown).await.is_some() {
            self.save().await;
        }
        self.save().await;
    }
}

impl LastUsedSaver {
    async fn save(&self) {
        self.0.store.save_last_used(&self.0).await;
    }
}

/// Follows the control store's keys (see [`control::KeysFollow`]).
pub fn follow(
    api: &Arc<KeysApi>,
) -> drg_base::infra::control::follow::Following<control::KeysFollow> {
    drg_base::infra::control::follow::Following(Arc::new(control::KeysFollow(api.clone())))
}

/// A new key id: `key_` and 12 random hex digits.
fn new_id() -> Result<String, getrandom::Error> {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b)?;
    Ok(format!("key_{}", hex::encode(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_waits_nine_times_its_last_write_within_bounds() {
        let ms = std::time::Duration::from_millis;
        assert_eq!(cache_wait(ms(3)), CACHE_EVERY);
        assert_eq!(cache_wait(ms(60)), ms(540));
        assert_eq!(cache_wait(ms(900)), CACHE_EVERY_MOST);
    }

    #[test]
    fn ids_are_valid_key_ids() {
        let id = new_id().unwrap();
        assert!(id_problem(&id).is_none(), "{id}");
        assert_ne!(id, new_id().unwrap());
    }
}
