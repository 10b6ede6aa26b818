//! How long a key's listed names have been held, as their registries date them or, where no
//! registry does, as long as the gateway has watched them there: a lapsed listed name
//! registered again gets a new registration date, so a name registered less than `hold_days`
//! ago cannot have held any host that long, whenever the gateway first saw it; and a name
//! nothing dates has held a host no longer than the gateway can show.

use crate::neighbour_index::AGED_LISTED;

/// What a registry, or the gateway's own watching, says of one listed name a key keeps by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListedAge {
    /// Registered this many days ago.
    Registered(u32),
    /// No registry dates it (none gives a date, or it is failing, or there is none for its
    /// TLD, RDAP off too): the gateway has watched it on the key's hosts this many days.
    Watched(u32),
    /// No registry dates it and nothing tells since when it is there: it has held nothing
    /// anyone can show (as [`Watched`](Self::Watched) 0).
    Unknown,
    /// Its date is on its way from a registry not known to fail.
    OnItsWay,
}

/// Whether a key's listed names, as their registries date them, have held it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Enough of them have held it at least `hold_days` (or it keeps none by name).
    Held,
    /// Too few could have: the key judges nobody (as names that moved there lately).
    Unheld,
    /// Too few are known to have, and dates that could settle it are on their way.
    Pending,
}

/// Names a key must show held before it judges: [`AGED_LISTED`], or every one when it keeps
/// fewer. A small company's host may serve one listed domain of its own; a throwaway
/// operator's names are about 8% under 120 days old when a list names them (a log-normal age
/// at listing, median 331 days: benches/detection/PROVENANCE.md). A name no registry dates
/// counts as long as the gateway has watched it: names re-registered and planted on a
/// company's host before a deployment first started, with the registries off or unreachable,
/// look to a fresh gateway exactly as a throwaway service's own (issue 94: must-not-flag wins,
/// so such a key judges once the gateway has watched its names `hold_days`).
fn needed(ages: &[ListedAge]) -> usize {
    (AGED_LISTED as usize).min(ages.len())
}

/// Names shown to have held at least `hold_days`, and names whose date is on its way.
fn count(ages: &[ListedAge], hold_days: u32) -> (usize, usize) {
    ages.iter().fold((0, 0), |(held, waiting), a| match a {
        ListedAge::Registered(days) | ListedAge::Watched(days) if *days >= hold_days => {
            (held + 1, waiting)
        }
        ListedAge::OnItsWay => (held, waiting + 1),
        ListedAge::Registered(_) | ListedAge::Watched(_) | ListedAge::Unknown => (held, waiting),
    })
}

/// Whether the names a key keeps by name (`ages`) have held it `hold_days` (0: nothing is
/// weighed by when it arrived, so every key holds). A key that keeps no name holds, as before.
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
    fn names_no_registry_dates_hold_as_long_as_the_gateway_watched_them() {
        use super::ListedAge::Watched;
        // A fresh deployment with RDAP off: names planted before it started look new to it.
        assert_eq!(held(&[Unknown; 5], 120), Held::Unheld);
        assert_eq!(held(&[Watched(0); 12], 120), Held::Unheld);
        assert_eq!(held(&[Watched(119); 12], 120), Held::Unheld);
        // Watched long enough, they hold: three of them, or every one of fewer.
        let watched = [Watched(130), Watched(5), Watched(121), Watched(400)];
        assert_eq!(held(&watched, 120), Held::Held);
        assert_eq!(held(&[Watched(200), Watched(3)], 120), Held::Unheld);
        // Undated names beside young dated ones do not make the key held.
        let mixed = [Registered(40), Unknown, Unknown, Unknown, Registered(60)];
        assert_eq!(held(&mixed, 120), Held::Unheld);
        let operator = [Registered(400), Unknown, Registered(500), Registered(800)];
        assert_eq!(held(&operator, 120), Held::Held);
        let beside = [
            Registered(400),
            Watched(300),
            Registered(20),
            Registered(800),
        ];
        assert_eq!(held(&beside, 120), Held::Held);
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
