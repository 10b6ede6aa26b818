//! A copy of what the index learned, kept by the MX service from a journal of changes: the
//! state file is written and ageing and eviction are ranked from it, so the index's lock is never
//! held for a pass over every domain (a long read lock makes a waiting writer, and so every
//! request's judge behind it, wait).

use std::collections::HashMap;

use drg_domain::neighbour_index::Learned;

/// One change to the index, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Taught (again): what it has now, and whether a list names it.
    Put { learned: Learned, listed: bool },
    /// Forgotten (aged out or evicted).
    Gone(Box<str>),
}

/// The index's domains as the journal says (see the module documentation).
#[derive(Debug, Default)]
pub struct Mirror {
    domains: HashMap<Box<str>, (bool, Learned)>,
}

impl Mirror {
    /// Applies changes in order.
    pub fn apply(&mut self, changes: Vec<Change>) {
        for change in changes {
            match change {
                Change::Put {
                    mut learned,
                    listed,
                } => {
                    // The index keeps the latest day a domain was taught (a file may carry
                    // an older one).
                    if let Some((_, old)) = self.domains.get(&learned.domain) {
                        learned.seen = learned.seen.max(old.seen);
                    }
                    self.domains
                        .insert(learned.domain.clone(), (listed, learned));
                }
                Change::Gone(domain) => {
                    self.domains.remove(&domain);
                }
            }
        }
    }

    /// Replaces everything (after the journal overflowed).
    pub fn reset(&mut self, all: Vec<(bool, Learned)>) {
        self.domains = all
            .into_iter()
            .map(|(listed, l)| (l.domain.clone(), (listed, l)))
            .collect();
    }

    pub fn len(&self) -> usize {
        self.domains.len()
    }

    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Every learned domain for the state file, listed ones first (loading teaches them
    /// before the unlisted ones they judge), then by name.
    pub fn learned(&self) -> Vec<Learned> {
        let mut out: Vec<(bool, &Learned)> = self
            .domains
            .values()
            .map(|(listed, l)| (!listed, l))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.domain.cmp(&b.1.domain)));
        out.into_iter().map(|(_, l)| l.clone()).collect()
    }

    /// Domains last taught before `oldest` (a day since the epoch), with that day.
    pub fn older_than(&self, oldest: u32) -> Vec<(Box<str>, u32)> {
        self.domains
            .iter()
            .filter(|(_, (_, l))| l.seen < oldest)
            .map(|(d, (_, l))| (d.clone(), l.seen))
            .collect()
    }

    /// Every domain with whether a list names it and the day it was last taught.
    pub fn all(&self) -> Vec<(Box<str>, bool, u32)> {
        self.domains
            .iter()
            .map(|(d, (listed, l))| (d.clone(), *listed, l.seen))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(domain: &str, listed: bool, seen: u32) -> Change {
        Change::Put {
            learned: Learned::new(
                domain,
                vec![format!("host:mx.{domain}").into()],
                seen,
                Default::default(),
            ),
            listed,
        }
    }

    #[test]
    fn the_journal_replayed_gives_the_index_listed_first() {
        let mut m = Mirror::default();
        m.apply(vec![
            put("b.com", false, 1),
            put("a.com", false, 1),
            put("z.com", true, 2),
            put("b.com", false, 3),
            Change::Gone("a.com".into()),
            Change::Gone("never.com".into()),
        ]);
        let learned = m.learned();
        let names: Vec<&str> = learned.iter().map(|l| &*l.domain).collect();
        assert_eq!(names, ["z.com", "b.com"]);
        assert_eq!(m.older_than(3), vec![("z.com".into(), 2)]);
        assert_eq!(m.len(), 2);
        m.reset(vec![]);
        assert!(m.is_empty());
    }
}
