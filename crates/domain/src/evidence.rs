//! Evidence: why a name got its answer (the rule, the list line that said so, the MX hosts),
//! for `?explain=true` and the `lookup` command, from one pure function.

use serde::Serialize;

use super::age::YoungEffect;
use super::classify::Verdict;
use super::mail::{MxEvidence, ProviderKind};
use super::name::DomainName;
use super::neighbour_index::Finding;
use super::table::{DomainTable, ListKind, TableRule};

/// The rule that decided an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// On the allowlist (at the name or a parent).
    Allowlist,
    /// An explicit record (`domains.csv`) for exactly this name.
    Record,
    /// On the curated free-provider list.
    FreeProvider,
    /// Only on a broad third-party free list, with no blocklist entry at the name or a parent.
    BroadFreeProvider,
    /// On a blocklist (at the name or a parent).
    Blocklist,
    /// A privacy relay or masked-email service (`relays.txt`, `relay_lists`).
    Relay,
    /// The table left the name open; its MX evidence changed the answer.
    Mx,
    /// The table left the name open; its MX host, host parent or network is dominated by
    /// listed throwaway neighbours (see `neighbourhood`).
    MxNeighbourhood,
    /// Nothing matched: the default answer.
    Unknown,
    /// The asking project's own `allow` (`/v1/overrides`), before every list and inference.
    ProjectAllow,
    /// The asking project's own `block`.
    ProjectBlock,
}

impl Rule {
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Allowlist => "allowlist",
            Rule::Record => "record",
            Rule::FreeProvider => "free_provider",
            Rule::BroadFreeProvider => "broad_free_provider",
            Rule::Blocklist => "blocklist",
            Rule::Relay => "relay",
            Rule::Mx => "mx",
            Rule::MxNeighbourhood => "mx_neighbourhood",
            Rule::Unknown => "unknown",
            Rule::ProjectAllow => "project_allow",
            Rule::ProjectBlock => "project_block",
        }
    }
}

/// The recognised MX provider: who runs the host and which pattern recognised it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProviderEvidence<'a> {
    pub label: &'a str,
    pub kind: ProviderKind,
    pub host: &'a str,
    pub pattern: &'a str,
}

/// Why a name got its answer (the `evidence` object of `?explain=true`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Evidence<'a> {
    pub rule: Rule,
    /// The table entry that matched: the name itself or the parent it was found under.
    pub matched: Option<&'a str>,
    /// `matched` is a parent of the name.
    pub via_parent: bool,
    /// The list or records source (a file relative to the data folder, a URL, or
    /// `builtin (mailchecker)`).
    pub source: Option<&'a str>,
    /// The line of `source` (absent for sources without lines).
    pub line: Option<u32>,
    /// What DNS said of the domain's mail, when it was asked.
    pub mx: Option<&'a MxEvidence>,
    /// The MX provider recognised among the hosts, when one was.
    pub mx_provider: Option<ProviderEvidence<'a>>,
    /// For `rule: mx_neighbourhood`: the key (host, parent or network) that judged, its
    /// distinct listed and unlisted neighbours and the lists that name them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neighbourhood: Option<&'a Finding>,
    /// The relay service, for `rule: relay` when its list named it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<&'a str>,
    /// The major provider the name is likely a typo of (also the `X-Did-You-Mean` header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub did_you_mean: Option<&'a str>,
    /// Why the name is not answered free although a broad free list names it:
    /// `free_exclusions` (an organisation, `free_exclusions.txt`) or `business_mx` (its mail
    /// goes first to a business mailbox provider, see `mx_provider`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_free_because: Option<&'static str>,
    /// The day the registrable domain was registered (`YYYY-MM-DD`, RDAP's `registration`
    /// event), when the gateway knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registered: Option<String>,
    /// Whole days since `registered`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub age_days: Option<u32>,
    /// Distinct projects that reported the domain `safe`, when enough did to keep inference
    /// from flagging it (`reports.min_projects`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reported_safe_by: Option<u32>,
    /// What the young-domain rule did: `raised` (the score, the reason left `safe`; age alone
    /// never flags).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub young_domain: Option<YoungEffect>,
    /// The neighbourhood (see `neighbourhood`) would have flagged the name, but it was
    /// registered more than `rdap.established_days` ago: neighbours alone do not flip an
    /// established domain.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub established: bool,
    /// The neighbourhood would have flagged the name on what lookups taught, but its age is on
    /// its way from a registry not known to fail (`registry` says `queued`): `safe` until the
    /// age is in and weighed.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub age_pending: bool,
    /// The neighbourhood would have flagged the name on a network key alone (`key_kind:
    /// network`), on what lookups or the look taught, and nothing dates the domain (no RDAP for
    /// its TLD, RDAP off, its registry failing): a hosting provider's network holds unrelated
    /// customers, so only an age would tell a company from a throwaway there.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub undated_network: bool,
}

