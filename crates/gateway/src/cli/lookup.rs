//! `lookup <domain>`: classifies one domain from the configured data and shows why (the same
//! evidence as `?explain=true`, from the same function).

use std::path::Path;
use std::sync::Arc;

use super::{settings, CommandError};
use arc_swap::ArcSwap;
use drg_domain::classify::{classify_match, wants_mx};
use drg_domain::evidence::evidence as evidence_of;
use drg_domain::mail::MxEvidence;
use drg_domain::{DomainName, DomainTable};
use drg_evidence::mx::config::MxConfig;
use drg_evidence::mx::neighbourhood::Neighbourhood;
use drg_evidence::mx::resolver::MxResolver;

/// The neighbourhood index as the gateway would start with it (snapshot, then state file).
fn neighbourhood(mx: &MxConfig, table: Arc<ArcSwap<DomainTable>>) -> Option<Arc<Neighbourhood>> {
    let config = &mx.neighbourhood;
    if !config.enabled {
        return None;
    }
    let index = Neighbourhood::new(config, table, false);
    if let Some(snapshot) = &config.snapshot {
        index.load(snapshot, "snapshot", true);
    }
    index.load(&config.state_path(), "state file", false);
    Some(Arc::new(index))
}

/// `lookup <domain>`: the record, the rule that decided it and the MX evidence, without a server.
pub fn lookup(conf: &Path, domain: &str) -> Result<String, CommandError> {
    let settings = settings(conf, Default::default())?;
    let shared = Arc::new(ArcSwap::from_pointee(
        settings.gateway.data_sources().build()?,
    ));
    let table = shared.load_full();
    let name = DomainName::parse(domain).map_err(|e| format!("'{domain}': {e}"))?;
    let found = table.lookup(&name);
    let mx = &settings.gateway.mx;
    let mut finding = None;
    let evidence = if mx.enabled && wants_mx(&found) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let index = neighbourhood(mx, shared.clone());
        let mut resolver = MxResolver::new(mx)?.with_providers(shared.clone());
        if let Some(index) = &index {
            resolver = resolver.with_neighbourhood(index.clone());
        }
        let resolver = Arc::new(resolver);
        // What the resolver says is believed only once the canaries vouch for it, as in `serve`.
        runtime.block_on(resolver.check_canaries());
        // No request is waiting here: give DNS its full query timeout, not the request budget.
        let (evidence, state) =
            runtime.block_on(resolver.evidence_within(name.as_str(), mx.query_timeout, "lookup"));
        if let (Some(index), MxEvidence::Hosts(_)) = (&index, &*evidence) {
            finding = index.finding(&name, "lookup");
        }
        Some((evidence, state))
    } else {
        None
    };
    let mx_evidence = evidence.as_ref().map(|(e, _)| &**e);
    let verdict = classify_match(&table, &name, found, mx_evidence, finding);
    let explained = evidence_of(&table, &name, &verdict, mx_evidence);
    let record = serde_json::to_string_pretty(&verdict.record)?;
    let mut out = format!(
        "{record}\nrule: {}\nevidence: {}\ndataset: {}",
        explained.describe(),
        serde_json::to_string(&explained)?,
        table.version().as_str()
    );
    match &evidence {
        None if !mx.enabled => out.push_str("\nmx: lookups disabled (gateway.mx.enabled)"),
        None => out.push_str("\nmx: not needed (the table decided)"),
        Some((e, state)) => {
            out.push_str(&format!(
                "\nmx: {} ({state:?})",
                serde_json::to_string(&**e)?
            ));
            for h in e.hosts() {
                out.push_str(&format!("\n  {:>5} {}", h.preference, h.host));
            }
            match &verdict.provider {
                Some(p) => out.push_str(&format!(
                    "\nprovider: {} ({:?}), host {} matched {}",
                    p.label, p.kind, p.host, p.pattern
                )),
                None => out.push_str("\nprovider: not recognised"),
            }
        }
    }
    Ok(out)
}
