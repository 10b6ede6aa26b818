//! `/v1/keys`: a project lists its keys, makes new ones (the secret shown once) and revokes
//! those it made, within its plan's `max_keys`.
//!
//! API-made keys live in the gateway-managed file ([`crate::access::managed`]), or with the
//! Redis quota store on the shared Redis ([`shared`]), never in the operator's keys file;
//! operator keys are listed but cannot be deleted here (403). After each change this gateway
//! swaps its key snapshot at once (a revoked key stops working on the next request); other
//! gateways pick the change up through the keys reloader (a shared file) or their poll of
//! Redis ([`sync`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::StatusCode;
use prometheus::IntCounter;
use serde::Serialize;

use crate::access::keys::{
    generate_secret, hash_secret, id_problem, key_prefix, KeyEntry, KeyOrigin, KeyStore,
    MAX_LABEL_LEN,
};
use crate::access::managed::{self, ManagedError, ManagedFile, ManagedKey};
use crate::access::plan::PlanConfig;
use crate::account::config::KeysApiConfig;
use crate::answer::Answer;

pub mod shared;
mod store;
pub mod sync;

/// A `/v1/keys` request, its id decoded and its body read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeysOp {
    List,
    Create(Bytes),
    Revoke(String),
}

/// The keys API's state: the snapshot it swaps, the file it writes, its counters.
pub struct KeysApi {
    keys: Arc<ArcSwap<KeyStore>>,
    file: PathBuf,
    plans: BTreeMap<String, PlanConfig>,
    pub config: KeysApiConfig,
    /// Shared with the keys reloader: a change is written and its snapshot stored under it, so
    /// no snapshot read before a change is stored after it (a revoked key never comes back).
    publishing: Arc<std::sync::Mutex<()>>,
    created: IntCounter,
    revoked: IntCounter,
    /// Where the API-made keys are kept: the managed file, or the shared Redis store (then
    /// `file` is its cache).
    store: Box<dyn store::KeysStore>,
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
}

impl<'a> KeyItem<'a> {
    fn of(k: &'a KeyEntry) -> Self {
        KeyItem {
            id: &k.id,
            label: k.label.as_deref(),
            key_prefix: k.key_prefix.as_deref(),
            created_at: k.created_at.as_deref(),
            last_used_at: k.last_used_at().and_then(rfc3339),
            origins: &k.origin_list,
            source: match k.source {
                KeyOrigin::Operator => "operator",
                KeyOrigin::Api => "api",
            },
            created_by: k.created_by.as_deref(),
        }
    }
}

fn rfc3339(unix: u64) -> Option<String> {
    let t = chrono::DateTime::from_timestamp(i64::try_from(unix).ok()?, 0)?;
    Some(t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
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
    File(ManagedError),
    /// The shared store did not answer (Redis away): nothing was changed.
    Unavailable,
}

impl From<ManagedError> for Refused {
    fn from(e: ManagedError) -> Self {
        Refused::File(e)
    }
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
                "This key is managed by the operator (keys file); it cannot be deleted through the API.",
                None,
            ),
            Refused::File(e) => {
                log::error!("keys API: {e}");
                crate::answer::ApiError::Internal("the managed keys file".into()).into()
            }
            Refused::Unavailable => error(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                "The shared key store is unreachable; nothing was changed. Try again shortly.",
                Some("redis"),
            )
            .with_header(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            ),
        }
    }
}

/// Origins a new key may name at most.
pub const MAX_NEW_ORIGINS: usize = 20;

/// What `POST /v1/keys` asks for.
#[derive(Debug, Default, PartialEq, Eq)]
struct NewKey {
    label: Option<String>,
    /// Empty: a server key; else a browser key for these origin patterns (as written).
    origins: Vec<String>,
}

/// What `POST /v1/keys` may send: an object with an optional `label` and optional `origins`.
fn parse_new_key(body: &[u8]) -> Result<NewKey, Answer> {
    let label = parse_label(body)?;
    let origins = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(map)) => parse_origins(map.get("origins"))?,
        // An empty body (no label either), checked by `parse_label`.
        _ => Vec::new(),
    };
    Ok(NewKey { label, origins })
}

