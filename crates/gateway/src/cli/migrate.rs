//! `migrate`: moves an earlier release's keys and records (the state folder's files and, with
//! the shared Redis, its rows) into the control store the configuration names, and tells what
//! moved.

use std::path::Path;

use super::{settings, CommandError};
use drg_access::quota::config::QuotaStoreKind;
use drg_base::infra::control::Control;

pub fn migrate(conf: &Path) -> Result<String, CommandError> {
    let settings = settings(conf, Default::default())?;
    let gateway = &settings.gateway;
    let folder = super::state_folder(gateway);
    let control = Control::open(gateway.control.as_ref(), &folder)
        .map_err(|e| format!("gateway.control: {e}"))?;
    let redis = (gateway.quota.store == QuotaStoreKind::Redis).then_some(&gateway.quota.redis);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let managed = gateway.keys_api.managed_file(&gateway.quota);
    let moved = runtime.block_on(drg_projects::account::migrate::migrate(
        &control, &folder, &managed, redis,
    ))?;
    let mut out = vec![format!("into the control store, {}:", control.described())];
    for m in &moved {
        let from = if m.from.is_empty() {
            "nothing new found".to_owned()
        } else {
            format!("from {}", m.from.join(", "))
        };
        let mut line = format!(
            "  {}: {} found, {} taken ({from})",
            m.kind, m.found, m.taken
        );
        if !m.before.is_empty() {
            line.push_str(&format!(
                "; taken by an earlier run: {}",
                m.before.join(", ")
            ));
        }
        out.push(line);
    }
    if redis.is_some() {
        out.push(
            "the rows on Redis were left there; once every gateway runs this release, \
             `DEL drg:{overrides}:rows keys:{keys}:rows` and the like drop them"
                .into(),
        );
    }
    Ok(out.join("\n"))
}
