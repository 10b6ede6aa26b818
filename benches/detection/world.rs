//! The labelled world of the detection benchmark: DNS zones (MX, addresses, reverse DNS), the
//! registration dates an RDAP server gives, the blocklist, the traffic that comes before the
//! cases, the cases (each with its class and the answer a good gateway gives), the planting
//! attacks and the names one project pushes at top-domains. Built from a size, so the test
//! command's gate runs a slice of the same world (`World::build(8)`) and the full run 20 a class.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use crate::dns::Zone;

/// The projects whose signups the cases are (one key each); the attacker is a project too.
pub const PROJECTS: [&str; 3] = ["web", "shop", "forum"];
/// The project that plants and pushes.
pub const ATTACKER: &str = "mallory";
/// Listed domains an attack plants at most, one at a time (more than the 20 the goal names).
pub const MAX_PLANTED: usize = 25;

/// What a good answer to a case is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// `disposable` (a throwaway domain no list names yet).
    Disposable,
    /// `undeliverable` (a mail set-up that cannot take mail).
    Undeliverable,
    /// `safe`, whatever the score: a real user's domain.
    NotFlagged,
}

impl Expect {
    pub fn as_str(self) -> &'static str {
        match self {
            Expect::Disposable => "disposable",
            Expect::Undeliverable => "undeliverable",
            Expect::NotFlagged => "not flagged",
        }
    }
}

/// One labelled lookup.
#[derive(Debug, Clone)]
pub struct Case {
    pub domain: String,
    pub class: &'static str,
    pub expect: Expect,
    pub project: &'static str,
}

/// One planting attack: listed domains whose DNS the attacker controls, looked up by the
/// attacker one at a time, and the victims they aim at (looked up after each plant).
#[derive(Debug, Clone)]
pub struct Attack {
    pub class: &'static str,
    pub planted: Vec<String>,
    pub victims: Vec<String>,
}

/// The whole world (see the module documentation).
#[derive(Default)]
pub struct World {
    pub zones: HashMap<String, Zone>,
    pub ptr: HashMap<Ipv4Addr, String>,
    /// Registrable domain -> days since its registration (RDAP); others answer 404.
    pub registered: HashMap<String, i64>,
    /// The blocklist (`disposable.txt`).
    pub listed: Vec<String>,
    /// Looked up before the cases, in order: listed names (the neighbourhood learns their mail
    /// hosts in the background) and companies seen earlier.
    pub history: Vec<(String, &'static str)>,
    pub cases: Vec<Case>,
    pub attacks: Vec<Attack>,
    /// Unlisted names the attacker looks up again and again, hoping for top-domains.
    pub pushed: Vec<String>,
    /// A listed name the attacker looks up as often: it must reach top-domains (the control).
    pub pushed_control: String,
    next_project: usize,
}

/// Ages in days: throwaway domains are minted days before use; companies are years old.
const OLD: i64 = 3_000;

impl World {
    /// The world with `n` cases in each class of clusters and must-not-flag customers.
    pub fn build(n: usize) -> World {
        let mut w = World::default();
        w.cluster_on_one_host(n);
        w.cluster_by_parent(n);
        w.cluster_by_network(n);
        w.minting(n);
        w.shared_services(n);
        w.relays(n);
        w.fresh_companies(n);
        w.old_companies(n);
        w.wrongly_listed(n);
        w.unusable();
        w.attacks();
        w.top_push();
        w
    }

    /// The next non-attacker project, in turn.
    fn project(&mut self) -> &'static str {
        self.next_project += 1;
        PROJECTS[self.next_project % PROJECTS.len()]
    }

    fn mx(&mut self, domain: &str, hosts: &[&str]) {
        self.zones.insert(
            domain.into(),
            Zone {
                mx: hosts
                    .iter()
                    .enumerate()
                    .map(|(i, h)| (10 * (i as u16 + 1), (*h).to_owned()))
                    .collect(),
                a: None,
                ttl: 300,
            },
        );
    }

    /// A name with neither MX nor address records.
    fn no_mail(&mut self, domain: &str) {
        self.zones.insert(
            domain.into(),
            Zone {
                mx: vec![],
                a: None,
                ttl: 300,
            },
        );
    }

