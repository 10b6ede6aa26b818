//! The real users of the detection world, who must not be flagged: customers of forwarders
//! and mailbox hosts that throwaway services use too, privacy relays, customers of
//! shared-hosting mail hosts with a few listed throwaways among hundreds of companies, young
//! companies on small shared hosts, companies under TLDs without RDAP, companies on their own
//! hosts or a big provider, and real domains public blocklists listed wrongly.

use super::facts;
use super::world::{Bucket, Expect, World};

pub const FORWARDERS: &str = "not: forwarder/mailbox customers";
pub const RELAYS: &str = "not: privacy relays";
pub const HOSTING: &str = "not: shared hosting beside listed throwaways";
pub const HOSTING_EVERY: &str = "not: shared hosting, its listed throwaways asked by every project";
pub const SMALL: &str = "not: young companies on small shared hosts";
pub const NO_RDAP: &str = "not: companies on TLDs without RDAP";
pub const COMPANIES: &str = "not: companies (own host, Google, Microsoft)";
pub const WRONGLY: &str = "not: wrongly listed, removed";

/// Forwarders and mailbox hosts (their MX hosts and SPF include), and the listed throwaways
/// each serves: Cloudflare Email Routing 21 (the `mytemp.email` family in Baviskar's sample),
/// Yandex 360 2 (`tempmailo.com`, `mail.tm`, same sample); the others an assumption (3 each).
const SERVICES: [(&[&str], &str, u64); 10] = [
    (
        &[
            "route1.mx.cloudflare.net",
            "route2.mx.cloudflare.net",
            "route3.mx.cloudflare.net",
        ],
        "include:_spf.mx.cloudflare.net ~all",
        21,
    ),
    (&["mx.yandex.net"], "include:_spf.yandex.net ~all", 2),
    (
        &["mx1.improvmx.com", "mx2.improvmx.com"],
        "include:spf.improvmx.com ~all",
        3,
    ),
    (
        &["mx1.forwardemail.net", "mx2.forwardemail.net"],
        "include:spf.forwardemail.net -all",
        3,
    ),
    (
        &[
            "in1-smtp.messagingengine.com",
            "in2-smtp.messagingengine.com",
        ],
        "include:spf.messagingengine.com ?all",
        3,
    ),
    (
        &["aspmx1.migadu.com", "aspmx2.migadu.com"],
        "include:spf.migadu.com -all",
        3,
    ),
    (
        &["mx.zoho.com", "mx2.zoho.com", "mx3.zoho.com"],
        "include:zoho.com ~all",
        3,
    ),
    (
        &["mail.protonmail.ch", "mailsec.protonmail.ch"],
        "include:_spf.protonmail.ch ~all",
        3,
    ),
    (
        &["mailserver.purelymail.com"],
        "include:_spf.purelymail.com ~all",
        3,
    ),
    (
        &["heracles.mxrouting.net", "heracles-relay.mxrouting.net"],
        "include:mxroute.com -all",
        3,
    ),
];