/// The evidence of `verdict`, the classification of `name` by `table` with `mx` (the MX evidence
/// it was given, if any).
pub fn evidence<'a>(
    table: &'a DomainTable,
    name: &DomainName,
    verdict: &'a Verdict<'a>,
    mx: Option<&'a MxEvidence>,
) -> Evidence<'a> {
    let provenance = table.provenance(name, &verdict.rule);
    let matched = match verdict.rule {
        TableRule::Allowlist { at }
        | TableRule::FreeProvider { at }
        | TableRule::Relay { at, .. }
        | TableRule::Blocklist { at } => Some(at),
        TableRule::Record(_) => table_name(table, name),
        TableRule::Unknown => None,
    };
    let rule = match verdict.rule {
        TableRule::Allowlist { .. } => Rule::Allowlist,
        TableRule::Record(_) => Rule::Record,
        TableRule::FreeProvider { .. } => match provenance.and_then(|p| p.kind) {
            Some(ListKind::BroadFree) => Rule::BroadFreeProvider,
            _ => Rule::FreeProvider,
        },
        TableRule::Blocklist { .. } => Rule::Blocklist,
        TableRule::Relay { .. } => Rule::Relay,
        TableRule::Unknown if verdict.inferred() => Rule::MxNeighbourhood,
        TableRule::Unknown if verdict.mx_decided => Rule::Mx,
        TableRule::Unknown => Rule::Unknown,
    };
    Evidence {
        rule,
        matched,
        via_parent: matched.is_some_and(|m| m != name.as_str()),
        source: provenance.and_then(|p| p.source),
        line: provenance.and_then(|p| p.line),
        mx,
        mx_provider: verdict.provider.as_ref().map(|p| ProviderEvidence {
            label: p.label,
            kind: p.kind,
            host: &p.host,
            pattern: p.pattern,
        }),
        neighbourhood: verdict.neighbourhood.as_ref(),
        service: match verdict.rule {
            TableRule::Relay { service, .. } => service,
            _ => None,
        },
        did_you_mean: verdict.did_you_mean,
        not_free_because: verdict.not_free_because,
        registered: verdict.age.map(|a| a.registered_date()),
        age_days: verdict.age.map(|a| a.age_days),
        young_domain: verdict.young,
        established: verdict.established,
        age_pending: verdict.age_pending,
        undated_network: verdict.undated_network,
        reported_safe_by: verdict.reported_safe,
    }
}

/// The name as the table holds it (a record matches exactly the name).
fn table_name<'a>(table: &'a DomainTable, name: &DomainName) -> Option<&'a str> {
    table.entry_name(name.as_str())
}

