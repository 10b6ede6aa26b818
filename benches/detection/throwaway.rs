//! The throwaway services of the detection world: operators whose listed domains sit on one
//! host (or a pair), on numbered hosts under one parent, over one /24, and one minting five
//! unlisted domains for each listed one; each operator's hosts in hosting providers' /24s
//! beside unrelated tenants (small companies' own mail hosts: a must-not-flag class).

use super::facts;
use super::world::{Arrival, Bucket, Case, Expect, Shape, World};

/// The must-not-flag class of companies whose own small mail host shares a /24 with a
/// throwaway service's host.
pub const TENANTS: &str = "not: small hosts in a throwaway's /24";

impl World {
    /// Every throwaway operator, and the tenants' companies (a must-not-flag class).
    pub(super) fn throwaways(&mut self) {
        let ops = self.size.operators;
        let per = self.size.per_shape.div_ceil(ops);
        let mut tenants = Vec::new();
        for o in 0..ops {
            let big = o == 0 && self.size.big_host;
            let hosts = self.operator_hosts(&mut tenants);
            self.listed_on(&hosts, big);
            self.unlisted(Shape::OneHost, per, |_, _| hosts.clone());
        }
        for _ in 0..ops {
            self.numbered(per, &mut tenants);
        }
        for _ in 0..ops {
            self.network(per, &mut tenants);
        }
        self.minting(&mut tenants);
        self.tenant_cases(&tenants);
    }

    /// The minting operator: as many listed domains on its host as a published cluster, and
    /// five unlisted ones minted for each, arriving one after another: the last `minting` of
    /// them are the cases, the others arrived in the past.
    fn minting(&mut self, tenants: &mut Vec<String>) {
        let hosts = self.operator_hosts(tenants);
        let listed = *self.rng.pick(&facts::CLUSTER_LISTED) as usize;
        for _ in 0..listed {
            let d = self.throwaway_name();
            self.listed(&d, &hosts);
        }
        let cases = self.size.minting.min(5 * listed);
        for _ in cases..5 * listed {
            let d = self.throwaway_name();
            let days = facts::unlisted_age(&mut self.rng) as i64;
            self.domain(&d, &hosts, "mx -all", days);
            self.seen_before(&d);
        }
        self.unlisted(Shape::Minting, cases, |_, _| hosts.clone());
    }

    /// A throwaway domain's name (its TLD drawn from the blocklist's, any).
    pub(super) fn throwaway_name(&mut self) -> String {
        let tld = self.any_tld(&facts::THROWAWAY_TLDS);
        self.fresh_name(&tld)
    }

    /// An operator's own host (or pair): `mail.<its domain>`, each in a VPS provider's /24
    /// with other tenants, reverse DNS naming it.
    pub(super) fn operator_hosts(&mut self, tenants: &mut Vec<String>) -> Vec<String> {
        let n = if self.rng.chance(facts::OPERATOR_TWO_HOSTS) {
            2
        } else {
            1
        };
        (0..n)
            .map(|_| {
                let parent = self.throwaway_name();
                let host = format!("mail.{parent}");
                let net = self.vps_net(tenants);
                let ip = self.ip_in(net);
                self.host(&host, ip, Some(&host));
                host
            })
            .collect()
    }

    /// A VPS provider's /24 with other tenants' own mail hosts (their names pushed to
    /// `tenants`); the caller places its host there too.
    fn vps_net(&mut self, tenants: &mut Vec<String>) -> [u8; 3] {
        let net = self.net24();
        let provider = self.fresh_name("net");
        let (lo, hi) = facts::VPS_TENANTS;
        for _ in 0..self.rng.range(lo, hi) {
            let company = self.company_tld(Bucket::Old);
            let host = format!("mail.{}", self.fresh_name(&company));
            let ip = self.ip_in(net);
            let ptr = if self.rng.chance(facts::TENANT_OWN_PTR) {
                host.clone()
            } else {
                format!("{}.{provider}", ip.to_string().replace('.', "-"))
            };
            self.host(&host, ip, Some(&ptr));
            tenants.push(host);
        }
        net
    }

    /// The listed domains of an operator on `hosts`: as many as one of the published
    /// clusters (`tinyhost.shop`'s 1,814 when `big`).
    fn listed_on(&mut self, hosts: &[String], big: bool) {
        let n = if big {
            facts::ONE_HOST_SERVED
        } else {
            *self.rng.pick(&facts::CLUSTER_LISTED)
        };
        for _ in 0..n {
            let d = self.throwaway_name();
            self.listed(&d, hosts);
        }
    }

    /// `n` unlisted throwaways of `shape`, the k-th on `hosts(world, k)`; their age buckets in
    /// turn, their arrival drawn (minting: after their host is known).
    fn unlisted(
        &mut self,
        shape: Shape,
        n: usize,
        mut hosts: impl FnMut(&mut World, usize) -> Vec<String>,
    ) {
        for k in 0..n {
            let bucket = Bucket::ALL[(k + self.seed as usize) % Bucket::ALL.len()];
            let tld = self.throwaway_tld(bucket);
            let d = self.fresh_name(&tld);
            let days = self.age_in(bucket, facts::unlisted_age);
            let on = hosts(self, k);
            self.domain(&d, &on, "mx -all", days);
            let arrival = if shape == Shape::Minting || self.rng.chance(facts::AFTER_HOST_KNOWN) {
                Arrival::After
            } else {
                Arrival::Before
            };
            self.case(Case {
                domain: d,
                class: class_of(shape),
                expect: Expect::Disposable,
                project: "",
                shape: Some(shape),
                bucket: Some(bucket),
                arrival,
                minimal: false,
            });
        }
    }

