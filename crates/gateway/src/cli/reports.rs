//! `reports list | accept ID | reject ID`: the operator's view of the projects' reports, from
//! the configured store (the state folder's `reports.records.sqlite`, or the quota's Redis).

use std::path::Path;

use super::{settings, CommandError};
use drg_access::quota::config::QuotaStoreKind;
use drg_base::infra::records::redis::RedisRecords;
use drg_base::infra::records::sqlite::SqliteRecords;
use drg_base::infra::records::{Merged, RecordStore};
use drg_projects::account::reports::{accept, decisions, grouped, Decision, Report};

/// What the operator asked.
pub enum ReportsAction<'a> {
    /// Open reports grouped by domain (`all`: decided ones too), as JSON.
    List {
        all: bool,
    },
    Accept(&'a str),
    Reject(&'a str),
}

pub fn reports(conf: &Path, action: ReportsAction<'_>) -> Result<String, CommandError> {
    let settings = settings(conf, Default::default())?;
    let gateway = &settings.gateway;
    let folder = super::state_folder(gateway);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store: Box<dyn RecordStore<Report>> = open(gateway, &folder, "reports");
        let decisions: Box<dyn RecordStore<Decision>> = open(gateway, &folder, decisions::KIND);
        let now = chrono::Utc::now().timestamp();
        match action {
            ReportsAction::List { all } => {
                let held = Merged::of(store.read().await?);
                let groups = grouped::groups(held.all(), !all);
                Ok(serde_json::to_string_pretty(&groups)?)
            }
            ReportsAction::Accept(id) | ReportsAction::Reject(id) => {
                let yes = matches!(action, ReportsAction::Accept(_));
                let stores = accept::Stores {
                    reports: &*store,
                    decisions: &*decisions,
                };
                let done = accept::decide(stores, id, yes, &gateway.data.dir, now).await?;
                let verb = if yes { "accepted" } else { "rejected" };
                Ok(match done.file {
                    _ if done.again => format!(
                        "{id} was accepted before; its verdict is in force on every gateway"
                    ),
                    Some(f) => format!(
                        "{verb} {}; in force on every gateway at its next poll, and written to {}",
                        done.reports.join(", "),
                        f.display()
                    ),
                    None => format!("{verb} {}", done.reports.join(", ")),
                })
            }
        }
    })
}

/// The store of `kind`'s records the gateways use: the state folder's SQLite file, or Redis.
fn open<R: drg_base::infra::records::Record>(
    gateway: &crate::config::GatewayConfig,
    folder: &Path,
    kind: &'static str,
) -> Box<dyn RecordStore<R>> {
    match gateway.quota.store {
        QuotaStoreKind::Local => Box::new(SqliteRecords::new(
            folder.join(format!("{kind}.records.sqlite")),
        )),
        QuotaStoreKind::Redis => Box::new(RedisRecords::new(&gateway.quota.redis, kind)),
    }
}
