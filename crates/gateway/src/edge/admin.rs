//! The operator-only listener (`gateway.admin.listen`, loopback by default, never the public
//! port): readiness with the details the public `/readyz` must not show, and the Prometheus
//! metrics.

use std::sync::Arc;

use async_trait::async_trait;
use http::{Response, StatusCode};
use pingora::apps::http_app::ServeHttp;
use pingora::protocols::http::ServerSession;
use serde::Serialize;

use crate::state::Shared;
use drg_base::answer::JSON;
use drg_telemetry::connections::{DownstreamCounts, DownstreamStats};
use drg_telemetry::lifecycle::Phase;
use drg_telemetry::metrics::Scrape;

/// What the admin listener reports on.
pub struct Admin {
    pub shared: Shared,
    pub downstream: Arc<DownstreamStats>,
    pub upstream: String,
    pub keys_api: Option<Arc<drg_projects::account::keys_api::KeysApi>>,
    /// The projects' reports (`GET /reports`).
    pub reports: Option<Arc<drg_projects::account::reports::Reports>>,
    /// Each kind of record's last revision that went back in this run (see `snapshot.rs`).
    pub went_back: Vec<WentBackOf>,
}

/// Asks one kind of record whether the control store's revision went back.
pub type WentBackOf =
    Box<dyn Fn() -> Option<drg_base::infra::records::snapshot::WentBack> + Send + Sync>;

#[derive(Serialize)]
struct Readiness {
    /// `ready`, `draining` (SIGTERM), `upgrading` (SIGQUIT), `quota_store_unavailable`,
    /// `quota_store_evicts` or `control_store_loading` (the first read at start).
    status: &'static str,
    /// Which process answered (several gateways may share a host).
    pid: u32,
    table_names: usize,
    /// `X-Dataset-Version` of the table in service (generation and content hash).
    dataset_version: String,
    keys: usize,
    /// Why the API-made keys are off (absent while their cache or store is read).
    #[serde(skip_serializing_if = "Option::is_none")]
    managed_keys_problem: Option<String>,
    quota: serde_json::Value,
    /// The API-made keys' store: its engine and the revision this gateway holds (`null`
    /// until it is first read).
    #[serde(skip_serializing_if = "Option::is_none")]
    keys_store: Option<serde_json::Value>,
    /// The control store: its engine, and each kind whose revision went back in this run (a
    /// restore from an older backup, a failover to a replica that lagged: what it holds now
    /// is served). Never a reason to be unready: the snapshot answers.
    control_store: serde_json::Value,
    upstream: String,
    connections: DownstreamCounts,
    /// MX evidence: what the canaries say of the resolver, and whether evidence is on (absent
    /// with `mx.enabled: false`). Never a reason to be unready: the table answers alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    mx: Option<serde_json::Value>,
}

/// The `status` word and whether the process is ready: not while it drains or hands its
/// sockets to a new process, nor while the quota store refuses every counted call.
fn readiness(shared: &Shared) -> (&'static str, bool) {
    match shared.draining.phase() {
        Phase::Serving if shared.quota.refuses_calls() => ("quota_store_unavailable", false),
        Phase::Serving if shared.quota.unready_for_eviction() => ("quota_store_evicts", false),
        Phase::Serving if shared.control.loading() => ("control_store_loading", false),
        Phase::Serving => ("ready", true),
        phase => (phase.status(), false),
    }
}

/// Keys listed by `/mx/neighbourhoods` by default, and at most.
const NEIGHBOURHOODS_DEFAULT: usize = 50;
const NEIGHBOURHOODS_MAX: usize = 1000;

