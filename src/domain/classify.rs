//! Classification: what the table says of a name, turned into the API's `RiskRecord`.
//!
//! Pure and ordered as the contract lists it (allowlist, explicit record, free provider,
//! blocklists, otherwise safe). Scores come from [`Scores`], which operators set in config.

use serde::{Deserialize, Serialize};

use super::mail::{MxEvidence, ProviderKind};
use super::name::DomainName;
use super::providers::ProviderMatch;
use super::record::{Reason, RiskRecord, RiskScore, MAX_SCORE};
use super::table::{DomainTable, TableMatch, TableRule};

/// Risk score per outcome. Bands: 0-29 safe, 30-49 low, 50-79 high, 80-99 very likely
/// disposable, 100 confirmed on a blocklist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Scores {
    /// The name itself is on a blocklist.
    pub disposable: RiskScore,
    /// A parent of the name is on a blocklist (`x.mailinator.com`).
    pub disposable_subdomain: RiskScore,
    /// Known to receive no mail (operator records; MX evidence later).
    pub undeliverable: RiskScore,
    /// A role account such as `info@` (operator records).
    pub role_account: RiskScore,
    /// On the allowlist.
    pub allowlisted: RiskScore,
    /// A consumer webmail provider.
    pub free_provider: RiskScore,
    /// Nothing known against the name.
    pub unknown: RiskScore,
    /// Mail is handled by a host dedicated to disposable mail (MX evidence).
    pub disposable_mx: RiskScore,
    /// Mail goes through a forwarding service that throwaway domains also use (MX evidence).
    pub forwarder_mx: RiskScore,
    /// A professional mail set-up: business mailbox provider, security gateway or own hosts.
    pub corporate: RiskScore,
}

impl Default for Scores {
    fn default() -> Self {
        Scores {
            disposable: 100,
            disposable_subdomain: 95,
            undeliverable: 90,
            role_account: 60,
            allowlisted: 5,
            free_provider: 10,
            unknown: 20,
            disposable_mx: 90,
            forwarder_mx: 35,
            corporate: 8,
        }
    }
}

/// Highest score that still reads as `safe` in the contract's bands.
pub const SAFE_BAND_MAX: RiskScore = 29;

impl Scores {
    /// Every problem with the scores, each naming its field.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let flagged = [
            ("disposable", self.disposable),
            ("disposable_subdomain", self.disposable_subdomain),
            ("undeliverable", self.undeliverable),
            ("role_account", self.role_account),
            ("disposable_mx", self.disposable_mx),
        ];
        let safe = [
            ("allowlisted", self.allowlisted),
            ("free_provider", self.free_provider),
            ("unknown", self.unknown),
            ("corporate", self.corporate),
        ];
        for (field, v) in flagged {
            if !(SAFE_BAND_MAX + 1..=MAX_SCORE).contains(&v) {
                out.push(format!(
                    "scores.{field}: {v} is outside 30..=100 (a flagged reason must not read as safe)"
                ));
            }
        }
        for (field, v) in safe {
            if v > SAFE_BAND_MAX {
                out.push(format!(
                    "scores.{field}: {v} is outside 0..=29 (the reason is `safe`)"
                ));
            }
        }
        if self.forwarder_mx > 49 {
            out.push(format!(
                "scores.forwarder_mx: {} is outside 0..=49 (evidence alone never flags)",
                self.forwarder_mx
            ));
        }
        out
    }
}

/// The classification of one name, with the rule that decided it (for `lookup` and logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict<'a> {
    pub record: RiskRecord<'a>,
    pub rule: TableRule<'a>,
    /// The recognised MX provider, when MX evidence was used.
    pub provider: Option<ProviderMatch<'a>>,
}

/// Whether MX evidence can change the answer for a table match: only names the table leaves
/// open (unknown or allowlisted) are worth a DNS lookup.
pub fn wants_mx(found: &TableMatch<'_>) -> bool {
    matches!(found.rule, TableRule::Unknown | TableRule::Allowlist { .. })
}

