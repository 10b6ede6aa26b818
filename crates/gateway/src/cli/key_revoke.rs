//! `key revoke ID`: revokes an API-made key, and every key it made, in the control store, by
//! the operator (audited): a key a restore from before its revocation brought back (a gateway
//! that saw it revoked names this command), or one whose holder is gone.

use std::path::Path;

use super::{settings, CommandError};

pub fn key_revoke(conf: &Path, id: &str) -> Result<String, CommandError> {
    let settings = settings(conf, Default::default())?;
    let (control, runtime) = super::control_store(&settings.gateway)?;
    let gone = runtime.block_on(drg_projects::account::keys_api::retire::revoke_by_operator(
        &control, id,
    ))?;
    if gone.is_empty() {
        return Err(format!(
            "no API-made key '{id}' in the control store, {}",
            control.described()
        )
        .into());
    }
    Ok(format!(
        "revoked in the control store, {}: {}",
        control.described(),
        gone.join(", ")
    ))
}
