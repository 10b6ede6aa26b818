//! What every part shares: the snapshots and handles one request reads, also handed to the
//! background services and the admin listener. Nothing here imports the listener's side (`edge`).

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::access::keys::KeyStore;
use crate::access::quota::{Clock, QuotaStore};
use crate::domain::DomainTable;
use crate::mx::resolver::MxResolver;
use crate::ops::lifecycle::Draining;
use crate::ops::metrics::Metrics;

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
    pub rdap: Option<Arc<crate::rdap::service::Rdap>>,
    /// Quota alerts (`gateway.quota.alerts`; `None`: off): told each counted call's month.
    pub alerts: Option<Arc<crate::access::quota::alerts::Alerts>>,
    /// OpenTelemetry tracing (`gateway.tracing`; `None`: off).
    pub tracing: Option<Arc<crate::ops::trace::Tracing>>,
    pub draining: Draining,
    pub metrics: Arc<Metrics>,
    /// Each project's own verdicts (`/v1/overrides`), which its lookups answer with first.
    pub overrides: Arc<ArcSwap<crate::domain::overrides::OverrideSet>>,
    /// The operator's accepted verdicts (`reports accept`), from the shared store.
    pub accepted: Arc<ArcSwap<crate::account::verdict_reports::Accepted>>,
    /// Each project's own webhooks (`gateway.webhooks`; `None`: off): who is subscribed to an
    /// event, and where and how one is sent.
    pub webhooks: Option<crate::account::webhooks::ProjectHooks>,
}