/// A `422 validation_error` saying what is wrong with the body.
fn invalid(detail: String) -> Answer {
    error(
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_error",
        "The request is not valid.",
        Some(&detail),
    )
}

/// `origins`: absent, null or a list of up to [`MAX_NEW_ORIGINS`] origin patterns
/// (`scheme://host[:port]`, host may start with `*.`), each checked as the keys file's are.
fn parse_origins(value: Option<&serde_json::Value>) -> Result<Vec<String>, Answer> {
    let list = match value {
        None | Some(serde_json::Value::Null) => return Ok(Vec::new()),
        Some(serde_json::Value::Array(list)) => list,
        Some(_) => return Err(invalid("origins must be a list of strings".into())),
    };
    if list.len() > MAX_NEW_ORIGINS {
        return Err(invalid(format!(
            "origins has {} entries, at most {MAX_NEW_ORIGINS}",
            list.len()
        )));
    }
    let mut out = Vec::with_capacity(list.len());
    for item in list {
        let serde_json::Value::String(s) = item else {
            return Err(invalid("origins must be a list of strings".into()));
        };
        if crate::access::origin::OriginPattern::parse(s).is_err() {
            return Err(invalid(format!(
                "origin {:?} is not scheme://host[:port] (host may start with *.)",
                s.chars().take(100).collect::<String>()
            )));
        }
        let s = s.trim().to_owned();
        if !out.contains(&s) {
            out.push(s);
        }
    }
    Ok(out)
}

/// The `label` of a `POST /v1/keys` body (the body must be a JSON object, or empty).
fn parse_label(body: &[u8]) -> Result<Option<String>, Answer> {
    let bad = |detail: &str| {
        error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "The request body must be a JSON object such as {\"label\": \"server\"}.",
            Some(detail),
        )
    };
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| bad(&format!("not JSON: {e}")))?;
    let serde_json::Value::Object(map) = value else {
        return Err(bad("not a JSON object"));
    };
    match map.get("label") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => {
            if s.chars().count() > MAX_LABEL_LEN {
                Err(invalid(format!(
                    "label is longer than {MAX_LABEL_LEN} characters"
                )))
            } else if s.chars().any(char::is_control) {
                Err(invalid("label must not contain control characters".into()))
            } else {
                Ok(Some(s.clone()))
            }
        }
        Some(_) => Err(invalid("label must be a string".into())),
    }
}

impl KeysApi {
    pub fn new(
        keys: Arc<ArcSwap<KeyStore>>,
        file: PathBuf,
        plans: BTreeMap<String, PlanConfig>,
        config: KeysApiConfig,
        publishing: Arc<std::sync::Mutex<()>>,
        metrics: &crate::ops::metrics::Metrics,
    ) -> Result<Self, prometheus::Error> {
        let changes = metrics.counter_vec(
            "drg_keys_api_changes_total",
            "Keys made (created) and revoked (revoked) through /v1/keys.",
            &["action"],
        )?;
        Ok(KeysApi {
            keys,
            file,
            plans,
            config,
            publishing,
            created: changes.with_label_values(&["created"]),
            revoked: changes.with_label_values(&["revoked"]),
            store: Box::new(store::FileKeys),
        })
    }

    /// Keeps the API-made keys on the shared Redis store (`file` is then its cache).
    pub fn with_shared(mut self, shared: Arc<shared::Shared>) -> Self {
        self.store = Box::new(shared);
        self
    }

    /// The shared key store's state for the admin `/readyz` (absent on the embedded store):
    /// whether it answers, and how often its data set was found lost and the keys put back.
    pub fn shared_status(&self) -> Option<serde_json::Value> {
        self.store.status()
    }

