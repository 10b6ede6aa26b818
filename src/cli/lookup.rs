//! `lookup <domain>`: classifies one domain from the configured data and shows why.

use std::path::Path;
use std::sync::Arc;

use super::{settings, CommandError};
use crate::data_files::DataSources;
use crate::domain::classify::{classify_match, wants_mx};
use crate::domain::{DomainName, TableRule};
use crate::mx::resolver::MxResolver;

/// `lookup <domain>`: the record, the rule that decided it and the MX evidence, without a server.
pub fn lookup(conf: &Path, domain: &str) -> Result<String, CommandError> {
    let settings = settings(conf, None)?;
    let table = DataSources::from_config(&settings.gateway).build()?;
    let name = DomainName::parse(domain).map_err(|e| format!("'{domain}': {e}"))?;
    let found = table.lookup(&name);
    let mx = &settings.gateway.mx;
    let evidence = if mx.enabled && wants_mx(&found) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let resolver = Arc::new(MxResolver::new(mx)?);
        // No request is waiting here: give DNS its full query timeout, not the request budget.
        let (evidence, state) =
            runtime.block_on(resolver.evidence_within(name.as_str(), mx.query_timeout));
        Some((evidence, state))
    } else {
        None
    };
    let verdict = classify_match(&table, &name, found, evidence.as_ref().map(|(e, _)| &**e));
    let rule = match verdict.rule {
        TableRule::Allowlist { at } if at == name.as_str() => "allowlist".to_owned(),
        TableRule::Allowlist { at } => format!("allowlist, via parent domain {at}"),
        TableRule::Record(_) => "explicit record (domains.csv)".to_owned(),
        TableRule::FreeProvider { at } if at == name.as_str() => "free-provider list".to_owned(),
        TableRule::FreeProvider { at } => format!("free-provider list, via parent domain {at}"),
        TableRule::Blocklist { at } if at == name.as_str() => "blocklist".to_owned(),
        TableRule::Blocklist { at } => format!("blocklist, via parent domain {at}"),
        TableRule::Unknown => "no entry (default)".to_owned(),
    };
    let record = serde_json::to_string_pretty(&verdict.record)?;
    let mut out = format!("{record}\nrule: {rule}");
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
