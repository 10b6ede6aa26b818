//! `key sync`: applies the keys file to the control store, the one truth every gateway serves
//! API-made keys from: keys made by an operator key the file no longer holds are revoked, with
//! what they made, and that key retired on every gateway, as is one an earlier sync applied
//! that made nothing; a retired key the file holds again comes back. Audited (`key sync`);
//! `--dry-run` says what it would do.

use std::collections::BTreeMap;
use std::path::Path;

use super::{settings, CommandError};
use crate::server::keys_source;

pub fn key_sync(conf: &Path, dry: bool) -> Result<String, CommandError> {
    let settings = settings(conf, Default::default())?;
    let source = keys_source(&settings);
    // The operator's file alone, checked as a start checks it: a broken file applies nothing.
    let text = std::fs::read_to_string(&source.path)
        .map_err(|e| format!("{}: {e}", source.path.display()))?;
    let keys =
        drg_access::keys::parse_keys(&text, &source.path.display().to_string(), &source.plans)?;
    let operator: BTreeMap<String, String> = keys
        .entries()
        .map(|k| (k.id.to_string(), k.project.to_string()))
        .collect();
    let (control, runtime) = super::control_store(&settings.gateway)?;
    let synced = runtime.block_on(drg_projects::account::keys_api::retire::sync_makers(
        &control, &operator, dry,
    ))?;
    let verb = if dry { "would be" } else { "were" };
    let mut out = vec![format!(
        "{} ({} operator keys) applied to the control store, {}{}:",
        source.path.display(),
        operator.len(),
        control.described(),
        if dry {
            " (dry run: nothing written)"
        } else {
            ""
        }
    )];
    for (maker, revoked) in &synced.retired {
        out.push(match revoked.is_empty() {
            true => format!("  retired {maker}: it made no key"),
            false => format!(
                "  retired {maker}: {} API-made keys it made {verb} revoked: {}",
                revoked.len(),
                revoked.join(", ")
            ),
        });
    }
    for id in &synced.restored {
        out.push(format!("  {id}: retired before, in service again"));
    }
    if synced.retired.is_empty() && synced.restored.is_empty() {
        out.push(
            "  nothing to change: every maker of an API-made key, and every operator key applied \
             before, is in the file"
                .into(),
        );
    }
    Ok(out.join("\n"))
}
