//! The listed names the teacher owes: queued or being resolved (with the projects whose traffic
//! asked meanwhile), or resolved lately with nothing to teach and left alone for a while. Without
//! the second kind, every lookup of a lapsed throwaway (NXDOMAIN, no MX, DNS failing) queued it
//! again: a hand-off to the MX service's thread and a DNS query a lookup.

use std::collections::HashMap;
use std::time::Instant;

use drg_domain::neighbour_index::Teachers;

/// Names left alone at once, at most: past it the expired ones go, and if none has, a new one
/// is not kept (it is queued again on its next lookup, as before there was a hold).
const QUIET_MAX: usize = 65_536;

enum State {
    /// Queued or being resolved; the projects that asked for it meanwhile.
    Waiting(Teachers),
    /// Resolved with nothing to teach: not queued again before this instant.
    Quiet(Instant),
}

/// Keyed by names callers choose: aHash, randomly keyed (see `mx::resolver`'s cache).
#[derive(Default)]
pub(super) struct Pending {
    names: HashMap<Box<str>, State, ahash::RandomState>,
}

impl Pending {
    /// Whether `name` is to be queued: not when it waits already (`teachers` join its askers)
    /// nor while it is left alone. `now` is read only for a name left alone.
    pub(super) fn needs_queue(
        &mut self,
        name: &str,
        teachers: Teachers,
        now: impl FnOnce() -> Instant,
    ) -> bool {
        match self.names.get_mut(name) {
            Some(State::Waiting(askers)) => {
                askers.merge(teachers);
                false
            }
            Some(State::Quiet(until)) => *until <= now(),
            None => true,
        }
    }

    /// `name` went into the queue.
    pub(super) fn queued(&mut self, name: &str, teachers: Teachers) {
        self.names.insert(name.into(), State::Waiting(teachers));
    }

    /// The projects whose traffic asked for `name` while it waited.
    pub(super) fn askers(&self, name: &str) -> Teachers {
        match self.names.get(name) {
            Some(State::Waiting(askers)) => *askers,
            _ => Teachers::default(),
        }
    }

    /// The resolution of `name` ended; with `quiet`, it taught nothing and is left alone until
    /// then.
    pub(super) fn resolved(&mut self, name: &str, quiet: Option<Instant>, now: Instant) {
        let Some(until) = quiet.filter(|u| *u > now) else {
            self.names.remove(name);
            return;
        };
        if self.names.len() >= QUIET_MAX {
            self.names
                .retain(|_, s| !matches!(s, State::Quiet(u) if *u <= now));
        }
        if self.names.len() >= QUIET_MAX {
            self.names.remove(name);
        } else {
            self.names.insert(name.into(), State::Quiet(until));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_name_waits_once_then_rests_until_its_hold_ends() {
        let mut p = Pending::default();
        let t0 = Instant::now();
        assert!(p.needs_queue("a.test", Teachers::default(), || t0));
        p.queued("a.test", Teachers::default());
        assert!(!p.needs_queue("a.test", Teachers::default(), || t0));
        p.resolved("a.test", Some(t0 + Duration::from_secs(30)), t0);
        assert!(!p.needs_queue("a.test", Teachers::default(), || t0
            + Duration::from_secs(29)));
        assert!(p.needs_queue("a.test", Teachers::default(), || t0
            + Duration::from_secs(30)));
        // Taught: forgotten at once.
        p.queued("a.test", Teachers::default());
        p.resolved("a.test", None, t0);
        assert!(p.needs_queue("a.test", Teachers::default(), || t0));
    }

    #[test]
    fn holds_are_bounded_and_the_expired_go_first() {
        let mut p = Pending::default();
        let t0 = Instant::now();
        for i in 0..QUIET_MAX {
            p.resolved(&format!("n{i}.test"), Some(t0 + Duration::from_secs(1)), t0);
        }
        // Full of live holds: a new one is not kept.
        p.resolved("late.test", Some(t0 + Duration::from_secs(60)), t0);
        assert!(p.needs_queue("late.test", Teachers::default(), || t0));
        // Once they expired, they make room.
        let t1 = t0 + Duration::from_secs(2);
        p.resolved("late.test", Some(t1 + Duration::from_secs(60)), t1);
        assert!(!p.needs_queue("late.test", Teachers::default(), || t1));
        assert_eq!(p.names.len(), 1);
    }
}
