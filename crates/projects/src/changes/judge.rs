//! Judging a watched domain again, off the request path: the same verdict function as a lookup
//! (`verdict_of`), on the table now in service and the evidence the gateway already holds (MX
//! evidence in the resolver's cache, the neighbourhood's finding, the registry's date as cached),
//! never a new DNS or RDAP query. A name the table leaves open whose MX evidence or age is not
//! at hand is not judged: a missing piece must not pass for a change (a young domain's raised
//! score would drop, an established one's neighbours would condemn it). One exception: a name
//! the table *decided* before a reload and leaves open after it (a delisting) was told the
//! lists' answer, which no longer holds, and no evidence was ever gathered for it (a listed name
//! is never resolved nor dated); it is judged with what is held, basis [`Basis::TableOnly`].

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::Told;
use drg_domain::age::{AgeRule, DomainAge};
use drg_domain::classify::{wants_mx, Signals, Verdict};
use drg_domain::listed_holds::Held;
use drg_domain::mail::MxEvidence;
use drg_domain::table::DomainTable;
use drg_domain::{DomainName, TableRule};
use drg_evidence::listed_holds;
use drg_evidence::mx::resolver::MxResolver;
use drg_evidence::rdap::service::Rdap;

/// What a verdict rests on, for how soon its change is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// The table alone (lists, records, the absence from them): recorded at once.
    Table,
    /// DNS evidence (MX, the neighbourhood) or the domain's age: recorded once it held for
    /// `stable_seconds`.
    Evidence,
    /// The table stopped deciding (a delisting) and the gateway held no MX evidence or age for
    /// the name yet: the verdict a lookup without them gives, recorded at once. The project's
    /// next lookup gathers them.
    TableOnly,
}

impl Basis {
    /// As a change shows it (`basis`).
    pub fn as_str(self) -> &'static str {
        match self {
            Basis::Table => "table",
            Basis::Evidence => "evidence",
            Basis::TableOnly => "table_only",
        }
    }

    /// The basis of a change recorded before changes carried one, from its rule.
    pub fn of_rule(rule: &str) -> Basis {
        match rule {
            "mx" | "mx_neighbourhood" | "young_domain" | "unlisted" => Basis::Evidence,
            _ => Basis::Table,
        }
    }
}

/// A domain judged again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    pub told: Told,
    pub basis: Basis,
    /// What decided it, as a change names it.
    pub rule: &'static str,
    pub dataset_version: String,
}

/// The parts a judgement reads.
pub struct Judge {
    /// Each project's own verdicts: they decide first, as on a lookup.
    pub overrides: Arc<ArcSwap<drg_domain::overrides::OverrideSet>>,
    /// The operator's accepted verdicts, as on a lookup.
    pub accepted: Arc<ArcSwap<crate::account::reports::Accepted>>,
    pub table: Arc<ArcSwap<DomainTable>>,
    pub mx: Option<Arc<MxResolver>>,
    pub rdap: Option<Arc<Rdap>>,
}

