//! Classification: what the table says of a name, turned into the API's `RiskRecord`.
//!
//! Pure and ordered as the contract lists it (allowlist, explicit record, free provider,
//! blocklists, otherwise safe). Scores come from [`Scores`], which operators set in config.

use serde::{Deserialize, Serialize};

use super::name::DomainName;
use super::record::{Reason, RiskRecord, RiskScore, MAX_SCORE};
use super::table::{DomainTable, TableRule};

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
        ];
        let safe = [
            ("allowlisted", self.allowlisted),
            ("free_provider", self.free_provider),
            ("unknown", self.unknown),
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
        out
    }
}

/// The classification of one name, with the rule that decided it (for `lookup` and logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict<'a> {
    pub record: RiskRecord<'a>,
    pub rule: TableRule<'a>,
}

/// Classifies `name` from what `table` knows.
pub fn classify<'a>(table: &'a DomainTable, name: &'a DomainName) -> Verdict<'a> {
    let scores = table.scores();
    let found = table.lookup(name);
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
            let v = classify(&t, &name);
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
            classify(&t, &name).record.mx_provider_label,
            Some("Google Workspace")
        );
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