impl Admin {
    /// `GET /reports[?all=true]`: the projects' reports grouped by domain, open ones first
    /// (`all`: decided ones too), with how many distinct projects said what.
    fn reports(&self, query: Option<&str>) -> (StatusCode, Vec<u8>) {
        let all = query.is_some_and(|q| q.split('&').any(|kv| kv == "all=true"));
        let Some(reports) = &self.reports else {
            return (StatusCode::OK, br#"{"groups":[]}"#.to_vec());
        };
        let held = reports.snapshot.held();
        let groups = drg_projects::account::reports::grouped::groups(held.all(), !all);
        let body = serde_json::json!({ "groups": groups });
        (StatusCode::OK, body.to_string().into_bytes())
    }

    /// `GET /mx/neighbourhoods?limit=N`: what the MX neighbourhood index learned, the keys
    /// with the most listed neighbours first.
    fn neighbourhoods(&self, query: Option<&str>) -> (StatusCode, Vec<u8>) {
        let limit = match query.and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("limit=")))
        {
            None => NEIGHBOURHOODS_DEFAULT,
            Some(v) => match v.parse::<usize>() {
                Ok(n) if (1..=NEIGHBOURHOODS_MAX).contains(&n) => n,
                _ => {
                    let body = serde_json::json!({
                        "error": "validation_error",
                        "message": "Invalid parameter.",
                        "detail": format!("limit must be an integer in 1..={NEIGHBOURHOODS_MAX}"),
                    });
                    return (
                        StatusCode::UNPROCESSABLE_ENTITY,
                        body.to_string().into_bytes(),
                    );
                }
            },
        };
        let Some(index) = self.shared.mx.as_ref().and_then(|mx| mx.neighbourhood()) else {
            let body = br#"{"enabled":false,"domains":0,"keys":0,"top":[]}"#;
            return (StatusCode::OK, body.to_vec());
        };
        let stats = index.stats();
        let body = serde_json::json!({
            "enabled": true,
            "domains": stats.domains,
            "keys": stats.keys.iter().sum::<u64>(),
            "keys_by_kind": {"host": stats.keys[0], "parent": stats.keys[1], "network": stats.keys[2]},
            "verdicts": {"host": stats.verdicts[0], "parent": stats.verdicts[1], "network": stats.verdicts[2]},
            "top": index.top(limit),
        });
        (StatusCode::OK, body.to_string().into_bytes())
    }
}

#[async_trait]
impl ServeHttp for Admin {
    async fn response(&self, session: &mut ServerSession) -> Response<Vec<u8>> {
        let header = session.req_header();
        let mut content_type = JSON;
        let (status, body) = match (header.method.as_str(), header.uri.path()) {
            ("GET", "/metrics") => {
                content_type = prometheus::TEXT_FORMAT;
                let table = self.shared.table.load();
                let scrape = Scrape {
                    table_names: table.len(),
                    table_generation: table.version().generation,
                    keys: self.shared.keys.load().len(),
                    keys_managed_ok: self.shared.keys.load().managed_problem().is_none(),
                    quota: self.shared.quota.status(),
                    mx: self.shared.mx.as_ref().map(|mx| mx.stats()),
                    rdap: self.shared.rdap.as_ref().map(|r| r.stats()),
                    alerts: self.shared.alerts.as_ref().map(|a| a.stats()),
                    tracing: self.shared.tracing.as_ref().map(|t| t.stats()),
                    downstream: self.downstream.counts(),
                };
                (StatusCode::OK, self.shared.metrics.render(&scrape))
            }
            ("GET", "/readyz") => {
                let (status, ready) = readiness(&self.shared);
                let body = Readiness {
                    status,
                    pid: std::process::id(),
                    table_names: self.shared.table.load().len(),
                    dataset_version: self.shared.table.load().version().as_str().to_owned(),
                    keys: self.shared.keys.load().len(),
                    managed_keys_problem: self
                        .shared
                        .keys
                        .load()
                        .managed_problem()
                        .map(str::to_owned),
                    quota: self.shared.quota.status(),
                    keys_store: self.keys_api.as_ref().map(|k| k.store_status()),
                    control_store: serde_json::json!({
                        "engine": self.shared.control.engine().name(),
                        "went_back": self.went_back.iter().filter_map(|w| w()).collect::<Vec<_>>(),
                    }),
                    upstream: self.upstream.clone(),
                    connections: self.downstream.counts(),
                    mx: self.shared.mx.as_ref().map(|mx| {
                        let s = mx.stats();
                        serde_json::json!({
                            "resolver": s.resolver,
                            "evidence": if s.breaker_open { "off" } else { "on" },
                        })
                    }),
                };
                let code = if ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                (code, serde_json::to_vec(&body).unwrap_or_default())
            }
            ("GET", "/mx/neighbourhoods") => self.neighbourhoods(header.uri.query()),
            ("GET", "/reports") => self.reports(header.uri.query()),
            _ => (
                StatusCode::NOT_FOUND,
                br#"{"error":"not_found","message":"No such route.","detail":null}"#.to_vec(),
            ),
        };
        Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::CONTENT_LENGTH, body.len())
            .body(body)
            .unwrap_or_default()
    }
}
