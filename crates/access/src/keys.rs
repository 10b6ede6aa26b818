//! API keys: the keys file (hashed secrets, plans, origins), the `KeyStore` that authenticates
//! a presented secret, and generation of new secrets.
//!
//! Secrets are never stored: the file holds their SHA-256. A presented secret is hashed, found
//! by the first bytes of its hash, and compared in constant time. Secrets never reach a log.
//! A file without a `keys:` list (emptied, truncated) is refused rather than read as "no keys":
//! locking every client out takes an explicit `keys: []`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use drg_domain::shards::Shards;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::origin::OriginPattern;
use super::plan::AsPlan;

/// Prefix of the secrets `key new` generates: recognisable in code reviews and secret scanners.
pub const SECRET_PREFIX: &str = "drg_";
/// Random bytes in a generated secret.
pub const SECRET_BYTES: usize = 32;
/// Longest bearer token we look at.
pub const MAX_TOKEN_LEN: usize = 256;
/// Characters of a secret shown as its `key_prefix` (the `drg_` and 8 random characters: enough
/// to tell keys apart, far too little to guess the rest).
pub const KEY_PREFIX_LEN: usize = SECRET_PREFIX.len() + 8;
/// Longest `label` of a key.
pub const MAX_LABEL_LEN: usize = 100;

/// The demo key shipped in `conf/keys.yaml` for the loopback quick start. Its secret is public
/// (in the README), so the gateway refuses it on any other address unless told otherwise.
pub const DEMO_SECRET: &str = "drg_demo_local_only_do_not_deploy_5xY8qk3RvT2mWn7pLc4Hb";

/// SHA-256 of a secret.
pub fn hash_secret(secret: impl AsRef<[u8]>) -> [u8; 32] {
    Sha256::digest(secret.as_ref()).into()
}

