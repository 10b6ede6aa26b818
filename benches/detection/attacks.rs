//! The planting attacks of the detection world: listed domains whose DNS the attacker controls
//! (lapsed listed names it re-registered: they do not resolve until the attack plants them,
//! `World::lapsed`), planted one at a time on the victims' own hosts,
//! on a third party's host where the victims get their mail, on made-up hosts under that third
//! party's name, and on the attacker's own servers in a hosting provider's /24 beside the
//! victims'; four victims each, one of every age bucket (the shapes `crowds.rs` has several
//! attackers plant too). And the names one project pushes at top-domains.

use super::facts;
use super::world::{Attack, Bucket, Through, World, MAX_PLANTED};

/// One self-serve attacker project.
const ONE: (usize, Through) = (1, Through::SelfServe);
/// The parent attack's class among the deployment projects' crowds.
pub const PARENT_SHAPE: &str = "a provider's numbered hosts (parent)";

impl World {
    /// The four attacks, each by one attacker project.
    pub(super) fn attacks(&mut self) {
        let (planted, victims) = self.on_own_hosts();
        self.push_attack("attack: victims' own hosts", ONE, planted, victims);
        let (planted, victims) = self.on_a_third_party();
        self.push_attack("attack: a third party's host", ONE, planted, victims);
        // Made-up hosts under that third party's name (they do not resolve).
        let hoster = self.own_host_in(None);
        let parent = hoster[0].trim_start_matches("mail.").to_owned();
        let victims = self.victims(|_| hoster.clone());
        let planted = self.plant(|w, _| {
            let label = w.fresh_name("x");
            vec![format!("{}.{parent}", label.trim_end_matches(".x"))]
        });
        self.push_attack(
            "attack: made-up hosts, third party's name",
            ONE,
            planted,
            victims,
        );
        let (planted, victims) = self.on_a_provider_net(&[]);
        self.push_attack("attack: a hosting provider's /24", ONE, planted, victims);
    }

    /// Planted on the victims' own hosts: the planted listed domains and the victims.
    pub(super) fn on_own_hosts(&mut self) -> (Vec<String>, Vec<(String, Bucket)>) {
        let mut own = Vec::new();
        let victims = self.victims(|w| {
            let hosts = w.own_host_in(None);
            own.push(hosts[0].clone());
            hosts
        });
        let planted = self.plant(|_, k| vec![own[k % own.len()].clone()]);
        (planted, victims)
    }

    /// Planted over a small provider's numbered hosts (`mx1..mx3` under its own name, each in a
    /// /24 of its own), where the victims get their mail (`mx1`, `mx2` as backup): the planted
    /// domains, the k-th on host k mod 3, make the provider's name (a parent key) hold listed
    /// neighbours on several hosts. The attacker controls none of the hosts, only the planted
    /// domains' MX records.
    pub(super) fn on_a_providers_hosts(&mut self) -> (Vec<String>, Vec<(String, Bucket)>) {
        let tld = self.company_tld(Bucket::Old);
        let provider = self.fresh_name(&tld);
        let hosts: Vec<String> = (1..=3).map(|i| format!("mx{i}.{provider}")).collect();
        for h in &hosts {
            let net = self.net24();
            let ip = self.ip_in(net);
            self.host(h, ip, Some(h));
        }
        let victims = self.victims(|_| hosts[..2].to_vec());
        let planted = self.plant(|_, k| vec![hosts[k % hosts.len()].clone()]);
        (planted, victims)
    }

    /// The parent attack (a provider's numbered hosts): by one self-serve attacker, and carried
    /// by 1, 2 and 4 of the deployment's own projects. Made last, so the worlds of before
    /// it are drawn the same.
    pub(super) fn parent_attacks(&mut self) {
        let (planted, victims) = self.on_a_providers_hosts();
        self.push_attack("attack: a provider's numbered hosts", ONE, planted, victims);
        for k in super::crowds::CARRIERS {
            let (planted, victims) = self.on_a_providers_hosts();
            self.past.extend(victims.iter().map(|(d, _)| d.clone()));
            let by = (k.min(self.projects.len()), Through::Deployment);
            self.push_attack(PARENT_SHAPE, by, planted, victims);
        }
    }

