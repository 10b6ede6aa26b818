//! API keys: the keys file (hashed secrets, plans, origins), the `KeyStore` that authenticates
//! a presented secret, and generation of new secrets.
//!
//! Secrets are never stored: the file holds their SHA-256. A presented secret is hashed, found
//! by the first bytes of its hash, and compared in constant time. Secrets never reach a log.
//! A file without a `keys:` list (emptied, truncated) is refused rather than read as "no keys":
//! locking every client out takes an explicit `keys: []`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::origin::OriginPattern;

/// Prefix of the secrets `key new` generates: recognisable in code reviews and secret scanners.
pub const SECRET_PREFIX: &str = "drg_";
/// Random bytes in a generated secret.
pub const SECRET_BYTES: usize = 32;
/// Longest bearer token we look at.
pub const MAX_TOKEN_LEN: usize = 256;

/// The demo key shipped in `conf/keys.yaml` for the loopback quick start. Its secret is public
/// (in the README), so the gateway refuses it on any other address unless told otherwise.
pub const DEMO_SECRET: &str = "drg_demo_local_only_do_not_deploy_5xY8qk3RvT2mWn7pLc4Hb";

/// SHA-256 of a secret.
pub fn hash_secret(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
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

/// One key as the gateway knows it.
#[derive(Debug, Clone)]
pub struct KeyEntry {
    pub id: Arc<str>,
    pub plan: Arc<str>,
    /// Calls allowed per calendar month.
    pub monthly_limit: u64,
    /// `None`: a server key, any origin.
    pub origins: Option<Vec<OriginPattern>>,
    pub disabled: bool,
    hash: [u8; 32],
}

impl KeyEntry {
    pub fn is_demo(&self) -> bool {
        bool::from(self.hash.ct_eq(&hash_secret(DEMO_SECRET)))
    }
}

/// The keys of one keys-file version, indexed by hash.
#[derive(Debug, Default)]
pub struct KeyStore {
    by_prefix: HashMap<u64, Vec<Arc<KeyEntry>>>,
    len: usize,
}

impl KeyStore {
    /// The key whose secret this is, if any (disabled keys included: the caller decides).
    pub fn find(&self, secret: &str) -> Option<&Arc<KeyEntry>> {
        let digest = hash_secret(secret);
        let candidates = self.by_prefix.get(&prefix(&digest))?;
        // Constant time over the full hash; the map lookup above only saw 8 bytes of a hash.
        candidates
            .iter()
            .find(|k| bool::from(k.hash.ct_eq(&digest)))
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
}

/// What a keys file without a `keys:` list is told (at start, and in the reload log).
const NO_KEYS_LIST: &str = "no `keys:` list (an empty or truncated file?); refused, since it \
     would lock every client out: write `keys: []` if no key is to be accepted";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyRow {
    id: String,
    sha256: String,
    plan: String,
    #[serde(default)]
    origins: Vec<String>,
    #[serde(default)]
    disabled: bool,
}

/// Why a keys file was refused: every problem, each naming the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {}", problems.join("; "))]
pub struct KeysError {
    pub origin: String,
    pub problems: Vec<String>,
}

/// Parses a keys file against the configured plans (`name -> monthly limit`).
pub fn parse_keys(
    text: &str,
    origin: &str,
    plans: &BTreeMap<String, u64>,
) -> Result<KeyStore, KeysError> {
    let fail = |problems: Vec<String>| KeysError {
        origin: origin.to_owned(),
        problems,
    };
    // A document that is empty or only comments is `None`, like a missing `keys:` entry.
    let file: Option<KeysFile> =
        serde_yaml_ng::from_str(text).map_err(|e| fail(vec![e.to_string()]))?;
    let Some(rows) = file.and_then(|f| f.keys) else {
        return Err(fail(vec![NO_KEYS_LIST.to_owned()]));
    };
    let mut problems = Vec::new();
    let mut ids = HashSet::new();
    let mut hashes = HashSet::new();
    let mut store = KeyStore::default();
    for (i, row) in rows.into_iter().enumerate() {
        let at = format!("keys[{i}] (id '{}')", row.id);
        if row.id.is_empty()
            || !row
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            problems.push(format!("{at}: id must be letters, digits, '-', '_' or '.'"));
        }
        // The embedded quota store keeps each id in a fixed-size slot of its state file.
        if row.id.len() > crate::access::quota::local::MAX_KEY_ID_LEN {
            problems.push(format!(
                "{at}: id is longer than {} characters",
                crate::access::quota::local::MAX_KEY_ID_LEN
            ));
        }
        if !ids.insert(row.id.clone()) {
            problems.push(format!("{at}: id is used by another key"));
        }
        let hash = match hex::decode(row.sha256.trim()) {
            Ok(bytes) if bytes.len() == 32 => {
                let mut h = [0u8; 32];
                h.copy_from_slice(&bytes);
                if !hashes.insert(h) {
                    problems.push(format!("{at}: sha256 is used by another key"));
                }
                Some(h)
            }
            _ => {
                problems.push(format!("{at}: sha256 must be 64 hex digits (the SHA-256 of the secret, never the secret)"));
                None
            }
        };
        let limit = plans.get(&row.plan).copied();
        if limit.is_none() {
            problems.push(format!(
                "{at}: unknown plan '{}' (configured: {})",
                row.plan,
                plans.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
        }
        let mut origins = Vec::new();
        for o in &row.origins {
            match OriginPattern::parse(o) {
                Ok(p) => origins.push(p),
                Err(e) => problems.push(format!("{at}: {e}")),
            }
        }
        if let (Some(hash), Some(monthly_limit)) = (hash, limit) {
            let entry = KeyEntry {
                id: row.id.into(),
                plan: row.plan.into(),
                monthly_limit,
                origins: (!origins.is_empty()).then_some(origins),
                disabled: row.disabled,
                hash,
            };
            store
                .by_prefix
                .entry(prefix(&hash))
                .or_default()
                .push(Arc::new(entry));
            store.len += 1;
        }
    }
    if problems.is_empty() {
        Ok(store)
    } else {
        Err(fail(problems))
    }
}

/// The YAML entry for a new key, for the keys file.
pub fn key_entry_yaml(id: &str, secret: &str, plan: &str, origins: &[String]) -> String {
    let mut out = format!(
        "  - id: {id}\n    sha256: {}\n    plan: {plan}\n",
        hex::encode(hash_secret(secret))
    );
    if !origins.is_empty() {
        out.push_str("    origins:\n");
        for o in origins {
            out.push_str(&format!("      - {o}\n"));
        }
    }
    out
}

/// The keys file as a hot-reloadable source.
#[derive(Debug, Clone)]
pub struct KeysSource {
    pub path: PathBuf,
    pub plans: BTreeMap<String, u64>,
    /// Refuse files that enable the demo key (set when listening beyond loopback).
    pub refuse_demo_key: bool,
}

impl KeysSource {
    pub fn load(&self) -> Result<KeyStore, KeysError> {
        let origin = self.path.display().to_string();
        let text = std::fs::read_to_string(&self.path).map_err(|e| KeysError {
            origin: origin.clone(),
            problems: vec![format!("cannot read: {e}")],
        })?;
        let store = parse_keys(&text, &origin, &self.plans)?;
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

impl crate::reload::Reloadable for KeysSource {
    type Snapshot = KeyStore;
    type Error = KeysError;

    fn name(&self) -> &str {
        "keys"
    }

    fn watched_files(&self) -> Vec<PathBuf> {
        vec![self.path.clone()]
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
