//! Resolver trust: the canaries asked at start, on a streak of unanswered lookups and every
//! interval; what is believed of negative answers follows them.

use super::*;

/// A canary lookup waits this long at most: a machine without DNS should have MX evidence off
/// before users notice; a slower resolver is checked again at the next interval.
pub(super) const CANARY_TIMEOUT: Duration = Duration::from_millis(1_000);

/// How often a streak of unanswered lookups may ask for an early canary check.
pub(super) const RECHECK_SPACING: Duration = Duration::from_secs(1);

impl MxResolver {
    /// MX evidence is off: no DNS server answers, or the canaries say the resolver lies.
    pub fn evidence_off(&self) -> bool {
        self.trust.get().evidence_off()
    }

    /// What the gateway thinks of its resolver now.
    pub fn trust(&self) -> Trust {
        self.trust.get()
    }

    /// Whether DNS answered a lookup. A streak of `breaker_failures` without an answer asks for
    /// the canaries at once (see [`take_recheck`](Self::take_recheck)); it never switches MX
    /// evidence off by itself: one slow zone is that zone's problem.
    pub(super) fn note_answer(&self, answered: bool) {
        if answered {
            self.failures.succeeded();
        } else if self.failures.failed(Instant::now()) {
            self.failures.succeeded();
            self.recheck.store(true, Ordering::Relaxed);
        }
    }

    /// Lookups went unanswered in a row since the last check: check the canaries now.
    pub fn take_recheck(&self) -> bool {
        self.recheck.swap(false, Ordering::Relaxed)
    }

    /// The least time between two early checks.
    pub fn recheck_spacing(&self) -> Duration {
        RECHECK_SPACING
    }

    /// Asks DNS for the canaries' MX records (all at once, no lookup slot taken: a full pool
    /// must not keep the resolver from being judged) and sets the resolver's standing. Leaving
    /// trust drops every cached answer (what a lying resolver said must not outlive it);
    /// each change is logged once.
    pub async fn check_canaries(&self) -> Trust {
        let wait = self.query_timeout.min(CANARY_TIMEOUT);
        let answers = futures_util::future::join_all(self.canaries.iter().map(|c| async move {
            let fqdn = format!("{}.", c.trim_end_matches('.'));
            match deadlines::timeout(wait, self.dns.query(fqdn.as_str(), RecordType::MX)).await {
                Ok(Ok(l))
                    if l.answers()
                        .iter()
                        .any(|r| matches!(&r.data, RData::MX(mx) if !mx.exchange.is_root())) =>
                {
                    CanaryAnswer::Mail
                }
                Ok(Ok(_)) => CanaryAnswer::Negative,
                Ok(Err(e)) if e.is_negative() => CanaryAnswer::Negative,
                Ok(Err(e)) if e.answered() => CanaryAnswer::Failed,
                Ok(Err(_)) | Err(_) => CanaryAnswer::Silent,
            }
        }))
        .await;
        let now = trust::trust_of(&answers);
        let was = self.trust.set(now);
        self.checked.send_replace(true);
        if now != Trust::Trusted && was == Trust::Trusted {
            self.cache.clear();
            self.host_facts.clear();
            self.tlds.clear();
        }
        if now != was {
            self.log_change(was, now, &answers);
        }
        if now != Trust::Silent {
            self.failures.succeeded();
        }
        now
    }

    pub(super) fn log_change(&self, was: Trust, now: Trust, answers: &[CanaryAnswer]) {
        let without: Vec<&str> = self
            .canaries
            .iter()
            .zip(answers)
            .filter(|(_, a)| **a != CanaryAnswer::Mail)
            .map(|(c, _)| c.as_str())
            .collect();
        match now {
            Trust::Silent => log::warn!(
                "MX lookups: no DNS server answers; answering from the table alone (no MX \
                 evidence) and probing in the background until one does"
            ),
            Trust::Untrusted => log::warn!(
                "MX lookups: the DNS resolver is not trusted: {} of {} canary names came back \
                 without MX records ({}); answering from the table alone (no MX evidence) and \
                 checking it again in the background",
                without.len(),
                answers.len(),
                without.join(", ")
            ),
            Trust::Trusted if was == Trust::Unchecked => {
                log::info!("MX lookups: the DNS resolver shows the canaries' MX records; MX evidence is on")
            }
            Trust::Trusted => log::info!("MX lookups: DNS answers again; MX evidence is back on"),
            Trust::Unchecked => {}
        }
    }

    /// Whether the resolver is trusted to say a name has no mail. Just after start, before the
    /// canaries were first asked, their verdict is awaited (briefly).
    pub(super) async fn believes_negatives(&self) -> bool {
        if self.trust() == Trust::Unchecked {
            let mut checked = self.checked.subscribe();
            let _ = deadlines::timeout(CANARY_TIMEOUT * 2, checked.wait_for(|c| *c)).await;
        }
        self.trust().believes_negatives()
    }
}