    /// Planted on a third party's real host, where the victims get their mail.
    pub(super) fn on_a_third_party(&mut self) -> (Vec<String>, Vec<(String, Bucket)>) {
        let hoster = self.own_host_in(None);
        let victims = self.victims(|_| hoster.clone());
        let planted = self.plant(|_, _| vec![hoster[0].clone()]);
        (planted, victims)
    }

    /// Planted on the attacker's servers in a hosting provider's /24 (reverse DNS naming each)
    /// beside the victims' own servers there; each planted domain's further MX hosts `more`.
    pub(super) fn on_a_provider_net(
        &mut self,
        more: &[String],
    ) -> (Vec<String>, Vec<(String, Bucket)>) {
        let net = self.net24();
        let provider = self.fresh_name("net");
        let mut n = 0;
        let mut server = |w: &mut World| {
            n += 1;
            let host = format!("srv{n}.{provider}");
            let ip = w.ip_in(net);
            w.host(&host, ip, Some(&host));
            vec![host]
        };
        let victims = self.victims(&mut server);
        let planted = self.plant(|w, _| {
            let mut hosts = server(w);
            hosts.extend_from_slice(more);
            hosts
        });
        (planted, victims)
    }

    pub(super) fn push_attack(
        &mut self,
        class: &'static str,
        (attackers, through): (usize, Through),
        planted: Vec<String>,
        victims: Vec<(String, Bucket)>,
    ) {
        let attack = Attack {
            class,
            attackers,
            through,
            planted,
            victims,
        };
        if attackers == 1 && through == Through::SelfServe {
            self.attacks.push(attack);
        } else {
            self.crowds.push(attack);
        }
    }

    /// Four victims, one of each age bucket, each on `hosts(world)`; looked up by the victims'
    /// project in the past (so their ages are known by the attack).
    fn victims(
        &mut self,
        mut hosts: impl FnMut(&mut World) -> Vec<String>,
    ) -> Vec<(String, Bucket)> {
        Bucket::ALL
            .iter()
            .map(|&bucket| {
                let tld = self.company_tld(bucket);
                let d = self.fresh_name(&tld);
                let days = self.age_in(bucket, facts::company_age);
                let on = hosts(self);
                self.domain(&d, &on, "mx ~all", days);
                self.early_lookup(&d, self.projects[0]);
                (d, bucket)
            })
            .collect()
    }

    /// `MAX_PLANTED` listed domains, the k-th with MX `hosts(world, k)` (listed, not looked up
    /// yet; lapsed until planted: `World::build` sets their zones aside).
    fn plant(&mut self, mut hosts: impl FnMut(&mut World, usize) -> Vec<String>) -> Vec<String> {
        (0..MAX_PLANTED)
            .map(|k| {
                let d = self.throwaway_name();
                let on = hosts(self, k);
                // A lapsed name the attacker registered again: the registry gives that day.
                let days = facts::reregistered_age(&mut self.rng) as i64;
                self.domain(&d, &on, "mx -all", days);
                self.listed.push(d.clone());
                d
            })
            .collect()
    }

    /// What one project pushes at top-domains: unlisted names on a throwaway host (judged by
    /// inference), young companies, names with no mail host; and a listed control.
    pub(super) fn top_push(&mut self) {
        let host = self
            .listed
            .first()
            .and_then(|d| self.zones.get(d))
            .and_then(|z| z.mx.first())
            .map(|(_, h)| h.clone())
            .expect("a listed domain with an MX host");
        for _ in 0..4 {
            let d = self.throwaway_name();
            let days = facts::unlisted_age(&mut self.rng) as i64;
            self.domain(&d, std::slice::from_ref(&host), "mx -all", days);
            self.pushed.push(d);
            let tld = self.company_tld(Bucket::Young);
            let d = self.fresh_name(&tld);
            let days = self.age_in(Bucket::Young, facts::company_age);
            let own = self.own_host_in(None);
            self.domain(&d, &own, "mx ~all", days);
            self.pushed.push(d);
            let d = self.throwaway_name();
            self.no_mail(&d, days);
            self.pushed.push(d);
        }
        let control = self.throwaway_name();
        self.domain(&control, &[host], "mx -all", 100);
        self.listed.push(control.clone());
        self.pushed_control = control;
    }
}