    /// A mail host with an address whose reverse DNS names it (as operators that own their
    /// network set it up).
    fn host(&mut self, host: &str, ip: [u8; 4]) {
        self.ptr.insert(Ipv4Addr::from(ip), host.to_owned());
        self.address(host, ip);
    }

    /// A name with an address and no reverse DNS of its own.
    fn address(&mut self, name: &str, ip: [u8; 4]) {
        self.zones.insert(
            name.into(),
            Zone {
                mx: vec![],
                a: Some(Ipv4Addr::from(ip)),
                ttl: 300,
            },
        );
    }

    fn listed(&mut self, domain: &str, hosts: &[&str], days: i64) {
        self.mx(domain, hosts);
        self.listed.push(domain.to_owned());
        self.registered.insert(domain.to_owned(), days);
        let p = self.project();
        self.history.push((domain.to_owned(), p));
    }

    fn case(&mut self, class: &'static str, domain: &str, expect: Expect, days: Option<i64>) {
        if let Some(days) = days {
            self.registered.insert(domain.to_owned(), days);
        }
        let project = self.project();
        self.cases.push(Case {
            domain: domain.to_owned(),
            class,
            expect,
            project,
        });
    }

    /// 30 listed domains on one dedicated host; `n` unlisted ones (days old) arrive after.
    fn cluster_on_one_host(&mut self, n: usize) {
        self.host("mx.quickbox.test", [198, 18, 1, 10]);
        for i in 0..30 {
            self.listed(&format!("qb-l{i}.test"), &["mx.quickbox.test"], 40 + i);
        }
        for i in 0..n {
            let d = format!("qb-u{i}.test");
            self.mx(&d, &["mx.quickbox.test"]);
            self.case(
                "cluster: one host",
                &d,
                Expect::Disposable,
                Some(2 + i as i64),
            );
        }
    }

    /// Numbered hosts under one parent, each in its own /24: 40 listed on mx1..mx30; `n`
    /// unlisted each on a numbered host never seen before (only the parent ties them).
    fn cluster_by_parent(&mut self, n: usize) {
        for i in 1..=30u8 {
            self.host(&format!("mx{i}.burnerpost.test"), [198, 19, i, 1]);
        }
        for i in 0..40u8 {
            let host = format!("mx{}.burnerpost.test", i % 30 + 1);
            self.listed(&format!("bp-l{i}.test"), &[&host], 60);
        }
        for i in 0..n as u8 {
            let host = format!("mx{}.burnerpost.test", 31 + i);
            self.host(&host, [198, 19, 31 + i, 1]);
            let d = format!("bp-u{i}.test");
            self.mx(&d, &[&host]);
            self.case("cluster: numbered hosts", &d, Expect::Disposable, Some(5));
        }
    }

    /// Hosts spread over one /24, each under a name of its own: 30 listed; `n` unlisted on new
    /// hosts of the same network, whose reverse DNS vouches for them.
    fn cluster_by_network(&mut self, n: usize) {
        for i in 0..30u8 {
            let host = format!("mail.nx{i}.test");
            self.host(&host, [203, 0, 113, i + 1]);
            self.listed(&format!("nx-l{i}.test"), &[&host], 90);
        }
        for i in 0..n as u8 {
            let host = format!("smtp.nxnew{i}.test");
            self.host(&host, [203, 0, 113, 100 + i]);
            let d = format!("nx-u{i}.test");
            self.mx(&d, &[&host]);
            self.case("cluster: one /24", &d, Expect::Disposable, Some(9));
        }
    }

    /// Minting: `n` listed domains on one host, then five times as many unlisted ones minted
    /// on it arrive, one after another (lists follow months late).
    fn minting(&mut self, n: usize) {
        self.host("mx.mintmail.test", [198, 18, 2, 10]);
        for i in 0..n {
            self.listed(&format!("mint-l{i}.test"), &["mx.mintmail.test"], 120);
        }
        for i in 0..5 * n {
            let d = format!("mint-u{i}.test");
            self.mx(&d, &["mx.mintmail.test"]);
            self.case(
                "minting 5:1",
                &d,
                Expect::Disposable,
                Some(1 + (i % 60) as i64),
            );
        }
    }

