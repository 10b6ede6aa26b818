//! Per-project shares of the MX lookup slots, fair over the projects asking: a project that
//! holds slots leaves a reserve free (a sixteenth of `max_inflight`), so a project that holds
//! none always finds a slot at once, and each holds at most an equal share of the rest among the
//! projects holding slots now (never more than `max_inflight_per_project`), which it reaches as
//! the others' lookups end. One project's names (a 1,000-name batch, names under a silent
//! zone), or four busy projects at once, never take the others' MX evidence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The slots each project holds now (lookups it started that have not ended, in the
/// background too).
pub struct Shares {
    /// `max_inflight_per_project`: what one project may hold however few ask.
    cap: usize,
    /// `max_inflight`: every project's slots together.
    total: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    by_project: HashMap<Box<str>, usize>,
    sum: usize,
}

/// One slot of a project's share, given back when dropped (when the lookup ends).
pub struct ShareSlot {
    shares: Arc<Shares>,
    project: Box<str>,
}

impl ShareSlot {
    /// The project whose lookup holds the slot.
    pub fn project(&self) -> &str {
        &self.project
    }
}

/// The part of `total` a project that holds slots leaves free for projects that hold none: a
/// sixteenth (at least one), so that many newcomers each start a lookup at once, and their
/// fair share follows as the busy projects' lookups end.
fn reserve(total: usize) -> usize {
    (total / 16).max(1)
}

impl Shares {
    /// At most `cap` slots per project, `total` for all projects together.
    pub fn new(cap: usize, total: usize) -> Self {
        Shares {
            cap: cap.max(1),
            total: total.max(1),
            held: Mutex::new(Held::default()),
        }
    }

    /// Slots one project may hold when no other asks (`max_inflight_per_project`).
    pub fn limit(&self) -> usize {
        self.cap
    }

    /// A slot for `project`, unless it holds its fair share already (`total` less the reserve,
    /// over the projects holding slots, this one included; at most `cap`), or it holds slots
    /// and taking one would leave less than the reserve free.
    pub fn try_take(self: &Arc<Self>, project: &str) -> Option<ShareSlot> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let mine = held.by_project.get(project).copied().unwrap_or(0);
        let asking = held.by_project.len() + usize::from(mine == 0);
        let shared = self.total.saturating_sub(reserve(self.total)).max(1);
        let fair = (shared / asking).clamp(1, self.cap);
        let kept_free = if mine > 0 { reserve(self.total) } else { 0 };
        if mine >= fair || held.sum + 1 + kept_free > self.total {
            return None;
        }
        *held.by_project.entry(project.into()).or_insert(0) += 1;
        held.sum += 1;
        Some(ShareSlot {
            shares: self.clone(),
            project: project.into(),
        })
    }

    /// Slots `project` holds now.
    pub fn held(&self, project: &str) -> usize {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.by_project.get(project).copied().unwrap_or(0)
    }
}

impl Drop for ShareSlot {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.by_project.get_mut(&self.project) {
            *n -= 1;
            // Projects come and go: the map holds only those with lookups running.
            if *n == 0 {
                held.by_project.remove(&self.project);
            }
            held.sum -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_project_holds_at_most_its_share_and_others_are_untouched() {
        let shares = Arc::new(Shares::new(2, 100));
        let a1 = shares.try_take("a").unwrap();
        let _a2 = shares.try_take("a").unwrap();
        assert!(shares.try_take("a").is_none());
        let _b = shares.try_take("b").unwrap();
        assert_eq!((shares.held("a"), shares.held("b")), (2, 1));
        drop(a1);
        assert!(shares.try_take("a").is_some());
        assert_eq!(shares.held("c"), 0);
    }

    /// The shipped limits (256 slots, 64 a project): four busy projects leave the reserve, a
    /// fifth (and a sixth) starts a lookup at once, and as lookups end and start again each
    /// comes to a fifth of what the reserve leaves.
    #[test]
    fn a_fifth_busy_project_gets_slots_and_then_its_fair_share() {
        let shares = Arc::new(Shares::new(64, 256));
        let projects = ["a", "b", "c", "d", "e"];
        let mut held: Vec<std::collections::VecDeque<ShareSlot>> =
            projects.iter().map(|_| Default::default()).collect();
        for (i, p) in projects[..4].iter().enumerate() {
            held[i].extend(std::iter::from_fn(|| shares.try_take(p)).take(1_000));
        }
        assert_eq!(held.iter().map(|h| h.len()).sum::<usize>(), 256 - 16);
        held[4].extend(std::iter::from_fn(|| shares.try_take("e")).take(1_000));
        assert_eq!(held[4].len(), 1, "one at once");
        assert!(shares.try_take("f").is_some(), "and so does a sixth");
        // Every project keeps asking: each round, its oldest lookup ends and it takes what it
        // may, the projects in turn.
        for round in 0..300 {
            for h in &mut held {
                h.pop_front();
            }
            for k in 0..projects.len() {
                let i = (round + k) % projects.len();
                let p = projects[i];
                held[i].extend(std::iter::from_fn(|| shares.try_take(p)).take(1_000));
            }
        }
        for (p, h) in projects.iter().zip(&held) {
            assert!((40..=48).contains(&h.len()), "{p}: {}", h.len());
        }
    }

    #[test]
    fn one_project_alone_takes_all_but_the_reserve() {
        let shares = Arc::new(Shares::new(1_000, 64));
        let taken: Vec<_> = std::iter::from_fn(|| shares.try_take("a"))
            .take(1_000)
            .collect();
        assert_eq!(taken.len(), 60);
        assert!(shares.try_take("b").is_some());
    }
}