/// Classifies `name` from what `table` knows and, optionally, its MX evidence.
pub fn classify<'a>(
    table: &'a DomainTable,
    name: &'a DomainName,
    mx: Option<&MxEvidence>,
) -> Verdict<'a> {
    classify_match(table, name, table.lookup(name), mx)
}

/// Classifies a table match (from [`DomainTable::lookup`]) with optional MX evidence.
pub fn classify_match<'a>(
    table: &'a DomainTable,
    name: &'a DomainName,
    found: TableMatch<'a>,
    mx: Option<&MxEvidence>,
) -> Verdict<'a> {
    let scores = table.scores();
    let base = classify_table(scores, name, &found);
    let mx = mx.filter(|_| wants_mx(&found));
    let Some(evidence) = mx else {
        return base;
    };
    let provider = table.providers().recognise(evidence.hosts());
    let mut v = base;
    let kind = provider.as_ref().map(|p| p.kind);
    if let Some(p) = &provider {
        v.record.mx_provider_label = Some(p.label);
    }
    let professional = matches!(evidence, MxEvidence::Hosts(_))
        && matches!(
            kind,
            None | Some(ProviderKind::Mailbox) | Some(ProviderKind::SecurityGateway)
        );
    if let TableRule::Unknown = found.rule {
        if evidence.is_undeliverable() {
            (v.record.reason, v.record.risk_score) = (Reason::Undeliverable, scores.undeliverable);
        } else if kind == Some(ProviderKind::Disposable) {
            (v.record.reason, v.record.risk_score) = (Reason::Disposable, scores.disposable_mx);
        } else if kind == Some(ProviderKind::Forwarder) {
            v.record.risk_score = scores.forwarder_mx;
        } else if professional {
            v.record.risk_score = scores.corporate;
        }
    }
    v.record.is_corporate_email =
        professional && !v.record.is_free_provider && v.record.reason == Reason::Safe;
    v.provider = provider;
    v
}

