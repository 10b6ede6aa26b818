//! API-made keys in the managed file's format: the control store's keys as this gateway last
//! read them (its cache, `keys.control-cache.json` in the state folder), which the keys reloader
//! merges with the operator's keys file (which the gateway never writes), and the file an
//! earlier release kept them in (`keys.managed.json`, taken in once by `migrate`).
//!
//! JSON, hashed secrets only, mode 0600. `version` changes only for a change older gateways
//! cannot read safely (a newer one makes them switch their API-made keys off); fields a gateway
//! does not know are kept as they are when it rewrites the file. Since version 2 the keys are
//! in files of their own beside it, one a shard of projects (`key_files`): a key change
//! rewrites its shard's, not every key stored; version 1 (keys inline) is still read.
//!
//! A key made through the API records the key that made it (`created_by`): it works only while
//! that key does, so removing, disabling or revoking a key revokes every key it made,
//! recursively. A write is a read-modify-write under an exclusive `flock` on a lock file beside
//! it, written to a temporary file and renamed over, so readers never see half a file.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::keys::{id_problem, KeyEntry, KeyOrigin, KeyStore, KeysError};
use super::origin::OriginPattern;
use super::plan::AsPlan;

pub mod key_files;
mod rows;
pub use rows::Rows;

/// The file format's version (written, checked on read): the keys in [`key_files`].
const VERSION: u32 = 2;

/// The version before, keys inline: an earlier release's cache and `keys.managed.json`.
const INLINE: u32 = 1;

/// The whole managed file. Written by [`write`] and [`cache`] alone, which put the version
/// this gateway writes and the keys in their own files ([`key_files`]).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagedFile {
    #[serde(skip_serializing)]
    pub version: u32,
    /// By project, shared between the files a gateway holds one after another: a change to a
    /// project's keys copies that project's, not the others (see [`Rows`]).
    #[serde(default, skip_serializing)]
    pub keys: Rows,
    /// When this gateway first saw each keys-file key that names no `created_at` (id ->
    /// RFC 3339 UTC): `/v1/keys` lists that time, the same on every gateway and after a
    /// restart. Left out of the file while empty, so older gateways still read it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub first_seen: BTreeMap<String, String>,
    /// Operator key ids the control store retired (`key sync` from a keys file without them):
    /// refused whatever this gateway's keys file says, until a sync from a file that holds
    /// them. Left out of the file while empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired: Vec<String>,
    /// When (unix seconds) the control store last answered this gateway: how far a gateway
    /// started while the store is away trusts these keys (`keys_api.unverified_after_seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_at: Option<i64>,
    /// API-made keys this gateway saw revoked (id -> unix seconds): a restore that brings one
    /// back does not bring it back into service here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub revoked_seen: BTreeMap<String, i64>,
    /// Fields of a newer gateway, kept as they are.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// Where the makers of API-made keys are known, which decides what a maker absent from this
/// gateway's keys file means (see [`merge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Makers {
    /// One gateway's own store (SQLite in its state folder): its keys file is the truth of
    /// which operator keys exist, so a key whose maker left it is revoked (and the serving
    /// gateway drops it from the store, audited).
    Here,
    /// A store shared by gateways whose keys files may differ (PostgreSQL, a rolling config
    /// change): an operator key absent here may be another gateway's, so a key it made is
    /// served as the store holds it; only `key sync` removes a maker, in the store.
    Shared,
}

/// One API-made key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagedKey {
    pub id: String,
    pub project: String,
    /// The project's plan when the key was made: used only when no operator key names the
    /// project any more (otherwise the operator's plan for the project wins).
    pub plan: String,
    #[serde(default)]
    pub label: Option<String>,
    /// SHA-256 of the secret, hex.
    pub sha256: String,
    /// The non-secret start of the secret.
    pub prefix: String,
    /// RFC 3339 UTC.
    pub created_at: String,
    /// Unix seconds of the last call any gateway saw and saved (the control store's
    /// `last_used` column).
    #[serde(default)]
    pub last_used: Option<u64>,
    /// Origins, as for operator keys; none: a server key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub origins: Vec<String>,
    /// The id of the key that made it (keys made before lineage was recorded have none: they
    /// follow their project only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// When the key stops working (RFC 3339 UTC; none: never). Every gateway compares it with
    /// its own clock at each call, so the moment needs no sync. Gateways released before it
    /// keep it as an unknown field and do not enforce it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// The lifetime it was made with (`expires_in_days`), given again to its successor when it
    /// is rotated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_days: Option<u32>,
    /// The key that replaced it (`POST /v1/keys/{id}/rotate`); it works until `expires_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotated_to: Option<String>,
    /// Fields of a newer gateway, kept as they are.
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

impl ManagedFile {
    /// A file of `keys` (as the control store gave them), in this gateway's format.
    pub fn with_keys<K: Into<Arc<ManagedKey>>>(keys: impl IntoIterator<Item = K>) -> ManagedFile {
        ManagedFile {
            version: VERSION,
            keys: keys.into_iter().collect(),
            ..ManagedFile::default()
        }
    }

    /// A file of the control store's `keys` and the operator keys it `retired`.
    pub fn of_store(keys: Rows, retired: Vec<String>) -> ManagedFile {
        ManagedFile {
            version: VERSION,
            keys,
            retired,
            ..ManagedFile::default()
        }
    }
}

