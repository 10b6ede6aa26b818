//! `Scores`: the risk score each classification outcome gets, as operators set them in config.
//!
//! An input of classification (and of the top-domains ranking), so it sits below the table and
//! `classify` and depends on nothing but the record types.

use serde::{Deserialize, Serialize};

use super::record::{RiskScore, MAX_SCORE};

/// Risk score per outcome. Bands: 0-29 safe, 30-49 low, 50-79 high, 80-99 very likely
/// disposable, 100 confirmed on a blocklist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Scores {
    /// The name itself is on a blocklist.
    pub disposable: RiskScore,
    /// A parent of the name is on a blocklist (`x.mailinator.com`).
    pub disposable_subdomain: RiskScore,
    /// Known to receive no mail (operator records, or MX evidence: a null MX, no mail host, no
    /// such domain).
    pub undeliverable: RiskScore,
    /// A role account such as `info@` (operator records).
    pub role_account: RiskScore,
    /// On the allowlist.
    pub allowlisted: RiskScore,
    /// A consumer webmail provider.
    pub free_provider: RiskScore,
    /// Nothing known against the name.
    pub unknown: RiskScore,
    /// Mail is handled by a host dedicated to disposable mail (MX evidence).
    pub disposable_mx: RiskScore,
    /// An unlisted domain whose MX host, host parent or network is dominated by listed
    /// throwaway neighbours (the learned MX neighbourhood): very likely disposable, below the
    /// scores of a listing or a dedicated throwaway host, which are confirmed facts.
    pub mx_neighbourhood: RiskScore,
    /// Mail goes through a forwarding service that throwaway domains also use (MX evidence).
    pub forwarder_mx: RiskScore,
    /// A recognised business set-up: the most preferred MX hosts are at a business mailbox
    /// provider or a security gateway. Own (unrecognised) hosts never get it: they keep `unknown`.
    pub corporate: RiskScore,
    /// A privacy relay or masked-email service (`relays.txt`): `safe`, since mail reaches a
    /// real, lasting mailbox, but at the bottom of the low-risk band (30), above any other
    /// safe answer: the person behind it is hidden and can switch the address off at will, so
    /// a form may ask for more before granting a trial, yet stays far below 50, where forms
    /// start refusing.
    pub relay: RiskScore,
    /// A name registered fewer than `rdap.young_days` ago (RDAP), nothing else known against
    /// it: `safe`, raised into the low band (40) where a form may ask for more, below 50 where
    /// forms start refusing, since new companies register domains every day.
    pub young_domain: RiskScore,
    /// A young name whose mail does not go first to a business mailbox provider (own or
    /// unrecognised hosts, a forwarder, a consumer host): still `safe` (age alone never makes
    /// a domain disposable: companies sign up in their first week), at the top of the low band
    /// (45), where a form may look closer.
    pub young_domain_weak_mx: RiskScore,
    /// A domain its MX neighbourhood would call disposable but registered more than
    /// `rdap.established_days` ago: an established domain is not flipped by its neighbours
    /// alone (anyone can point listed domains at a host it uses): `safe`, in the low band (40).
    pub neighbourhood_established: RiskScore,
}

impl Default for Scores {
    fn default() -> Self {
        Scores {
            disposable: 100,
            disposable_subdomain: 95,
            undeliverable: 90,
            role_account: 60,
            allowlisted: 5,
            free_provider: 10,
            unknown: 20,
            disposable_mx: 90,
            mx_neighbourhood: 80,
            forwarder_mx: 35,
            corporate: 8,
            relay: 30,
            young_domain: 40,
            young_domain_weak_mx: 45,
            neighbourhood_established: 40,
        }
    }
}

/// Highest score that still reads as `safe` in the contract's bands.
pub const SAFE_BAND_MAX: RiskScore = 29;

impl Scores {
    /// Every problem with the scores, each naming its field.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let flagged = [
            ("disposable", self.disposable),
            ("disposable_subdomain", self.disposable_subdomain),
            ("undeliverable", self.undeliverable),
            ("role_account", self.role_account),
            ("disposable_mx", self.disposable_mx),
            ("mx_neighbourhood", self.mx_neighbourhood),
        ];
        let safe = [
            ("allowlisted", self.allowlisted),
            ("free_provider", self.free_provider),
            ("unknown", self.unknown),
            ("corporate", self.corporate),
        ];
        for (field, v) in flagged {
            if !(SAFE_BAND_MAX + 1..=MAX_SCORE).contains(&v) {
                out.push(format!(
                    "scores.{field}: {v} is outside 30..=100 (a flagged reason must not read as safe)"
                ));
            }
        }
        for (field, v) in safe {
            if v > SAFE_BAND_MAX {
                out.push(format!(
                    "scores.{field}: {v} is outside 0..=29 (the reason is `safe`)"
                ));
            }
        }
        if self.relay > 49 {
            out.push(format!(
                "scores.relay: {} is outside 0..=49 (a relay is `safe`: a real mailbox)",
                self.relay
            ));
        }
        for (field, v) in [
            ("young_domain", self.young_domain),
            ("young_domain_weak_mx", self.young_domain_weak_mx),
            ("neighbourhood_established", self.neighbourhood_established),
        ] {
            if v > 49 {
                out.push(format!(
                    "scores.{field}: {v} is outside 0..=49 (the answer stays `safe`: age alone never flags, neighbours alone never flip an established domain)"
                ));
            }
        }
        if self.forwarder_mx > 49 {
            out.push(format!(
                "scores.forwarder_mx: {} is outside 0..=49 (evidence alone never flags)",
                self.forwarder_mx
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_scores_respect_the_bands_and_bad_ones_are_named() {
        assert!(Scores::default().problems().is_empty());
        let bad = Scores {
            disposable: 20,
            unknown: 50,
            ..Scores::default()
        };
        let p = bad.problems();
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].starts_with("scores.disposable:"));
        assert!(p[1].starts_with("scores.unknown:"));
    }
}
