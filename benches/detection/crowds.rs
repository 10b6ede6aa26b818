//! The crowds of the detection world: what K self-serve attacker projects do together that one
//! alone could not, and the same planting carried by K of the deployment's own projects
//! (their end users typing the planted addresses into sign-up forms). Planting attacks by K of
//! them (the planted listed domains spread over them, the k-th by attacker k mod K: the same
//! total as one attacker's attack; lapsed listed names re-registered, as in `attacks.rs`), on
//! the victims' own hosts, on a third party's host, and on a hosting provider's /24 with listed
//! domains that have further MX hosts elsewhere; and K of them reporting throwaways on a known
//! throwaway host `safe`. The victims are a deployment project's (the deployment's first).

use super::facts;
use super::world::{Bucket, Reported, Through, World};

/// How many attacker projects act together.
pub const CROWDS: [usize; 4] = [2, 3, 5, 10];
/// How many of the deployment's own projects carry a planting attack's lookups: one,
/// two, and four (every project of the default deployment). Anyone can type an address into a
/// sign-up form, so a deployment project's traffic carries whatever its end users choose.
pub const CARRIERS: [usize; 3] = [1, 2, 4];
/// Throwaways each crowd reports `safe` (an assumption: a handful, well under a project's cap
/// of open reports whatever the crowd).
pub const REPORTED: usize = 10;

/// The crowd attacks' classes, in the order the world makes them for each crowd.
pub const SHAPES: [&str; 3] = [
    "victims' own hosts",
    "a third party's host",
    "a provider's /24, several MX",
];

impl World {
    /// Every crowd's attacks and reports, each on hosts of its own. The crowds' victims are of
    /// the past (their ages in the RDAP cache at start): the registries have no more to answer
    /// during the run than without the crowds.
    pub(super) fn crowds(&mut self) {
        for k in CROWDS {
            self.crowd_attacks(k, Through::SelfServe);
        }
        for k in CROWDS {
            self.reports(k);
        }
    }

    /// The same three attacks carried by `k` of the deployment's own projects (the
    /// k-th planted domain looked up by project k mod K; with fewer projects, all of them).
    pub(super) fn deployment_crowds(&mut self) {
        for k in CARRIERS {
            self.crowd_attacks(k.min(self.projects.len()), Through::Deployment);
        }
    }

    /// The three crowd attacks of `k` projects `through` whom.
    fn crowd_attacks(&mut self, k: usize, through: Through) {
        {
            let (planted, victims) = self.on_own_hosts();
            self.crowd(SHAPES[0], (k, through), planted, victims);
            let (planted, victims) = self.on_a_third_party();
            self.crowd(SHAPES[1], (k, through), planted, victims);
            // The planted domains' backup MX hosts: the attacker's, each in a /24 of its own.
            let parent = self.throwaway_name();
            let backups: Vec<String> = ["mx2", "mx3"]
                .iter()
                .map(|label| {
                    let host = format!("{label}.{parent}");
                    let ip = self.public_ip();
                    self.host(&host, ip, Some(&host));
                    host
                })
                .collect();
            let (planted, victims) = self.on_a_provider_net(&backups);
            self.crowd(SHAPES[2], (k, through), planted, victims);
        }
    }

    fn crowd(
        &mut self,
        shape: &'static str,
        by: (usize, Through),
        planted: Vec<String>,
        victims: Vec<(String, Bucket)>,
    ) {
        self.past.extend(victims.iter().map(|(d, _)| d.clone()));
        self.push_attack(shape, by, planted, victims);
    }

    /// A throwaway operator's host with as many listed domains as a published cluster (looked
    /// up in the past by the projects), and `REPORTED` + 1 unlisted throwaways on it.
    fn reports(&mut self, attackers: usize) {
        let host = format!("mail.{}", self.throwaway_name());
        let ip = self.public_ip();
        self.host(&host, ip, Some(&host));
        let on = [host];
        for _ in 0..*self.rng.pick(&facts::CLUSTER_LISTED) {
            let d = self.throwaway_name();
            self.listed(&d, &on);
        }
        let mut unlisted: Vec<String> = (0..=REPORTED)
            .map(|_| {
                let d = self.throwaway_name();
                let days = facts::unlisted_age(&mut self.rng) as i64;
                self.domain(&d, &on, "mx -all", days);
                d
            })
            .collect();
        let unreported = unlisted.pop().expect("one more");
        self.reported.push(Reported {
            attackers,
            reported: unlisted,
            unreported,
        });
    }
}