/// Why the managed file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ManagedError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a managed keys file: {message}")]
    Format { path: PathBuf, message: String },
    #[error(
        "{path}: written by a newer gateway (format version {found}; this one reads {VERSION}): \
         upgrade this gateway"
    )]
    Newer { path: PathBuf, found: u32 },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ManagedError + '_ {
    move |source| ManagedError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Reads the managed file; a missing file is an empty one.
pub fn read(path: &Path) -> Result<ManagedFile, ManagedError> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(ManagedFile {
                version: VERSION,
                ..ManagedFile::default()
            })
        }
        Err(e) => return Err(io(path)(e)),
    };
    let file: ManagedFile = serde_json::from_slice(&text).map_err(|e| ManagedError::Format {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    check_version(path, file.version)?;
    let mut file = file;
    if file.version == VERSION {
        let count = key_file_count(path, &mut file.unknown)?;
        file.keys = key_files::read(path, count)?;
    }
    Ok(file)
}

/// A version this gateway reads (this one or [`INLINE`]), or why not.
fn check_version(path: &Path, version: u32) -> Result<(), ManagedError> {
    if version > VERSION {
        return Err(ManagedError::Newer {
            path: path.to_owned(),
            found: version,
        });
    }
    if version != VERSION && version != INLINE {
        return Err(ManagedError::Format {
            path: path.to_owned(),
            message: format!("version {version} (this gateway reads {INLINE} and {VERSION})"),
        });
    }
    Ok(())
}

/// How many key files the file names (taken out of the fields kept as they are).
fn key_file_count(
    path: &Path,
    fields: &mut BTreeMap<String, serde_json::Value>,
) -> Result<usize, ManagedError> {
    let count = fields.remove(KEY_FILES).and_then(|n| n.as_u64());
    let count = count.and_then(|n| usize::try_from(n).ok());
    count.ok_or_else(|| ManagedError::Format {
        path: path.to_owned(),
        message: format!("no `{KEY_FILES}` count"),
    })
}

/// The field naming how many key files the file's keys are in.
const KEY_FILES: &str = "key_files";

/// Applies `change` to the file under the exclusive lock and writes the result (unless
/// `change` says nothing changed by returning `Ok((false, _))`). Blocking: call it off the
/// request threads.
pub fn update<T, E: From<ManagedError>>(
    path: &Path,
    change: impl FnOnce(&mut ManagedFile) -> Result<(bool, T), E>,
) -> Result<T, E> {
    let _lock = Lock::take(path)?;
    let mut file = read(path)?;
    let (changed, out) = change(&mut file)?;
    if changed {
        write(path, &file)?;
    }
    Ok(out)
}

/// Writes `held`'s keys and retired ids as the file's (the control store's, as this gateway
/// holds them), keeping what else it holds (the first-seen times); a file that does not read is
/// written anew. `written`: the keys this gateway last cached there, whose shards `held`
/// shares are not written again; how many key files were written.
pub fn cache(
    path: &Path,
    held: &ManagedFile,
    written: Option<&Rows>,
) -> Result<usize, ManagedError> {
    let _lock = Lock::take(path)?;
    let kept = read_kept(path).ok();
    // Key files are kept only beside a file of this version that reads.
    let written = written.filter(|_| kept.as_ref().is_some_and(|k| k.version == VERSION));
    let kept = kept.unwrap_or_default();
    let file = ManagedFile {
        version: VERSION,
        keys: held.keys.clone(),
        first_seen: kept.first_seen,
        retired: held.retired.clone(),
        read_at: held.read_at.or(kept.read_at),
        revoked_seen: held.revoked_seen.clone(),
        unknown: kept.unknown,
    };
    let wrote = key_files::write(path, &file.keys, written)?;
    write_meta(path, &file)?;
    Ok(wrote)
}

/// What [`cache`] keeps of the file: all but what it replaces, whose text is skipped, not
/// parsed (the keys are most of the file, and each change of a key rewrites it).
#[derive(Default, Deserialize)]
struct Kept {
    version: u32,
    #[serde(default)]
    first_seen: BTreeMap<String, String>,
    #[serde(default)]
    read_at: Option<i64>,
    #[serde(default, rename = "keys")]
    _keys: serde::de::IgnoredAny,
    #[serde(default, rename = "retired")]
    _retired: serde::de::IgnoredAny,
    #[serde(default, rename = "revoked_seen")]
    _revoked_seen: serde::de::IgnoredAny,
    #[serde(default, rename = "key_files")]
    _key_files: serde::de::IgnoredAny,
    #[serde(flatten)]
    unknown: BTreeMap<String, serde_json::Value>,
}

/// The file's [`Kept`] part; an error for a file [`read`] refuses too (absent, of another
/// version, not the format).
fn read_kept(path: &Path) -> Result<Kept, ManagedError> {
    let text = std::fs::read(path).map_err(io(path))?;
    let kept: Kept = serde_json::from_slice(&text).map_err(|e| ManagedError::Format {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    check_version(path, kept.version)?;
    Ok(kept)
}

/// Records in the cache that the control store answered at `at` (unix seconds).
pub fn note_read(path: &Path, at: i64) -> Result<(), ManagedError> {
    let _lock = Lock::take(path)?;
    // The file alone where its keys are in key files (they stay as they are).
    if let Some(mut file) = read_meta(path) {
        file.read_at = Some(at);
        return write_meta(path, &file);
    }
    let mut file = read(path).unwrap_or_else(|_| ManagedFile::with_keys(Vec::<ManagedKey>::new()));
    file.read_at = Some(at);
    write(path, &file)
}

/// The file without its keys, when it is of this version and names its key files.
fn read_meta(path: &Path) -> Option<ManagedFile> {
    let text = std::fs::read(path).ok()?;
    let mut file: ManagedFile = serde_json::from_slice(&text).ok()?;
    key_file_count(path, &mut file.unknown).ok()?;
    (file.version == VERSION).then_some(file)
}

/// When the control store last answered, as the cache at `path` says (its time of writing
/// for a cache written before that was recorded).
pub fn read_at(path: &Path, file: &ManagedFile) -> Option<i64> {
    file.read_at.or_else(|| {
        let modified = std::fs::metadata(path).ok()?.modified().ok()?;
        let since = modified.duration_since(std::time::UNIX_EPOCH).ok()?;
        i64::try_from(since.as_secs()).ok()
    })
}

/// Writes the file and every key file, each atomically with mode 0600 (see
/// [`drg_base::infra::fsutil`]); the key files first, so the file never names keys that
/// are not written.
fn write(path: &Path, file: &ManagedFile) -> Result<(), ManagedError> {
    key_files::write(path, &file.keys, None)?;
    write_meta(path, file)
}

/// Writes the file itself, in this gateway's version, naming its key files.
fn write_meta(path: &Path, file: &ManagedFile) -> Result<(), ManagedError> {
    #[derive(Serialize)]
    struct Meta<'a> {
        version: u32,
        key_files: usize,
        #[serde(flatten)]
        file: &'a ManagedFile,
    }
    let meta = Meta {
        version: VERSION,
        key_files: key_files::count(&file.keys),
        file,
    };
    let mut body = serde_json::to_vec_pretty(&meta).map_err(|e| ManagedError::Format {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    body.push(b'\n');
    drg_base::infra::fsutil::write_atomic(path, 0o600, &body).map_err(io(path))
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Makes `dir` (and its parents) with mode 0700 unless it is there.
fn private_folder(dir: &Path) -> Result<(), ManagedError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(dir))
}

/// An exclusive `flock` on `<file>.lock`, released on drop (and by the kernel if the process
/// dies holding it).
struct Lock {
    _file: std::fs::File,
}

impl Lock {
    fn take(path: &Path) -> Result<Lock, ManagedError> {
        private_folder(&parent(path))?;
        let f = drg_base::infra::fsutil::lock_beside(path).map_err(|(p, e)| io(&p)(e))?;
        Ok(Lock { _file: f })
    }
}

/// Adds the keys of the managed file to a store of operator keys. A managed key is skipped,
/// with a warning in the returned list, when its id or secret is an operator key's (the
/// operator wins), when it is malformed, or when its plan no longer exists. Keys of a project
/// the operator names take the operator's plan for it.
///
/// An API-made key follows its project: it works only while the keys file holds an enabled
/// key of the project (so a project disabled in `projects:`, or whose operator keys were all
/// disabled or removed, takes its API-made keys with it: they answer 401). Its stored plan is
/// never a reason to keep it working.
///
/// An API-made key that names the key that made it (`created_by`) works only while that key is
/// enabled, recursively: a disabled maker disables it. A maker absent from the store is, with
/// [`Makers::Here`], gone: the key is revoked (left out and listed in `revoked`; the serving
/// gateway then drops it from the control store, audited: a revocation is for good). With
/// [`Makers::Shared`] it may be another gateway's operator key: the key is served as the
/// control store holds it (a project no operator key here names follows its keys there).
///
/// Operator keys the control store retired (`file.retired`) are taken out of service first.
pub fn merge<P: AsPlan>(
    mut store: KeyStore,
    file: &ManagedFile,
    plans: &BTreeMap<String, P>,
    makers: Makers,
) -> Merged {
    let mut warnings = Vec::new();
    for id in store.retire(&file.retired) {
        warnings.push(format!(
            "operator key '{id}': retired in the control store by `key sync`: refused (remove \
             it from the keys file, or run `key sync` with a keys file that holds it)"
        ));
    }
    let mut skipped: HashSet<&str> = HashSet::new();
    let mut ids: HashSet<Arc<str>> = store.entries().map(|k| k.id.clone()).collect();
    let mut hashes: HashSet<[u8; 32]> = HashSet::new();
    let mut made: Vec<(KeyEntry, Option<&str>)> = Vec::new();
    for row in &file.keys {
        let id_taken = ids.contains(row.id.as_str());
        let hash_taken = |h: &[u8; 32]| store.find_hash(h).is_some() || !hashes.insert(*h);
        match weigh(row, id_taken, hash_taken, &store, plans, makers) {
            Ok(entry) => {
                ids.insert(entry.id.clone());
                made.push((entry, row.created_by.as_deref()));
            }
            Err(warning) => {
                warnings.push(warning);
                skipped.insert(&row.id);
            }
        }
    }
    let operator: BTreeMap<&str, bool> = store.entries().map(|k| (&*k.id, !k.disabled)).collect();
    let revoked = revoke_orphans(
        |maker| operator.get(maker).copied(),
        &mut made,
        makers,
        &skipped,
    );
    drop(operator);
    warnings.extend(revoked.iter().map(|id| revoked_warning(id)));
    for (entry, _) in made {
        store.insert(entry);
    }
    store.index_projects();
    Merged {
        store,
        warnings,
        revoked,
    }
}

/// [`merge`] for the API-made keys of `projects` alone: `current` (a store [`merge`] made from
/// the operator's keys and a file whose other rows are as they were) with those projects' keys
/// replaced by `rows` (all theirs, as the control store gave them), weighed as [`merge`] weighs
/// them. A change to one project then costs that project's keys, not every key stored.
///
/// `None` when a key outside them may hang on one of theirs, or one of theirs on a key of
/// another project (a maker moved with a keys-file edit, rows planted in the store): only a
/// whole merge weighs those, and the caller makes one.
pub fn merge_projects<P: AsPlan>(
    current: &KeyStore,
    projects: &HashSet<&str>,
    rows: &[Arc<ManagedKey>],
    plans: &BTreeMap<String, P>,
    makers: Makers,
) -> Option<Merged> {
    let ours = |k: &KeyEntry| k.source == KeyOrigin::Api && projects.contains(&*k.project);
    let absent = untied(current, projects, rows)?;
    let mut warnings = Vec::new();
    let mut skipped: HashSet<&str> = HashSet::new();
    let mut ids: HashSet<&str> = HashSet::new();
    let mut hashes: HashSet<[u8; 32]> = HashSet::new();
    let mut made: Vec<(KeyEntry, Option<&str>)> = Vec::new();
    for row in rows {
        let id_taken = current.by_id(&row.id).is_some_and(|k| !ours(k)) || ids.contains(&*row.id);
        let hash_taken =
            |h: &[u8; 32]| current.find_hash(h).is_some_and(|k| !ours(k)) || !hashes.insert(*h);
        match weigh(row, id_taken, hash_taken, current, plans, makers) {
            Ok(entry) => {
                ids.insert(&row.id);
                made.push((entry, row.created_by.as_deref()));
            }
            Err(warning) => {
                warnings.push(warning);
                skipped.insert(&row.id);
            }
        }
    }
    let outside = |maker: &str| {
        (current.by_id(maker))
            .filter(|k| !ours(k))
            .map(|k| !k.disabled)
    };
    let revoked = revoke_orphans(outside, &mut made, makers, &skipped);
    warnings.extend(revoked.iter().map(|id| revoked_warning(id)));
    let made = made.into_iter().map(|(k, _)| k).collect();
    let store = current.with_projects(projects, made, absent);
    Some(Merged {
        store,
        warnings,
        revoked,
    })
}

/// What the log says of a key revoked with its maker.
fn revoked_warning(id: &str) -> String {
    format!("managed key '{id}': the key that made it is gone (removed or revoked): revoked")
}

/// The makers `rows` (the keys of `projects`) name that `current` lacks, for
/// [`merge_projects`]; `None` when their keys and another project's hang on each other (a key
/// outside them made by one of theirs, one of theirs made by another project's key), or a row
/// is of another project.
fn untied(
    current: &KeyStore,
    projects: &HashSet<&str>,
    rows: &[Arc<ManagedKey>],
) -> Option<Vec<Arc<str>>> {
    let ours = |k: &KeyEntry| k.source == KeyOrigin::Api && projects.contains(&*k.project);
    let tied = |id: &str| current.is_foreign_maker(id);
    let held = projects.iter().flat_map(|p| current.project_keys(p));
    if held.filter(|k| ours(k)).any(|k| tied(&k.id)) || rows.iter().any(|r| tied(&r.id)) {
        return None;
    }
    let homes: HashMap<&str, &str> = rows.iter().map(|r| (&*r.id, &*r.project)).collect();
    // Makers no key has (with `Makers::Shared`, another gateway's operator key): a later change
    // that brings one must weigh these rows again.
    let mut absent: Vec<Arc<str>> = Vec::new();
    for row in rows {
        if !projects.contains(row.project.as_str()) {
            return None;
        }
        let Some(maker) = &row.created_by else {
            continue;
        };
        match (homes.get(maker.as_str()), current.by_id(maker)) {
            (Some(home), _) if *home == row.project => {}
            (None, Some(k)) if k.source == KeyOrigin::Operator && *k.project == *row.project => {}
            // Not among the rows: gone from the store (a restore brings it back with a whole
            // read), or never there.
            (None, Some(k)) if ours(k) => absent.push(maker.as_str().into()),
            (None, None) => absent.push(maker.as_str().into()),
            _ => return None,
        }
    }
    Some(absent)
}

/// One row of the managed file weighed: the key in service, or the warning that skips it.
/// `id_taken` and `hash_taken` say whether another key holds its id or its secret (the keys
/// file's, or a row weighed before it: the first wins).
fn weigh<P: AsPlan>(
    row: &ManagedKey,
    id_taken: bool,
    hash_taken: impl FnOnce(&[u8; 32]) -> bool,
    store: &KeyStore,
    plans: &BTreeMap<String, P>,
    makers: Makers,
) -> Result<KeyEntry, String> {
    let at = format!("managed key '{}'", row.id);
    let Some(hash) = decode_hash(&row.sha256) else {
        return Err(format!("{at}: sha256 is not 64 hex digits; skipped"));
    };
    if let Some(p) = id_problem(&row.id).or_else(|| id_problem(&row.project)) {
        return Err(format!("{at}: id or project {p}; skipped"));
    }
    if id_taken {
        return Err(format!(
            "{at}: the id is also in the keys file, whose key wins; skipped"
        ));
    }
    if hash_taken(&hash) {
        return Err(format!(
            "{at}: its secret is also a key of the keys file, which wins; skipped"
        ));
    }
    entry_of(row, hash, store, plans, makers).map_err(|why| format!("{at}: {why}; skipped"))
}

/// The key in service for one row of the managed file (its plan and switch from the operator's
/// keys of its project), or why it is skipped.
fn entry_of<P: AsPlan>(
    row: &ManagedKey,
    hash: [u8; 32],
    store: &KeyStore,
    plans: &BTreeMap<String, P>,
    makers: Makers,
) -> Result<KeyEntry, String> {
    let operator = store
        .project_keys(&row.project)
        .iter()
        .filter(|k| k.source == KeyOrigin::Operator);
    let project_enabled = operator.clone().any(|k| !k.disabled)
        || (makers == Makers::Shared && operator.clone().next().is_none());
    let plan_name = operator
        .clone()
        .next()
        .map_or_else(|| row.plan.clone(), |k| k.plan.to_string());
    let Some(plan) = plans.get(&plan_name).map(|p| p.resolve(&plan_name)) else {
        return Err(format!("plan '{plan_name}' is not configured"));
    };
    let origins: Vec<OriginPattern> = row
        .origins
        .iter()
        .filter_map(|o| OriginPattern::parse(o).ok())
        .collect();
    if origins.len() != row.origins.len() {
        return Err("an origin is not valid".to_owned());
    }
    // A time that cannot be read is no reason to let the key live for ever: skipped.
    let expires_at = match row.expires_at.as_deref().map(unix_of) {
        None => None,
        Some(Some(t)) => Some(t),
        Some(None) => return Err("expires_at is not an RFC 3339 time".to_owned()),
    };
    Ok(KeyEntry {
        id: row.id.as_str().into(),
        project: row.project.as_str().into(),
        plan: plan_name.into(),
        monthly_limit: plan.monthly_limit,
        max_keys: plan.max_keys,
        log_retention: plan.log_retention,
        rate: plan.rate,
        mode: plan.mode,
        origins: (!origins.is_empty()).then_some(origins),
        origin_list: row.origins.clone(),
        disabled: !project_enabled,
        label: row.label.as_deref().map(Into::into),
        key_prefix: Some(row.prefix.as_str().into()),
        created_at: Some(row.created_at.as_str().into()),
        created_by: row.created_by.as_deref().map(Into::into),
        expires_at,
        rotated_to: row.rotated_to.as_deref().map(Into::into),
        source: KeyOrigin::Api,
        last_used: Arc::new(row.last_used.unwrap_or(0).into()),
        queued_calls: Default::default(),
        hash,
    })
}

/// Unix seconds of an RFC 3339 time.
fn unix_of(rfc3339: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .ok()
        .map(|t| t.timestamp())
}

/// The keys store with the managed file merged in (see [`merge`]).
pub struct Merged {
    pub store: KeyStore,
    /// Keys skipped and why (for the log).
    pub warnings: Vec<String>,
    /// API-made keys whose maker is gone, recursively.
    pub revoked: Vec<String>,
}

/// Follows each API-made key's maker (`created_by`), until nothing changes: a key whose maker is
/// gone (with [`Makers::Here`]: removed from the keys file, revoked through the API, itself
/// revoked) is taken out of `made` and returned, for good; a key whose maker is there but
/// disabled (the key, or its project), or a row of the store skipped here, is disabled with
/// it, and comes back when its maker does. Recursively: what such a key made follows it.
///
/// `outside` tells whether a maker that is not in `made` is there and enabled (`None`: not
/// there): the operator's keys, and with [`merge_projects`] the keys of the other projects.
fn revoke_orphans(
    outside: impl Fn(&str) -> Option<bool>,
    made: &mut Vec<(KeyEntry, Option<&str>)>,
    makers: Makers,
    skipped: &HashSet<&str>,
) -> Vec<String> {
    let mut revoked = Vec::new();
    loop {
        let present: BTreeMap<String, bool> = made
            .iter()
            .map(|(k, _)| (k.id.to_string(), !k.disabled))
            .collect();
        let enabled = |maker: &str| {
            let absent = match makers {
                // A row skipped here (its plan gone, say) is no revocation.
                _ if skipped.contains(maker) => Some(false),
                Makers::Here => None,
                // Another gateway's operator key: the store holds what it made.
                Makers::Shared => Some(true),
            };
            outside(maker)
                .or_else(|| present.get(maker).copied())
                .or(absent)
        };
        let before = made.len();
        let mut disabled_now = false;
        made.retain_mut(|(k, by)| {
            let Some(maker) = by else { return true };
            match enabled(maker) {
                None => {
                    revoked.push(k.id.to_string());
                    false
                }
                Some(false) if !k.disabled => {
                    k.disabled = true;
                    disabled_now = true;
                    true
                }
                Some(_) => true,
            }
        });
        if made.len() == before && !disabled_now {
            return revoked;
        }
    }
}

/// Removes the keys `ids` and every key they made, recursively, from `file`; how many.
pub fn without_descendants(file: &mut ManagedFile, ids: &[String]) -> usize {
    let mut gone: HashSet<String> = ids.iter().cloned().collect();
    let before = file.keys.len();
    loop {
        let n = file.keys.len();
        file.keys.retain(|k| {
            let out =
                gone.contains(&k.id) || k.created_by.as_ref().is_some_and(|by| gone.contains(by));
            if out {
                gone.insert(k.id.clone());
            }
            !out
        });
        if file.keys.len() == n {
            return before - file.keys.len();
        }
    }
}

/// Gives the keys-file keys without a `created_at` the time a gateway first saw them: from the
/// file's `first_seen`, and for keys not in it yet, now, recorded in the file under its lock
/// (a time another gateway recorded meanwhile wins). Fills the times into `store`.
pub fn fill_first_seen(path: &Path, store: &mut KeyStore, now: &str) -> Result<(), ManagedError> {
    let unseen = |file: &ManagedFile, store: &KeyStore| -> Vec<String> {
        store
            .entries()
            .filter(|k| k.source == KeyOrigin::Operator && k.created_at.is_none())
            .filter(|k| !file.first_seen.contains_key(&*k.id))
            .map(|k| k.id.to_string())
            .collect()
    };
    let mut file = read(path)?;
    if !unseen(&file, store).is_empty() {
        file = update(path, |f: &mut ManagedFile| {
            let ids = unseen(f, store);
            for id in &ids {
                f.first_seen.insert(id.clone(), now.to_owned());
            }
            Ok::<_, ManagedError>((!ids.is_empty(), f.clone()))
        })?;
    }
    store.fill_created_at(&file.first_seen);
    Ok(())
}

fn decode_hash(hex_text: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(hex_text).ok()?;
    bytes.try_into().ok()
}

impl From<ManagedError> for KeysError {
    fn from(e: ManagedError) -> KeysError {
        let (origin, problem) = match e {
            ManagedError::Io { path, source } => (path, source.to_string()),
            ManagedError::Format { path, message } => (path, message),
            ManagedError::Newer { path, found } => (
                path,
                format!(
                    "written by a newer gateway (format version {found}; this one reads \
                     {VERSION}): upgrade this gateway"
                ),
            ),
        };
        KeysError {
            origin: origin.display().to_string(),
            problems: vec![problem],
        }
    }
}

/// A managed key for unit tests: `id` of `project`, made by `by` (one fixture for every module
/// that tests rows).
#[cfg(any(test, feature = "test-support"))]
pub fn test_key(id: &str, project: &str, by: Option<&str>) -> ManagedKey {
    ManagedKey {
        id: id.into(),
        project: project.into(),
        plan: "free".into(),
        label: None,
        sha256: "ab".repeat(32),
        prefix: "drg_x".into(),
        created_at: "2026-01-01T00:00:00Z".into(),
        last_used: None,
        origins: vec![],
        created_by: by.map(Into::into),
        expires_at: None,
        expires_in_days: None,
        rotated_to: None,
        unknown: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{hash_secret, key_entry_yaml, parse_keys};

    fn plans() -> BTreeMap<String, u64> {
        [("free".to_owned(), 100)].into()
    }

    /// The keys file's `ids`, server keys each of its own project.
    fn operator(ids: &[&str]) -> KeyStore {
        let entries: String = (ids.iter())
            .map(|id| key_entry_yaml(id, &format!("drg_{id}_secret_0123456789"), "free", &[]))
            .collect();
        let yaml = format!("keys:\n{entries}");
        parse_keys(&yaml, "keys.yaml", &plans()).unwrap()
    }

    fn made(id: &str, by: &str) -> ManagedKey {
        ManagedKey {
            id: id.to_owned(),
            project: "acme".to_owned(),
            plan: "free".to_owned(),
            label: None,
            sha256: hex::encode(hash_secret(format!("drg_{id}_made"))),
            prefix: "drg_".to_owned(),
            created_at: "2026-11-28T00:00:00Z".to_owned(),
            last_used: None,
            origins: Vec::new(),
            created_by: Some(by.to_owned()),
            expires_at: None,
            expires_in_days: None,
            rotated_to: None,
            unknown: BTreeMap::new(),
        }
    }

    fn of(project: &str, mut key: ManagedKey) -> ManagedKey {
        key.project = project.to_owned();
        key
    }

    /// What a store serves, by key id: its project and whether it is off.
    fn served(store: &KeyStore) -> BTreeMap<String, (String, bool)> {
        (store.entries())
            .map(|k| (k.id.to_string(), (k.project.to_string(), k.disabled)))
            .collect()
    }

    #[test]
    fn a_change_merged_for_its_projects_alone_serves_what_a_whole_merge_serves() {
        for makers in [Makers::Here, Makers::Shared] {
            let globex = vec![
                of("globex", made("g1", "globex")),
                of("globex", made("g2", "g1")),
            ];
            let mut file = vec![made("a1", "acme"), made("a2", "a1"), made("a3", "a2")];
            file.extend(globex.clone());
            let current = merge(
                operator(&["acme", "globex"]),
                &ManagedFile::with_keys(file),
                &plans(),
                makers,
            )
            .store;
            current.by_id("a1").unwrap().touch(500);
            // acme's change: a2 gone (a3, planted, names it), a4 made by a1, a5 unreadable and
            // a6 made by it.
            let mut bad = made("a5", "a1");
            bad.sha256 = "zz".into();
            let acme = vec![
                made("a1", "acme"),
                made("a3", "a2"),
                made("a4", "a1"),
                bad,
                made("a6", "a5"),
            ];
            let mut file = acme.clone();
            file.extend(globex.clone());
            let whole = merge(
                operator(&["acme", "globex"]),
                &ManagedFile::with_keys(file),
                &plans(),
                makers,
            );
            let projects = HashSet::from(["acme"]);
            let acme: Vec<Arc<ManagedKey>> = acme.into_iter().map(Arc::new).collect();
            let part = merge_projects(&current, &projects, &acme, &plans(), makers).unwrap();
            assert_eq!(served(&part.store), served(&whole.store), "{makers:?}");
            assert_eq!(part.revoked, whole.revoked);
            assert_eq!(part.store.len(), whole.store.len());
            let ids = |s: &KeyStore| -> Vec<String> {
                (s.project_keys("acme").iter())
                    .map(|k| k.id.to_string())
                    .collect()
            };
            assert_eq!(ids(&part.store), ids(&whole.store));
            // Found by its secret, and not the key gone.
            assert!(part.store.find("drg_a4_made").is_some());
            assert!(part.store.find("drg_a2_made").is_none());
            // The last use is carried; the other project's keys are the same entries.
            let a1 = part.store.by_id("a1").unwrap();
            assert_eq!(a1.last_used.load(std::sync::atomic::Ordering::Relaxed), 500);
            let g1 = |s: &KeyStore| s.by_id("g1").unwrap().clone();
            assert!(Arc::ptr_eq(&g1(&part.store), &g1(&current)));
            // The project's calls are counted on one counter, the one it had.
            let queue = |s: &KeyStore, id: &str| s.by_id(id).unwrap().queued_calls().clone();
            assert!(Arc::ptr_eq(
                &queue(&part.store, "a4"),
                &queue(&current, "acme")
            ));
        }
    }

    #[test]
    fn a_change_to_one_project_copies_the_shards_of_its_keys_alone() {
        let projects: Vec<String> = (0..200).map(|i| format!("p{i:03}")).collect();
        let ids: Vec<&str> = projects.iter().map(String::as_str).collect();
        let rows = |p: &str, n: usize| -> Vec<ManagedKey> {
            (0..n)
                .map(|i| of(p, made(&format!("{p}k{i}"), p)))
                .collect()
        };
        let file: Vec<ManagedKey> = ids.iter().flat_map(|p| rows(p, 5)).collect();
        let file = ManagedFile::with_keys(file);
        let current = merge(operator(&ids), &file, &plans(), Makers::Here).store;
        assert_eq!(current.len(), 200 * 6);
        // p007 makes a sixth key.
        let change: Vec<Arc<ManagedKey>> = rows("p007", 6).into_iter().map(Arc::new).collect();
        let p007 = HashSet::from(["p007"]);
        let part = merge_projects(&current, &p007, &change, &plans(), Makers::Here).unwrap();
        assert_eq!(part.store.len(), current.len() + 1);
        assert!(part.store.find("drg_p007k5_made").is_some());
        // The project's shard, and its keys' shards by hash and by id, of 3 x 64.
        let apart = part.store.shards_apart(&current);
        assert!((1..=13).contains(&apart), "{apart} shards copied");
    }

    #[test]
    fn a_change_tied_to_another_projects_keys_is_merged_whole() {
        // g1, planted in globex, names acme's a1 as its maker.
        let file = vec![made("a1", "acme"), of("globex", made("g1", "a1"))];
        let current = merge(
            operator(&["acme", "globex"]),
            &ManagedFile::with_keys(file),
            &plans(),
            Makers::Here,
        )
        .store;
        let merged = |projects: &[&str], rows: &[ManagedKey]| {
            let projects: HashSet<&str> = projects.iter().copied().collect();
            let rows: Vec<Arc<ManagedKey>> = rows.iter().cloned().map(Arc::new).collect();
            merge_projects(&current, &projects, &rows, &plans(), Makers::Here).is_some()
        };
        // a1's project: g1 hangs on it.
        assert!(!merged(&["acme"], &[made("a1", "acme")]));
        // globex's: its key hangs on acme's.
        assert!(!merged(&["globex"], &[of("globex", made("g1", "a1"))]));
        // A row of a project not read, or made by another project's operator key.
        assert!(!merged(&["acme"], &[of("globex", made("g9", "globex"))]));
        assert!(!merged(&["acme"], &[made("a9", "globex")]));
        // globex's own keys alone (g1 gone with its tie): merged alone.
        assert!(merged(&["globex"], &[of("globex", made("g9", "globex"))]));
    }

    #[test]
    fn a_maker_absent_here_is_gone_on_ones_own_store_and_perhaps_elsewhere_on_a_shared_one() {
        let file = ManagedFile::with_keys(vec![made("a", "rollout"), made("b", "a")]);
        let here = merge(operator(&["server"]), &file, &plans(), Makers::Here);
        assert_eq!(here.revoked, ["a", "b"]);
        let shared = merge(operator(&["server"]), &file, &plans(), Makers::Shared);
        assert!(shared.revoked.is_empty());
        let a = shared.store.by_id("a").unwrap();
        assert!(!a.disabled && !shared.store.by_id("b").unwrap().disabled);
    }

    #[test]
    fn a_retired_operator_key_is_out_of_service_and_back_when_the_store_says_so() {
        let retired = ManagedFile::of_store(
            [made("a", "rollout")].into_iter().collect(),
            vec!["rollout".into()],
        );
        let merged = merge(
            operator(&["server", "rollout"]),
            &retired,
            &plans(),
            Makers::Shared,
        );
        assert!(merged.store.by_id("rollout").is_none());
        assert!(merged.warnings.iter().any(|w| w.contains("retired")));
        // What the keys API merges again holds it aside: a store that lifts it needs no file.
        let back = merge(
            merged.store.operator_keys(),
            &ManagedFile::with_keys(Vec::<ManagedKey>::new()),
            &plans(),
            Makers::Shared,
        );
        assert!(back.store.by_id("rollout").is_some_and(|k| !k.disabled));
    }

    #[test]
    fn the_cache_rewritten_keeps_all_but_what_the_store_gave() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.control-cache.json");
        let mut first = ManagedFile::of_store(
            [made("a", "server")].into_iter().collect(),
            vec!["gone".into()],
        );
        first
            .first_seen
            .insert("server".into(), "2026-11-01T00:00:00Z".into());
        first.read_at = Some(7);
        first.revoked_seen.insert("old".into(), 3);
        first
            .unknown
            .insert("newer".into(), serde_json::json!({"x": 1}));
        write(&path, &first).unwrap();
        let mut held = ManagedFile::with_keys(vec![made("b", "server")]);
        held.revoked_seen.insert("a".into(), 9);
        cache(&path, &held, None).unwrap();
        let now = read(&path).unwrap();
        assert_eq!(now.keys, held.keys);
        assert!(now.retired.is_empty());
        assert_eq!(now.revoked_seen, held.revoked_seen);
        assert_eq!((now.first_seen, now.read_at), (first.first_seen, Some(7)));
        assert_eq!(now.unknown, first.unknown);
        // A file that does not read (another version, corrupt) is written anew.
        std::fs::write(&path, r#"{"version": 99, "keys": []}"#).unwrap();
        cache(&path, &held, Some(&held.keys)).unwrap();
        let anew = read(&path).unwrap();
        assert_eq!((anew.keys, anew.read_at), (held.keys, None));
    }

    #[test]
    fn a_key_change_rewrites_its_projects_key_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.control-cache.json");
        let keys: Vec<ManagedKey> = (0..1_000)
            .map(|i| of(&format!("p{}", i % 300), made(&format!("k{i}"), "server")))
            .collect();
        let held = ManagedFile::with_keys(keys);
        assert_eq!(cache(&path, &held, None).unwrap(), 64);
        assert_eq!(read(&path).unwrap().keys, held.keys);
        // One project's keys change: its shard's file alone is written again.
        let project = HashSet::from(["p7".to_owned()]);
        let next = ManagedFile {
            keys: (held.keys).with_projects(&project, &[Arc::new(of("p7", made("new", "s")))]),
            ..held.clone()
        };
        assert_eq!(cache(&path, &next, Some(&held.keys)).unwrap(), 1);
        let back = read(&path).unwrap();
        assert_eq!(back.keys, next.keys);
        assert_eq!(back.keys.project("p7").len(), 1);
        // Noting a read leaves the keys where they are.
        note_read(&path, 42).unwrap();
        let noted = read(&path).unwrap();
        assert_eq!((noted.keys, noted.read_at), (next.keys.clone(), Some(42)));
        // A key file lost: the cache does not read (keys gone are never taken from it), and
        // the next write puts it back even for a shard it shares.
        let folder = key_files::folder(&path);
        let lost = std::fs::read_dir(&folder).unwrap().next().unwrap().unwrap();
        std::fs::remove_file(lost.path()).unwrap();
        assert!(matches!(read(&path), Err(ManagedError::Io { .. })));
        assert_eq!(cache(&path, &next, Some(&next.keys)).unwrap(), 1);
        assert_eq!(read(&path).unwrap().keys, next.keys);
        // An earlier release's file (keys inline) reads, and is written in this version.
        let inline = serde_json::json!({
            "version": 1, "keys": [made("old", "server")], "first_seen": {"s": "t"}
        });
        std::fs::write(&path, inline.to_string()).unwrap();
        let old = read(&path).unwrap();
        assert_eq!(old.keys.iter().map(|k| &*k.id).collect::<Vec<_>>(), ["old"]);
        assert_eq!(cache(&path, &next, Some(&next.keys)).unwrap(), 64);
        let now = read(&path).unwrap();
        assert_eq!((now.keys, now.first_seen), (next.keys, old.first_seen));
    }
}
