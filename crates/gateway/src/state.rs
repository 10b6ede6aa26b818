//! What every part shares: the snapshots and handles one request reads, also handed to the
//! background services and the admin listener. Nothing here imports the listener's side (`edge`).

use std::sync::Arc;

use arc_swap::ArcSwap;

use drg_access::keys::KeyStore;
use drg_access::quota::{Clock, QuotaStore};
use drg_domain::DomainTable;
use drg_evidence::mx::resolver::MxResolver;
use drg_telemetry::lifecycle::Draining;
use drg_telemetry::metrics::Metrics;

/// Everything the gateway reads per request, shared with the background services and the
/// admin listener.
#[derive(Clone)]
pub struct Shared {
    pub table: Arc<ArcSwap<DomainTable>>,
    pub keys: Arc<ArcSwap<KeyStore>>,
    pub quota: Arc<dyn QuotaStore>,
    pub clock: Arc<dyn Clock>,
    /// `None` when MX lookups are disabled.
    pub mx: Option<Arc<MxResolver>>,
    /// Domain age (`gateway.rdap`; `None`: off).
    pub rdap: Option<Arc<drg_evidence::rdap::service::Rdap>>,
    /// Quota alerts (`gateway.quota.alerts`; `None`: off): told each counted call's month.
    pub alerts: Option<Arc<drg_access::quota::alerts::Alerts>>,
    /// OpenTelemetry tracing (`gateway.tracing`; `None`: off).
    pub tracing: Option<Arc<drg_telemetry::trace::Tracing>>,
    pub draining: Draining,
    pub metrics: Arc<Metrics>,
    /// Each project's own verdicts (`/v1/overrides`), which its lookups answer with first.
    pub overrides: Arc<ArcSwap<drg_domain::overrides::OverrideSet>>,
    /// The operator's accepted verdicts (`reports accept`), from the shared store.
    pub accepted: Arc<ArcSwap<drg_projects::account::reports::Accepted>>,
    /// Each project's own webhooks (`gateway.webhooks`; `None`: off): who is subscribed to an
    /// event, and where and how one is sent.
    pub webhooks: Option<drg_projects::account::webhooks::ProjectHooks>,
    /// The control store (PostgreSQL with `gateway.control`, else SQLite in the state folder).
    pub control: Arc<drg_base::infra::control::Control>,
}
