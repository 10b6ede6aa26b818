//! `key new`: generates an API key, prints its secret once, and prints or appends its entry.

use std::path::Path;

use super::{settings, CommandError};
use crate::server::keys_source;
use drg_access::keys::{generate_secret, key_entry_yaml_with, parse_keys, EntryExtras};

/// `key new`: a new secret (printed once) and its keys-file entry, printed or appended.
pub fn key_new(
    conf: &Path,
    id: &str,
    plan: &str,
    origins: &[String],
    project: Option<&str>,
    append: bool,
) -> Result<String, CommandError> {
    let settings = settings(conf, Default::default())?;
    let secret = generate_secret()?;
    let created_at = drg_base::infra::units::now_rfc3339();
    let extras = EntryExtras {
        project,
        label: None,
        created_at: Some(&created_at),
    };
    let entry = key_entry_yaml_with(id, &secret, plan, origins, &extras);
    let source = keys_source(&settings);
    let current = match std::fs::read_to_string(&source.path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("{}: {e}", source.path.display()).into()),
    };
    // An explicitly empty list (`keys: []`) becomes a block list the entry can join.
    let emptied = current.lines().any(|l| l.trim() == "keys: []");
    let current = if emptied {
        current.replacen("keys: []", "keys:", 1)
    } else {
        current
    };
    let header = if current.contains("keys:") {
        ""
    } else {
        "keys:\n"
    };
    let separator = if current.is_empty() || current.ends_with('\n') {
        ""
    } else {
        "\n"
    };
    let updated = format!("{current}{separator}{header}{entry}");
    // Validate the file as it would become: a known plan, a unique id, valid origins, and the
    // project within its plan's `max_keys`.
    parse_keys(&updated, &source.path.display().to_string(), &source.plans)?;
    let mut out =
        format!("secret (shown once; store it now, it cannot be recovered):\n  {secret}\n");
    if append {
        // Replaced whole, atomically and synced (the reloader never reads half an entry, a
        // crash leaves the old file or the new one), keeping the file's mode: a keys file holds
        // secrets' hashes and its owner chose who reads it; a new one is the owner's only. A
        // symlinked file is replaced where it points, the link kept.
        let target = std::fs::canonicalize(&source.path).unwrap_or_else(|_| source.path.clone());
        let mode = drg_base::infra::fsutil::mode_of(&target).unwrap_or(0o600);
        drg_base::infra::fsutil::write_atomic(&target, mode, updated.as_bytes())
            .map_err(|e| format!("{}: {e}", source.path.display()))?;
        out.push_str(&format!(
            "entry {} {} (live within a second):\n{entry}",
            if emptied { "added to" } else { "appended to" },
            source.path.display()
        ));
    } else {
        out.push_str(&format!(
            "entry for {} (add it under `keys:`):\n{entry}",
            source.path.display()
        ));
    }
    Ok(out)
}