    /// The managed file.
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
        let new = match parse_new_key(&body) {
            Ok(new) => new,
            Err(a) => return a,
        };
        let secret = match generate_secret() {
            Ok(s) => s,
            Err(e) => return crate::answer::ApiError::Internal(e.to_string()).into(),
        };
        self.store.create(self, caller, new, secret).await
    }

    /// The `201` of a key made, its secret in it (shown this once).
    fn created(&self, key: &ManagedKey, secret: &str) -> Answer {
        self.created.inc();
        #[derive(Serialize)]
        struct Created<'a> {
            #[serde(flatten)]
            item: KeyItem<'a>,
            key: &'a str,
        }
        let item = KeyItem {
            id: &key.id,
            label: key.label.as_deref(),
            key_prefix: Some(&key.prefix),
            created_at: Some(&key.created_at),
            last_used_at: None,
            origins: &key.origins,
            source: "api",
            created_by: key.created_by.as_deref(),
        };
        Answer::json(StatusCode::CREATED, &Created { item, key: secret })
    }

    /// A new key's row (its id still to be drawn), made by `caller`.
    fn new_row(caller: &KeyEntry, new: NewKey, secret: &str) -> ManagedKey {
        let NewKey { label, origins } = new;
        ManagedKey {
            id: String::new(),
            project: caller.project.to_string(),
            plan: caller.plan.to_string(),
            label,
            sha256: hex::encode(hash_secret(secret)),
            prefix: key_prefix(secret).to_owned(),
            created_at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            last_used: None,
            origins,
            created_by: Some(caller.id.to_string()),
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

    fn create_blocking(
        &self,
        caller: &KeyEntry,
        new: NewKey,
        secret: &str,
    ) -> Result<ManagedKey, Refused> {
        let mut key = Self::new_row(caller, new, secret);
        let _publishing = self.publishing();
        managed::update(&self.file, |file: &mut ManagedFile| {
            let current = self.keys.load();
            // Operator keys from the snapshot, API-made ones from the file under the lock: the
            // count is exact across gateways sharing the file.
            let operator = self.operator_count(&caller.project);
            let made = file
                .keys
                .iter()
                .filter(|k| *k.project == *caller.project)
                .count();
            if operator + made >= caller.max_keys as usize {
                return Err(Refused::Full {
                    max: caller.max_keys,
                });
            }
            let id = loop {
                let id = new_id().map_err(|e| {
                    Refused::File(ManagedError::Io {
                        path: self.file.clone(),
                        source: std::io::Error::other(e),
                    })
                })?;
                if current.by_id(&id).is_none() && !file.keys.iter().any(|k| k.id == id) {
                    break id;
                }
            };
            key.id = id;
            file.keys.push(key.clone());
            Ok((true, key))
        })
        .inspect(|_| self.publish())
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
        self.store.revoke(self, caller, id).await
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

    fn revoke_blocking(&self, caller: &KeyEntry, id: &str) -> Result<(), Refused> {
        let _publishing = self.publishing();
        managed::update(&self.file, |file: &mut ManagedFile| {
            // The key and every key it made, recursively (all of the caller's project).
            let ours = file
                .keys
                .iter()
                .any(|k| k.id == id && *k.project == *caller.project);
            if ours && managed::without_descendants(file, &[id.to_owned()]) > 0 {
                return Ok((true, ()));
            }
            Err(self.not_revocable(caller, id))
        })
        .inspect(|_| self.publish())
    }

    /// The publishing lock (see the field). A poisoned one guards no data of its own.
    fn publishing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.publishing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Rebuilds the snapshot from the operator keys in service and the managed file, and swaps
    /// it in at once; called with the publishing lock held, after the change was written. The
    /// keys file is not re-read: a broken edit of it in progress must not stop a revocation
    /// from taking effect.
    fn publish(&self) {
        // A file that cannot be read now switches the API-made keys off (fail closed), never
        // leaves revoked ones working.
        let (file, problem) = match managed::read(&self.file) {
            Ok(f) => (f, None),
            Err(e) => {
                log::error!("keys API: {e}; API-made keys are off meanwhile");
                (ManagedFile::default(), Some(e.to_string()))
            }
        };
        let current = self.keys.load_full();
        let merged = managed::merge(current.operator_keys(), &file, &self.plans);
        for w in &merged.warnings {
            log::warn!("{}: {w}", self.file.display());
        }
        self.store.published(&file, &merged.revoked);
        let mut next = merged.store;
        next.set_managed_problem(problem);
        next.carry_last_used(&current);
        self.keys.store(Arc::new(next));
    }

    /// Saves the last use of API-made keys to the managed file (see the periodic service).
    pub fn save_last_used(&self) {
        match managed::save_last_used(&self.file, &self.keys.load()) {
            Ok(0) => {}
            Ok(n) => log::debug!("keys API: saved the last use of {n} keys"),
            Err(e) => log::warn!("keys API: could not save when keys were last used: {e}"),
        }
    }
}

/// Saves the last use of API-made keys every `keys_api.last_used_flush_seconds`, and once more
/// at shutdown.
pub struct LastUsedSaver(pub Arc<KeysApi>);

#[async_trait::async_trait]
impl pingora::services::background::BackgroundService for LastUsedSaver {
    async fn start(&self, mut shutdown: pingora::server::ShutdownWatch) {
        let mut ticks = crate::ops::periodic::Ticks::new(self.0.config.last_used_flush);
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
    fn origins_are_checked_as_the_keys_files_are() {
        let ok = parse_new_key(
            br#"{"label":"web","origins":["https://app.example.com"," https://*.example.org ","https://app.example.com"]}"#,
        )
        .unwrap();
        assert_eq!(ok.label.as_deref(), Some("web"));
        assert_eq!(
            ok.origins,
            ["https://app.example.com", "https://*.example.org"],
            "trimmed, once each"
        );
        assert_eq!(parse_new_key(b"").unwrap(), NewKey::default());
        for body in [
            &br#"{"origins":"https://a.example"}"#[..],
            br#"{"origins":[5]}"#,
            br#"{"origins":["not an origin"]}"#,
            br#"{"origins":["https://a.example/path"]}"#,
        ] {
            assert_eq!(
                parse_new_key(body).unwrap_err().status,
                422,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let many: Vec<String> = (0..=MAX_NEW_ORIGINS)
            .map(|i| format!("\"https://a{i}.example\""))
            .collect();
        let body = format!(r#"{{"origins":[{}]}}"#, many.join(","));
        assert_eq!(parse_new_key(body.as_bytes()).unwrap_err().status, 422);
    }

    #[test]
    fn labels_are_bounded_and_bodies_must_be_json_objects() {
        assert_eq!(parse_label(b"").ok(), Some(None));
        assert_eq!(
            parse_label(br#"{"label":"ci"}"#).ok(),
            Some(Some("ci".into()))
        );
        assert_eq!(parse_label(br#"{"label":null,"x":1}"#).ok(), Some(None));
        for (body, status) in [
            (&b"{"[..], 400),
            (b"[1]", 400),
            (b"\"x\"", 400),
            (br#"{"label":5}"#, 422),
            (br#"{"label":"a\u0000b"}"#, 422),
        ] {
            let a = parse_label(body).unwrap_err();
            assert_eq!(
                a.status.as_u16(),
                status,
                "{}",
                String::from_utf8_lossy(body)
            );
            let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
            assert!(v["error"].is_string() && v["message"].is_string(), "{v}");
            assert!(v.get("detail").is_some());
        }
        let long = format!(r#"{{"label":"{}"}}"#, "é".repeat(MAX_LABEL_LEN + 1));
        assert_eq!(parse_label(long.as_bytes()).unwrap_err().status, 422);
        let fits = format!(r#"{{"label":"{}"}}"#, "é".repeat(MAX_LABEL_LEN));
        assert!(parse_label(fits.as_bytes()).is_ok());
    }

    #[test]
    fn ids_are_valid_key_ids() {
        let id = new_id().unwrap();
        assert!(id_problem(&id).is_none(), "{id}");
        assert_ne!(id, new_id().unwrap());
    }
}
