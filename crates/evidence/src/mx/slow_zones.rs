//! Which zones are left alone for a while after their lookups timed out, judged from more than
//! one project: one project's timeouts under a zone (names it minted under a silent nameserver,
//! or simply its bad luck) leave the zone alone for that project only; once a second project
//! timed out under it too, for everyone. Pure: time is passed in.

use std::time::Instant;

/// Distinct projects whose timeouts switch a zone off for everyone.
pub const PROJECTS_FOR_EVERYONE: usize = 2;

/// Projects remembered per zone (a zone past [`PROJECTS_FOR_EVERYONE`] needs no more).
const KEPT: usize = 4;

/// The projects that timed out under one zone lately, each until when it is left alone.
#[derive(Debug, Clone, Default)]
pub struct ZoneTimeouts {
    by_project: Vec<(Box<str>, Instant)>,
}

impl ZoneTimeouts {
    /// `project`'s lookup under the zone timed out at `now`: left alone until `until`.
    pub fn timed_out(&mut self, project: &str, now: Instant, until: Instant) {
        self.by_project.retain(|(p, t)| *t > now && &**p != project);
        if self.by_project.len() >= KEPT {
            // The earliest to end goes: the zone is everyone's problem already.
            self.by_project.sort_by_key(|(_, t)| *t);
            self.by_project.remove(0);
        }
        self.by_project.push((project.into(), until));
    }

    /// Whether `project`'s lookups under the zone are left alone at `now`: it timed out there
    /// itself, or enough projects did.
    pub fn skips(&self, project: &str, now: Instant) -> bool {
        let live = || self.by_project.iter().filter(|(_, t)| *t > now);
        live().any(|(p, _)| &**p == project) || live().count() >= PROJECTS_FOR_EVERYONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn one_projects_timeouts_are_its_own_and_a_second_makes_them_everyones() {
        let now = Instant::now();
        let later = now + Duration::from_secs(30);
        let mut zone = ZoneTimeouts::default();
        zone.timed_out("a", now, later);
        zone.timed_out("a", now, later);
        assert!(zone.skips("a", now));
        assert!(!zone.skips("b", now), "a's timeouts alone are a's");
        zone.timed_out("b", now, later);
        assert!(zone.skips("c", now), "two projects: everyone's");
        assert!(!zone.skips("c", later), "until it ends");
        assert!(!zone.skips("a", later));
    }

    #[test]
    fn a_zone_keeps_a_bounded_list() {
        let now = Instant::now();
        let mut zone = ZoneTimeouts::default();
        for i in 0..100u64 {
            zone.timed_out(&i.to_string(), now, now + Duration::from_secs(i + 1));
        }
        assert_eq!(zone.by_project.len(), KEPT);
        assert!(zone.skips("x", now));
    }
}