/// Privacy relays and masked-email services (the shipped `relays.txt`).
const RELAY_NAMES: [&str; 20] = [
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

/// Domains public blocklists listed wrongly and removed after complaints (each source in
/// `benches/detection/PROVENANCE.md`), their real mail host, and years since registration.
const WRONGLY_LISTED: [(&str, &str, i64); 20] = [
    ("fastmessaging.com", "in1-smtp.messagingengine.com", 20),
    ("mailhaven.com", "in1-smtp.messagingengine.com", 20),
    ("nospammail.net", "in1-smtp.messagingengine.com", 20),
    ("reallyfast.info", "in1-smtp.messagingengine.com", 18),
    ("veryfast.biz", "in1-smtp.messagingengine.com", 18),
    ("cloaked.id", "aspmx.l.google.com", 5),
    ("cloaked.com", "aspmx.l.google.com", 6),
    ("cloaked.dev", "aspmx.l.google.com", 5),
    ("atomicmail.io", "mx.atomicmail.io", 3),
    ("feedspot.com", "aspmx.l.google.com", 15),
    ("feedspotmailer.com", "aspmx.l.google.com", 8),
    ("gmx.com", "mx00.gmx.net", 25),
    ("yandex.com", "mx.yandex.net", 20),
    ("google.com", "smtp.google.com", 28),
    (
        "microsoft.com",
        "microsoft-com.mail.protection.outlook.com",
        30,
    ),
    ("newpillow360.com", "mail.newpillow360.com", 4),
    ("126.com", "126mx00.mxmail.netease.com", 25),
    ("163.com", "163mx00.mxmail.netease.com", 25),
    ("bluewin.ch", "mxbw.bluewin.ch", 25),
    ("freemail.hu", "fmx.freemail.hu", 25),
];

impl World {
    /// Every must-not-flag class.
    pub(super) fn legit(&mut self) {
        self.forwarders();
        let take = self.size.per_class.clamp(4, RELAY_NAMES.len());
        for relay in RELAY_NAMES.iter().take(take) {
            self.simple_case(RELAYS, relay, Expect::NotFlagged);
        }
        let hosters: Vec<Vec<String>> = (0..self.size.hosters).map(|_| self.hoster()).collect();
        for k in 0..self.size.per_class {
            let hosts = hosters[k % hosters.len()].clone();
            self.company(HOSTING, Bucket::ALL[k % 4], &hosts, "a mx ~all");
        }
        self.small_hosts();
        for k in 0..self.size.per_class {
            let hosts = match k % 4 {
                0 => hosters[k % hosters.len()].clone(),
                1 => self.own_host_in(None),
                2 => self.google(),
                _ => self.microsoft(),
            };
            self.company(NO_RDAP, Bucket::NoRdap, &hosts, "mx ~all");
        }
        for k in 0..self.size.per_class {
            let bucket = Bucket::ALL[k % 4];
            let (hosts, spf) = match k % 3 {
                0 => (self.own_host_in(None), "mx ~all"),
                1 => (self.google(), "include:_spf.google.com ~all"),
                _ => (self.microsoft(), "include:spf.protection.outlook.com -all"),
            };
            self.company(COMPANIES, bucket, &hosts, spf);
        }
        self.wrongly_listed();
    }

    /// A company of `bucket` on `hosts` (a case of `class`).
    fn company(&mut self, class: &'static str, bucket: Bucket, hosts: &[String], spf: &str) {
        let tld = self.company_tld(bucket);
        let d = self.fresh_name(&tld);
        let days = self.age_in(bucket, facts::company_age);
        self.domain(&d, hosts, spf, days);
        self.simple_case(class, &d, Expect::NotFlagged);
    }

    /// A company of any age on `hosts`, seen before the cases (part of the past).
    fn customer_seen(&mut self, hosts: &[String]) {
        let tld = self.any_tld(&facts::COMPANY_TLDS);
        let d = self.fresh_name(&tld);
        let days = facts::company_age(&mut self.rng) as i64;
        self.domain(&d, hosts, "a mx ~all", days);
        self.seen_before(&d);
    }

    /// The forwarders and mailbox hosts, their listed throwaways, and their customers.
    fn forwarders(&mut self) {
        for (hosts, _, listed) in SERVICES {
            let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
            self.provider_hosts(&hosts);
            for _ in 0..listed {
                let d = self.throwaway_name();
                self.listed(&d, &hosts);
            }
        }
        for k in 0..self.size.per_class {
            let (hosts, spf, _) = SERVICES[(k + self.seed as usize) % SERVICES.len()];
            let hosts: Vec<String> = hosts.iter().map(|h| (*h).to_owned()).collect();
            self.company(FORWARDERS, Bucket::ALL[k % 4], &hosts, spf);
        }
    }

    /// A shared host whose listed throwaways every project of the deployment looked up (as
    /// many as the assumption's most, 5: issue 85's case), and its customers the cases, their
    /// age buckets in turn: honest traffic only.
    pub(super) fn hosting_every_project(&mut self) {
        let (_, most) = facts::HOSTING_LISTED;
        let hosts = self.hoster_with(Some(most));
        for k in 0..self.size.per_class {
            self.company(HOSTING_EVERY, Bucket::ALL[k % 4], &hosts, "a mx ~all");
        }
    }

    /// A shared-hosting mail host in its provider's own /24: hundreds of customers, the share
    /// the deployment saw before looked up in the past, and a few listed throwaways.
    fn hoster(&mut self) -> Vec<String> {
        self.hoster_with(None)
    }

    /// [`hoster`](Self::hoster); with `every: Some(n)`, `n` listed throwaways each looked up
    /// by every project.
    fn hoster_with(&mut self, every: Option<u64>) -> Vec<String> {
        let tld = self.company_tld(Bucket::Old);
        let provider = self.fresh_name(&tld);
        let net = self.net24();
        let hosts: Vec<String> = (1..=2)
            .map(|i| {
                let host = format!("mx{i}.{provider}");
                let ip = self.ip_in(net);
                self.host(&host, ip, Some(&host));
                host
            })
            .collect();
        let (lo, hi) = facts::HOSTING_CUSTOMERS;
        let customers = self.rng.range(lo, hi) as f64;
        let seen = (customers * facts::HOSTING_SEEN).round() as usize;
        for _ in 0..seen {
            self.customer_seen(&hosts);
        }
        let (lo, hi) = facts::HOSTING_LISTED;
        let listed = every.unwrap_or_else(|| self.rng.range(lo, hi));
        for _ in 0..listed {
            let d = self.throwaway_name();
            self.listed(&d, &hosts);
            if every.is_some() {
                for project in self.projects.clone() {
                    self.listing_lookup(&d, project);
                }
            }
        }
        hosts
    }

    /// Small shared hosts (a local provider, an agency), each with a few customers the
    /// deployment saw, sometimes one listed throwaway; the cases are young customers.
    fn small_hosts(&mut self) {
        const YOUNG: [Bucket; 3] = [Bucket::Young, Bucket::Months, Bucket::NoRdap];
        let n = self.size.per_class.div_ceil(3);
        let hosts: Vec<Vec<String>> = (0..n)
            .map(|_| {
                let hosts = self.own_host_in(None);
                let (lo, hi) = facts::SMALL_HOST_CUSTOMERS;
                for _ in 0..self.rng.range(lo, hi) {
                    if self.rng.chance(facts::HOSTING_SEEN) {
                        self.customer_seen(&hosts);
                    }
                }
                if self.rng.chance(facts::SMALL_HOST_LISTED) {
                    let d = self.throwaway_name();
                    self.listed(&d, &hosts);
                }
                hosts
            })
            .collect();
        for k in 0..self.size.per_class {
            let on = hosts[k % hosts.len()].clone();
            self.company(SMALL, YOUNG[k % YOUNG.len()], &on, "a mx ~all");
        }
    }

    /// A mail host of a company's or a small provider's own (`mail.<name>`, a backup `mx2`
    /// sometimes), in `net` or a hosting provider's /24 of its own.
    pub(super) fn own_host_in(&mut self, net: Option<[u8; 3]>) -> Vec<String> {
        let tld = self.company_tld(Bucket::Old);
        let owner = self.fresh_name(&tld);
        let mut hosts = vec![format!("mail.{owner}")];
        if self.rng.chance(facts::OWN_BACKUP_MX) {
            hosts.push(format!("mx2.{owner}"));
        }
        for h in &hosts {
            let n = net.unwrap_or_else(|| self.net24());
            let ip = self.ip_in(n);
            self.host(h, ip, Some(h));
        }
        hosts
    }

    /// Google Workspace's MX records (one, or the five older ones).
    pub(super) fn google(&mut self) -> Vec<String> {
        let hosts: Vec<String> = if self.rng.chance(facts::GOOGLE_ONE_RECORD) {
            vec!["smtp.google.com".to_owned()]
        } else {
            std::iter::once("aspmx.l.google.com".to_owned())
                .chain((1..=4).map(|i| format!("alt{i}.aspmx.l.google.com")))
                .collect()
        };
        self.provider_hosts(&hosts);
        hosts
    }

    /// Microsoft 365's one MX record (`<tenant>.mail.protection.outlook.com`).
    pub(super) fn microsoft(&mut self) -> Vec<String> {
        let tenant = self.fresh_name("com").replace('.', "-");
        let hosts = vec![format!("{tenant}.mail.protection.outlook.com")];
        self.provider_hosts(&hosts);
        hosts
    }

    /// Addresses for a provider's MX hosts the world has not placed yet.
    pub(super) fn provider_hosts(&mut self, hosts: &[String]) {
        for h in hosts {
            if !self.zones.contains_key(h) {
                let ip = self.public_ip();
                self.host(h, ip, Some(h));
            }
        }
    }

    /// The wrongly listed real names: `wrongly` of them, from the seed's place on.
    fn wrongly_listed(&mut self) {
        for k in 0..self.size.wrongly.min(WRONGLY_LISTED.len()) {
            let (domain, host, years) =
                WRONGLY_LISTED[(k + 7 * self.seed as usize) % WRONGLY_LISTED.len()];
            let hosts = [host.to_owned()];
            self.provider_hosts(&hosts);
            let days = (years as f64 * facts::YEAR) as i64;
            self.domain(domain, &hosts, "mx ~all", days);
            self.simple_case(WRONGLY, domain, Expect::NotFlagged);
        }
    }
}