    /// Forwarders and mailbox hosts that throwaway services use too, and a small unknown host:
    /// eight listed domains on each, and their (old) customers.
    fn shared_services(&mut self, n: usize) {
        const HOSTS: [&str; 10] = [
            "route1.mx.cloudflare.net",
            "mx1.forwardemail.net",
            "mx1.improvmx.com",
            "in1-smtp.messagingengine.com",
            "aspmx1.migadu.com",
            "mx.zoho.com",
            "mail.protonmail.ch",
            "mailserver.purelymail.com",
            "heracles.mxrouting.net",
            "mx.tinymail.test",
        ];
        for (h, host) in HOSTS.iter().enumerate() {
            self.host(host, [198, 18, 10, h as u8 + 1]);
            for i in 0..8 {
                self.listed(&format!("svc{h}-l{i}.test"), &[host], 200);
            }
        }
        for i in 0..n.max(HOSTS.len()) {
            let host = HOSTS[i % HOSTS.len()];
            let d = format!("customer{i}.test");
            self.mx(&d, &[host]);
            self.case(
                "not: forwarder/mailbox customers",
                &d,
                Expect::NotFlagged,
                Some(OLD + i as i64),
            );
        }
    }

    /// Privacy relays and masked-email services (the shipped `relays.txt`).
    fn relays(&mut self, n: usize) {
        const RELAYS: [&str; 20] = [
            "privaterelay.appleid.com",
            "duck.com",
            "mozmail.com",
            "simplelogin.com",
            "simplelogin.co",
            "simplelogin.fr",
            "aleeas.com",
            "slmail.me",
            "silomails.com",
            "slmails.com",
            "8alias.com",
            "8shield.net",
            "dralias.com",
            "anonaddy.com",
            "anonaddy.me",
            "x.mozmail.com",
            "user.anonaddy.com",
            "a.duck.com",
            "b.simplelogin.com",
            "c.aleeas.com",
        ];
        for relay in RELAYS.iter().take(n.max(8)) {
            self.case("not: privacy relays", relay, Expect::NotFlagged, None);
        }
    }

    /// Companies registered days ago: on their own host, on Google Workspace, on Fastmail.
    fn fresh_companies(&mut self, n: usize) {
        for i in 0..n {
            let d = format!("freshco{i}.test");
            match i % 3 {
                0 => {
                    let own = format!("mail.{d}");
                    self.host(&own, [198, 18, 20, i as u8 + 1]);
                    self.mx(&d, &[&own]);
                }
                1 => self.mx(&d, &["aspmx.l.google.com", "alt1.aspmx.l.google.com"]),
                _ => self.mx(
                    &d,
                    &[
                        "in1-smtp.messagingengine.com",
                        "in2-smtp.messagingengine.com",
                    ],
                ),
            }
            self.case(
                "not: fresh companies",
                &d,
                Expect::NotFlagged,
                Some(1 + (i % 20) as i64),
            );
        }
    }

    /// Old companies on their own hosts.
    fn old_companies(&mut self, n: usize) {
        for i in 0..n {
            let d = format!("oldco{i}.test");
            let own = format!("mx.{d}");
            self.host(&own, [198, 18, 21, i as u8 + 1]);
            self.mx(&d, &[&own]);
            self.case(
                "not: old companies",
                &d,
                Expect::NotFlagged,
                Some(OLD + 10 * i as i64),
            );
        }
    }

