//! `restore-withheld`: the operator's word that this gateway's withheld API-made keys (kept
//! aside when the shared Redis was found lost while the copy was not in step with it) may go
//! back.

use std::path::Path;

use super::{settings, CommandError};
use drg_access::quota::config::QuotaStoreKind;

pub fn restore_withheld(conf: &Path) -> Result<String, CommandError> {
    let settings = settings(conf, Default::default())?;
    let gateway = &settings.gateway;
    if gateway.quota.store != QuotaStoreKind::Redis {
        return Err(
            "nothing is ever withheld without the shared store (quota.store: redis)".into(),
        );
    }
    let (keys_cache, _) = drg_projects::account::keys_api::shared::paths(
        &gateway.keys_api.managed_file(&gateway.quota),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let done = runtime.block_on(drg_projects::account::withheld::restore(
        &keys_cache,
        &gateway.quota.redis,
    ))?;
    if done.is_empty() {
        return Ok(format!("nothing withheld beside {}", keys_cache.display()));
    }
    let said: Vec<String> = (done.iter())
        .map(|r| format!("{} {}", r.records, r.kind))
        .collect();
    Ok(format!(
        "put back {} (less what was removed or revoked meanwhile); every gateway reads them at \
         its next poll",
        said.join(", ")
    ))
}
