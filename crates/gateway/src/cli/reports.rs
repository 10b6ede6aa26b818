//! `reports list | accept ID | reject ID`: the operator's view of the projects' reports, from
//! the control store (PostgreSQL with `gateway.control`, else the state folder's SQLite).

use std::path::Path;

use super::{settings, CommandError};
use drg_base::infra::control::Control;
use drg_base::infra::records::sql::SqlRecords;
use drg_base::infra::records::Merged;
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
    let control = Control::open(gateway.control.as_ref(), &folder)
        .map_err(|e| format!("gateway.control: {e}"))?;
    runtime.block_on(async {
        let store = SqlRecords::<Report>::new(control.clone(), "reports");
        let decisions = SqlRecords::<Decision>::new(control.clone(), decisions::KIND);
        let now = chrono::Utc::now().timestamp();
        match action {
            ReportsAction::List { all } => {
                let held = Merged::of(store.read().await?.1);
                let groups = grouped::groups(held.all(), !all);
                Ok(serde_json::to_string_pretty(&groups)?)
            }
            ReportsAction::Accept(id) | ReportsAction::Reject(id) => {
                let yes = matches!(action, ReportsAction::Accept(_));
                let stores = accept::Stores {
                    reports: &store,
                    decisions: &decisions,
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