    /// Numbered hosts `mx1..mx5` under one parent, each in its own VPS /24; listed domains
    /// on them, unlisted ones each on a numbered host never seen before (in a /24 of its own).
    fn numbered(&mut self, per: usize, tenants: &mut Vec<String>) {
        let parent = self.throwaway_name();
        for i in 1..=facts::NUMBERED_HOSTS {
            let host = format!("mx{i}.{parent}");
            let net = self.vps_net(tenants);
            let ip = self.ip_in(net);
            self.host(&host, ip, Some(&host));
        }
        self.listed_over_numbered(&parent);
        let mut next = facts::NUMBERED_HOSTS;
        self.unlisted(Shape::Numbered, per, |w, _| {
            next += 1;
            let host = format!("mx{next}.{parent}");
            let net = w.net24();
            let ip = w.ip_in(net);
            w.host(&host, ip, Some(&host));
            vec![host]
        });
    }

    /// As many listed domains as a published cluster, the k-th on `mx{k mod 5 + 1}.{parent}`.
    fn listed_over_numbered(&mut self, parent: &str) {
        let listed = *self.rng.pick(&facts::CLUSTER_LISTED);
        for k in 0..listed {
            let d = self.throwaway_name();
            let host = format!("mx{}.{parent}", k % facts::NUMBERED_HOSTS + 1);
            self.listed(&d, &[host]);
        }
    }

    /// Differently named hosts over one /24 a throwaway service rents (reverse DNS naming
    /// each), beside other tenants; listed domains on them, unlisted ones on new hosts there.
    fn network(&mut self, per: usize, tenants: &mut Vec<String>) {
        let net = self.vps_net(tenants);
        let new_host = |w: &mut World| {
            let host = format!("mail.{}", w.throwaway_name());
            let ip = w.ip_in(net);
            w.host(&host, ip, Some(&host));
            host
        };
        let hosts: Vec<String> = (0..facts::NETWORK_HOSTS).map(|_| new_host(self)).collect();
        let listed = *self.rng.pick(&facts::CLUSTER_LISTED);
        for k in 0..listed as usize {
            let d = self.throwaway_name();
            self.listed(&d, &[hosts[k % hosts.len()].clone()]);
        }
        self.unlisted(Shape::Network, per, |w, _| vec![new_host(w)]);
    }

    /// Throwaway operators whose reverse DNS says nothing: one host whose reverse zone answers
    /// REFUSED, and numbered hosts with no PTR at all. Drawn last, so the worlds of before are
    /// drawn the same.
    pub(super) fn unanswered_reverse(&mut self) {
        let parent = self.throwaway_name();
        let host = format!("mail.{parent}");
        let net = self.net24();
        let ip = self.ip_in(net);
        // The test DNS server answers REFUSED for a PTR whose name has a `refused` label.
        self.host(&host, ip, Some("refused.invalid"));
        let hosts = vec![host];
        self.listed_on(&hosts, false);
        let per = self.size.per_shape;
        self.unlisted(Shape::Refusing, per, |_, _| hosts.clone());
        let parent = self.throwaway_name();
        let new_host = |w: &mut World, i: u64| {
            let host = format!("mx{i}.{parent}");
            let net = w.net24();
            let ip = w.ip_in(net);
            w.host(&host, ip, None);
            host
        };
        for i in 1..=facts::NUMBERED_HOSTS {
            new_host(self, i);
        }
        self.listed_over_numbered(&parent);
        let mut next = facts::NUMBERED_HOSTS;
        self.unlisted(Shape::NumberedNoPtr, per, |w, _| {
            next += 1;
            vec![new_host(w, next)]
        });
    }

    /// The tenants' companies: `per_class` cases, their age buckets in turn, on the tenants'
    /// hosts in turn.
    fn tenant_cases(&mut self, tenants: &[String]) {
        for k in 0..self.size.per_class.min(tenants.len()) {
            let host = tenants[k * tenants.len() / self.size.per_class.min(tenants.len())].clone();
            let bucket = Bucket::ALL[k % Bucket::ALL.len()];
            let tld = self.company_tld(bucket);
            let d = self.fresh_name(&tld);
            let days = self.age_in(bucket, facts::company_age);
            self.domain(&d, &[host], "mx ~all", days);
            self.simple_case(TENANTS, &d, Expect::NotFlagged);
        }
    }
}

/// The class label of a throwaway shape.
pub fn class_of(shape: Shape) -> &'static str {
    match shape {
        Shape::OneHost => "cluster: one host",
        Shape::Numbered => "cluster: numbered hosts",
        Shape::Network => "cluster: one /24",
        Shape::Minting => "minting 5:1",
        Shape::Refusing => "cluster: one host, reverse refused",
        Shape::NumberedNoPtr => "cluster: numbered hosts, no PTR",
    }
}
