//! Whether the DNS resolver can be believed: it is judged by canary names that certainly have
//! MX records, never by the answers for the names users ask about.
//!
//! A resolver that says NXDOMAIN for everything (no internet behind it, a captive or filtering
//! resolver, split-horizon DNS) would make every company `undeliverable`; one that says nothing
//! at all would make every lookup wait out its budget. Both are told apart from an honest
//! resolver by the canaries, and both switch MX evidence off.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// What one canary lookup gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CanaryAnswer {
    /// MX hosts: what an honest resolver says.
    Mail,
    /// An answer without MX hosts: NXDOMAIN, NODATA, a null MX.
    Negative,
    /// An error answer: SERVFAIL, REFUSED, a malformed reply.
    Failed,
    /// No answer: a timeout or a network error.
    Silent,
}

/// What the gateway thinks of its resolver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Trust {
    /// Not checked yet (the first seconds after start): lookups run, but only what they find
    /// is believed, never that a name has no mail.
    Unchecked = 0,
    /// The canaries show their MX records: MX evidence is on.
    Trusted = 1,
    /// The resolver answers, but not with the canaries' MX records: MX evidence is off.
    Untrusted = 2,
    /// No DNS server answers: MX evidence is off.
    Silent = 3,
}

impl Trust {
    /// The word for logs, `/readyz` and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Trust::Unchecked => "unchecked",
            Trust::Trusted => "trusted",
            Trust::Untrusted => "untrusted",
            Trust::Silent => "silent",
        }
    }

    fn from_u8(v: u8) -> Trust {
        match v {
            1 => Trust::Trusted,
            2 => Trust::Untrusted,
            3 => Trust::Silent,
            _ => Trust::Unchecked,
        }
    }

    /// No lookup is started: answers come from the table alone.
    pub fn evidence_off(self) -> bool {
        matches!(self, Trust::Untrusted | Trust::Silent)
    }

    /// That a name has no mail (NXDOMAIN, no MX and no address, a null MX) is believed.
    pub fn believes_negatives(self) -> bool {
        self == Trust::Trusted
    }
}

/// The verdict on a resolver from its canaries' answers: trusted when more than half show MX
/// hosts (one canary's outage does not switch evidence off), silent when none answered at all,
/// untrusted otherwise.
pub fn trust_of(answers: &[CanaryAnswer]) -> Trust {
    let mail = answers.iter().filter(|a| **a == CanaryAnswer::Mail).count();
    if !answers.is_empty() && mail * 2 > answers.len() {
        Trust::Trusted
    } else if answers.iter().all(|a| *a == CanaryAnswer::Silent) {
        Trust::Silent
    } else {
        Trust::Untrusted
    }
}

/// The resolver's standing, shared by every lookup (an atomic read per lookup).
#[derive(Default)]
pub struct TrustState {
    state: AtomicU8,
    /// Times MX evidence was switched off (trusted or unchecked to silent or untrusted).
    pub trips: AtomicU64,
    /// Lookups answered at once, without DNS, while evidence was off.
    pub skipped: AtomicU64,
}

impl TrustState {
    /// Starts at `trust` (silent when there is no server to ask).
    pub fn new(trust: Trust) -> Self {
        TrustState {
            state: AtomicU8::new(trust as u8),
            ..TrustState::default()
        }
    }

    pub fn get(&self) -> Trust {
        Trust::from_u8(self.state.load(Ordering::Relaxed))
    }

    /// Sets the standing; returns the one it replaces.
    pub fn set(&self, trust: Trust) -> Trust {
        let old = Trust::from_u8(self.state.swap(trust as u8, Ordering::Relaxed));
        if trust.evidence_off() && !old.evidence_off() {
            self.trips.fetch_add(1, Ordering::Relaxed);
        }
        old
    }
}

#[cfg(test)]
mod tests {
    use super::CanaryAnswer::*;
    use super::*;

    #[test]
    fn a_majority_of_canaries_with_mail_is_needed_to_trust() {
        assert_eq!(trust_of(&[Mail, Mail, Mail, Mail]), Trust::Trusted);
        assert_eq!(trust_of(&[Mail, Mail, Mail, Silent]), Trust::Trusted);
        assert_eq!(trust_of(&[Mail, Mail, Negative, Failed]), Trust::Untrusted);
        assert_eq!(trust_of(&[Negative; 4]), Trust::Untrusted);
        assert_eq!(trust_of(&[Failed; 4]), Trust::Untrusted);
        assert_eq!(
            trust_of(&[Negative, Silent, Silent, Silent]),
            Trust::Untrusted
        );
        assert_eq!(trust_of(&[Silent; 4]), Trust::Silent);
        assert_eq!(trust_of(&[Mail]), Trust::Trusted);
        assert_eq!(trust_of(&[]), Trust::Silent);
    }

    #[test]
    fn only_a_trusted_resolver_says_a_name_has_no_mail() {
        assert!(Trust::Trusted.believes_negatives());
        for t in [Trust::Unchecked, Trust::Untrusted, Trust::Silent] {
            assert!(!t.believes_negatives(), "{t:?}");
        }
        assert!(!Trust::Unchecked.evidence_off());
        let s = TrustState::new(Trust::Unchecked);
        assert_eq!(s.set(Trust::Untrusted), Trust::Unchecked);
        assert_eq!(s.set(Trust::Silent), Trust::Untrusted);
        assert_eq!(s.trips.load(Ordering::Relaxed), 1);
        s.set(Trust::Trusted);
        s.set(Trust::Silent);
        assert_eq!(
            (s.get(), s.trips.load(Ordering::Relaxed)),
            (Trust::Silent, 2)
        );
    }
}
