//! How long a key's listed names have been held, as their registries date them: a lapsed
//! listed name registered again gets a new registration date, so a name registered less than
//! `hold_days` ago cannot have held any host that long, whenever the gateway first saw it.

use crate::neighbour_index::AGED_LISTED;

/// What a registry says of one listed name a key keeps by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListedAge {
    /// Registered this many days ago.
    Registered(u32),
    /// Nothing tells how long it was held: the registry gives no date, or it is failing, or
    /// there is none for its TLD (RDAP off too). It weighs neither way.
    Unknown,
    /// Its date is on its way from a registry not known to fail.
    OnItsWay,
}

/// Whether a key's listed names, as their registries date them, have held it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Enough of them were registered at least `hold_days` ago (or no registry dates any).
    Held,
    /// Too few could have: the key judges nobody (as names that moved there lately).
    Unheld,
    /// Too few are known to have, and dates that could settle it are on their way (a name no
    /// registry dates needs every other name dated before it says the key held).
    Pending,
}

/// Names a key must show held before it judges: [`AGED_LISTED`] of those a registry dates (or
/// will: a date on its way), or every one when it dates fewer. A small company's host may
/// serve one listed domain of its own; a throwaway operator's names are about 8% under 120
/// days old when a list names them (a log-normal age at listing, median 331 days:
/// benches/detection/PROVENANCE.md). A name no registry dates (a TLD without RDAP) says
/// nothing either way: whoever re-registers lapsed names under such TLDs beside dated ones
/// must not make the dated ones' youth count for nothing.
fn needed(ages: &[ListedAge]) -> usize {
    let dated = ages
        .iter()
        .filter(|a| !matches!(a, ListedAge::Unknown))
        .count();
    (AGED_LISTED as usize).min(dated)
}

/// Names a registry dates at least `hold_days` back, and names whose date is on its way.
fn count(ages: &[ListedAge], hold_days: u32) -> (usize, usize) {
    ages.iter().fold((0, 0), |(held, waiting), a| match a {
        ListedAge::Registered(days) if *days >= hold_days => (held + 1, waiting),
        ListedAge::OnItsWay => (held, waiting + 1),
        ListedAge::Registered(_) | ListedAge::Unknown => (held, waiting),
    })
}

/// Whether the names a key keeps by name (`ages`, as their registries date them) have held it
/// `hold_days` (0: nothing is weighed by when it arrived, so every key holds). Decided on the
/// names a registry dates: a key none of whose names can be dated holds, as before.
pub fn held(ages: &[ListedAge], hold_days: u32) -> Held {
    if hold_days == 0 {
        return Held::Held;
    }
    let (held, waiting) = count(ages, hold_days);
    let needed = needed(ages);
    if held >= needed {
        Held::Held
    } else if held + waiting >= needed {
        Held::Pending
    } else {
        Held::Unheld
    }
}

#[cfg(test)]
mod tests {
    use super::ListedAge::{OnItsWay, Registered, Unknown};
    use super::*;

    #[test]
    fn names_registered_lately_have_not_held_their_key() {
        let planted = [Registered(40); 12];
        assert_eq!(held(&planted, 120), Held::Unheld);
        // With `hold_days` 0 nothing is weighed by when it arrived.
        assert_eq!(held(&planted, 0), Held::Held);
        // A company's own listed domain beside the planted ones is not enough.
        let mut one_own = planted.to_vec();
        one_own[3] = Registered(4_000);
        assert_eq!(held(&one_own, 120), Held::Unheld);
        // A throwaway operator's names: three held are enough, young ones beside them.
        let operator = [
            Registered(20),
            Registered(400),
            Registered(131),
            Registered(900),
        ];
        assert_eq!(held(&operator, 120), Held::Held);
        assert_eq!(
            held(&operator[..2], 120),
            Held::Unheld,
            "every one of fewer"
        );
    }

    #[test]
    fn names_no_registry_dates_say_nothing_and_dates_on_their_way_wait() {
        assert_eq!(
            held(&[Unknown; 5], 120),
            Held::Held,
            "nothing dated: as before"
        );
        // Undated names beside young dated ones do not make the key held.
        let mixed = [Registered(40), Unknown, Unknown, Unknown, Registered(60)];
        assert_eq!(held(&mixed, 120), Held::Unheld);
        let operator = [Registered(400), Unknown, Registered(500), Registered(800)];
        assert_eq!(held(&operator, 120), Held::Held);
        let waiting = [Registered(40), Registered(500), OnItsWay, OnItsWay];
        assert_eq!(held(&waiting, 120), Held::Pending);
        let lost = [Registered(40), Registered(30), Registered(500), OnItsWay];
        assert_eq!(held(&lost, 120), Held::Unheld);
        assert_eq!(
            held(&[], 120),
            Held::Held,
            "nothing kept by name: as before"
        );
    }
}
