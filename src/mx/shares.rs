//! Per-project shares of the MX lookup slots: one project's names (a 1,000-name batch, names
//! under a silent zone) hold at most its share of `max_inflight`, so the other projects' lookups
//! always find slots and keep their MX evidence.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The slots each project holds now (lookups it started that have not ended, in the
/// background too).
pub struct Shares {
    limit: usize,
    held: Mutex<HashMap<Box<str>, usize>>,
}

/// One slot of a project's share, given back when dropped (when the lookup ends).
pub struct ShareSlot {
    shares: Arc<Shares>,
    project: Box<str>,
}

impl Shares {
    /// At most `limit` slots per project.
    pub fn new(limit: usize) -> Self {
        Shares {
            limit: limit.max(1),
            held: Mutex::new(HashMap::new()),
        }
    }

    /// Slots one project may hold.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A slot for `project`, unless it already holds its share.
    pub fn try_take(self: &Arc<Self>, project: &str) -> Option<ShareSlot> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = held.entry(project.into()).or_insert(0);
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(ShareSlot {
            shares: self.clone(),
            project: project.into(),
        })
    }

    /// Slots `project` holds now.
    pub fn held(&self, project: &str) -> usize {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(project).copied().unwrap_or(0)
    }
}

impl Drop for ShareSlot {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(&self.project) {
            *n -= 1;
            // Projects come and go: the map holds only those with lookups running.
            if *n == 0 {
                held.remove(&self.project);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_project_holds_at_most_its_share_and_others_are_untouched() {
        let shares = Arc::new(Shares::new(2));
        let a1 = shares.try_take("a").unwrap();
        let _a2 = shares.try_take("a").unwrap();
        assert!(shares.try_take("a").is_none());
        let _b = shares.try_take("b").unwrap();
        assert_eq!((shares.held("a"), shares.held("b")), (2, 1));
        drop(a1);
        assert!(shares.try_take("a").is_some());
        assert_eq!(shares.held("c"), 0);
    }
}