/// A new secret from the OS random source: prefix plus 32 bytes, base64url without padding.
pub fn generate_secret() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; SECRET_BYTES];
    getrandom::fill(&mut bytes)?;
    Ok(format!(
        "{SECRET_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// The start of a secret that may be shown (`key_prefix`): never enough to use it.
pub fn key_prefix(secret: &str) -> &str {
    secret.get(..KEY_PREFIX_LEN).unwrap_or(secret)
}

/// Where a key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyOrigin {
    /// The operator's keys file: listed by `/v1/keys`, never deleted through it.
    Operator,
    /// Made through `POST /v1/keys`, kept in the gateway-managed file.
    Api,
}

/// One key as the gateway knows it.
#[derive(Debug, Clone)]
pub struct KeyEntry {
    pub id: Arc<str>,
    /// The project whose monthly quota (and logs, stats) this key shares: its own id when the
    /// entry names none.
    pub project: Arc<str>,
    pub plan: Arc<str>,
    /// Calls allowed per calendar month (to the project).
    pub monthly_limit: u64,
    /// Keys the project may hold (its plan's `max_keys`).
    pub max_keys: u32,
    /// How long the project's call logs are kept (its plan's retention).
    pub log_retention: Duration,
    /// The project's per-second rate (its plan's), shared by the project's keys.
    pub rate: Option<crate::rate::RateConfig>,
    /// Whether the plan's limits refuse or only report.
    pub mode: crate::plan::PlanMode,
    /// `None`: a server key, any origin.
    pub origins: Option<Vec<OriginPattern>>,
    /// `origins` as written, for listing.
    pub origin_list: Vec<String>,
    pub disabled: bool,
    /// A human name (`/v1/keys` `label`).
    pub label: Option<Arc<str>>,
    /// The non-secret start of the secret, when known (`/v1/keys` `key_prefix`).
    pub key_prefix: Option<Arc<str>>,
    /// RFC 3339 UTC, when known.
    pub created_at: Option<Arc<str>>,
    /// The key that made it (API-made keys that record it).
    pub created_by: Option<Arc<str>>,
    /// Unix seconds from which the key is refused (`401`, naming the time); none: never.
    pub expires_at: Option<i64>,
    /// The key that replaced it, if it was rotated (it works until `expires_at`).
    pub rotated_to: Option<Arc<str>>,
    pub source: KeyOrigin,
    /// Unix seconds of the last authenticated call (0: none seen). Shared by the snapshots of a
    /// key across reloads (see [`KeyStore::carry_last_used`]).
    pub last_used: Arc<AtomicU64>,
    /// Calls of its project waiting for the call-log writer: one counter shared by the
    /// project's keys (set when the store indexes its projects), so that a project's calls hold
    /// at most its share of the writer's queue.
    pub queued_calls: std::sync::OnceLock<Arc<AtomicUsize>>,
    pub(super) hash: [u8; 32],
}

impl KeyEntry {
    pub fn is_demo(&self) -> bool {
        same_digest(&self.hash, &hash_secret(DEMO_SECRET))
    }

    /// Records a call at `unix` seconds. Writes only when the second changed, so keys busy on
    /// many threads do not fight over the cache line.
    pub fn touch(&self, unix: u64) {
        if self.last_used.load(Ordering::Relaxed) < unix {
            self.last_used.fetch_max(unix, Ordering::Relaxed);
        }
    }

    /// When the key expired, if it has at `now` (unix seconds): from that second on it is
    /// refused.
    pub fn expired_at(&self, now: i64) -> Option<i64> {
        self.expires_at.filter(|at| *at <= now)
    }

    /// Unix seconds of the last call, if any.
    pub fn last_used_at(&self) -> Option<u64> {
        match self.last_used.load(Ordering::Relaxed) {
            0 => None,
            t => Some(t),
        }
    }

    /// Calls of this key's project waiting for the call-log writer (see the field).
    pub fn queued_calls(&self) -> &Arc<AtomicUsize> {
        self.queued_calls.get_or_init(Arc::default)
    }

    /// The SHA-256 of the secret, hex (for the managed file).
    pub fn sha256_hex(&self) -> String {
        hex::encode(self.hash)
    }

    /// A key of `project` on a 100-call free plan, for unit tests elsewhere in the crate.
    #[cfg(any(test, feature = "test-support"))]
    pub fn for_tests(id: &str, project: &str) -> KeyEntry {
        KeyEntry {
            id: id.into(),
            project: project.into(),
            plan: "free".into(),
            monthly_limit: 100,
            max_keys: 1,
            log_retention: Duration::from_secs(3600),
            rate: None,
            mode: crate::plan::PlanMode::Enforce,
            origins: None,
            origin_list: Vec::new(),
            disabled: false,
            label: None,
            key_prefix: None,
            created_at: None,
            created_by: None,
            expires_at: None,
            rotated_to: None,
            source: KeyOrigin::Operator,
            last_used: Arc::default(),
            queued_calls: Default::default(),
            hash: [0; 32],
        }
    }
}

/// The keys of one keys-file version, indexed by hash. The indexes are kept in shards shared
/// with the store a change was made from ([`with_projects`](Self::with_projects)): a key
/// change copies the shards its keys are in, not every key stored.
#[derive(Debug)]
pub struct KeyStore {
    /// Keyed by the first 8 bytes of a SHA-256: already uniform, so a multiply (foldhash)
    /// spreads them as well as SipHash, for a fraction of its cost on every request.
    by_prefix: Shards<u64, Vec<Arc<KeyEntry>>, foldhash::fast::RandomState>,
    /// Each project's keys, sorted by id.
    by_project: Shards<Arc<str>, Vec<Arc<KeyEntry>>>,
    /// Every key by its id (ids are unique in a store).
    by_id: Shards<Arc<str>, Arc<KeyEntry>>,
    len: usize,
    /// Why the managed file's keys are not in this store (unreadable, corrupt and set aside,
    /// written by a newer gateway): the API-made keys are off meanwhile, the operator's work.
    managed_problem: Option<Arc<str>>,
    /// Operator keys the control store retired (`key sync`): out of service, kept as parsed so
    /// that a sync that brings them back needs no new read of the keys file.
    retired: Vec<Arc<KeyEntry>>,
    /// Until when (unix seconds) what this gateway last read of the control store vouches for
    /// its API-made keys: past it, with the store away, one may have been revoked since, and it
    /// answers `503` (see [`KeyStore::unverified_at`]). Shared by every store the serving
    /// gateway builds; never past for stores no control store feeds.
    verified_until: Arc<std::sync::atomic::AtomicI64>,
    /// Ids of the makers (`created_by`) that keys of another project name, or that no key of
    /// the store has: a change to the keys holding such an id can change keys outside their
    /// project, which only a whole merge weighs (see [`KeyStore::with_projects`]).
    foreign_makers: Arc<HashSet<Arc<str>>>,
}

impl Default for KeyStore {
    fn default() -> Self {
        KeyStore {
            by_prefix: Shards::default(),
            by_project: Shards::default(),
            by_id: Shards::default(),
            len: 0,
            managed_problem: None,
            retired: Vec::new(),
            verified_until: Arc::new(i64::MAX.into()),
            foreign_makers: Arc::default(),
        }
    }
}

impl KeyStore {
    /// Whether, at `now` (unix seconds), the control store was last read too long ago to vouch
    /// for an API-made key (see the field).
    pub fn unverified_at(&self, now: i64) -> bool {
        now > self
            .verified_until
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Makes this store read `until` (the serving gateway's one clock of its last read).
    pub fn share_verified(&mut self, until: &Arc<std::sync::atomic::AtomicI64>) {
        self.verified_until = until.clone();
    }

    /// Why the API-made keys are off, if they are (see the field).
    pub fn managed_problem(&self) -> Option<&str> {
        self.managed_problem.as_deref()
    }

    /// Records why the API-made keys are off.
    pub fn set_managed_problem(&mut self, problem: Option<String>) {
        self.managed_problem = problem.map(Into::into);
    }

    /// The key whose secret this is, if any (disabled keys included: the caller decides).
    pub fn find(&self, secret: &str) -> Option<&Arc<KeyEntry>> {
        self.find_bytes(secret.as_bytes())
    }

    /// [`find`](Self::find) for a secret as the request's bytes (no UTF-8 check: the hash
    /// reads bytes).
    pub fn find_bytes(&self, secret: &[u8]) -> Option<&Arc<KeyEntry>> {
        let digest = hash_secret(secret);
        let candidates = self.by_prefix.get(&prefix(&digest))?;
        // Constant time over the full hash; the map lookup above only saw 8 bytes of a hash.
        candidates.iter().find(|k| same_digest(&k.hash, &digest))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn entries(&self) -> impl Iterator<Item = &Arc<KeyEntry>> {
        self.by_prefix.values().flatten()
    }

    /// Whether an enabled key is the public demo key.
    pub fn has_enabled_demo_key(&self) -> bool {
        self.entries().any(|k| !k.disabled && k.is_demo())
    }

    /// The keys of a project, by id.
    pub fn project_keys(&self, project: &str) -> &[Arc<KeyEntry>] {
        self.by_project.get(project).map_or(&[], Vec::as_slice)
    }

    /// The operator's keys of this store (the same entries, the retired ones back in), without
    /// the API-made ones.
    pub fn operator_keys(&self) -> KeyStore {
        let mut out = KeyStore::default();
        let operator = self.entries().filter(|k| k.source == KeyOrigin::Operator);
        for key in operator.chain(&self.retired) {
            out.by_prefix
                .or_default(prefix(&key.hash))
                .push(key.clone());
            out.len += 1;
        }
        out.index_projects();
        out
    }

    /// The key with this id, if any.
    pub fn by_id(&self, id: &str) -> Option<&Arc<KeyEntry>> {
        self.by_id.get(id)
    }

    /// Takes the operator keys `ids` out of service (set aside: see the field); the ids taken.
    pub(super) fn retire(&mut self, ids: &[String]) -> Vec<String> {
        let mut taken = Vec::new();
        for keys in self.by_prefix.values_mut() {
            keys.retain(|k| {
                let out = k.source == KeyOrigin::Operator && ids.iter().any(|id| **id == *k.id);
                if out {
                    taken.push(k.id.to_string());
                    self.retired.push(k.clone());
                }
                !out
            });
        }
        self.by_prefix.retain(|_, keys| !keys.is_empty());
        self.len -= taken.len();
        taken
    }

    /// Adds a key; [`index_projects`](Self::index_projects) makes it visible per project and by id.
    pub(super) fn insert(&mut self, entry: KeyEntry) {
        self.by_prefix
            .or_default(prefix(&entry.hash))
            .push(Arc::new(entry));
        self.len += 1;
    }

    /// Sets `created_at` of keys that have none from `times` (key id -> RFC 3339).
    pub(super) fn fill_created_at(&mut self, times: &BTreeMap<String, String>) {
        let mut changed = false;
        for keys in self.by_prefix.values_mut() {
            for key in keys.iter_mut() {
                if key.created_at.is_none() {
                    if let Some(t) = times.get(&*key.id) {
                        Arc::make_mut(key).created_at = Some(t.as_str().into());
                        changed = true;
                    }
                }
            }
        }
        if changed {
            self.index_projects();
        }
    }

    pub(super) fn index_projects(&mut self) {
        let mut by_project: HashMap<Arc<str>, Vec<Arc<KeyEntry>>> = HashMap::new();
        for key in self.by_prefix.values().flatten() {
            by_project
                .entry(key.project.clone())
                .or_default()
                .push(key.clone());
        }
        for keys in by_project.values_mut() {
            keys.sort_by(|a, b| a.id.cmp(&b.id));
            // One queue counter per project: the one a key already has (a store rebuilt from
            // another keeps counting there), else a new one.
            let counter = keys
                .iter()
                .find_map(|k| k.queued_calls.get().cloned())
                .unwrap_or_default();
            for key in keys.iter() {
                let _ = key.queued_calls.set(counter.clone());
            }
        }
        self.by_project = by_project.into_iter().collect();
        self.by_id = self
            .by_prefix
            .values()
            .flatten()
            .map(|k| (k.id.clone(), k.clone()))
            .collect();
        let foreign = self.by_prefix.values().flatten().filter_map(|k| {
            let maker = k.created_by.as_ref()?;
            let home = self
                .by_id
                .get(maker)
                .is_some_and(|m| m.project == k.project);
            (!home).then(|| maker.clone())
        });
        self.foreign_makers = Arc::new(foreign.collect());
    }

    /// How many shards of its indexes this store does not share with `other` (a change copies
    /// the shards its keys are in, and no other).
    #[cfg(test)]
    pub(super) fn shards_apart(&self, other: &KeyStore) -> usize {
        self.by_prefix.unshared(&other.by_prefix).count()
            + self.by_project.unshared(&other.by_project).count()
            + self.by_id.unshared(&other.by_id).count()
    }

    /// Whether `id` is a maker named from outside its project, or by keys whose maker the
    /// store lacks (see the field).
    pub(super) fn is_foreign_maker(&self, id: &str) -> bool {
        self.foreign_makers.contains(id)
    }

    /// This store with the API-made keys of `projects` replaced by `made` (keys of those
    /// projects), the rest shared: a change to a few projects costs their keys, not a rebuild
    /// of every key. Each new key takes the last-use counter of the same key here (the later
    /// time wins) and its project's queued-calls counter, as [`carry_last_used`] gives them.
    /// The caller makes sure no key outside `projects` hangs on theirs
    /// ([`is_foreign_maker`](Self::is_foreign_maker)) nor theirs on a key of another project,
    /// and names the makers theirs name that the store lacks (`foreign_makers`).
    ///
    /// [`carry_last_used`]: Self::carry_last_used
    pub(super) fn with_projects(
        &self,
        projects: &HashSet<&str>,
        made: Vec<KeyEntry>,
        foreign_makers: Vec<Arc<str>>,
    ) -> KeyStore {
        let mut next = KeyStore {
            by_prefix: self.by_prefix.clone(),
            by_project: self.by_project.clone(),
            by_id: self.by_id.clone(),
            len: self.len,
            managed_problem: self.managed_problem.clone(),
            retired: self.retired.clone(),
            verified_until: self.verified_until.clone(),
            foreign_makers: self.foreign_makers.clone(),
        };
        if foreign_makers
            .iter()
            .any(|m| !self.foreign_makers.contains(m))
        {
            let mut all = HashSet::clone(&self.foreign_makers);
            all.extend(foreign_makers);
            next.foreign_makers = Arc::new(all);
        }
        for &project in projects {
            let Some(keys) = next.by_project.remove(project) else {
                continue;
            };
            let (operator, api): (Vec<_>, Vec<_>) = keys
                .into_iter()
                .partition(|k| k.source == KeyOrigin::Operator);
            for key in api {
                next.by_id.remove(&key.id);
                let at = prefix(&key.hash);
                if let Some(keys) = next.by_prefix.get_mut(&at) {
                    keys.retain(|k| !Arc::ptr_eq(k, &key));
                    if keys.is_empty() {
                        next.by_prefix.remove(&at);
                    }
                }
                next.len -= 1;
            }
            if let Some(first) = operator.first() {
                next.by_project.insert(first.project.clone(), operator);
            }
        }
        for mut entry in made {
            if let Some(old) = self.find_hash(&entry.hash).filter(|old| old.id == entry.id) {
                (old.last_used)
                    .fetch_max(entry.last_used.load(Ordering::Relaxed), Ordering::Relaxed);
                entry.last_used = old.last_used.clone();
            }
            let entry = Arc::new(entry);
            (next.by_prefix.or_default(prefix(&entry.hash))).push(entry.clone());
            next.by_id.insert(entry.id.clone(), entry.clone());
            (next.by_project.or_default(entry.project.clone())).push(entry);
            next.len += 1;
        }
        for &project in projects {
            let Some(keys) = next.by_project.get_mut(project) else {
                continue;
            };
            keys.sort_by(|a, b| a.id.cmp(&b.id));
            // The project's calls still queued are counted where they were.
            let counter = (self.by_project.get(project))
                .and_then(|keys| keys.first())
                .map(|k| k.queued_calls().clone())
                .unwrap_or_default();
            for key in keys.iter() {
                let _ = key.queued_calls.set(counter.clone());
            }
        }
        next
    }

    /// Gives each key of `self` the last-use counter of the same key in `previous`, so a
    /// reload does not forget when keys were used (the later time wins), and its project's
    /// queued-calls counter.
    pub fn carry_last_used(&mut self, previous: &KeyStore) {
        // The indexes hold clones of the entries: drop them so each entry is unique.
        self.by_project = Shards::default();
        self.by_id = Shards::default();
        for keys in self.by_prefix.values_mut() {
            for key in keys.iter_mut() {
                let old = previous.find_hash(&key.hash).filter(|old| old.id == key.id);
                // The project's calls still queued are counted where they were.
                let queue = previous
                    .by_project
                    .get(&*key.project)
                    .and_then(|keys| keys.first())
                    .map(|k| k.queued_calls().clone());
                if let Some(old) = old {
                    old.last_used
                        .fetch_max(key.last_used.load(Ordering::Relaxed), Ordering::Relaxed);
                }
                if let Some(k) = Arc::get_mut(key) {
                    if let Some(old) = old {
                        k.last_used = old.last_used.clone();
                    }
                    if let Some(queue) = queue {
                        k.queued_calls = std::sync::OnceLock::from(queue);
                    }
                }
            }
        }
        self.index_projects();
    }

    pub(super) fn find_hash(&self, hash: &[u8; 32]) -> Option<&Arc<KeyEntry>> {
        self.by_prefix
            .get(&prefix(hash))?
            .iter()
            .find(|k| same_digest(&k.hash, hash))
    }
}

/// Whether two digests are equal, in constant time, a 64-bit word at a time: `subtle`
/// compares a byte slice a byte at a time, each behind an optimisation barrier (31 ns of every
/// request; this is 4 barriers instead of 32).
fn same_digest(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let words = |d: &[u8; 32]| {
        let mut w = [0u64; 4];
        for (w, bytes) in w.iter_mut().zip(d.chunks_exact(8)) {
            *w = u64::from_ne_bytes(bytes.try_into().unwrap_or([0; 8]));
        }
        w
    };
    bool::from(words(a)[..].ct_eq(&words(b)[..]))
}

fn prefix(digest: &[u8; 32]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(b)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    /// `None` when the entry is missing or empty (`keys:`): that is a truncated or emptied
    /// file, not a wish for no keys, which must be written `keys: []`.
    keys: Option<Vec<KeyRow>>,
    /// Project-wide settings, by project id: `projects: { acme: { disabled: true } }` turns
    /// off every key of the project, the API-made ones included.
    #[serde(default)]
    projects: BTreeMap<String, ProjectRow>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProjectRow {
    #[serde(default)]
    disabled: bool,
}

/// What a keys file without a `keys:` list is told (at start, and in the reload log).
const NO_KEYS_LIST: &str = "no `keys:` list (an empty or truncated file?); refused, since it \
     would lock every client out: write `keys: []` if no key is to be accepted";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyRow {
    id: String,
    #[serde(default)]
    project: Option<String>,
    sha256: String,
    plan: String,
    #[serde(default)]
    origins: Vec<String>,
    #[serde(default)]
    disabled: bool,
    /// A human name, listed by `/v1/keys`.
    #[serde(default)]
    label: Option<String>,
    /// The first characters of the secret (`key new` writes them), listed as `key_prefix`.
    #[serde(default)]
    prefix: Option<String>,
    /// RFC 3339 (`key new` writes it), listed as `created_at`.
    #[serde(default)]
    created_at: Option<String>,
}

/// Why a keys file was refused: every problem, each naming the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {}", problems.join("; "))]
pub struct KeysError {
    pub origin: String,
    pub problems: Vec<String>,
}

/// What is wrong with a key or project id, if anything: the characters of an id, and a length
/// the embedded quota store can hold (it keeps each project's count in a fixed-size slot).
pub fn id_problem(id: &str) -> Option<String> {
    use crate::quota::local::table::MAX_KEY_ID_LEN;
    if id.is_empty()
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        Some("must be letters, digits, '-', '_' or '.'".to_owned())
    } else if id.len() > MAX_KEY_ID_LEN {
        Some(format!("is longer than {MAX_KEY_ID_LEN} characters"))
    } else {
        None
    }
}

/// What is wrong with a `prefix` / `key_prefix`, if anything: it is shown to anyone holding a
/// key of the project, so it must stay a short start, never most of a secret.
fn prefix_problem(p: &str) -> Option<String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"-_".contains(&b);
    (p.is_empty() || p.len() > KEY_PREFIX_LEN || !p.bytes().all(token))
        .then(|| format!("prefix must be 1 to {KEY_PREFIX_LEN} of the secret's first characters"))
}

/// Parses a keys file against the configured plans (`name -> plan`, or a bare monthly limit).
pub fn parse_keys<P: AsPlan>(
    text: &str,
    origin: &str,
    plans: &BTreeMap<String, P>,
) -> Result<KeyStore, KeysError> {
    let fail = |problems: Vec<String>| KeysError {
        origin: origin.to_owned(),
        problems,
    };
    // A document that is empty or only comments is `None`, like a missing `keys:` entry.
    let file: Option<KeysFile> =
        serde_yaml::from_str(text).map_err(|e| fail(vec![e.to_string()]))?;
    let Some((rows, project_rows)) = file.and_then(|f| Some((f.keys?, f.projects))) else {
        return Err(fail(vec![NO_KEYS_LIST.to_owned()]));
    };
    let mut problems = Vec::new();
    let disabled_projects = disabled_projects(project_rows, &mut problems);
    let mut ids = HashSet::new();
    let mut hashes = HashSet::new();
    let mut store = KeyStore::default();
    // Project -> (its plan, the key that set it, its keys).
    let mut projects: BTreeMap<String, (String, String, u32)> = BTreeMap::new();
    for (i, row) in rows.into_iter().enumerate() {
        let at = format!("keys[{i}] (id '{}')", row.id);
        if let Some(p) = id_problem(&row.id) {
            problems.push(format!("{at}: id {p}"));
        }
        if !ids.insert(row.id.clone()) {
            problems.push(format!("{at}: id is used by another key"));
        }
        let project = row.project.clone().unwrap_or_else(|| row.id.clone());
        if let Some(p) = row.project.as_deref().and_then(id_problem) {
            problems.push(format!("{at}: project '{project}' {p}"));
        }
        note_project(&mut projects, &project, &row, &at, &mut problems);
        let hash = row_hash(&row.sha256, &at, &mut hashes, &mut problems);
        let plan = plans.get(&row.plan).map(|p| p.resolve(&row.plan));
        if plan.is_none() {
            problems.push(unknown_plan(&at, &row.plan, plans));
        }
        let origins = row_origins(&row, &at, &mut problems);
        if let (Some(hash), Some(plan)) = (hash, plan) {
            let id: Arc<str> = row.id.into();
            let project_disabled = disabled_projects.contains(&project);
            store.insert(KeyEntry {
                project: project.into(),
                id,
                plan: row.plan.into(),
                monthly_limit: plan.monthly_limit,
                max_keys: plan.max_keys,
                log_retention: plan.log_retention,
                rate: plan.rate,
                mode: plan.mode,
                origins: (!origins.is_empty()).then_some(origins),
                origin_list: row.origins,
                disabled: row.disabled || project_disabled,
                label: row.label.map(Into::into),
                key_prefix: row.prefix.map(Into::into),
                created_at: row.created_at.map(Into::into),
                created_by: None,
                expires_at: None,
                rotated_to: None,
                source: KeyOrigin::Operator,
                last_used: Arc::default(),
                queued_calls: Default::default(),
                hash,
            });
        }
    }
    max_keys_problems(&projects, plans, &mut problems);
    if problems.is_empty() {
        store.index_projects();
        Ok(store)
    } else {
        Err(fail(problems))
    }
}

/// The problem of a key row naming `plan`, which is not configured.
fn unknown_plan<P>(at: &str, plan: &str, plans: &BTreeMap<String, P>) -> String {
    let configured: Vec<&str> = plans.keys().map(String::as_str).collect();
    format!(
        "{at}: unknown plan '{plan}' (configured: {})",
        configured.join(", ")
    )
}

/// The projects the file switches off (`projects: { id: { disabled: true } }`); bad ids are
/// problems.
fn disabled_projects(
    rows: BTreeMap<String, ProjectRow>,
    problems: &mut Vec<String>,
) -> HashSet<String> {
    let mut disabled = HashSet::new();
    for (project, row) in rows {
        if let Some(p) = id_problem(&project) {
            problems.push(format!("projects.{project}: project id {p}"));
        }
        if row.disabled {
            disabled.insert(project);
        }
    }
    disabled
}

/// A key's hash from its `sha256` (64 hex digits), unique in the file.
fn row_hash(
    sha256: &str,
    at: &str,
    hashes: &mut HashSet<[u8; 32]>,
    problems: &mut Vec<String>,
) -> Option<[u8; 32]> {
    match hex::decode(sha256.trim()) {
        Ok(bytes) if bytes.len() == 32 => {
            let mut h = [0u8; 32];
            h.copy_from_slice(&bytes);
            if !hashes.insert(h) {
                problems.push(format!("{at}: sha256 is used by another key"));
            }
            Some(h)
        }
        _ => {
            problems.push(format!(
                "{at}: sha256 must be 64 hex digits (the SHA-256 of the secret, never the secret)"
            ));
            None
        }
    }
}

/// A key's origin patterns; its origins, prefix, label and creation time checked.
fn row_origins(row: &KeyRow, at: &str, problems: &mut Vec<String>) -> Vec<OriginPattern> {
    let mut origins = Vec::new();
    for o in &row.origins {
        match OriginPattern::parse(o) {
            Ok(p) => origins.push(p),
            Err(e) => problems.push(format!("{at}: {e}")),
        }
    }
    if let Some(p) = row.prefix.as_deref().and_then(prefix_problem) {
        problems.push(format!("{at}: {p}"));
    }
    if let Some(label) = &row.label {
        if label.chars().count() > MAX_LABEL_LEN {
            problems.push(format!(
                "{at}: label is longer than {MAX_LABEL_LEN} characters"
            ));
        }
    }
    if let Some(t) = &row.created_at {
        if chrono::DateTime::parse_from_rfc3339(t).is_err() {
            problems.push(format!("{at}: created_at '{t}' is not an RFC 3339 time"));
        }
    }
    origins
}

/// Counts a key towards its project; every key of a project must name the same plan.
fn note_project(
    projects: &mut BTreeMap<String, (String, String, u32)>,
    project: &str,
    row: &KeyRow,
    at: &str,
    problems: &mut Vec<String>,
) {
    match projects.get_mut(project) {
        Some((plan, first, count)) => {
            *count += 1;
            if *plan != row.plan {
                problems.push(format!(
                    "{at}: project '{project}' is on plan '{}' here but on plan '{plan}' for key '{first}'; all keys of a project share one plan",
                    row.plan
                ));
            }
        }
        None => {
            projects.insert(project.to_owned(), (row.plan.clone(), row.id.clone(), 1));
        }
    }
}

/// Projects holding more keys than their plan's `max_keys`.
fn max_keys_problems<P: AsPlan>(
    projects: &BTreeMap<String, (String, String, u32)>,
    plans: &BTreeMap<String, P>,
    problems: &mut Vec<String>,
) {
    for (project, (plan, _, count)) in projects {
        let Some(max) = plans.get(plan).map(|p| p.resolve(plan).max_keys) else {
            continue;
        };
        if *count > max {
            problems.push(format!(
                "project '{project}' has {count} keys but its plan '{plan}' allows {max} (max_keys); remove keys, or give the plan more keys or the project a larger plan"
            ));
        }
    }
}

/// The YAML entry for a new key, for the keys file.
pub fn key_entry_yaml(id: &str, secret: &str, plan: &str, origins: &[String]) -> String {
    key_entry_yaml_with(id, secret, plan, origins, &EntryExtras::default())
}

/// The optional parts of a new keys-file entry.
#[derive(Debug, Clone, Default)]
pub struct EntryExtras<'a> {
    pub project: Option<&'a str>,
    pub label: Option<&'a str>,
    /// RFC 3339.
    pub created_at: Option<&'a str>,
}

/// [`key_entry_yaml`] with a project, label and creation time.
pub fn key_entry_yaml_with(
    id: &str,
    secret: &str,
    plan: &str,
    origins: &[String],
    extras: &EntryExtras<'_>,
) -> String {
    // `prefix` and the optional lines come before `sha256` and `plan`: a file cut short inside
    // the entry then lacks a required field and is refused, instead of keeping a shortened value.
    let mut out = format!("  - id: {id}\n    prefix: {}\n", key_prefix(secret));
    if let Some(project) = extras.project {
        out.push_str(&format!("    project: {project}\n"));
    }
    if let Some(label) = extras.label {
        // JSON strings are YAML strings: quoted and escaped whatever the label holds.
        out.push_str(&format!("    label: {}\n", serde_json::Value::from(label)));
    }
    if let Some(t) = extras.created_at {
        out.push_str(&format!("    created_at: '{t}'\n"));
    }
    out.push_str(&format!(
        "    sha256: {}\n    plan: {plan}\n",
        hex::encode(hash_secret(secret))
    ));
    if !origins.is_empty() {
        out.push_str("    origins:\n");
        for o in origins {
            out.push_str(&format!("      - {o}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_differing_in_any_byte_are_not_the_same() {
        let a = hash_secret("drg_one_secret");
        let same = a;
        assert!(same_digest(&a, &same));
        for i in 0..32 {
            let mut b = a;
            b[i] ^= 0x80;
            assert!(!same_digest(&a, &b), "byte {i}");
        }
        assert!(!same_digest(&a, &hash_secret("drg_another_secret")));
    }
    use crate::plan::PlanConfig;

    fn plans() -> BTreeMap<String, u64> {
        [("free".to_owned(), 100), ("pro".to_owned(), 10_000)].into()
    }

    #[test]
    fn generated_secrets_are_prefixed_random_and_urlsafe() {
        let a = generate_secret().unwrap();
        let b = generate_secret().unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with(SECRET_PREFIX));
        assert_eq!(a.len(), SECRET_PREFIX.len() + 43);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
    }

    #[test]
    fn the_generated_entry_authenticates_its_secret_only() {
        let secret = generate_secret().unwrap();
        let yaml = format!(
            "keys:\n{}",
            key_entry_yaml("web", &secret, "pro", &["https://*.example.com".into()])
        );
        let store = parse_keys(&yaml, "keys.yaml", &plans()).unwrap();
        let k = store.find(&secret).unwrap();
        assert_eq!(&*k.id, "web");
        assert_eq!(k.monthly_limit, 10_000);
        assert!(k.origins.is_some());
        assert!(store.find("drg_wrong").is_none());
        assert!(
            !yaml.contains(&secret),
            "the secret must not be in the file"
        );
    }

    #[test]
    fn every_problem_is_named() {
        let text = "keys:\n\
            - { id: a, sha256: abc, plan: free }\n\
            - { id: a, sha256: 0000000000000000000000000000000000000000000000000000000000000000, plan: gold }\n\
            - { id: 'b c', sha256: 0000000000000000000000000000000000000000000000000000000000000000, plan: free, origins: [nope] }\n";
        let err = parse_keys(text, "keys.yaml", &plans()).unwrap_err();
        let all = err.problems.join("\n");
        for needle in [
            "keys[0] (id 'a'): sha256 must be 64 hex",
            "keys[1] (id 'a'): id is used",
            "keys[1] (id 'a'): unknown plan 'gold'",
            "keys[2] (id 'b c'): id must be",
            "keys[2] (id 'b c'): sha256 is used",
            "keys[2] (id 'b c'): 'nope' is not an origin",
        ] {
            assert!(all.contains(needle), "missing {needle}:\n{all}");
        }
        assert!(parse_keys("keys: [{ id: x }]", "k", &plans()).is_err());
        assert!(parse_keys("extra: 1", "k", &plans()).is_err());
    }

    #[test]
    fn an_empty_or_truncated_file_is_refused_and_keys_empty_list_is_not() {
        for text in [
            "",
            "  \n",
            "# all gone\n",
            "---\n",
            "keys:\n",
            "keys: ~\n",
            "keys:\n  # the entries were cut off\n",
            "keys:\n  - id: a\n    sha",
            "keys:\n  - id: a\n    sha256: 00\n",
        ] {
            let err = parse_keys(text, "keys.yaml", &plans()).unwrap_err();
            assert_eq!(err.origin, "keys.yaml");
            assert!(!err.problems.is_empty(), "{text:?}");
        }
        let err = parse_keys("# nothing\n", "keys.yaml", &plans()).unwrap_err();
        assert!(err.to_string().contains("write `keys: []`"), "{err}");
        assert!(err.to_string().starts_with("keys.yaml: "), "{err}");
        let store = parse_keys("keys: []\n", "keys.yaml", &plans()).unwrap();
        assert!(store.is_empty());
    }

    #[test]
    fn the_demo_key_is_recognised() {
        let yaml = format!(
            "keys:\n{}",
            key_entry_yaml("demo", DEMO_SECRET, "free", &[])
        );
        let store = parse_keys(&yaml, "k", &plans()).unwrap();
        assert!(store.has_enabled_demo_key());
        let disabled = format!("{yaml}    disabled: true\n");
        assert!(!parse_keys(&disabled, "k", &plans())
            .unwrap()
            .has_enabled_demo_key());
    }

    const ZERO: &str = "0000000000000000000000000000000000000000000000000000000000000000";

    fn row(id: &str, project: Option<&str>, plan: &str, n: u8) -> String {
        let project = project.map_or(String::new(), |p| format!(", project: {p}"));
        format!(
            "  - {{ id: {id}{project}, sha256: {}{n:02x}, plan: {plan} }}\n",
            &ZERO[..62]
        )
    }

    fn plans_with_keys() -> BTreeMap<String, PlanConfig> {
        [
            ("free".to_owned(), PlanConfig::limit(100)),
            ("starter".to_owned(), PlanConfig::limit(1_000)),
            (
                "team".to_owned(),
                PlanConfig {
                    max_keys: Some(2),
                    log_retention_hours: Some(48),
                    ..PlanConfig::limit(50)
                },
            ),
        ]
        .into()
    }

    #[test]
    fn keys_of_a_project_share_its_plan_and_a_key_without_one_is_its_own() {
        let text = format!(
            "keys:\n{}{}{}",
            row("web", Some("acme"), "team", 1),
            row("server", Some("acme"), "team", 2),
            row("solo", None, "starter", 3)
        );
        let store = parse_keys(&text, "k", &plans_with_keys()).unwrap();
        let acme: Vec<&str> = store.project_keys("acme").iter().map(|k| &*k.id).collect();
        assert_eq!(acme, ["server", "web"]);
        let web = store.by_id("web").unwrap();
        assert_eq!(
            (&*web.project, web.monthly_limit, web.max_keys),
            ("acme", 50, 2)
        );
        assert_eq!(web.log_retention, Duration::from_secs(48 * 3_600));
        let solo = store.by_id("solo").unwrap();
        assert_eq!(&*solo.project, "solo");
        assert_eq!(solo.max_keys, 5);
        assert_eq!(solo.log_retention, Duration::from_secs(30 * 86_400));
        assert_eq!(store.project_keys("solo").len(), 1);
        assert!(store.project_keys("nobody").is_empty());
    }

    #[test]
    fn a_project_on_two_plans_or_over_its_max_keys_or_with_a_bad_id_is_refused() {
        let text = format!(
            "keys:\n{}{}",
            row("a", Some("acme"), "team", 1),
            row("b", Some("acme"), "free", 2)
        );
        let err = parse_keys(&text, "k", &plans_with_keys())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("keys[1] (id 'b'): project 'acme' is on plan 'free' here but on plan 'team' for key 'a'"),
            "{err}"
        );
        let text = format!(
            "keys:\n{}{}{}",
            row("a", Some("acme"), "team", 1),
            row("b", Some("acme"), "team", 2),
            row("c", Some("acme"), "team", 3)
        );
        let err = parse_keys(&text, "k", &plans_with_keys())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("project 'acme' has 3 keys but its plan 'team' allows 2 (max_keys)"),
            "{err}"
        );
        // The free plan allows one key: a second key in a free project is refused.
        let text = format!(
            "keys:\n{}{}",
            row("a", Some("p"), "free", 1),
            row("b", Some("p"), "free", 2)
        );
        assert!(parse_keys(&text, "k", &plans_with_keys())
            .unwrap_err()
            .to_string()
            .contains("allows 1 (max_keys)"));
        let long = "p".repeat(crate::quota::local::table::MAX_KEY_ID_LEN + 1);
        let text = format!(
            "keys:\n{}{}",
            row("a", Some("bad project"), "free", 1),
            row("b", Some(&long), "free", 2)
        );
        let err = parse_keys(&text, "k", &plans_with_keys())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("keys[0] (id 'a'): project 'bad project' must be letters"),
            "{err}"
        );
        assert!(err.contains("keys[1] (id 'b'): project 'ppp"), "{err}");
        assert!(err.contains("is longer than 48 characters"), "{err}");
    }

    #[test]
    fn key_new_entries_carry_prefix_project_label_and_time() {
        let secret = generate_secret().unwrap();
        let extras = EntryExtras {
            project: Some("acme"),
            label: Some("CI: \"deploy\" #1"),
            created_at: Some("2026-01-02T03:04:05Z"),
        };
        let yaml = format!(
            "keys:\n{}",
            key_entry_yaml_with("ci", &secret, "starter", &[], &extras)
        );
        let store = parse_keys(&yaml, "k", &plans_with_keys()).unwrap();
        let k = store.find(&secret).unwrap();
        assert_eq!(k.key_prefix.as_deref(), Some(&secret[..12]));
        assert_eq!(k.label.as_deref(), Some("CI: \"deploy\" #1"));
        assert_eq!(k.created_at.as_deref(), Some("2026-01-02T03:04:05Z"));
        assert_eq!(&*k.project, "acme");
        assert!(!yaml.contains(&secret[12..]), "only the prefix is written");
        // A prefix longer than a prefix is refused: it would show most of the secret.
        let bad = yaml.replace(
            &format!("prefix: {}", &secret[..12]),
            &format!("prefix: {secret}"),
        );
        assert!(parse_keys(&bad, "k", &plans_with_keys())
            .unwrap_err()
            .to_string()
            .contains("prefix must be"));
    }

    #[test]
    fn last_use_survives_a_reload_and_the_later_time_wins() {
        let secret = generate_secret().unwrap();
        let yaml = format!("keys:\n{}", key_entry_yaml("a", &secret, "free", &[]));
        let old = parse_keys(&yaml, "k", &plans_with_keys()).unwrap();
        old.find(&secret).unwrap().touch(100);
        old.find(&secret).unwrap().touch(50);
        assert_eq!(old.find(&secret).unwrap().last_used_at(), Some(100));
        let mut new = parse_keys(&yaml, "k", &plans_with_keys()).unwrap();
        assert_eq!(new.find(&secret).unwrap().last_used_at(), None);
        new.carry_last_used(&old);
        let k = new.find(&secret).unwrap();
        assert_eq!(k.last_used_at(), Some(100));
        // The counter is shared: a call seen through the old snapshot shows in the new one.
        old.find(&secret).unwrap().touch(200);
        assert_eq!(k.last_used_at(), Some(200));
        assert_eq!(new.project_keys("a")[0].last_used_at(), Some(200));
    }
}