impl Judge {
    /// `name`'s verdict now for `project`'s answer (`None`: it cannot be judged from what is
    /// held). `before` is the table the previous pass judged with, when a reload came since.
    pub fn judge(&self, name: &str, project: &str, before: Option<&DomainTable>) -> Option<Judged> {
        let name = DomainName::parse(name).ok()?;
        let table = self.table.load();
        if let Some(o) = self.overrides.load().find(project, &name) {
            let mut v = drg_domain::classify::classify(&table, &name, None);
            o.verdict.apply(&mut v.record);
            return Some(Judged {
                told: Told {
                    reason: v.record.reason,
                    score: v.record.risk_score,
                },
                basis: Basis::Table,
                rule: o.verdict.rule(),
                dataset_version: table.version().as_str().to_owned(),
            });
        }
        let found = table.lookup(&name);
        let open = found.rule == TableRule::Unknown;
        // Delisted: the lists decided it before (so it was never resolved nor dated) and no
        // longer do.
        let delisted = open && before.is_some_and(|b| !wants_mx(&b.lookup(&name)));
        // Whether a piece the verdict wants is not held.
        let mut missing = false;
        let evidence: Option<Arc<MxEvidence>> = match &self.mx {
            Some(mx) if wants_mx(&found) => {
                let held = mx.peek(name.as_str());
                missing |= held.is_none();
                held
            }
            _ => None,
        };
        let nb = self.mx.as_ref().and_then(|mx| mx.neighbourhood());
        let mut finding = match (evidence.as_deref(), nb) {
            (Some(MxEvidence::Hosts(_)), Some(nb)) => nb.finding(&name, project),
            _ => None,
        };
        let (age, rule) = self.age_of(&name, open, &mut missing);
        missing |= self.weigh_listed_dates(&mut finding, age, rule);
        if missing && !delisted {
            return None;
        }
        let (mx, neighbourhood, reported_safe) = (evidence.as_deref(), finding, None);
        let signals = Signals {
            mx,
            neighbourhood,
            age,
            // Not judged while the age is missing (above): an age on its way is never weighed
            // here, the change is told once it is in.
            age_pending: false,
            reported_safe,
        };
        let v = crate::account::reports::decisions::verdict_with(
            &self.accepted.load(),
            (&table, &name, found),
            signals,
            rule,
        );
        Some(Judged {
            told: Told {
                reason: v.record.reason,
                score: v.record.risk_score,
            },
            // A name the table leaves open rests on evidence either way (its absence too),
            // unless none was held.
            basis: match (open, missing) {
                (false, _) => basis(&v),
                (true, true) => Basis::TableOnly,
                (true, false) => Basis::Evidence,
            },
            rule: rule_name(&v),
            dataset_version: table.version().as_str().to_owned(),
        })
    }
}

impl Judge {
    /// `finding` as a lookup weighs its key's listed names' registration dates
    /// (`drg_evidence::listed_holds`; not for an established `age`, which outweighs it
    /// anyway): gone when they have not held the key. True while the dates that could show it
    /// are on their way: not judged then (told once they are in).
    fn weigh_listed_dates(
        &self,
        finding: &mut Option<drg_domain::neighbour_index::Finding>,
        age: Option<DomainAge>,
        rule: AgeRule,
    ) -> bool {
        let nb = self.mx.as_ref().and_then(|mx| mx.neighbourhood());
        let outweighed = age.is_some_and(|a| rule.is_established(a));
        let (Some(f), Some(nb), false) = (finding.as_ref(), nb, outweighed) else {
            return false;
        };
        let rdap = self.rdap.as_deref();
        let weighed = listed_holds::weigh(nb, rdap, f);
        listed_holds::apply(finding, &weighed, rdap);
        weighed.held == Held::Pending
    }

    /// `name`'s age as the cache knows it (for a name the table leaves `open`), and the age
    /// rule; `missing` is set while the cache knows nothing (not judged then; a delisted name
    /// is judged without it).
    fn age_of(
        &self,
        name: &DomainName,
        open: bool,
        missing: &mut bool,
    ) -> (Option<DomainAge>, AgeRule) {
        match &self.rdap {
            Some(r) if open => match r.known_age(name) {
                Some(age) => (age, r.age_rule()),
                None => {
                    *missing = true;
                    (None, r.age_rule())
                }
            },
            Some(r) => (None, r.age_rule()),
            None => (None, AgeRule::OFF),
        }
    }
}

fn basis(v: &Verdict<'_>) -> Basis {
    if v.mx_decided || v.neighbourhood.is_some() || v.young.is_some() || v.established {
        Basis::Evidence
    } else {
        Basis::Table
    }
}

/// The rule a change names: the table's, else the evidence that decided.
pub fn rule_name(v: &Verdict<'_>) -> &'static str {
    if v.neighbourhood.is_some() {
        return "mx_neighbourhood";
    }
    if v.young.is_some() {
        return "young_domain";
    }
    if v.mx_decided {
        return "mx";
    }
    match v.rule {
        TableRule::Allowlist { .. } => "allowlist",
        TableRule::Record(_) => "record",
        TableRule::FreeProvider { .. } => "free_provider",
        TableRule::Blocklist { .. } => "blocklist",
        TableRule::Relay { .. } => "relay",
        TableRule::Unknown => "unlisted",
    }
}
