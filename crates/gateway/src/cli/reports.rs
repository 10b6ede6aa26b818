//! `reports list | accept ID | reject ID`: the operator's view of the projects' reports, from
//! the configured store (the control store, the state folder's `reports.records.sqlite`, or the
//! quota's Redis).

use std::path::Path;

use super::{settings, CommandError};
use drg_access::quota::config::QuotaStoreKind;
use drg_base::infra::control::Control;
use drg_base::infra::records::{Home, Merged, RecordStore};
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
    let control = match &gateway.control {
        Some(config) => Some(Control::new(config).map_err(|e| format!("gateway.control: {e}"))?),
        None => None,
    };
    let redis = (gateway.quota.store == QuotaStoreKind::Redis).then_some(&gateway.quota.redis);
    let home = Home {
        folder: &folder,
        redis,
        control: control.as_ref(),
    };
    runtime.block_on(async {
        let store: Box<dyn RecordStore<Report>> = home.store("reports");
        let decisions: Box<dyn RecordStore<Decision>> = home.store(decisions::KIND);
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