    /// Domains public blocklists listed wrongly and removed after complaints (the source of
    /// each in `benches/detection/PROVENANCE.md`), with their real mail set-up's shape.
    fn wrongly_listed(&mut self, n: usize) {
        const NAMES: [(&str, &str); 20] = [
            ("fastmessaging.com", "in1-smtp.messagingengine.com"),
            ("mailhaven.com", "in1-smtp.messagingengine.com"),
            ("nospammail.net", "in1-smtp.messagingengine.com"),
            ("reallyfast.info", "in1-smtp.messagingengine.com"),
            ("veryfast.biz", "in1-smtp.messagingengine.com"),
            ("cloaked.id", "aspmx.l.google.com"),
            ("cloaked.com", "aspmx.l.google.com"),
            ("cloaked.dev", "aspmx.l.google.com"),
            ("atomicmail.io", "mx.atomicmail.io"),
            ("feedspot.com", "aspmx.l.google.com"),
            ("feedspotmailer.com", "aspmx.l.google.com"),
            ("gmx.com", "mx00.gmx.net"),
            ("yandex.com", "mx.yandex.net"),
            ("google.com", "smtp.google.com"),
            ("microsoft.com", "microsoft-com.mail.protection.outlook.com"),
            ("newpillow360.com", "mail.newpillow360.com"),
            ("126.com", "126mx00.mxmail.netease.com"),
            ("163.com", "163mx00.mxmail.netease.com"),
            ("bluewin.ch", "mxbw.bluewin.ch"),
            ("freemail.hu", "fmx.freemail.hu"),
        ];
        for (i, (domain, host)) in NAMES.iter().enumerate().take(n.max(10)) {
            if !self.zones.contains_key(*host) {
                self.host(host, [198, 18, 30, i as u8 + 1]);
            }
            self.mx(domain, &[host]);
            let days = if *domain == "atomicmail.io" {
                900
            } else {
                OLD * 2
            };
            self.case(
                "not: wrongly listed, removed",
                domain,
                Expect::NotFlagged,
                Some(days),
            );
        }
    }

    /// Mail set-ups that cannot take mail: MX hosts on loopback, private, shared, link-local,
    /// reserved or unspecified addresses, a null MX, an MX host that does not exist, an MX
    /// host that is not a host name, no MX and no address.
    fn unusable(&mut self) {
        let on: [(&str, [u8; 4]); 12] = [
            ("loop0", [127, 0, 0, 1]),
            ("loop1", [127, 0, 1, 1]),
            ("ten0", [10, 0, 0, 5]),
            ("ten1", [10, 20, 30, 40]),
            ("lan0", [192, 168, 1, 1]),
            ("lan1", [172, 16, 0, 1]),
            ("zero0", [0, 0, 0, 0]),
            ("zero1", [0, 1, 2, 3]),
            ("link0", [169, 254, 1, 1]),
            ("cgnat0", [100, 64, 0, 1]),
            ("resv0", [240, 0, 0, 1]),
            ("bcast0", [255, 255, 255, 255]),
        ];
        for (label, ip) in on {
            let d = format!("{label}-mail.test");
            let host = format!("mx.{label}-host.test");
            self.address(&host, ip);
            self.mx(&d, &[&host]);
            self.case("unusable mail", &d, Expect::Undeliverable, Some(300));
        }
        for i in 0..3 {
            let d = format!("nullmx{i}.test");
            self.zones.insert(
                d.clone(),
                Zone {
                    mx: vec![(0, String::new())],
                    a: None,
                    ttl: 300,
                },
            );
            self.case("unusable mail", &d, Expect::Undeliverable, Some(OLD));
        }
        for i in 0..3 {
            let d = format!("ghostmx{i}.test");
            self.mx(&d, &[&format!("mx.nothere{i}.test")]);
            self.case("unusable mail", &d, Expect::Undeliverable, Some(40));
        }
        for i in 0..2 {
            let d = format!("nomail{i}.test");
            self.no_mail(&d);
            self.case("unusable mail", &d, Expect::Undeliverable, Some(OLD));
        }
        self.mx("localmx.test", &["localhost"]);
        self.case(
            "unusable mail",
            "localmx.test",
            Expect::Undeliverable,
            Some(OLD),
        );
    }