fn classify_table<'a>(
    scores: &Scores,
    name: &'a DomainName,
    found: &TableMatch<'a>,
) -> Verdict<'a> {
    let (reason, risk_score) = match found.rule {
        TableRule::Allowlist { .. } => match found.record {
            Some(rec) if rec.reason == Reason::Safe => (Reason::Safe, rec.risk_score),
            _ => (Reason::Safe, scores.allowlisted),
        },
        TableRule::Record(rec) => (rec.reason, rec.risk_score),
        TableRule::FreeProvider { .. } => (Reason::Safe, scores.free_provider),
        TableRule::Blocklist { at } if at == name.as_str() => {
            (Reason::Disposable, scores.disposable)
        }
        TableRule::Blocklist { .. } => (Reason::Disposable, scores.disposable_subdomain),
        TableRule::Unknown => (Reason::Safe, scores.unknown),
    };
    Verdict {
        record: RiskRecord {
            domain: name.as_str(),
            risk_score,
            reason,
            is_free_provider: found.is_free_provider,
            is_corporate_email: false,
            mx_provider_label: found.record.and_then(|r| r.mx_provider_label.as_deref()),
        },
        rule: found.rule,
        provider: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::table::{ExplicitRecord, ListKind, TableBuilder};

    fn n(s: &str) -> DomainName {
        DomainName::parse(s).unwrap()
    }

    fn sample() -> DomainTable {
        let mut b = TableBuilder::new();
        b.add(&n("mailinator.com"), ListKind::Disposable);
        b.add(&n("gmail.com"), ListKind::FreeProvider);
        b.add(&n("126.com"), ListKind::Allow);
        b.add(&n("126.com"), ListKind::FreeProvider);
        b.add_record(
            &n("corp.example"),
            ExplicitRecord {
                reason: Reason::Safe,
                risk_score: 2,
                mx_provider_label: Some("Google Workspace".into()),
                flag_weight: 0,
            },
        )
        .unwrap();
        b.add_record(
            &n("team.example"),
            ExplicitRecord {
                reason: Reason::RoleAccount,
                risk_score: 65,
                mx_provider_label: None,
                flag_weight: 0,
            },
        )
        .unwrap();
        b.build(Scores::default())
    }

    #[test]
    fn each_rule_gives_its_reason_and_configured_score() {
        let t = sample();
        let s = Scores::default();
        let check = |q: &str, reason, score, free| {
            let name = n(q);
            let v = classify(&t, &name, None);
            assert_eq!(v.record.reason, reason, "{q}");
            assert_eq!(v.record.risk_score, score, "{q}");
            assert_eq!(v.record.is_free_provider, free, "{q}");
        };
        check("mailinator.com", Reason::Disposable, s.disposable, false);
        check(
            "a.b.mailinator.com",
            Reason::Disposable,
            s.disposable_subdomain,
            false,
        );
        check("gmail.com", Reason::Safe, s.free_provider, true);
        check("126.com", Reason::Safe, s.allowlisted, true);
        check("team.example", Reason::RoleAccount, 65, false);
        check("corp.example", Reason::Safe, 2, false);
        check("unknown-domain.org", Reason::Safe, s.unknown, false);
    }

    #[test]
    fn record_label_is_reported() {
        let t = sample();
        let name = n("corp.example");
        assert_eq!(
            classify(&t, &name, None).record.mx_provider_label,
            Some("Google Workspace")
        );
    }

    #[test]
    fn mx_evidence_only_decides_what_the_table_leaves_open() {
        use crate::domain::mail::MxHost;
        use crate::domain::providers::ProviderTable;
        let mut b = TableBuilder::new();
        b.add(&n("mailinator.com"), ListKind::Disposable);
        b.add(&n("gmail.com"), ListKind::FreeProvider);
        b.set_providers(
            ProviderTable::parse(
                "match,pattern,label,kind\nsuffix,google.com,Google Workspace,mailbox\nsuffix,yopmail.com,Yopmail,disposable\n",
                "p",
            )
            .unwrap(),
        );
        let t = b.build(Scores::default());
        let s = Scores::default();
        let hosts = |h: &str| {
            MxEvidence::Hosts(vec![MxHost {
                preference: 1,
                host: h.into(),
            }])
        };
        let run = |q: &str, e: MxEvidence| {
            let name = n(q);
            let v = classify(&t, &name, Some(&e));
            (
                v.record.reason,
                v.record.risk_score,
                v.record.is_corporate_email,
                v.record.mx_provider_label.map(str::to_owned),
            )
        };
        assert_eq!(
            run("corp.example", hosts("aspmx.l.google.com")),
            (
                Reason::Safe,
                s.corporate,
                true,
                Some("Google Workspace".into())
            )
        );
        assert_eq!(
            run("corp.example", hosts("mx.corp.example")),
            (Reason::Safe, s.corporate, true, None)
        );
        assert_eq!(
            run("x.example", hosts("mx.yopmail.com")),
            (
                Reason::Disposable,
                s.disposable_mx,
                false,
                Some("Yopmail".into())
            )
        );
        assert_eq!(
            run("x.example", MxEvidence::NullMx),
            (Reason::Undeliverable, s.undeliverable, false, None)
        );
        assert_eq!(
            run("x.example", MxEvidence::Unknown),
            (Reason::Safe, s.unknown, false, None)
        );
        assert_eq!(
            run("x.example", MxEvidence::AddressOnly),
            (Reason::Safe, s.unknown, false, None)
        );
        // The table decided: evidence is ignored.
        assert_eq!(
            run("mailinator.com", MxEvidence::NullMx).0,
            Reason::Disposable
        );
        assert_eq!(run("gmail.com", MxEvidence::NoDomain).0, Reason::Safe);
    }

    #[test]
    fn default_scores_respect_the_bands_and_bad_ones_are_named() {
        assert!(Scores::default().problems().is_empty());
        let bad = Scores {
            disposable: 20,
            unknown: 50,
            ..Scores::default()
        };
        let p = bad.problems();
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].starts_with("scores.disposable:"));
        assert!(p[1].starts_with("scores.unknown:"));
    }
}
