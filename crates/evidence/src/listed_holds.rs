//! Whether the listed names a neighbourhood finding rests on have held its key, as their
//! registries date them or, where none does, as long as the gateway has watched them there
//! (`drg_domain::listed_holds`): one weighing for a lookup's answer and for the verdict
//! changes' judgement.

use drg_domain::listed_holds::{held, Held, ListedAge};
use drg_domain::neighbour_index::{Finding, Grounds};
use drg_domain::DomainName;

use crate::mx::neighbourhood::{today, Neighbourhood};
use crate::rdap::service::Rdap;

/// The RDAP queue's line for the listed names a finding's key keeps by name when no answer
/// waits for them (no project's: their fetches count against no project's share of the queue).
pub const LINE: &str = "(listed neighbours)";

/// What the registries say of a finding's listed names.
#[derive(Debug)]
pub struct Weighed {
    pub held: Held,
    /// The names whose dates are on their way, in the key's order (up to 16: a registry
    /// fetch each, once, then cached as every age is).
    pub on_its_way: Vec<DomainName>,
}

/// Weighs `finding` (one that rests on lookups or the gateway's own look: the operator's
/// lists alone are the operator's word, however young the names) by the dates of the names
/// its key keeps by name (`rdap` `None`: RDAP off, no name dated). Only a finding that judges
/// waits for them.
pub fn weigh(nb: &Neighbourhood, rdap: Option<&Rdap>, finding: &Finding) -> Weighed {
    let hold_days = nb.config.hold_days();
    let mut names = Vec::new();
    let mut ages = Vec::new();
    if finding.grounds == Grounds::Lookups && hold_days > 0 {
        let today = today();
        for (listed, since) in nb.listed_watched(finding) {
            let Ok(name) = DomainName::parse(&listed) else {
                continue;
            };
            let age = match rdap.map_or(ListedAge::Unknown, |r| r.listed_age(&name)) {
                // No registry dates it: it has held as long as the gateway has watched it.
                ListedAge::Unknown => since.map_or(ListedAge::Unknown, |day| {
                    ListedAge::Watched(today.saturating_sub(day))
                }),
                age => age,
            };
            if age == ListedAge::OnItsWay {
                names.push(name);
            }
            ages.push(age);
        }
    }
    Weighed {
        held: held(&ages, hold_days),
        on_its_way: names,
    }
}

/// `finding` as `weighed` leaves it: gone when its key's names have not held it (they count
/// for nobody, as names that moved there lately), waiting when the dates are on their way
/// (they are queued in the background on [`LINE`], if no answer waits for them already).
pub fn apply(finding: &mut Option<Finding>, weighed: &Weighed, rdap: Option<&Rdap>) {
    match weighed.held {
        Held::Held => {}
        Held::Unheld => *finding = None,
        Held::Pending => {
            if let Some(f) = finding.as_mut() {
                f.holds_pending = true;
            }
            // Nothing is on its way without a registry to ask.
            if let Some(rdap) = rdap {
                for name in &weighed.on_its_way {
                    rdap.fetch_later(name, LINE);
                }
            }
        }
    }
}
