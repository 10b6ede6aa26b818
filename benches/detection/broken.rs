//! Mail set-ups of the detection world that cannot take mail (`undeliverable`): MX hosts on
//! loopback, private, shared, link-local, reserved, broadcast or unspecified addresses, a null
//! MX, an MX host that does not exist, no MX and no address, `localhost`; and an MX host that
//! does not exist asked through a resolver that gives minimal answers (no additional section:
//! only the host's own A/AAAA queries, answered NXDOMAIN, tell).

use std::net::Ipv4Addr;

use super::facts;
use super::world::{Arrival, Case, Expect, World};
use crate::dns::Zone;

pub const UNUSABLE: &str = "unusable mail";
pub const MINIMAL: &str = "missing MX host, minimal answers";

/// What an unusable set-up is.
#[derive(Clone, Copy)]
enum Broken {
    /// The MX host's address.
    On([u8; 4]),
    NullMx,
    /// The MX host does not exist.
    Missing,
    /// Neither MX nor an address.
    NoMail,
    Localhost,
}

/// The unusable set-ups, in the order the seeds take them.
const KINDS: [Broken; 21] = [
    Broken::On([127, 0, 0, 1]),
    Broken::On([10, 0, 0, 5]),
    Broken::On([192, 168, 1, 1]),
    Broken::On([0, 0, 0, 0]),
    Broken::On([169, 254, 1, 1]),
    Broken::On([100, 64, 0, 1]),
    Broken::On([240, 0, 0, 1]),
    Broken::NullMx,
    Broken::Missing,
    Broken::NoMail,
    Broken::Localhost,
    Broken::On([127, 0, 1, 1]),
    Broken::On([10, 20, 30, 40]),
    Broken::On([172, 16, 0, 1]),
    Broken::On([0, 1, 2, 3]),
    Broken::On([255, 255, 255, 255]),
    Broken::NullMx,
    Broken::Missing,
    Broken::NoMail,
    Broken::NullMx,
    Broken::Missing,
];

impl World {
    /// The unusable set-ups (`unusable` of them, from the seed's place on) and the missing
    /// hosts asked with minimal answers.
    pub(super) fn broken(&mut self) {
        for k in 0..self.size.unusable.min(KINDS.len()) {
            let kind = KINDS[(k + 7 * self.seed as usize) % KINDS.len()];
            let d = self.broken_domain();
            self.unusable(&d, kind);
            self.simple_case(UNUSABLE, &d, Expect::Undeliverable);
        }
        for _ in 0..self.size.minimal {
            let d = self.broken_domain();
            let host = format!("mail.{d}");
            self.unusable(&d, Broken::Missing);
            // The set-up as a company's: its own host named under it, which is gone.
            self.zones.get_mut(&d).expect("just made").mx = vec![(10, host)];
            self.case(Case {
                domain: d,
                class: MINIMAL,
                expect: Expect::Undeliverable,
                project: "",
                shape: None,
                bucket: None,
                arrival: Arrival::After,
                minimal: true,
            });
        }
    }

    /// A name for a broken set-up: a company's TLD and age.
    fn broken_domain(&mut self) -> String {
        let tld = self.any_tld(&facts::COMPANY_TLDS);
        self.fresh_name(&tld)
    }

    /// `d` with neither MX nor an address (its TXT records as drawn).
    pub(super) fn no_mail(&mut self, d: &str, days: i64) {
        self.domain(d, &[], "-all", days);
        self.zones.get_mut(d).expect("just made").a = None;
        if let Some(r) = self.records.get_mut(d) {
            r.a.clear();
            r.aaaa.clear();
        }
    }

    fn unusable(&mut self, d: &str, kind: Broken) {
        let days = facts::company_age(&mut self.rng) as i64;
        match kind {
            Broken::On(ip) => {
                let host = format!("mx.{}", self.broken_domain());
                let ttl = facts::ttl(&mut self.rng);
                self.zones.insert(
                    host.clone(),
                    Zone {
                        mx: vec![],
                        a: Some(Ipv4Addr::from(ip)),
                        ttl,
                    },
                );
                self.domain(d, &[host], "mx -all", days);
            }
            Broken::NullMx => {
                self.domain(d, &[String::new()], "-all", days);
                self.zones.get_mut(d).expect("just made").mx = vec![(0, String::new())];
            }
            Broken::Missing => {
                let host = format!("mx.{}", self.broken_domain());
                self.domain(d, &[host], "mx -all", days);
            }
            Broken::NoMail => self.no_mail(d, days),
            Broken::Localhost => self.domain(d, &["localhost".to_owned()], "mx -all", days),
        }
    }
}