impl Evidence<'_> {
    /// The rule in words, with the entry and its source line, for `lookup`.
    pub fn describe(&self) -> String {
        let mut out = self.rule.as_str().to_owned();
        if let Some(service) = self.service {
            out.push_str(&format!(" ({service})"));
        }
        if let Some(f) = self.neighbourhood {
            out.push_str(&format!(
                ", {} {}: {} listed, {} unlisted neighbours",
                f.key_kind.as_str(),
                f.key,
                f.listed,
                f.unlisted
            ));
        }
        if let (Some(date), Some(days)) = (&self.registered, self.age_days) {
            out.push_str(&format!(", registered {date} ({days} days ago)"));
        }
        if let (Some(m), true) = (self.matched, self.via_parent) {
            out.push_str(&format!(", via parent domain {m}"));
        }
        match (self.source, self.line) {
            (Some(s), Some(l)) => out.push_str(&format!(" ({s}:{l})")),
            (Some(s), None) => out.push_str(&format!(" ({s})")),
            _ => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::classify;
    use crate::mail::MxHost;
    use crate::providers::ProviderTable;
    use crate::scores::Scores;
    use crate::sources::{add_domain_list, add_records};
    use crate::{table::Origin, TableBuilder};

    fn n(s: &str) -> DomainName {
        DomainName::parse(s).unwrap()
    }

    fn table() -> DomainTable {
        let mut b = TableBuilder::new();
        let builtin = b.source(crate::sources::BUILTIN_SOURCE);
        b.add_from(
            &n("mailinator.com"),
            ListKind::Disposable,
            Origin {
                source: builtin,
                line: 0,
            },
        );
        add_domain_list(
            &mut b,
            "# block\nmailinator.com\nthrowaway.example\n126.com\n",
            "block.conf",
            ListKind::Disposable,
        )
        .unwrap();
        add_domain_list(&mut b, "126.com\n", "allow.conf", ListKind::Allow).unwrap();
        add_domain_list(&mut b, "gmail.com\n", "free.txt", ListKind::FreeProvider).unwrap();
        add_domain_list(
            &mut b,
            "lycos.example\nthrowaway.example\n",
            "broad.txt",
            ListKind::BroadFree,
        )
        .unwrap();
        add_records(
            &mut b,
            "domain,reason,risk_score\n# note\nteam.example,role_account,60\n",
            "domains.csv",
        )
        .unwrap();
        b.set_providers(
            ProviderTable::parse(
                "match,pattern,label,kind\nsuffix,yopmail.com,Yopmail,disposable\n",
                "p",
            )
            .unwrap(),
        );
        b.build(Scores::default())
    }

    fn explain(t: &DomainTable, q: &str, mx: Option<&MxEvidence>) -> String {
        let name = n(q);
        let v = classify(t, &name, mx);
        let e = evidence(t, &name, &v, mx);
        serde_json::to_string(&e).unwrap()
    }

    #[test]
    fn each_rule_names_its_entry_and_source_line() {
        let t = table();
        let none = r#""mx":null,"mx_provider":null}"#;
        let cases = [
            // The first source that listed a name is the one named.
            (
                "mailinator.com",
                r#"{"rule":"blocklist","matched":"mailinator.com","via_parent":false,"source":"builtin (mailchecker)","line":null,"#,
            ),
            (
                "a.b.throwaway.example",
                r#"{"rule":"blocklist","matched":"throwaway.example","via_parent":true,"source":"block.conf","line":3,"#,
            ),
            // The allowlist wins over the blocklist, and is the one named.
            (
                "mx.126.com",
                r#"{"rule":"allowlist","matched":"126.com","via_parent":true,"source":"allow.conf","line":1,"#,
            ),
            (
                "gmail.com",
                r#"{"rule":"free_provider","matched":"gmail.com","via_parent":false,"source":"free.txt","line":1,"#,
            ),
            (
                "lycos.example",
                r#"{"rule":"broad_free_provider","matched":"lycos.example","via_parent":false,"source":"broad.txt","line":1,"#,
            ),
            (
                "team.example",
                r#"{"rule":"record","matched":"team.example","via_parent":false,"source":"domains.csv","line":3,"#,
            ),
            (
                "nothing.example",
                r#"{"rule":"unknown","matched":null,"via_parent":false,"source":null,"line":null,"#,
            ),
        ];
        for (q, start) in cases {
            assert_eq!(explain(&t, q, None), format!("{start}{none}"), "{q}");
        }
    }

    #[test]
    fn mx_evidence_is_shown_and_named_when_it_decided() {
        let t = table();
        let mx = MxEvidence::Hosts(vec![MxHost {
            preference: 10,
            host: "mx.yopmail.com".into(),
        }]);
        assert_eq!(
            explain(&t, "fresh.example", Some(&mx)),
            r#"{"rule":"mx","matched":null,"via_parent":false,"source":null,"line":null,"mx":{"status":"hosts","hosts":[{"preference":10,"host":"mx.yopmail.com"}]},"mx_provider":{"label":"Yopmail","kind":"disposable","host":"mx.yopmail.com","pattern":"suffix yopmail.com"}}"#
        );
        // Hosts no pattern knows: shown, but the default decided.
        let own = MxEvidence::Hosts(vec![MxHost {
            preference: 10,
            host: "mail.fresh.example".into(),
        }]);
        assert!(explain(&t, "fresh.example", Some(&own)).starts_with(r#"{"rule":"unknown""#));
        assert!(
            explain(&t, "fresh.example", Some(&MxEvidence::NullMx)).starts_with(r#"{"rule":"mx""#)
        );
    }

    #[test]
    fn describe_reads_as_a_sentence() {
        let t = table();
        let name = n("x.throwaway.example");
        let v = classify(&t, &name, None);
        assert_eq!(
            evidence(&t, &name, &v, None).describe(),
            "blocklist, via parent domain throwaway.example (block.conf:3)"
        );
    }
}
