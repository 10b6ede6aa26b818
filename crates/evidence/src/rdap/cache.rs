//! What the gateway knows of domains' registration: a bounded in-memory cache (S3-FIFO) and its
//! state file, so a restart does not ask the registries again for days.
//!
//! The state file is JSON lines, written whole and atomically (mode 0600); a line that does not
//! parse or is out of range is skipped, never believed.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use drg_domain::age::DayNumber;

/// What is known of one registrable domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// Registered on this day.
    Registered(DayNumber),
    /// The registry answers for it, without a registration date.
    Undated,
    /// The registry does not know it (404).
    NotFound,
    /// The last fetch failed, for this reason (`FetchError::kind`): not asked again before
    /// the entry expires.
    Failed(&'static str),
}

/// A cached fact and when it stops being believed (Unix seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub known: Known,
    pub expires: u64,
}

/// One line of the state file.
#[derive(Serialize, Deserialize)]
struct Line {
    /// The registrable domain.
    d: String,
    /// `registered`, `undated` or `not_found`.
    k: String,
    /// The registration day, for `registered`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    r: Option<DayNumber>,
    /// Expiry, Unix seconds.
    e: u64,
}

/// A cache of `capacity` entries (as `Cache::new` sizes it) with a randomly keyed aHash.
pub(super) fn caller_keyed_cache<K: Eq + std::hash::Hash, V: Clone>(
    capacity: usize,
) -> quick_cache::sync::Cache<K, V, quick_cache::UnitWeighter, ahash::RandomState> {
    quick_cache::sync::Cache::with(
        capacity,
        capacity as u64,
        quick_cache::UnitWeighter,
        ahash::RandomState::new(),
        quick_cache::sync::DefaultLifecycle::default(),
    )
}

/// The cache.
pub struct AgeCache {
    /// Keyed by names callers choose: aHash with per-process random keys (resistant to
    /// collisions built without them), ~4 times cheaper than SipHash on a name.
    entries:
        quick_cache::sync::Cache<Box<str>, Entry, quick_cache::UnitWeighter, ahash::RandomState>,
}

impl AgeCache {
    pub fn new(capacity: usize) -> Self {
        AgeCache {
            entries: caller_keyed_cache(capacity.max(1)),
        }
    }

    /// The entry for `name` unless it expired by `now` (Unix seconds).
    pub fn get(&self, name: &str, now: u64) -> Option<Known> {
        self.entries
            .get(name)
            .filter(|e| e.expires > now)
            .map(|e| e.known)
    }

    /// The entry for `name`, expired or not.
    pub fn entry(&self, name: &str) -> Option<Entry> {
        self.entries.get(name)
    }

    pub fn insert(&self, name: &str, entry: Entry) {
        self.entries.insert(name.into(), entry);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.len() == 0
    }

    /// Loads the state file, keeping lines that parse and have not expired by `now`, each kept
    /// at most `longest` seconds from now (a shorter configured lifetime applies at once);
    /// returns (kept, skipped). A missing file is an empty one.
    pub fn load(&self, path: &Path, now: u64, longest: u64) -> std::io::Result<(usize, usize)> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, 0)),
            Err(e) => return Err(e),
        };
        let (mut kept, mut skipped) = (0, 0);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            match parse_line(line, now) {
                Some((name, mut entry)) => {
                    entry.expires = entry.expires.min(now.saturating_add(longest));
                    self.insert(&name, entry);
                    kept += 1;
                }
                None => skipped += 1,
            }
        }
        Ok((kept, skipped))
    }

    /// Writes every unexpired fact (failures are not kept) to `path`; returns the lines.
    pub fn save(&self, path: &Path, now: u64) -> std::io::Result<usize> {
        let mut out = Vec::new();
        let mut lines = 0;
        for (name, entry) in self.entries.iter() {
            if entry.expires <= now {
                continue;
            }
            let (k, r) = match entry.known {
                Known::Registered(day) => ("registered", Some(day)),
                Known::Undated => ("undated", None),
                Known::NotFound => ("not_found", None),
                Known::Failed(_) => continue,
            };
            let line = Line {
                d: name.to_string(),
                k: k.to_owned(),
                r,
                e: entry.expires,
            };
            serde_json::to_writer(&mut out, &line)?;
            out.write_all(b"\n")?;
            lines += 1;
        }
        drg_base::infra::fsutil::write_atomic(path, 0o600, &out)?;
        Ok(lines)
    }
}

/// A state file's line, if it is sound: a domain name, a known kind, an unexpired time.
fn parse_line(line: &str, now: u64) -> Option<(String, Entry)> {
    let line: Line = serde_json::from_str(line).ok()?;
    let name = drg_domain::DomainName::parse(&line.d).ok()?;
    if name.as_str() != line.d || line.e <= now {
        return None;
    }
    let known = match (line.k.as_str(), line.r) {
        ("registered", Some(day)) if (5_479..=200_000).contains(&day) => Known::Registered(day),
        ("undated", None) => Known::Undated,
        ("not_found", None) => Known::NotFound,
        _ => return None,
    };
    Some((
        line.d,
        Entry {
            known,
            expires: line.e,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_survive_a_save_and_load_and_bad_lines_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rdap_cache.jsonl");
        let cache = AgeCache::new(100);
        let now = 1_000;
        let entry = |known, expires| Entry { known, expires };
        cache.insert("young.com", entry(Known::Registered(20_700), 2_000));
        cache.insert("gone.com", entry(Known::NotFound, 2_000));
        cache.insert("failed.com", entry(Known::Failed("timeout"), 2_000));
        cache.insert("old.com", entry(Known::Undated, 500));
        assert_eq!(cache.save(&path, now).unwrap(), 2);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("not json\n{\"d\":\"Bad Name\",\"k\":\"undated\",\"e\":5000}\n");
        text.push_str("{\"d\":\"x.com\",\"k\":\"registered\",\"r\":3,\"e\":5000}\n");
        std::fs::write(&path, text).unwrap();
        let loaded = AgeCache::new(100);
        assert_eq!(loaded.load(&path, now, 10_000).unwrap(), (2, 3));
        assert_eq!(
            loaded.get("young.com", now),
            Some(Known::Registered(20_700))
        );
        assert_eq!(loaded.get("gone.com", now), Some(Known::NotFound));
        assert_eq!(loaded.get("young.com", 2_000), None);
        assert_eq!(
            loaded.load(&dir.path().join("none"), now, 10_000).unwrap(),
            (0, 0)
        );
        // A lifetime shortened since the file was written applies at once.
        let short = AgeCache::new(100);
        short.load(&path, now, 100).unwrap();
        assert_eq!(short.get("young.com", now + 100), None);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