    /// The four planting attacks, each on four old victims.
    fn attacks(&mut self) {
        // 1. On the victims' own hosts (`mail.victimN.test`).
        let mut victims = Vec::new();
        for v in 0..4u8 {
            let d = format!("victim{v}.test");
            let own = format!("mail.{d}");
            self.host(&own, [198, 18, 40, v + 1]);
            self.mx(&d, &[&own]);
            self.registered.insert(d.clone(), OLD);
            victims.push(d);
        }
        let planted = self.plant("own", |k| format!("mail.victim{}.test", k % 4));
        self.attacks.push(Attack {
            class: "attack: victims' own hosts",
            planted,
            victims,
        });
        // 2. On a third party's real host, where the victims get their mail.
        self.host("mx.smallhoster.test", [198, 18, 41, 1]);
        let victims = self.customers("sh", &["mx.smallhoster.test"]);
        let planted = self.plant("third", |_| "mx.smallhoster.test".to_owned());
        self.attacks.push(Attack {
            class: "attack: a third party's host",
            planted,
            victims,
        });
        // 3. On made-up hosts under that third party's name (they do not resolve).
        self.host("mx.smallhoster2.test", [198, 18, 42, 1]);
        let victims = self.customers("sh2", &["mx.smallhoster2.test"]);
        let planted = self.plant("ghost", |k| format!("ghost{k}.smallhoster2.test"));
        self.attacks.push(Attack {
            class: "attack: made-up hosts, third party's name",
            planted,
            victims,
        });
        // 4. On the other servers of a hosting provider's /24 (real, reverse DNS vouching).
        for s in 1..=4u8 + MAX_PLANTED as u8 {
            self.host(&format!("srv{s}.webhost.test"), [198, 18, 43, s]);
        }
        let mut victims = Vec::new();
        for v in 0..4u8 {
            let d = format!("hosted{v}.test");
            self.mx(&d, &[&format!("srv{}.webhost.test", v + 1)]);
            self.registered.insert(d.clone(), OLD);
            victims.push(d);
        }
        let planted = self.plant("net", |k| format!("srv{}.webhost.test", 5 + k));
        self.attacks.push(Attack {
            class: "attack: a hosting provider's /24",
            planted,
            victims,
        });
    }

    /// Four old customers of `hosts`.
    fn customers(&mut self, tag: &str, hosts: &[&str]) -> Vec<String> {
        (0..4)
            .map(|v| {
                let d = format!("{tag}-customer{v}.test");
                self.mx(&d, hosts);
                self.registered.insert(d.clone(), OLD);
                d
            })
            .collect()
    }

    /// `MAX_PLANTED` listed domains, the k-th with MX `host(k)` (listed, not looked up yet).
    fn plant(&mut self, tag: &str, host: impl Fn(usize) -> String) -> Vec<String> {
        (0..MAX_PLANTED)
            .map(|k| {
                let d = format!("plant-{tag}{k}.test");
                self.mx(&d, &[&host(k)]);
                self.listed.push(d.clone());
                self.registered.insert(d.clone(), 15);
                d
            })
            .collect()
    }

    /// What one project pushes at top-domains: unlisted names judged by inference (on the
    /// one-host cluster), young companies, names with no mail host; and a listed control.
    fn top_push(&mut self) {
        for i in 0..4 {
            let d = format!("push-qb{i}.test");
            self.mx(&d, &["mx.quickbox.test"]);
            self.registered.insert(d.clone(), 3);
            self.pushed.push(d);
            let d = format!("push-young{i}.test");
            let own = format!("mail.{d}");
            self.host(&own, [198, 18, 50, i as u8 + 1]);
            self.mx(&d, &[&own]);
            self.registered.insert(d.clone(), 2);
            self.pushed.push(d);
            let d = format!("push-nomail{i}.test");
            self.no_mail(&d);
            self.pushed.push(d);
        }
        self.pushed_control = "push-control-listed.test".to_owned();
        self.mx(&self.pushed_control.clone(), &["mx.quickbox.test"]);
        self.listed.push(self.pushed_control.clone());
    }

    /// The TLDs the world's names are under (each gets the loopback RDAP server).
    pub fn tlds(&self) -> Vec<String> {
        let mut tlds: Vec<String> = self
            .zones
            .keys()
            .chain(self.cases.iter().map(|c| &c.domain))
            .filter_map(|d| d.rsplit('.').next().map(str::to_owned))
            .collect();
        tlds.sort();
        tlds.dedup();
        tlds
    }
}
