//! The quota state file's format before the counters file (JSON): parsed for the one import,
//! and the old file moved aside once its counts are in.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::StateError;
use crate::quota::Month;

/// Removes the legacy file once its counts are in the counters file (it is kept, hard-linked,
/// under its `.migrated` name).
pub(super) fn finish_migration(legacy: &Path, log: bool) -> Result<(), StateError> {
    let kept = migrated_name(legacy);
    let io = |source| StateError::Io {
        path: legacy.to_owned(),
        source,
    };
    if !kept.exists() {
        std::fs::hard_link(legacy, &kept).map_err(io)?;
    }
    std::fs::remove_file(legacy).map_err(io)?;
    sync_dir(legacy)?;
    if log {
        log::warn!(
            "quota: {} was already imported; kept as {}",
            legacy.display(),
            kept.display()
        );
    }
    Ok(())
}

pub(super) fn migrated_name(legacy: &Path) -> PathBuf {
    let mut name = legacy.file_name().unwrap_or_default().to_owned();
    name.push(".migrated");
    legacy.with_file_name(name)
}

fn sync_dir(path: &Path) -> Result<(), StateError> {
    let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d,
        None => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| StateError::Io {
            path: dir.to_owned(),
            source,
        })
}

/// The legacy state file (JSON): per key, its month and count.
#[derive(Debug, Default, Serialize, Deserialize)]
struct StateFile {
    version: u32,
    keys: BTreeMap<String, KeyState>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct KeyState {
    month: MonthLabel,
    used: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MonthLabel(Month);

impl Serialize for MonthLabel {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.label())
    }
}

impl<'de> Deserialize<'de> for MonthLabel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Month::parse_label(&s)
            .map(MonthLabel)
            .ok_or_else(|| serde::de::Error::custom(format!("'{s}' is not a YYYY-MM month")))
    }
}

pub(super) fn read_legacy(path: &Path) -> Result<Vec<(String, Month, u64)>, StateError> {
    let text = std::fs::read_to_string(path).map_err(|source| StateError::Io {
        path: path.to_owned(),
        source,
    })?;
    parse_state(&text).map_err(|e| StateError::Corrupt {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

/// Parses a legacy (JSON) state file as the import does: each key's month and count (the fuzz
/// target's entry).
pub fn parse_state(text: &str) -> Result<Vec<(String, Month, u64)>, serde_json::Error> {
    let file: StateFile = serde_json::from_str(text)?;
    Ok(file
        .keys
        .into_iter()
        .map(|(id, k)| (id, k.month.0, k.used))
        .collect())
}
