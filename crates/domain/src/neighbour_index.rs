//! The MX neighbourhood index (pure): which domains share an MX host, the host's registrable
//! parent or the network of its addresses, and how many of those neighbours the blocklists name.
//!
//! Throwaway-mail operators run thousands of domains on a handful of hosts; lists learn of a new
//! domain months late, but its mail host is usually already known. A key (host, parent or
//! network) whose distinct neighbours are mostly listed judges an unlisted domain on it.
//!
//! Counts are of distinct registrable domains: each domain remembers the keys it was counted
//! under, and a new observation replaces its old contribution, so asking again adds nothing.
//! Every piece has its provenance:
//! - **Listed** neighbours remember who taught their hosts ([`Teachers`]): the lists' snapshot,
//!   the gateway's own look at every listed name, or which projects' lookups. What the lists
//!   and the look taught judges every project's answers alike (one verdict per domain); what a
//!   project's lookups taught judges only that project's own answers, whichever project it is
//!   and however many projects say the same.
//! - **Who controls the evidence** ([`Grounds`]): where a listed domain's mail goes is chosen by
//!   whoever holds that domain now (lapsed names are re-registered), and any end user can make
//!   any project look any address up. So the project that carried a lookup decides nothing
//!   about another project's answer, and a finding that rests on lookups or the look yields to
//!   the domain's own established age. Only a finding the operator's lists hold alone (the
//!   snapshot) does not.
//! - **Unknown is not legitimate.** An unlisted domain dilutes its keys only when something
//!   vouches for it ([`Standing::Vouched`]: the registry gave it an age few throwaway domains
//!   reach unlisted); one nobody vouches for counts neither way, as a throwaway domain no list
//!   names yet looks the same.
//!   A domain the gateway itself answered disposable by inference ([`Standing::Inferred`])
//!   counts neither way either: throwaway services mint faster than lists follow.
//! - **Who arrived first** ([`History`]): a listed domain the gateway saw move onto a host
//!   never counts against a domain it saw receiving mail there before that day, however long
//!   it holds; newcomers are judged by it once it has held `hold_days`.
//! - A parent or a network judges only with listed neighbours on several distinct MX hosts
//!   *inside* it (`min_hosts`): hosting providers put unrelated tenants in one /24, and a
//!   throwaway domain's other hosts elsewhere say nothing of that /24.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;

use super::mail::ProviderKind;
use super::name::DomainName;
use super::providers::ProviderTable;

/// MX hosts of one domain considered at most (by preference): a domain cannot spread itself
/// over many keys.
pub const MAX_HOSTS: usize = 4;
/// Networks of one host considered at most (IPv4 and IPv6, say).
pub const MAX_NETS_PER_HOST: usize = 2;
/// How far below `min_share` a verdict already reached still stands (hysteresis).
pub const HOLD_MARGIN: f64 = 0.15;

/// What a key is.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize, PartialOrd, Ord,
)]
#[serde(rename_all = "snake_case")]
pub enum KeyKind {
    /// An MX host name (`mx1.example-mail.io`).
    Host,
    /// The registrable parent of an MX host (`example-mail.io`).
    Parent,
    /// The network of an MX host's addresses (IPv4 /24, IPv6 /48).
    Network,
}

impl KeyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::Host => "host",
            KeyKind::Parent => "parent",
            KeyKind::Network => "network",
        }
    }

    /// The kind and value of a stored key (`host:mx.example.io`).
    pub fn split(key: &str) -> Option<(KeyKind, &str)> {
        let (kind, value) = key.split_once(':')?;
        let kind = match kind {
            "host" => KeyKind::Host,
            "parent" => KeyKind::Parent,
            "network" => KeyKind::Network,
            _ => return None,
        };
        (!value.is_empty()).then_some((kind, value))
    }
}

/// The network of an address: IPv4 /24, IPv6 /48 (what one hosting customer usually gets).
pub fn network(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            format!("{}.{}.{}.0/24", o[0], o[1], o[2])
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let net = std::net::Ipv6Addr::new(s[0], s[1], s[2], 0, 0, 0, 0, 0);
            format!("{net}/48")
        }
    }
}

/// An MX host and the networks of its addresses (empty when not asked or not found).
pub type HostNetworks = (Box<str>, Vec<String>);

/// Whether `name` is `domain` or under it (a company's own mail host, `mx.victim.com` of
/// `victim.com`, or its own name used as a parent).
fn is_own(name: &str, domain: &str) -> bool {
    name == domain
        || name
            .strip_suffix(domain)
            .is_some_and(|head| head.ends_with('.'))
}

/// The keys of `domain` whose MX hosts (most preferred first) are `hosts`, each with its
/// networks. A host run by a recognised mailbox provider, security gateway, forwarder or
/// consumer service gives no key at all: those serve legitimate and throwaway domains alike.
/// Hosts dedicated to disposable mail do give keys (their neighbours teach). Nor does a host
/// under the domain's own registrable domain: a company's own mail host, its own name as a
/// parent and the networks of its own hosts are its own, and whoever points listed domains at
/// them (`ghost1.victim.com` needs no record at the victim's) must not make them judge it.
pub fn keys_of(domain: &str, hosts: &[HostNetworks], providers: &ProviderTable) -> Vec<Box<str>> {
    let own = DomainName::parse(domain)
        .ok()
        .and_then(|n| n.registrable().map(str::to_owned))
        .unwrap_or_else(|| domain.to_owned());
    let mut keys: Vec<Box<str>> = Vec::new();
    let mut push = |k: String| {
        if !keys.iter().any(|have| **have == *k) {
            keys.push(k.into());
        }
    };
    for (host, nets) in hosts.iter().take(MAX_HOSTS) {
        let is_name = host.contains('.') && host.parse::<IpAddr>().is_err();
        let shared_service = providers
            .kind_of(host)
            .is_some_and(|k| k != ProviderKind::Disposable);
        if !is_name || shared_service || is_own(host, &own) {
            continue;
        }
        push(format!("host:{host}"));
        let host: &str = host;
        if let Some(parent) = DomainName::parse(host)
            .ok()
            .and_then(|n| n.registrable().map(str::to_owned))
        {
            if parent != *host {
                push(format!("parent:{parent}"));
            }
        }
        for net in nets.iter().take(MAX_NETS_PER_HOST) {
            push(format!("network:{net}"));
        }
    }
    keys
}

/// When a key judges: at least `min_listed` distinct listed neighbours the asking project may
/// count, listed ones at least `min_share` of the listed and vouched-for together, and, for a
/// parent or a network, listed neighbours on at least `min_hosts` distinct MX hosts (VPS and
/// hosting providers put unrelated tenants in one /24: one throwaway host there says nothing of
/// its neighbours).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NeighbourhoodRule {
    pub min_listed: u32,
    pub min_share: f64,
    pub min_hosts: u32,
    /// Days a listed domain the gateway saw elsewhere (or with no mail: a lapsed name) must
    /// hold its new hosts before it counts there (see [`History`]).
    pub hold_days: u32,
}

impl NeighbourhoodRule {
    fn dominates(&self, kind: KeyKind, listed: u32, vouched: u32, hosts: u32) -> bool {
        let all = f64::from(listed) + f64::from(vouched);
        listed >= self.min_listed.max(1)
            && f64::from(listed) >= self.min_share * all
            && (kind == KeyKind::Host || hosts >= self.min_hosts.max(1))
    }
}

/// A project, as the index remembers it: a stable hash of its name (the same on every
/// gateway, and no name in a state file). 64 bits: two of 10^6 projects share one with odds
/// of about 3 in 10^8 (32 bits: likely from about 10^5), and two projects that did would count
/// as one teacher, and see each other's own findings.
pub type ProjectId = u64;

/// The id of project `name` (FNV-1a, 64 bits).
pub fn project_id(name: &str) -> ProjectId {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Projects remembered per listed domain at most: enough to tell one from several.
const TEACHERS_MAX: usize = 3;

/// Who taught the index a listed domain's mail hosts: the lists themselves (the operator's
/// `mx-snapshot`, made from every listed name), the gateway's own look at every listed name,
/// or the traffic of which projects (the first few). Whoever controls a listed domain's DNS
/// chooses its hosts, and any end user can make any project look any address up: a lookup
/// teaches the project that carried it, for its own answers only, whoever that project is
/// and however many projects say the same (issue 85: before, projects on a trusted plan
/// taught for everyone).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Teachers {
    global: bool,
    /// The gateway's own background look at every listed name taught it.
    looked: bool,
    projects: [ProjectId; TEACHERS_MAX],
    n: u8,
}

/// What a listed domain's teachers make of it in its keys' counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Support<'t> {
    /// The lists' snapshot: the operator's word.
    Lists,
    /// The gateway's own look: what it verified itself, for every project alike.
    Looked,
    /// Projects' lookups only: each of them counts it for its own answers.
    Own(&'t [ProjectId]),
    /// Nobody recorded (an older state file): judges nobody.
    Untaught,
}

impl Teachers {
    /// Taught by the lists (the snapshot): judges every project's answers.
    pub const GLOBAL: Teachers = Teachers {
        global: true,
        looked: false,
        projects: [0; TEACHERS_MAX],
        n: 0,
    };

    /// Taught by the gateway's own look at every listed name (no project asked): counts for
    /// every project.
    pub const LOOKED: Teachers = Teachers {
        global: false,
        looked: true,
        projects: [0; TEACHERS_MAX],
        n: 0,
    };

    /// Taught by `project`'s traffic.
    pub fn project(project: ProjectId) -> Teachers {
        let mut t = Teachers::default();
        t.add(project);
        t
    }

    /// From what a state file or another gateway kept.
    pub fn of<'p>(
        (global, looked): (bool, bool),
        projects: impl IntoIterator<Item = &'p ProjectId>,
    ) -> Teachers {
        let mut t = Teachers {
            global,
            looked,
            ..Teachers::default()
        };
        for p in projects {
            t.add(*p);
        }
        t
    }

    /// Adds `project`; whether anything changed (a known one, or a full set: no).
    pub fn add(&mut self, project: ProjectId) -> bool {
        let n = usize::from(self.n);
        if self.has(project) || n >= TEACHERS_MAX {
            return false;
        }
        self.projects[n] = project;
        self.n += 1;
        true
    }

    /// Both together; whether anything changed.
    pub fn merge(&mut self, other: Teachers) -> bool {
        let mut changed = (other.global && !self.global) || (other.looked && !self.looked);
        self.global |= other.global;
        self.looked |= other.looked;
        for p in other.projects() {
            changed |= self.add(*p);
        }
        changed
    }

    pub fn is_global(&self) -> bool {
        self.global
    }

    /// The gateway's own look taught it.
    pub fn is_looked(&self) -> bool {
        self.looked
    }

    /// The projects whose traffic taught it.
    pub fn projects(&self) -> &[ProjectId] {
        &self.projects[..usize::from(self.n)]
    }

    /// Whether `project` taught it.
    pub fn has(&self, project: ProjectId) -> bool {
        self.projects().contains(&project)
    }

    fn support(&self) -> Support<'_> {
        match (self.global, self.looked) {
            (true, _) => Support::Lists,
            (false, true) => Support::Looked,
            (false, false) if self.n > 0 => Support::Own(self.projects()),
            (false, false) => Support::Untaught,
        }
    }
}

/// How a domain counts in its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// A blocklist names it (the source's index in the index's source names).
    Listed(u16),
    /// No blocklist names it and nothing vouches for it: it neither flags nor dilutes (a
    /// throwaway domain no list names yet looks just the same).
    Unknown,
    /// No blocklist names it and something vouches for it (the registry gave an age of at
    /// least the rule's `vouch_age_days`: few throwaway domains live that long unlisted, or
    /// the operator accepted a `safe` report): evidence of a real organisation's domain,
    /// which dilutes its keys.
    Vouched,
    /// No blocklist names it and the gateway answered it disposable from its neighbours: it
    /// neither dilutes nor feeds its keys.
    Inferred,
}

impl Standing {
    /// What an unlisted domain counts as: vouched for (whatever the gateway answered: a
    /// domain the registry shows old enough is evidence against its key even when that key
    /// judged it, so that a shared host's established tenants end a cold start), else what the
    /// gateway inferred, else unknown.
    fn unlisted(inferred: bool, vouched: bool) -> Standing {
        match (inferred, vouched) {
            (_, true) => Standing::Vouched,
            (true, false) => Standing::Inferred,
            (false, false) => Standing::Unknown,
        }
    }

    fn is_listed(self) -> bool {
        matches!(self, Standing::Listed(_))
    }
}

/// Listed neighbours by what supports them (see [`Support`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Taught {
    /// The lists' snapshot.
    lists: u32,
    /// The gateway's own look (each listed domain once).
    looked: u32,
    /// Projects' lookups only, per project (a domain two of them taught counts for each).
    own: Vec<(ProjectId, u32)>,
    /// Projects' lookups only, each domain once (for the admin listing).
    own_any: u32,
    untaught: u32,
}

impl Taught {
    fn count(&mut self, teachers: &Teachers, up: bool) {
        let step = |n: &mut u32| *n = if up { *n + 1 } else { n.saturating_sub(1) };
        match teachers.support() {
            Support::Lists => step(&mut self.lists),
            Support::Looked => step(&mut self.looked),
            Support::Own(ps) => {
                step(&mut self.own_any);
                for p in ps {
                    bump(&mut self.own, p, up);
                }
            }
            Support::Untaught => step(&mut self.untaught),
        }
    }

    fn is_empty(&self) -> bool {
        self.lists + self.looked + self.untaught + self.own_any == 0
    }

    /// What `asking` counts: the shared ones (the lists' and the look's) and what its own
    /// lookups taught.
    fn seen_by(&self, asking: Option<ProjectId>) -> u32 {
        let own = (self.own.iter())
            .find(|(p, _)| Some(*p) == asking)
            .map_or(0, |(_, n)| *n);
        self.lists + self.looked + own
    }

    /// Every listed neighbour recorded, whoever taught it, each once (for the admin listing).
    fn all(&self) -> u32 {
        self.lists + self.looked + self.untaught + self.own_any
    }
}

/// The counts of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Counts {
    listed: Taught,
    /// Unlisted neighbours something vouches for (an established age the registry gave).
    vouched: u32,
    /// Unknown and inferred neighbours (shown; they count neither way).
    other: u32,
    /// Listed neighbours per source (few sources: a small vector).
    sources: Vec<(u16, u32)>,
    /// The MX hosts (`host:` keys) of the listed neighbours *inside* this key (the host
    /// itself; a parent's hosts under it; a network's hosts with an address in it), each with
    /// who taught those: a parent or a network judges only with several.
    hosts: Vec<(Arc<str>, Taught)>,
    /// The listed neighbours the gateway saw arrive here (moved from other hosts, or from no
    /// mail: see [`History`]) and counted, earliest first: a domain it saw here before one
    /// arrived is not judged by it (see [`Counts::view`]).
    arrivals: Vec<Arrival>,
    /// From which day each unlisted domain something vouches for (the registry shows it
    /// established) makes this key a mail home, earliest first: the day the gateway first saw
    /// it here. Listed names that arrive at a mail home count for nobody (see [`Counts::view`]).
    /// A domain of unknown age makes no home, however long it receives mail here: anyone can
    /// register one and make any project look it up, and a home changes every project's
    /// answers.
    homes: Vec<u32>,
    /// A few of the listed neighbours counted here (the first [`SAMPLE`] seen, as they come and
    /// go): whose registry ages show whether the names on the key were held long
    /// ([`Finding::aged_listed`]).
    sample: Vec<Box<str>>,
}

/// Listed neighbours a key keeps by name ([`Counts::sample`]): enough to find
/// [`AGED_LISTED`] of them registered long ago where about 45% are (a throwaway operator's
/// names: 3 or more of 16 nearly always, of 8 about four times in five), few enough to ask a
/// registry for each.
const SAMPLE: usize = 16;

/// Listed neighbours on a key the registry shows registered at least `established_days` ago
/// that make its finding one an established age does not outweigh ([`Finding::aged_listed`]).
/// A lapsed name re-registered gets a new registration date: whoever plants names on a host
/// with the cheap means (lapsed names, self-serve accounts) plants young ones. Three, not one:
/// a small company host may serve one listed domain of its own; a throwaway operator's 21 to
/// 43 names (benches/detection/PROVENANCE.md) hold about 45% over a year old.
pub const AGED_LISTED: u32 = 3;

/// A listed neighbour that arrived on a key: the day, who it counts for, its hosts inside the
/// key (what it adds to the key's counts, taken out again for a domain that was there first).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Arrival {
    since: u32,
    teachers: Teachers,
    hosts: Box<[Arc<str>]>,
}

fn bump<K: PartialEq + Clone>(list: &mut Vec<(K, u32)>, key: &K, up: bool) {
    match list.iter().position(|(k, _)| k == key) {
        Some(i) if up => list[i].1 += 1,
        Some(i) => {
            list[i].1 -= 1;
            if list[i].1 == 0 {
                list.swap_remove(i);
            }
        }
        None if up => list.push((key.clone(), 1)),
        None => {}
    }
}

/// The `host:` keys among `keys` (one domain's, in [`keys_of`]'s order: each host followed by
/// its parent and its networks) that lie inside `key`: the host itself, a parent's hosts under
/// it, a network's hosts whose addresses gave it. A throwaway server elsewhere whose domains
/// also name hosts in a provider's /24 says nothing of that /24.
fn hosts_inside<'k>(keys: &'k [Arc<str>], key: &str) -> Vec<&'k Arc<str>> {
    let mut out = Vec::new();
    let mut host: Option<&Arc<str>> = None;
    for k in keys {
        match KeyKind::split(k) {
            Some((KeyKind::Host, name)) => {
                host = Some(k);
                let inside = match KeyKind::split(key) {
                    Some((KeyKind::Host, _)) => **k == *key,
                    Some((KeyKind::Parent, parent)) => name
                        .strip_suffix(parent)
                        .is_some_and(|head| head.ends_with('.')),
                    _ => false,
                };
                if inside {
                    out.push(k);
                }
            }
            Some((KeyKind::Network, _)) if **k == *key => {
                if let Some(h) = host.filter(|h| !out.contains(h)) {
                    out.push(h);
                }
            }
            _ => {}
        }
    }
    out
}

impl Counts {
    /// Adds (`up`) or removes what `entry` contributes to `key` (this key); `hold_days` 0: no
    /// key is a mail home.
    fn count(
        &mut self,
        key: &str,
        (domain, entry): (&str, &DomainEntry),
        up: bool,
        hold_days: u32,
    ) {
        let step = |n: &mut u32| *n = if up { *n + 1 } else { n.saturating_sub(1) };
        if let Some(day) = entry.home_from(hold_days) {
            let at = self.homes.partition_point(|d| *d < day);
            if up {
                self.homes.insert(at, day);
            } else if self.homes.get(at) == Some(&day) {
                self.homes.remove(at);
            }
        }
        match entry.standing {
            Standing::Listed(s) => {
                let sampled = self.sample.iter().position(|d| **d == *domain);
                match sampled {
                    Some(i) if !up => {
                        self.sample.swap_remove(i);
                    }
                    None if up && !entry.unheld && self.sample.len() < SAMPLE => {
                        self.sample.push(domain.into());
                    }
                    _ => {}
                }
                let teachers = entry.counted_teachers();
                self.listed.count(&teachers, up);
                bump(&mut self.sources, &s, up);
                let inside = hosts_inside(&entry.keys, key);
                if entry.history.arrived() && !entry.unheld {
                    let arrival = Arrival {
                        since: entry.history.since,
                        teachers,
                        hosts: inside.iter().map(|h| Arc::clone(h)).collect(),
                    };
                    if up {
                        let at = (self.arrivals).partition_point(|a| a.since <= arrival.since);
                        self.arrivals.insert(at, arrival);
                    } else if let Some(at) = self.arrivals.iter().position(|a| *a == arrival) {
                        self.arrivals.remove(at);
                    }
                }
                for k in inside {
                    let i = match self.hosts.iter().position(|(h, _)| h == k) {
                        Some(i) => i,
                        None if up => {
                            self.hosts.push((k.clone(), Taught::default()));
                            self.hosts.len() - 1
                        }
                        None => continue,
                    };
                    self.hosts[i].1.count(&teachers, up);
                    if self.hosts[i].1.is_empty() {
                        self.hosts.swap_remove(i);
                    }
                }
            }
            Standing::Vouched => step(&mut self.vouched),
            Standing::Unknown | Standing::Inferred => step(&mut self.other),
        }
    }

    fn listed(&self) -> u32 {
        self.listed.all()
    }

    fn is_empty(&self) -> bool {
        self.listed.is_empty() && self.vouched + self.other == 0 && self.homes.is_empty()
    }

    /// What `project` may count, `own` (the domain being judged) left out: the listed
    /// neighbours the lists and the gateway's own look taught, the same for every project,
    /// with what its own lookups taught; and, as `lists`, those the lists' snapshot taught.
    /// `here_since`: the day the gateway first saw the judged domain on its hosts. Listed
    /// neighbours it saw arrive after that day are left out too, however long they have held:
    /// a domain that received mail here before them is not condemned by newcomers (who arrived
    /// first, issue 94). And whoever asks, listed neighbours that arrived once the key was a
    /// mail home (a domain the registry shows established received mail here, [`Counts::homes`])
    /// are left out: newcomers to a company's host are the planting.
    fn view(
        &self,
        project: Option<ProjectId>,
        own: Option<Standing>,
        here_since: Option<u32>,
    ) -> View {
        let after_own = here_since.map_or(self.arrivals.len(), |day| {
            self.arrivals.partition_point(|a| a.since <= day)
        });
        let at_home = (self.homes.first()).map_or(self.arrivals.len(), |home| {
            self.arrivals.partition_point(|a| a.since < *home)
        });
        let late = &self.arrivals[after_own.min(at_home)..];
        // What the late arrivals add, on the key and on each of its hosts (usually nothing).
        let mut gone = Taught::default();
        let mut gone_hosts: Vec<(&Arc<str>, Taught)> = Vec::new();
        for a in late {
            gone.count(&a.teachers, true);
            for h in a.hosts.iter() {
                let i = match gone_hosts.iter().position(|(k, _)| *k == h) {
                    Some(i) => i,
                    None => {
                        gone_hosts.push((h, Taught::default()));
                        gone_hosts.len() - 1
                    }
                };
                gone_hosts[i].1.count(&a.teachers, true);
            }
        }
        let gone_on = |h: &Arc<str>| gone_hosts.iter().find(|(k, _)| *k == h).map(|(_, t)| t);
        let hosts = |f: &dyn Fn(&Taught) -> u32| {
            (self.hosts.iter())
                .filter(|(h, t)| f(t) > gone_on(h).map_or(0, f))
                .count() as u32
        };
        let less = |f: &dyn Fn(&Taught) -> u32| f(&self.listed).saturating_sub(f(&gone));
        let mut v = View {
            listed: less(&|t| t.seen_by(project)),
            hosts: hosts(&|t| t.seen_by(project)),
            everyone: less(&|t| t.seen_by(None)),
            everyone_hosts: hosts(&|t| t.seen_by(None)),
            lists: less(&|t| t.lists),
            lists_hosts: hosts(&|t| t.lists),
            vouched: self.vouched,
            other: self.other,
        };
        match own {
            Some(Standing::Vouched) => v.vouched = v.vouched.saturating_sub(1),
            Some(Standing::Unknown | Standing::Inferred) => v.other = v.other.saturating_sub(1),
            _ => {}
        }
        v
    }
}

/// A key's counts as one project sees them.
#[derive(Debug, Clone, Copy)]
struct View {
    listed: u32,
    hosts: u32,
    /// What every project counts (the lists and the gateway's own look), and on how many hosts.
    everyone: u32,
    everyone_hosts: u32,
    lists: u32,
    lists_hosts: u32,
    vouched: u32,
    other: u32,
}

impl View {
    fn judges(&self, rule: &NeighbourhoodRule, kind: KeyKind) -> bool {
        rule.dominates(kind, self.listed, self.vouched, self.hosts)
    }

    /// Whether the finding needs the asking project's own lookups: what every project counts
    /// (the lists and the gateway's own look) does not hold it alone.
    fn needs_own(&self, rule: &NeighbourhoodRule, kind: KeyKind) -> bool {
        !rule.dominates(kind, self.everyone, self.vouched, self.everyone_hosts)
    }

    /// What the finding rests on: the lists' snapshot alone holds it, or lookups taught it.
    fn grounds(&self, rule: &NeighbourhoodRule, kind: KeyKind) -> Grounds {
        if rule.dominates(kind, self.lists, self.vouched, self.lists_hosts) {
            Grounds::Lists
        } else {
            Grounds::Lookups
        }
    }
}

#[derive(Debug, Clone)]
struct DomainEntry {
    standing: Standing,
    keys: Box<[Arc<str>]>,
    /// Day (since the epoch) it was last taught.
    seen: u32,
    /// For a listed domain: who taught its hosts.
    teachers: Teachers,
    /// Something vouches for it.
    vouched: bool,
    /// The gateway answered it disposable by inference (what it stands as when nothing
    /// vouches for it).
    inferred: bool,
    /// Since when its hosts are what they are, and whether it was seen elsewhere before.
    history: History,
    /// It moved to its hosts less than the rule's `hold_days` ago (when last taught): as a
    /// listed neighbour it counts for nobody.
    unheld: bool,
    /// The last day its DNS answered with mail on its hosts (see [`REPOINTED_WITHIN_DAYS`]).
    live: Option<u32>,
}

/// A listed name the gateway saw answer on its own hosts at most this many days before it
/// shows new ones was re-pointed by its holder, not registered again: a lapsed name spends
/// weeks out of DNS (a registry's redemption and pending-delete periods, 35 days at least for
/// a gTLD) before anyone else can register it, and the look passes daily. A throwaway service
/// moving its listed names to a new host is judged there at once (they hold no `hold_days`);
/// a name seen without mail, or not seen for longer (a gateway stopped for weeks), holds.
pub const REPOINTED_WITHIN_DAYS: u32 = 2;

/// Since when a domain's mail goes where it goes now, as the gateway saw it: the day it first
/// saw its current MX hosts, and whether it had seen the domain's mail elsewhere, or nowhere,
/// before (`moved`). Where a listed domain's mail goes is chosen by whoever holds it now, and
/// lists are full of lapsed names anyone can register again: a listed name the gateway saw
/// with no mail (a lapsed name) or on other hosts, and now sees on new ones, was most likely
/// re-registered or re-pointed by someone else than the throwaway service the list named. It
/// counts on its new hosts only once it has held them `hold_days`. A name the gateway never saw
/// before counts at once: nothing tells it moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct History {
    pub since: u32,
    pub moved: bool,
    /// It came to these hosts [re-pointed](REPOINTED_WITHIN_DAYS) by its holder, counted at
    /// once: a name is taken as re-pointed once, so a second move (a parked name sold and
    /// pointed elsewhere) holds.
    pub repointed: bool,
    /// The day the gateway began watching it with its current holder: `since`, but for a
    /// re-pointed name the day it was first seen on its earlier hosts (the same holder chose
    /// both). A name no registry dates has held its hosts only as long as this shows
    /// (`crate::listed_holds`).
    pub watched: u32,
}

/// Whether `new` names an MX host `old` did not (networks left out: a host's addresses may be
/// asked later, or renumbered by its owner, whom the listed domain's holder does not control).
/// Fewer hosts is no move: a host whose addresses did not answer this time drops out of a
/// domain's keys, and coming back it is one it had.
fn moved_to<A: AsRef<str>, B: AsRef<str>>(old: &[A], new: &[B]) -> bool {
    new.iter()
        .map(AsRef::as_ref)
        .filter(|k| is_host(k))
        .any(|k| !old.iter().any(|o| o.as_ref() == k))
}

/// The last day a domain answered with mail on its hosts once taught `keys` on `day` as `how`
/// says, after `old`'s: today when this teaching saw its hosts answer (one that carries no kept
/// history), or the day a state line or another gateway kept.
fn live_after(old: Option<u32>, keys: &[Arc<str>], how: Teach, day: u32) -> Option<u32> {
    let observed = how.history.is_none() && !how.restore && !how.no_mail && !keys.is_empty();
    [old, how.live, observed.then_some(day)]
        .into_iter()
        .flatten()
        .max()
}

/// Whether `key` is an MX host's.
fn is_host(key: &str) -> bool {
    matches!(KeyKind::split(key), Some((KeyKind::Host, _)))
}

impl History {
    /// Seen on its hosts since `since` (`moved` there), watched since then.
    pub fn new(since: u32, moved: bool) -> History {
        History {
            since,
            moved,
            repointed: false,
            watched: since,
        }
    }

    /// It arrived on its hosts after the gateway first saw it (moved there, or re-pointed):
    /// the domains seen there before it are not judged by it.
    fn arrived(&self) -> bool {
        self.moved || self.repointed
    }

    /// What a domain's history is once taught `keys` on `day`, as `how` says, after `old` (its
    /// keys and history, if it was known).
    fn after(
        old: Option<(&[Arc<str>], History)>,
        keys: &[Arc<str>],
        how: Teach,
        day: u32,
    ) -> History {
        let first = History::new(day, false);
        match old {
            _ if how.restore => how.history.unwrap_or(first),
            Some((old_keys, had)) if !moved_to(old_keys, keys) => match how.history {
                // Another gateway saw it move: the later day, the longer hold.
                Some(h) if h.moved => History::new(
                    if had.moved {
                        had.since.max(h.since)
                    } else {
                        h.since
                    },
                    true,
                ),
                _ => had,
            },
            // Seen before, with no mail or on other hosts, and now on a host it was not: moved.
            Some(_) => History::new(day, true),
            None => how.history.unwrap_or(first),
        }
    }
}

impl DomainEntry {
    /// From which day it makes its keys a mail home ([`Counts::homes`]): a domain something
    /// vouches for (the registry shows it established, or the operator accepted it), from the
    /// day first seen there. One of unknown age makes none: whoever registers a domain and
    /// makes a self-serve project look it up would otherwise choose, a month on, which of their
    /// listed names count for every project. With `hold_days` 0 nothing is weighed by when it
    /// arrived (names that move count at once, as before the look), so no key is a home.
    fn home_from(&self, hold_days: u32) -> Option<u32> {
        match self.standing {
            Standing::Vouched if hold_days > 0 => Some(self.history.since),
            _ => None,
        }
    }

    /// Who it counts for: nobody while it moved lately; a name that moved is no longer the
    /// lists' word either (a snapshot made after the move shows the new holder's choice), only
    /// as the look's, once it has held.
    fn counted_teachers(&self) -> Teachers {
        if self.unheld {
            return Teachers::default();
        }
        let mut t = self.teachers;
        if self.history.arrived() && t.global {
            t.global = false;
            t.looked = true;
        }
        t
    }
}

/// What one teaching says besides the keys: how the gateway answered the domain, whether
/// something vouches for it (`None`: not known, the last word stands), and who taught it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Teach {
    pub inferred: bool,
    pub vouched: Option<bool>,
    pub teachers: Teachers,
    /// What a state file or another gateway kept of its history; `None`: first seen now.
    pub history: Option<History>,
    /// Restored from the gateway's own files at start: the history is taken as kept (a state
    /// line read after the snapshot is the gateway's own later view, not a move).
    pub restore: bool,
    /// The last day its DNS answered with mail on its hosts, as a state file or another
    /// gateway kept it (`None` with no `history`: a teaching that saw its hosts now, today).
    pub live: Option<u32>,
    /// The look saw it with no mail now (or its DNS silent): its keys are the ones it had,
    /// not an answer that shows it live.
    pub no_mail: bool,
}

/// A key that judges a domain, with its counts (the `evidence` of `rule: mx_neighbourhood`).
/// Read back too: a verdict one gateway holds is every gateway's while it holds.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct Finding {
    pub key_kind: KeyKind,
    pub key: Box<str>,
    /// Distinct listed neighbours on the key that judge this project's answer (the domain
    /// itself not counted): those the lists and the gateway's own look taught, and those the
    /// asking project's own lookups taught.
    pub listed: u32,
    /// Distinct unlisted neighbours (the domain itself not counted): vouched for or not.
    pub unlisted: u32,
    /// Unlisted neighbours something vouches for (an established age): what dilutes.
    pub vouched: u32,
    /// Distinct MX hosts of the listed neighbours.
    pub throwaway_hosts: u32,
    /// `listed / (listed + vouched)`.
    pub share: f64,
    /// Who controls what the finding rests on: the operator's lists alone, or lookups (an
    /// established age shields a domain from those). A verdict another gateway of an earlier
    /// release holds, without it, rests on lookups.
    #[serde(default)]
    pub grounds: Grounds,
    /// The finding needs what the asking project's own lookups taught: the lists and the
    /// gateway's own look (what every project counts) do not hold it alone: whoever types an
    /// address into the project's sign-up form can plant that. (Every finding lookups or the
    /// look taught waits for a registry's age on its way, `classify::pending`.)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_lookups: bool,
    /// Listed neighbours by the list that names them, most first.
    pub sources: Vec<SourceCount>,
    /// When this verdict was first reached (RFC 3339, UTC): a verdict is kept for a while
    /// (`verdict_hold_seconds`) with the counts it was reached on, so it does not flip back and
    /// forth as the index learns. Set by the service that holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Listed neighbours on the key the registry shows registered at least `established_days`
    /// ago, among the few the key keeps by name (up to 16): names held that long, which
    /// nobody plants cheaply (a lapsed name re-registered is young again). From
    /// [`AGED_LISTED`] on, a finding lookups taught is not outweighed by the judged domain's
    /// own established age. Set where the registry's answers are known (0: none known).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub aged_listed: u32,
    /// Whether the key's listed names have held it is still to be dated: too few of the names
    /// it keeps by name are known to have been registered `hold_days` ago, and the dates that
    /// could show it are on their way from registries not known to fail
    /// ([`crate::listed_holds::Held::Pending`]). The answer waits, as for an age on its way.
    /// Each answer's own: set where the registry's answers are known, never shared.
    #[serde(skip)]
    pub holds_pending: bool,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

// `share` is a ratio of counts (never NaN): equality is total.
impl Eq for Finding {}

/// What a neighbourhood finding rests on, by who controls it (docs/mx.md, "Who controls the
/// evidence").
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize, PartialOrd, Ord,
)]
#[serde(rename_all = "snake_case")]
pub enum Grounds {
    /// The operator's lists alone hold it: the `mx-snapshot` the operator made and loaded, where
    /// the listed names' mail went when the operator looked. No lookup added to it.
    Lists,
    /// Lookups taught it. Where a listed domain's mail goes is chosen by whoever holds that
    /// domain now (lapsed names are re-registered by anyone), and any end user can make any
    /// project look any address up: the same fact whichever project carried the lookup, and
    /// however many did. A domain's own established age outweighs it.
    #[default]
    Lookups,
}

/// Listed neighbours from one source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SourceCount {
    pub source: Box<str>,
    pub neighbours: u32,
}

/// One key, for the admin listing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyReport {
    pub key_kind: KeyKind,
    pub key: Box<str>,
    pub listed: u32,
    /// Listed neighbours the lists' snapshot taught (the rest, lookups).
    pub from_lists: u32,
    pub unlisted: u32,
    pub vouched: u32,
    pub throwaway_hosts: u32,
    /// The key judges every project's answers under the current rule (on what the lists and
    /// the look taught; a project's own lookups may judge its own answers too).
    pub judges: bool,
    pub sources: Vec<SourceCount>,
}

/// One learned domain, as the state file and the snapshot keep it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Learned {
    pub domain: Box<str>,
    pub keys: Vec<Box<str>>,
    /// Day since the epoch it was last seen.
    pub seen: u32,
    /// The gateway answered it disposable from its neighbours ([`Standing::Inferred`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inferred: bool,
    /// Something vouches for it ([`Standing::Vouched`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub vouched: bool,
    /// Taught by the lists (the snapshot): see [`Teachers`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub global: bool,
    /// Taught by the gateway's own look at every listed name: see [`Teachers`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub looked: bool,
    /// It moved to its hosts (see [`History`]) on this day.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u32>,
    /// The gateway first saw it on its hosts on this day (it did not move there): listed
    /// names that arrived later do not judge it (who arrived first), and a listed name that
    /// comes with it is no newcomer to a host where established domains receive mail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<u32>,
    /// The last day its DNS answered with mail on its hosts (a line without it, from an
    /// earlier release, shows no day: a move from its hosts then holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<u32>,
    /// It came to its hosts re-pointed by its holder (see [`History::repointed`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repointed: bool,
    /// The day the gateway began watching it with its holder, when earlier than `first` (a
    /// re-pointed name: see [`History::watched`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watched: Option<u32>,
    /// The projects whose traffic taught it, each for its own answers (64-bit ids, the first
    /// few). The name is the one earlier releases read as their untrusted projects': the same
    /// meaning, so a gateway of an earlier release beside this one counts them the same way.
    /// Earlier releases still kept 32-bit ids under `taught_by` and `trusted_by`: those are
    /// not read (an old id would be a second teacher beside the same project's new one).
    #[serde(
        default,
        rename = "untrusted_ids",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub taught_by: Vec<ProjectId>,
    /// Read only: the projects an earlier release trusted to teach for everyone. Who carried
    /// a lookup makes its fact no truer: they now teach their own answers, like every project.
    #[serde(default, rename = "trusted_ids", skip_serializing)]
    pub trusted_by: Vec<ProjectId>,
}

impl Learned {
    /// A domain `keys` were found for on `seen`, taught as `how` says.
    pub fn new(domain: &str, keys: Vec<Box<str>>, seen: u32, how: Teach) -> Learned {
        Learned {
            domain: domain.into(),
            keys,
            seen,
            inferred: how.inferred,
            vouched: how.vouched.unwrap_or(false),
            global: how.teachers.is_global(),
            looked: how.teachers.is_looked(),
            since: how.history.filter(|h| h.moved).map(|h| h.since),
            first: how.history.filter(|h| !h.moved).map(|h| h.since),
            live: how.live,
            repointed: how.history.is_some_and(|h| h.repointed),
            watched: how
                .history
                .filter(|h| !h.moved && h.watched != h.since)
                .map(|h| h.watched),
            taught_by: how.teachers.projects().to_vec(),
            trusted_by: Vec::new(),
        }
    }

    /// How to teach it.
    pub fn teach(&self) -> Teach {
        Teach {
            inferred: self.inferred,
            // Vouching is sticky here: a gateway that did not ask does not undo one that did.
            vouched: self.vouched.then_some(true),
            teachers: Teachers::of(
                (self.global, self.looked),
                self.trusted_by.iter().chain(&self.taught_by),
            ),
            history: (self.since.map(|since| History::new(since, true))).or(self.first.map(
                |since| History {
                    repointed: self.repointed,
                    watched: self.watched.unwrap_or(since),
                    ..History::new(since, false)
                },
            )),
            restore: false,
            live: self.live,
            no_mail: false,
        }
    }

    /// How to teach it back from the gateway's own files at start (see [`Teach::restore`]).
    pub fn restore(&self) -> Teach {
        Teach {
            restore: true,
            ..self.teach()
        }
    }
}

/// The index (see the module documentation). Not synchronised: the `mx` part holds it behind
/// a lock.
#[derive(Debug)]
pub struct NeighbourhoodIndex {
    // Keyed by names callers choose: aHash with per-process random keys (resistant to
    // collisions built without them), not SipHash, which cost ~200 instructions a mix lookup.
    keys: HashMap<Arc<str>, Counts, ahash::RandomState>,
    domains: HashMap<Box<str>, DomainEntry, ahash::RandomState>,
    sources: Vec<Box<str>>,
    rule: NeighbourhoodRule,
    max_entries: usize,
    /// Keys by kind (host, parent, network), kept as keys come and go: metrics read them
    /// without a scan of every key under the lock.
    kinds: [usize; 3],
    /// Domains seen to move to new hosts (see [`History`]), since start.
    moves: u64,
    /// Listed domains seen re-pointed by their holder ([`REPOINTED_WITHIN_DAYS`]), since start.
    repoints: u64,
    /// Listed domains whose counts carry each project's own lookups ([`Support::Own`]): a
    /// project with none has no view of its own, and its answers skip that second look.
    own: HashMap<ProjectId, u32, ahash::RandomState>,
}

impl NeighbourhoodIndex {
    /// An empty index remembering at most `max_entries` domains.
    pub fn new(rule: NeighbourhoodRule, max_entries: usize) -> Self {
        NeighbourhoodIndex {
            keys: HashMap::default(),
            domains: HashMap::default(),
            sources: Vec::new(),
            rule,
            max_entries: max_entries.max(1),
            kinds: [0; 3],
            moves: 0,
            repoints: 0,
            own: HashMap::default(),
        }
    }

    /// Domains beyond nine tenths of `max_entries` once the bound is passed (what an eviction
    /// takes), or 0.
    pub fn excess(&self) -> usize {
        if self.domains.len() <= self.max_entries {
            return 0;
        }
        self.domains.len() - (self.max_entries - self.max_entries / 10)
    }

    /// How much `domain` teaches (for eviction: the least useful go first), if it is known.
    pub fn usefulness_of(&self, domain: &str) -> Option<u8> {
        self.domains.get(domain).map(|e| self.usefulness(e))
    }

    /// Forgets `domain`, unless it was taught on a day after `seen_after`; whether it did.
    pub fn forget(&mut self, domain: &str, seen_after: Option<u32>) -> bool {
        match self.domains.get(domain) {
            Some(e) if seen_after.is_none_or(|day| e.seen <= day) => {}
            _ => return false,
        }
        if let Some(e) = self.domains.remove(domain) {
            self.withdraw(domain, &e);
        }
        true
    }

    /// Domains seen to move to new hosts since start (see [`History`]).
    pub fn moves(&self) -> u64 {
        self.moves
    }

    /// Listed domains seen re-pointed by their holder since start ([`REPOINTED_WITHIN_DAYS`]).
    pub fn repoints(&self) -> u64 {
        self.repoints
    }

    /// Domains remembered.
    pub fn domains(&self) -> usize {
        self.domains.len()
    }

    /// Keys held.
    pub fn keys(&self) -> usize {
        self.keys.len()
    }

    /// The domain was taught (whatever its keys): no need to resolve it again to learn.
    pub fn knows(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// Whether `domain` was taught with at least one key: only then can any gateway's index
    /// judge it (its keys come from its own MX hosts, the same on every gateway).
    pub fn has_keys(&self, domain: &str) -> bool {
        self.domains.get(domain).is_some_and(|e| !e.keys.is_empty())
    }

    /// Whether `domain` stands as [`Standing::Inferred`].
    pub fn is_inferred(&self, domain: &str) -> bool {
        self.domains.get(domain).is_some_and(|e| e.inferred)
    }

    /// Whether something vouches for `domain`, as last taught.
    pub fn is_vouched(&self, domain: &str) -> bool {
        self.domains.get(domain).is_some_and(|e| e.vouched)
    }

    /// Records how the gateway answered the unlisted `domain`: disposable from its neighbours
    /// (`inferred`: it counts neither way) or not (it counts as what vouches for it says:
    /// `vouched`, `None` keeping the last word). Whether anything changed (a listed or unknown
    /// domain is left as it is).
    pub fn judged(&mut self, domain: &str, inferred: bool, vouched: Option<bool>) -> bool {
        let Some(entry) = self.domains.get(domain) else {
            return false;
        };
        let vouched = vouched.unwrap_or(entry.vouched);
        if entry.standing.is_listed() || (entry.inferred, entry.vouched) == (inferred, vouched) {
            return false;
        }
        self.restand(domain, |e| {
            e.standing = Standing::unlisted(inferred, vouched);
            e.vouched = vouched;
            e.inferred = inferred;
        });
        true
    }

    /// `project`'s traffic asked for the listed `domain` again: it joins its teachers. Whether
    /// anything changed (an unknown domain, a known teacher, or a full set of teachers: no).
    pub fn add_teacher(&mut self, domain: &str, project: ProjectId) -> bool {
        let Some(entry) = self.domains.get(domain) else {
            return false;
        };
        let mut teachers = entry.teachers;
        if !entry.standing.is_listed() || !teachers.add(project) {
            return false;
        }
        self.restand(domain, |e| e.teachers = teachers);
        true
    }

    /// Withdraws `domain`'s contribution, changes its entry, counts it again.
    fn restand(&mut self, domain: &str, change: impl FnOnce(&mut DomainEntry)) {
        let Some(mut entry) = self.domains.remove(domain) else {
            return;
        };
        self.withdraw(domain, &entry);
        change(&mut entry);
        self.contribute(domain, &entry);
        self.domains.insert(domain.into(), entry);
    }

    /// `domain` as the state file keeps it, if it is known.
    pub fn learned_of(&self, domain: &str) -> Option<Learned> {
        self.domains.get(domain).map(|e| learned(domain, e))
    }

    fn source_id(&mut self, source: &str) -> u16 {
        if let Some(i) = self.sources.iter().position(|s| &**s == source) {
            return i as u16;
        }
        // Sources are the configured lists: a handful. Past u16, fold into the last one.
        if self.sources.len() >= usize::from(u16::MAX) {
            return u16::MAX - 1;
        }
        self.sources.push(source.into());
        (self.sources.len() - 1) as u16
    }

    /// Learns that `domain` (a registrable domain) has `keys` (from [`keys_of`]); `listed`
    /// names the blocklist source when a list names it; `how` says how it was answered,
    /// whether its owner vouches for it and who taught it (merged with who taught it before).
    /// Seen on `day` (days since the epoch). Past the bound, the owner evicts (off the lock's
    /// long holds: see [`excess`](Self::excess)); only an index a tenth over it evicts here,
    /// and returns what it forgot.
    pub fn teach(
        &mut self,
        domain: &str,
        keys: &[Box<str>],
        listed: Option<&str>,
        how: Teach,
        day: u32,
    ) -> Vec<Box<str>> {
        let listed = listed.map(|s| self.source_id(s));
        let old = self.domains.remove(domain);
        if let Some(old) = &old {
            self.withdraw(domain, old);
        }
        let inferred = how.inferred || old.as_ref().is_some_and(|o| o.inferred);
        let vouched = how
            .vouched
            .unwrap_or_else(|| old.as_ref().is_some_and(|o| o.vouched));
        let mut teachers = old.as_ref().map_or_else(Teachers::default, |o| o.teachers);
        teachers.merge(how.teachers);
        // A domain with no key (its mail at a shared service) is remembered too, so that it
        // is not resolved again and again to learn nothing. Keys under its own name (from a
        // state file, a snapshot or another gateway older than that rule) are dropped.
        let keys: Vec<&Box<str>> = keys
            .iter()
            .filter(|k| match KeyKind::split(k) {
                Some((KeyKind::Host | KeyKind::Parent, value)) => !is_own(value, domain),
                _ => true,
            })
            .collect();
        // A listed domain seen on fewer of its hosts (one whose addresses did not answer this
        // time) keeps them all: the host coming back is not a move.
        let keys: Box<[Arc<str>]> = match &old {
            Some(o)
                if listed.is_some()
                    && !how.restore
                    && !keys.is_empty()
                    && !moved_to(&o.keys, &keys)
                    && moved_to(&keys, &o.keys) =>
            {
                o.keys.clone()
            }
            _ => keys.iter().map(|k| self.intern(k)).collect(),
        };
        let history = self.history_of(old.as_ref(), &keys, listed.is_some(), how, day);
        if !how.restore && history.moved && old.as_ref().is_some_and(|o| moved_to(&o.keys, &keys)) {
            self.moves += u64::from(listed.is_some());
        }
        if history.repointed && old.as_ref().is_some_and(|o| !o.history.repointed) {
            self.repoints += 1;
        }
        // Only a listed name's move is weighed by it (unlisted domains' lines stay as they were).
        let live =
            listed.and_then(|_| live_after(old.as_ref().and_then(|o| o.live), &keys, how, day));
        let unheld = history.moved && day < history.since.saturating_add(self.rule.hold_days);
        let entry = DomainEntry {
            standing: listed
                .map_or_else(|| Standing::unlisted(inferred, vouched), Standing::Listed),
            keys,
            seen: old.map_or(day, |o| o.seen.max(day)),
            teachers,
            vouched,
            inferred,
            history,
            unheld,
            live,
        };
        self.contribute(domain, &entry);
        self.domains.insert(domain.into(), entry);
        if self.domains.len() > self.max_entries + self.max_entries / 10 {
            return self.evict();
        }
        Vec::new()
    }

    /// What `domain`'s history is once taught `keys` on `day` as `how` says, after `old`:
    /// [`History::after`], then what the index knows of the hosts (an established domain
    /// receives mail there) and of the name (it answered on its first hosts lately).
    fn history_of(
        &self,
        old: Option<&DomainEntry>,
        keys: &[Arc<str>],
        listed: bool,
        how: Teach,
        day: u32,
    ) -> History {
        let mut history = History::after(old.map(|o| (&*o.keys, o.history)), keys, how, day);
        let established_here =
            |k: &Arc<str>| is_host(k) && self.keys.get(k).is_some_and(|c| c.vouched > 0);
        // A listed name first seen (by anyone: no history came with it) on a host where domains
        // the registry shows established already receive mail is weighed as one that moved
        // there: it arrived after them, or nothing says it did not.
        // The operator's snapshot is the operator's word, not an arrival.
        let first_sight = old.is_none() && how.history.is_none() && !how.restore;
        if listed && first_sight && !how.teachers.is_global() {
            history.moved = keys.iter().any(established_here);
        }
        // Re-pointed by its holder: on its first hosts (it never moved) and answering there
        // lately, now on new ones where no established domain receives mail. Its hosts are
        // its holder's choice as they were: counted at once, first seen there today.
        let repointed = listed
            && !how.restore
            && history.moved
            && old.is_some_and(|o| {
                !o.history.moved
                    && !o.history.repointed
                    && o.keys.iter().any(|k| is_host(k))
                    && moved_to(&o.keys, keys)
                    && o.live
                        .is_some_and(|l| day <= l.saturating_add(REPOINTED_WITHIN_DAYS))
            })
            && !keys.iter().any(established_here);
        if repointed {
            history = History {
                repointed: true,
                // Its holder is the one the gateway watched on its earlier hosts.
                watched: old.map_or(day, |o| o.history.watched),
                ..History::new(day, false)
            };
        }
        history
    }

    fn intern(&mut self, key: &str) -> Arc<str> {
        if let Some((k, _)) = self.keys.get_key_value(key) {
            return k.clone();
        }
        let k: Arc<str> = key.into();
        self.keys.insert(k.clone(), Counts::default());
        if let Some((kind, _)) = KeyKind::split(key) {
            self.kinds[kind as usize] += 1;
        }
        k
    }

    /// Counts `entry` in each of its keys; a key its own withdrawal emptied (and removed) a
    /// moment before is made again, so that a domain alone on its key keeps counting when it
    /// is re-stood (a teacher added, its standing changed).
    fn contribute(&mut self, domain: &str, entry: &DomainEntry) {
        self.count_own(entry, true);
        for k in entry.keys.iter() {
            if !self.keys.contains_key(k) {
                self.keys.insert(k.clone(), Counts::default());
                if let Some((kind, _)) = KeyKind::split(k) {
                    self.kinds[kind as usize] += 1;
                }
            }
            if let Some(c) = self.keys.get_mut(k) {
                c.count(k, (domain, entry), true, self.rule.hold_days);
            }
        }
    }

    fn withdraw(&mut self, domain: &str, entry: &DomainEntry) {
        self.count_own(entry, false);
        for k in entry.keys.iter() {
            if let Some(c) = self.keys.get_mut(k) {
                c.count(k, (domain, entry), false, self.rule.hold_days);
                if c.is_empty() {
                    self.keys.remove(k);
                    if let Some((kind, _)) = KeyKind::split(k) {
                        self.kinds[kind as usize] -= 1;
                    }
                }
            }
        }
    }

    /// Counts (`up`) or withdraws the projects whose own lookups `entry` counts for.
    fn count_own(&mut self, entry: &DomainEntry, up: bool) {
        if !entry.standing.is_listed() || entry.keys.is_empty() {
            return;
        }
        if let Support::Own(projects) = entry.counted_teachers().support() {
            for p in projects {
                match self.own.get_mut(p) {
                    Some(n) if up => *n += 1,
                    Some(n) if *n > 1 => *n -= 1,
                    Some(_) => {
                        self.own.remove(p);
                    }
                    None if up => {
                        self.own.insert(*p, 1);
                    }
                    None => {}
                }
            }
        }
    }

    /// Whether `project`'s own lookups taught any listed domain the index counts (else its
    /// view is everyone's).
    pub fn has_own(&self, project: ProjectId) -> bool {
        self.own.contains_key(&project)
    }

    /// The key among `keys` that judges `project`'s answer (most listed neighbours first, then
    /// host before parent before network), leaving `own` out of the counts.
    fn dominant<'k>(
        &self,
        keys: &'k [Arc<str>],
        project: Option<ProjectId>,
        own: Option<Standing>,
        here_since: Option<u32>,
    ) -> Option<(&'k Arc<str>, &Counts, KeyKind, View)> {
        let mut best: Option<(&Arc<str>, &Counts, KeyKind, View)> = None;
        for k in keys {
            let (Some(c), Some((kind, _))) = (self.keys.get(k), KeyKind::split(k)) else {
                continue;
            };
            let view = c.view(project, own, here_since);
            if view.judges(&self.rule, kind)
                && best.is_none_or(|(_, _, _, b)| view.listed > b.listed)
            {
                best = Some((k, c, kind, view));
            }
        }
        best
    }

    /// A few of the listed domains counted on `finding`'s key (up to 16, as they come and go),
    /// by name.
    pub fn listed_sample(&self, finding: &Finding) -> Vec<Box<str>> {
        let key = format!("{}:{}", finding.key_kind.as_str(), finding.key);
        self.keys
            .get(key.as_str())
            .map_or_else(Vec::new, |c| c.sample.clone())
    }

    /// [`listed_sample`](Self::listed_sample) with the day the gateway first saw each name on
    /// its current hosts (`None`: no longer known): how long it has watched a name no registry
    /// dates hold the key.
    pub fn listed_watched(&self, finding: &Finding) -> Vec<(Box<str>, Option<u32>)> {
        (self.listed_sample(finding).into_iter())
            .map(|name| {
                let since = self.domains.get(&*name).map(|e| e.history.watched);
                (name, since)
            })
            .collect()
    }

    /// Whether `key` (`kind:value`) has a listed neighbour: the only keys that can judge.
    pub fn has_listed(&self, key: &str) -> bool {
        self.keys.get(key).is_some_and(|c| c.listed() > 0)
    }

    /// Whether any key of `domain` has a listed neighbour (its own evidence may then matter).
    pub fn near_listed(&self, domain: &str) -> bool {
        self.domains
            .get(domain)
            .is_some_and(|e| e.keys.iter().any(|k| self.has_listed(k)))
    }

    /// What the index says of `domain` (a registrable domain) for `project`'s answer: the key
    /// that judges it, if one does. `None` for a listed domain (the lists have spoken) or one
    /// never taught.
    pub fn finding(&self, domain: &str, project: ProjectId) -> Option<Finding> {
        self.finding_for(domain, Some(project))
    }

    /// [`finding`](Self::finding) for `project`, or (`None`) for a project with no teaching
    /// of its own: what every project's answer is judged on.
    pub fn finding_for(&self, domain: &str, project: Option<ProjectId>) -> Option<Finding> {
        let entry = self.domains.get(domain)?;
        if entry.standing.is_listed() {
            return None;
        }
        let own = Some(entry.standing);
        let here_since = Some(entry.history.since);
        let (key, counts, kind, view) = self.dominant(&entry.keys, project, own, here_since)?;
        let (_, value) = KeyKind::split(key)?;
        Some(Finding {
            key_kind: kind,
            key: value.into(),
            listed: view.listed,
            unlisted: view.vouched + view.other,
            vouched: view.vouched,
            throwaway_hosts: view.hosts,
            share: f64::from(view.listed) / f64::from((view.listed + view.vouched).max(1)),
            grounds: view.grounds(&self.rule, kind),
            own_lookups: view.needs_own(&self.rule, kind),
            sources: self.source_counts(counts),
            since: None,
            aged_listed: 0,
            holds_pending: false,
        })
    }

    /// Whether a verdict reached earlier (`finding`, for `project`) still stands: its key still
    /// has at least `min_listed` listed neighbours and a share within [`HOLD_MARGIN`] of
    /// `min_share`. The margin keeps a verdict from flipping as neighbours trickle in around
    /// the threshold; evidence well against it (legitimate tenants seen after a cold start)
    /// drops it.
    pub fn holds(&self, domain: &str, finding: &Finding, project: Option<ProjectId>) -> bool {
        let Some(entry) = self.domains.get(domain) else {
            return false;
        };
        if entry.standing.is_listed() {
            return false;
        }
        let key = format!("{}:{}", finding.key_kind.as_str(), finding.key);
        if !entry.keys.iter().any(|k| **k == *key) {
            return false;
        }
        let Some(counts) = self.keys.get(key.as_str()) else {
            return false;
        };
        let view = counts.view(project, Some(entry.standing), Some(entry.history.since));
        let relaxed = NeighbourhoodRule {
            min_share: (self.rule.min_share - HOLD_MARGIN).max(0.5),
            ..self.rule
        };
        view.judges(&relaxed, finding.key_kind)
    }

    fn source_counts(&self, counts: &Counts) -> Vec<SourceCount> {
        let mut out: Vec<SourceCount> = counts
            .sources
            .iter()
            .map(|(id, n)| SourceCount {
                source: self
                    .sources
                    .get(usize::from(*id))
                    .cloned()
                    .unwrap_or_default(),
                neighbours: *n,
            })
            .collect();
        out.sort_by(|a, b| {
            b.neighbours
                .cmp(&a.neighbours)
                .then(a.source.cmp(&b.source))
        });
        out
    }

    /// The `limit` keys with the most listed neighbours.
    pub fn top(&self, limit: usize) -> Vec<KeyReport> {
        let mut ranked: Vec<(&Arc<str>, &Counts)> =
            self.keys.iter().filter(|(_, c)| c.listed() > 0).collect();
        ranked.sort_by(|a, b| b.1.listed().cmp(&a.1.listed()).then(a.0.cmp(b.0)));
        ranked
            .into_iter()
            .take(limit)
            .filter_map(|(k, c)| {
                let (kind, value) = KeyKind::split(k)?;
                // As a verdict on one of its tenants would see it (that tenant left out), for
                // a project with no lookups of its own, by the verdict's test (a tenant new
                // here: every arrival before it counts).
                let own = (c.other > 0).then_some(Standing::Unknown);
                let view = c.view(None, own, None);
                Some(KeyReport {
                    key_kind: kind,
                    key: value.into(),
                    listed: c.listed(),
                    from_lists: view.lists,
                    unlisted: c.vouched + c.other,
                    vouched: c.vouched,
                    throwaway_hosts: view.hosts,
                    judges: view.judges(&self.rule, kind),
                    sources: self.source_counts(c),
                })
            })
            .collect()
    }

    /// Forgets domains not seen for more than `max_age_days` before `today`; what it forgot.
    pub fn expire(&mut self, today: u32, max_age_days: u32) -> Vec<Box<str>> {
        let old: Vec<Box<str>> = self
            .domains
            .iter()
            .filter(|(_, e)| today.saturating_sub(e.seen) > max_age_days)
            .map(|(d, _)| d.clone())
            .collect();
        for d in &old {
            if let Some(e) = self.domains.remove(d) {
                self.withdraw(d, &e);
            }
        }
        old
    }

    /// How much a domain teaches: listed ones most, then unlisted ones on a key with listed
    /// neighbours (they may be what keeps a shared host from judging), then the rest.
    fn usefulness(&self, e: &DomainEntry) -> u8 {
        match e.standing {
            Standing::Listed(_) => 2,
            _ if e.keys.iter().any(|k| self.has_listed(k)) => 1,
            _ => 0,
        }
    }

    /// Down to nine tenths of `max_entries`, the least useful and then the oldest first (so an
    /// eviction runs once per tenth of the bound, not on every new domain); what it forgot.
    fn evict(&mut self) -> Vec<Box<str>> {
        let target = self.max_entries - self.max_entries / 10;
        let excess = self.domains.len().saturating_sub(target);
        if excess == 0 {
            return Vec::new();
        }
        let mut ranked: Vec<(u8, u32, Box<str>)> = self
            .domains
            .iter()
            .map(|(d, e)| (self.usefulness(e), e.seen, d.clone()))
            .collect();
        ranked.select_nth_unstable(excess - 1);
        ranked.truncate(excess);
        for (_, _, d) in &ranked {
            if let Some(e) = self.domains.remove(d) {
                self.withdraw(d, &e);
            }
        }
        ranked.into_iter().map(|(_, _, d)| d).collect()
    }

    /// Every learned domain (for the state file), listed ones first so that loading teaches
    /// them before the unlisted ones they judge.
    pub fn learned(&self) -> Vec<Learned> {
        let mut out = self.learned_unsorted();
        out.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.domain.cmp(&b.1.domain)));
        out.into_iter().map(|(_, l)| l).collect()
    }

    /// Every learned domain with whether a list names it, in no order (one pass, no sort: for
    /// a caller that sorts off the lock).
    pub fn learned_unsorted(&self) -> Vec<(bool, Learned)> {
        self.domains
            .iter()
            .map(|(d, e)| (e.standing.is_listed(), learned(d, e)))
            .collect()
    }

    /// Keys by kind (for metrics).
    pub fn keys_by_kind(&self) -> [(KeyKind, usize); 3] {
        let n = self.kinds;
        [
            (KeyKind::Host, n[0]),
            (KeyKind::Parent, n[1]),
            (KeyKind::Network, n[2]),
        ]
    }
}

/// `e` (of `domain`) as the state file keeps it.
fn learned(domain: &str, e: &DomainEntry) -> Learned {
    Learned {
        domain: domain.into(),
        keys: e.keys.iter().map(|k| (**k).into()).collect(),
        seen: e.seen,
        inferred: e.inferred,
        vouched: e.vouched,
        global: e.teachers.is_global(),
        looked: e.teachers.is_looked(),
        since: e.history.moved.then_some(e.history.since),
        first: (!e.history.moved).then_some(e.history.since),
        live: e.live,
        repointed: e.history.repointed,
        watched: (!e.history.moved && e.history.watched != e.history.since)
            .then_some(e.history.watched),
        taught_by: e.teachers.projects().to_vec(),
        trusted_by: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_ids_are_64_bits_and_a_32_bit_ids_state_teaches_nobody() {
        // These two share their 32-bit FNV-1a id (0x78cc99a2): one teacher, before.
        assert_ne!(project_id("project-123773"), project_id("project-1040280"));
        // A state line of an earlier release (32-bit ids) keeps its hosts, not its teachers.
        let old = r#"{"domain":"x.example","keys":["host:mx.x.example"],"seen":1,"trusted_by":[2026011234],"taught_by":[7]}"#;
        let l: Learned = serde_json::from_str(old).unwrap();
        assert!(l.trusted_by.is_empty() && l.taught_by.is_empty());
        assert_eq!(l.keys.len(), 1);
        // A line of the release that trusted projects: its trusted teachers teach their own
        // answers now, like every project, and are written back as such.
        let (a, b) = (project_id("a"), project_id("b"));
        let trusted = format!(
            r#"{{"domain":"x.example","keys":["host:mx.x.example"],"seen":1,"trusted_ids":[{a}],"untrusted_ids":[{b}]}}"#
        );
        let l: Learned = serde_json::from_str(&trusted).unwrap();
        assert_eq!(l.teach().teachers, Teachers::of((false, false), &[a, b]));
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        ix.teach(
            &l.domain,
            &keys(&["host:mx.x.example"]),
            Some("s"),
            l.teach(),
            1,
        );
        let text = serde_json::to_string(&ix.learned_of("x.example").unwrap()).unwrap();
        assert!(
            text.contains(&format!(r#""untrusted_ids":[{a},{b}]"#))
                && !text.contains(r#""trusted_ids""#),
            "{text}"
        );
    }

    const RULE: NeighbourhoodRule = NeighbourhoodRule {
        min_listed: 3,
        min_share: 0.8,
        min_hosts: 2,
        hold_days: 30,
    };

    /// The project every test asks for.
    const P: ProjectId = 7;

    /// Taught by the lists' snapshot (listed) or seen in traffic, nobody vouching (unlisted).
    fn teach(ix: &mut NeighbourhoodIndex, d: &str, k: &[Box<str>], listed: Option<&str>, day: u32) {
        let how = Teach {
            teachers: if listed.is_some() {
                Teachers::GLOBAL
            } else {
                Teachers::default()
            },
            ..Teach::default()
        };
        ix.teach(d, k, listed, how, day);
    }

    /// An unlisted domain something vouches for (an established age).
    fn vouched(ix: &mut NeighbourhoodIndex, d: &str, k: &[Box<str>]) {
        let how = Teach {
            vouched: Some(true),
            ..Teach::default()
        };
        ix.teach(d, k, None, how, 1);
    }

    fn keys(list: &[&str]) -> Vec<Box<str>> {
        list.iter().map(|k| (*k).into()).collect()
    }

    fn providers() -> ProviderTable {
        ProviderTable::parse(
            "match,pattern,label,kind\n\
             suffix,google.com,Google Workspace,mailbox\n\
             suffix,improvmx.com,ImprovMX,forwarder\n\
             suffix,mailinator.com,Mailinator,disposable\n",
            "t",
        )
        .unwrap()
    }

    /// How the gateway's own look teaches.
    const LOOK: Teach = Teach {
        inferred: false,
        vouched: None,
        teachers: Teachers::LOOKED,
        history: None,
        restore: false,
        live: None,
        no_mail: false,
    };

    /// Listed names the look saw lapsed (no keys), then on a company's host: they count for
    /// nobody until they have held it `hold_days`; a state file keeps when they moved; one seen
    /// there first counts at once.
    #[test]
    fn a_listed_name_moved_to_a_host_counts_there_once_it_has_held_it() {
        let look = LOOK;
        let host = keys(&["host:mx.smallhost.test"]);
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        for i in 0..3 {
            ix.teach(&format!("l{i}.test"), &[], Some("list"), look, 100);
        }
        teach(&mut ix, "victim.test", &host, None, 100);
        for i in 0..3 {
            ix.teach(&format!("l{i}.test"), &host, Some("list"), look, 101);
        }
        assert_eq!(ix.moves(), 3);
        assert!(ix.finding("victim.test", P).is_none(), "moved a day ago");
        let kept = ix.learned_of("l0.test").unwrap();
        assert_eq!((kept.since, kept.looked), (Some(101), true));
        let line = serde_json::to_string(&kept).unwrap();
        assert!(
            line.contains("\"since\":101") && line.contains("\"looked\":true"),
            "{line}"
        );
        assert_eq!(serde_json::from_str::<Learned>(&line).unwrap(), kept);
        // A restart keeps when they moved.
        let mut again = NeighbourhoodIndex::new(RULE, 1000);
        for l in ["l0.test", "l1.test", "l2.test"].map(|d| ix.learned_of(d).unwrap()) {
            again.teach(&l.domain, &l.keys, Some("list"), l.teach(), l.seen);
        }
        again.teach("victim.test", &host, None, Teach::default(), 101);
        assert!(
            again.finding("victim.test", P).is_none(),
            "still moved a day ago"
        );
        // Seen on the same host 30 days after the move: they count.
        for i in 0..3 {
            ix.teach(&format!("l{i}.test"), &host, Some("list"), look, 131);
        }
        assert_eq!(ix.moves(), 3, "the same hosts are no move");
        teach(&mut ix, "newcomer.test", &host, None, 131);
        assert!(ix.finding("newcomer.test", P).is_some(), "held 30 days");
        // The victim received mail there before they arrived: never judged by them.
        assert!(ix.finding("victim.test", P).is_none(), "there first");
        // Never seen before: counts at once.
        let mut fresh = NeighbourhoodIndex::new(RULE, 1000);
        teach(&mut fresh, "victim.test", &host, None, 100);
        for i in 0..3 {
            fresh.teach(&format!("l{i}.test"), &host, Some("list"), look, 100);
        }
        assert!(fresh.finding("victim.test", P).is_some());
    }

    /// `ix`'s lines taught on `day` to a new index, as a restart and as another gateway would
    /// (the `*co.test` names unlisted): `judged` is judged there, `spared` not.
    fn same_when_replayed(ix: &NeighbourhoodIndex, day: u32, judged: &str, spared: &str) {
        let lines = ix.learned();
        for restore in [true, false] {
            let mut again = NeighbourhoodIndex::new(RULE, 1000);
            for l in &lines {
                let how = if restore { l.restore() } else { l.teach() };
                let source = (!l.domain.ends_with("co.test")).then_some("list");
                again.teach(&l.domain, &l.keys, source, how, day);
            }
            assert!(again.finding(judged, P).is_some(), "{judged}, {restore}");
            assert!(again.finding(spared, P).is_none(), "{spared}, {restore}");
        }
    }

    /// Who arrived first (issue 94): listed names the gateway saw arrive on a host judge a
    /// domain it saw there before them never, however long they hold; a domain first seen
    /// after them, as they count; names that were there first count for both. A restart and
    /// another gateway keep when the domain was first seen there.
    #[test]
    fn listed_names_that_arrived_after_a_domain_never_judge_it() {
        let host = keys(&["host:mx.smallhost.test"]);
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        // Two listed names first seen on the host (no move: there from the gateway's start).
        for i in 0..2 {
            ix.teach(&format!("old{i}.test"), &host, Some("list"), LOOK, 100);
        }
        // Three lapsed names, seen with no mail.
        for i in 0..3 {
            ix.teach(&format!("new{i}.test"), &[], Some("list"), LOOK, 100);
        }
        teach(&mut ix, "company-co.test", &host, None, 110);
        // Re-registered onto the host on day 120, held 200 days.
        for day in [120, 320] {
            for i in 0..3 {
                ix.teach(&format!("new{i}.test"), &host, Some("list"), LOOK, day);
            }
        }
        teach(&mut ix, "late-co.test", &host, None, 320);
        let f = ix
            .finding("late-co.test", P)
            .expect("five listed neighbours");
        assert_eq!(f.listed, 5);
        assert!(
            ix.finding("company-co.test", P).is_none(),
            "two were there first, three arrived after it"
        );
        assert!(ix.finding_for("company-co.test", None).is_none());
        let line = ix.learned_of("company-co.test").unwrap();
        assert_eq!((line.first, line.since), (Some(110), None));
        let text = serde_json::to_string(&line).unwrap();
        assert!(text.contains(r#""first":110"#), "{text}");
        // Re-taught today (its MX asked again): still first seen on day 110.
        teach(&mut ix, "company-co.test", &host, None, 330);
        assert!(ix.finding("company-co.test", P).is_none());
        // A restart (the state file's lines) and another gateway (the same lines, shared).
        same_when_replayed(&ix, 330, "late-co.test", "company-co.test");
        // A third name that was there before the company judges it with the first two.
        ix.teach("old2.test", &host, Some("list"), LOOK, 330);
        let f = ix.finding("company-co.test", P).expect("three there first");
        assert_eq!(f.listed, 3);
        // It moves to a new host after the arrivals: a newcomer there like any other.
        let other = keys(&["host:mx.other.test"]);
        for i in 0..3 {
            ix.teach(&format!("o{i}.test"), &other, Some("list"), LOOK, 330);
        }
        teach(&mut ix, "company-co.test", &other, None, 340);
        assert!(ix.finding("company-co.test", P).is_some());
    }

    /// A listed name first seen on a host where an established domain already receives mail
    /// is weighed as one that moved there: the host is a mail home (the registry shows a
    /// domain there established), so it counts for nobody, however long it holds, neither
    /// against the domains seen there before it nor against newcomers. On a host with no
    /// established domain, first sight counts at once.
    #[test]
    fn a_listed_name_first_seen_beside_an_established_domain_arrived_after_it() {
        let host = keys(&["host:mx.regional.test"]);
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        vouched(&mut ix, "old-co.test", &host);
        teach(&mut ix, "young-co.test", &host, None, 1);
        for i in 0..4 {
            ix.teach(&format!("l{i}.test"), &host, Some("list"), LOOK, 100);
        }
        let line = ix.learned_of("l0.test").unwrap();
        assert_eq!((line.since, line.first), (Some(100), None), "moved there");
        teach(&mut ix, "new-co.test", &host, None, 100);
        assert!(ix.finding("new-co.test", P).is_none(), "not held yet");
        for i in 0..4 {
            ix.teach(&format!("l{i}.test"), &host, Some("list"), LOOK, 130);
        }
        teach(&mut ix, "later-co.test", &host, None, 130);
        assert!(ix.finding("young-co.test", P).is_none(), "there first");
        assert!(ix.finding("new-co.test", P).is_none(), "a mail home");
        assert!(ix.finding("later-co.test", P).is_none(), "a mail home");
        assert!(ix.finding_for("later-co.test", None).is_none());
        assert!(!ix.top(10).iter().any(|k| k.judges), "the listing agrees");
        // Another gateway's lines, and a restart: the same.
        let replayed = NeighbourhoodIndex::new(RULE, 1000);
        let mut replayed = replayed;
        for l in ix.learned() {
            let how = l.restore();
            let listed = l.domain.starts_with('l').then_some("list");
            replayed.teach(&l.domain, &l.keys, listed, how, l.seen);
        }
        assert!(replayed.finding("later-co.test", P).is_none());
        // No established domain on the host: the first sight is no move.
        let other = keys(&["host:mx.other.test"]);
        teach(&mut ix, "unknown-co.test", &other, None, 1);
        for i in 0..4 {
            ix.teach(&format!("o{i}.test"), &other, Some("list"), LOOK, 100);
        }
        assert_eq!(ix.learned_of("o0.test").unwrap().first, Some(100));
        teach(&mut ix, "fresh-co.test", &other, None, 100);
        assert!(ix.finding("fresh-co.test", P).is_some());
    }

    /// A host where a customer the registry shows established receives mail is a mail home
    /// from the day the gateway first saw it there: listed names that move there afterwards
    /// count for nobody, whoever is judged, however long they hold. Customers of unknown age
    /// make none, however long they have received mail there (anyone can register such a domain and
    /// have it looked up): the names count once held, against every domain but those seen
    /// before them.
    #[test]
    fn listed_names_that_arrive_at_a_mail_home_count_for_nobody() {
        let host = keys(&["host:mx.smallhost.test"]);
        for (customer_day, established, judged) in [
            (60, true, false),
            (99, true, false),
            (10, false, true),
            (99, false, true),
        ] {
            let mut ix = NeighbourhoodIndex::new(RULE, 1000);
            for i in 0..3 {
                ix.teach(&format!("new{i}.test"), &[], Some("list"), LOOK, 50);
            }
            let how = Teach {
                vouched: Some(established),
                ..Teach::default()
            };
            ix.teach("company-co.test", &host, None, how, customer_day);
            // Re-registered onto the host on day 100, held 200 days.
            for day in [100, 300] {
                for i in 0..3 {
                    ix.teach(&format!("new{i}.test"), &host, Some("list"), LOOK, day);
                }
            }
            teach(&mut ix, "late-co.test", &host, None, 300);
            assert_eq!(
                ix.finding("late-co.test", P).is_some(),
                judged,
                "customer first seen on day {customer_day}, established {established}"
            );
            assert_eq!(ix.finding_for("late-co.test", None).is_some(), judged);
            if customer_day < 100 {
                assert!(ix.finding("company-co.test", P).is_none(), "there first");
            }
        }
    }

    /// A key keeps a few of its listed neighbours by name, as they come and go: those whose
    /// registry ages may show them held long. Names that moved lately (counting for nobody)
    /// are not among them.
    #[test]
    fn a_key_keeps_a_few_listed_names_by_name() {
        let host = keys(&["host:mx.throw.test"]);
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        for i in 0..SAMPLE + 4 {
            ix.teach(&format!("l{i}.test"), &host, Some("list"), LOOK, 100);
        }
        teach(&mut ix, "new.test", &host, None, 100);
        let finding = ix.finding("new.test", P).unwrap();
        let sample = ix.listed_sample(&finding);
        assert_eq!(sample.len(), SAMPLE);
        assert!(sample.iter().all(|d| d.starts_with('l')), "{sample:?}");
        for d in &sample[..3] {
            assert!(ix.forget(d, None));
        }
        let left = ix.listed_sample(&finding);
        assert_eq!(left.len(), SAMPLE - 3);
        assert!(!left.iter().any(|d| sample[..3].contains(d)));
        // Taught again, a name joins; one that moved there lately does not.
        ix.teach("l0.test", &host, Some("list"), LOOK, 101);
        ix.teach("moved.test", &[], Some("list"), LOOK, 100);
        ix.teach("moved.test", &host, Some("list"), LOOK, 101);
        let now = ix.listed_sample(&finding);
        assert!(
            now.iter().any(|d| &**d == "l0.test") || now.len() == SAMPLE,
            "{now:?}"
        );
        assert!(!now.iter().any(|d| &**d == "moved.test"), "{now:?}");
    }

    /// Names the look saw answering on their own host yesterday and on a new one today were
    /// re-pointed by their holder (a lapsed name takes weeks to be registered again): they
    /// count on the new host at once, through a restart. Seen without mail in between, not
    /// seen for longer than [`REPOINTED_WITHIN_DAYS`], or arriving where an established domain
    /// receives mail, they hold as any move does.
    #[test]
    fn names_re_pointed_by_their_holder_count_at_once_on_their_new_host() {
        let look = LOOK;
        let old = keys(&["host:mx.old-service.test"]);
        let names = |tag: &'static str| (0..3).map(move |i| format!("{tag}{i}.test"));
        let noticed = Teach {
            no_mail: true,
            ..LOOK
        };
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        // tw: answering on the old host on day 100, then on day 101 on a new one.
        // lapsed: answering on day 60, seen without mail on day 100 (its keys kept).
        // stale: answering on day 90, not seen again until day 101.
        // home: answering on day 100, then on a host an established domain receives mail on.
        for d in names("tw").chain(names("home")) {
            ix.teach(&d, &old, Some("list"), look, 100);
        }
        // A customer of the new host, seen there before the names arrive.
        let new = keys(&["host:mx.new-service.test"]);
        teach(&mut ix, "customer.test", &new, None, 95);
        for d in names("lapsed") {
            ix.teach(&d, &old, Some("list"), look, 60);
            ix.teach(&d, &old, Some("list"), noticed, 100);
        }
        for d in names("stale") {
            ix.teach(&d, &old, Some("list"), look, 90);
        }
        let home = keys(&["host:mx.regional.test"]);
        let how = Teach {
            vouched: Some(true),
            ..Teach::default()
        };
        ix.teach("old-firm.test", &home, None, how, 50);
        for (tag, host) in [
            ("tw", "host:mx.new-service.test"),
            ("lapsed", "host:mx.lapsed.test"),
            ("stale", "host:mx.stale.test"),
        ] {
            for d in names(tag) {
                ix.teach(&d, &keys(&[host]), Some("list"), look, 101);
            }
        }
        for d in names("home") {
            ix.teach(&d, &home, Some("list"), look, 101);
        }
        assert_eq!(ix.moves(), 9, "the re-pointed names are no move");
        assert_eq!(ix.repoints(), 3);
        let newcomer = |ix: &mut NeighbourhoodIndex, host: &str| {
            teach(ix, "newcomer.test", &keys(&[host]), None, 102);
            ix.finding("newcomer.test", P)
        };
        let f = newcomer(&mut ix, "host:mx.new-service.test").expect("re-pointed: at once");
        assert_eq!(f.listed, 3, "{f:?}");
        assert!(ix.finding("customer.test", P).is_none(), "there first");
        let kept = ix.learned_of("tw0.test").unwrap();
        assert_eq!(
            (kept.first, kept.since, kept.live),
            (Some(101), None, Some(101))
        );
        // Watched since day 100, when its holder's names were first seen on the old host: a
        // name no registry dates has held as long as that (issue 94).
        assert_eq!(kept.watched, Some(100));
        let watched = ix.listed_watched(&f);
        assert!(
            watched
                .iter()
                .all(|(d, day)| d.starts_with("tw") && *day == Some(100)),
            "{watched:?}"
        );
        for host in [
            "host:mx.lapsed.test",
            "host:mx.stale.test",
            "host:mx.regional.test",
        ] {
            assert!(newcomer(&mut ix, host).is_none(), "{host}: holds");
        }
        assert_eq!(ix.learned_of("lapsed0.test").unwrap().since, Some(101));
        // A restart keeps the day each last answered.
        let mut again = NeighbourhoodIndex::new(RULE, 1000);
        for d in names("tw").chain(names("lapsed")) {
            let l = ix.learned_of(&d).unwrap();
            let line: Learned = serde_json::from_str(&serde_json::to_string(&l).unwrap()).unwrap();
            again.teach(
                &line.domain,
                &line.keys,
                Some("list"),
                line.restore(),
                line.seen,
            );
        }
        let f = newcomer(&mut again, "host:mx.new-service.test").expect("kept");
        let watched = again.listed_watched(&f);
        assert!(
            watched.iter().all(|(_, day)| *day == Some(100)),
            "{watched:?}"
        );
        assert!(newcomer(&mut again, "host:mx.lapsed.test").is_none());
        // A name is taken as re-pointed once: moved on again the next day (a parked name sold
        // and pointed at someone's host), it holds.
        for d in names("tw") {
            again.teach(&d, &keys(&["host:mx.victim.test"]), Some("list"), look, 102);
        }
        assert!(newcomer(&mut again, "host:mx.victim.test").is_none());
        assert_eq!(again.learned_of("tw0.test").unwrap().since, Some(102));
    }

    /// What restarts, snapshots and other gateways make of a move: a state line read after a
    /// snapshot keeps its history (the snapshot, made after the move, is no baseline); another
    /// gateway's move is kept even where this index saw the hosts first; fewer hosts is no
    /// move; and a moved name that has held counts as the look's, never as the lists' word.
    #[test]
    fn a_move_survives_snapshots_peers_and_missing_hosts() {
        let look = LOOK;
        let host = keys(&["host:mx.smallhost.test"]);
        let names = ["l0.test", "l1.test", "l2.test"];
        // A state line: moved on day 101.
        let moved = |d: &str| Learned {
            since: Some(101),
            looked: true,
            ..Learned::new(d, host.clone(), 101, Teach::default())
        };
        // Restart: the snapshot (made on 105, after the move) first, then the state file.
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        for d in names {
            let snap = Learned::new(d, host.clone(), 105, Teach::default());
            let snap = Learned {
                global: true,
                ..snap
            };
            ix.teach(d, &snap.keys, Some("list"), snap.restore(), snap.seen);
            let l = moved(d);
            ix.teach(d, &l.keys, Some("list"), l.restore(), l.seen);
        }
        teach(&mut ix, "victim.test", &host, None, 105);
        assert!(ix.finding("victim.test", P).is_none(), "moved on 101");
        // Another gateway's word that they moved, where this one saw them there first.
        let mut peer = NeighbourhoodIndex::new(RULE, 1000);
        for d in names {
            peer.teach(d, &host, Some("list"), look, 104);
            let l = moved(d);
            peer.teach(d, &l.keys, Some("list"), l.teach(), 104);
        }
        teach(&mut peer, "victim.test", &host, None, 104);
        assert!(
            peer.finding("victim.test", P).is_none(),
            "a peer saw them move"
        );
        // Held: they count, as the look's word (an established age outweighs it).
        for d in names {
            ix.teach(d, &host, Some("list"), look, 131);
        }
        let f = ix.finding("victim.test", P).expect("held 30 days");
        assert_eq!(f.grounds, Grounds::Lookups);
        // Fewer hosts (a backup host whose addresses did not answer) is no move.
        let two = keys(&["host:mx.a.test", "host:mx.b.test"]);
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        ix.teach("t.test", &two, Some("list"), look, 100);
        ix.teach("t.test", &two[..1], Some("list"), look, 101);
        ix.teach("t.test", &two, Some("list"), look, 102);
        assert_eq!(ix.moves(), 0);
    }

    #[test]
    fn keys_cover_host_parent_and_networks_but_never_shared_services() {
        let p = providers();
        let h = |host: &str, nets: &[&str]| -> HostNetworks {
            (host.into(), nets.iter().map(|n| n.to_string()).collect())
        };
        let got = keys_of(
            "new.example",
            &[
                h("mx1.throw.io", &["203.0.113.0/24"]),
                h("aspmx.l.google.com", &["198.51.100.0/24"]),
                h("mx1.improvmx.com", &[]),
                h("mail.mailinator.com", &[]),
                h("localhost", &[]),
            ],
            &p,
        );
        assert_eq!(
            got,
            keys(&[
                "host:mx1.throw.io",
                "parent:throw.io",
                "network:203.0.113.0/24",
                "host:mail.mailinator.com",
                "parent:mailinator.com",
            ])
        );
        assert!(keys_of("new.example", &[h("throw.io", &[])], &p) == keys(&["host:throw.io"]));
        // A domain's own hosts, its name as a parent and their networks are no keys of its.
        let own = [
            h("mx.victim.com", &["192.0.2.0/24"]),
            h("ghost1.victim.com", &[]),
            h("victim.com", &[]),
        ];
        assert!(keys_of("victim.com", &own, &p).is_empty());
        assert!(keys_of("www.victim.com", &own, &p).is_empty());
        assert_eq!(
            keys_of("other.com", &own[..1], &p),
            keys(&[
                "host:mx.victim.com",
                "parent:victim.com",
                "network:192.0.2.0/24"
            ])
        );
        assert!(!is_own("notvictim.com", "victim.com"));
    }

    #[test]
    fn networks_are_slash_24_and_slash_48() {
        assert_eq!(network("203.0.113.77".parse().unwrap()), "203.0.113.0/24");
        assert_eq!(
            network("2001:db8:aa:bb::1".parse().unwrap()),
            "2001:db8:aa::/48"
        );
    }

    #[test]
    fn a_key_dominated_by_listed_neighbours_judges_an_unlisted_domain() {
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        let k = keys(&["host:mx.throw.io", "parent:throw.io"]);
        for i in 0..3 {
            teach(&mut ix, &format!("l{i}.com"), &k, Some("list-a"), 1);
        }
        teach(&mut ix, "new.com", &k, None, 1);
        let f = ix.finding("new.com", P).unwrap();
        assert_eq!((f.key_kind, &*f.key), (KeyKind::Host, "mx.throw.io"));
        assert_eq!((f.listed, f.unlisted), (3, 0));
        assert_eq!(f.sources[0].source.as_ref(), "list-a");
        // Listed domains are not judged; unknown ones neither.
        assert_eq!(ix.finding("l0.com", P), None);
        assert_eq!(ix.finding("never.com", P), None);
        // Taught again: counted once.
        for _ in 0..5 {
            teach(&mut ix, "l0.com", &k, Some("list-a"), 2);
        }
        assert_eq!(ix.finding("new.com", P).unwrap().listed, 3);
    }

    #[test]
    fn keys_under_a_domains_own_name_never_count_for_it() {
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        // Planted: listed domains on the victim's host and on made-up hosts under its name.
        let planted = keys(&["host:mx.victim.com", "parent:victim.com"]);
        for i in 0..10 {
            teach(&mut ix, &format!("l{i}.com"), &planted, Some("s"), 1);
        }
        // Taught with those keys anyway (a state file from before the rule): they are dropped.
        teach(&mut ix, "victim.com", &planted, None, 1);
        assert_eq!(ix.finding("victim.com", P), None);
        let sister = keys(&["host:mx.victim.com"]);
        teach(&mut ix, "sister.com", &sister, None, 1);
        assert!(
            ix.finding("sister.com", P).is_some(),
            "another domain on it is a tenant"
        );
    }

    /// What flagging a tenant of an unrecognised shared host costs at the shipped rule: listed
    /// domains (each a throwaway domain on a list whose MX the attacker sets: a lapsed one,
    /// re-registered) pointed at the host, per legitimate tenant already seen there. Tenants
    /// nobody vouches for (no established age known) dilute nothing: `min_listed` flags them all.
    #[test]
    fn the_cost_of_flagging_a_shared_hosts_tenants() {
        let shipped = NeighbourhoodRule {
            min_listed: 5,
            min_share: 0.8,
            min_hosts: 3,
            hold_days: 30,
        };
        let cost = |tenants: u32, vouch: bool| -> u32 {
            let mut ix = NeighbourhoodIndex::new(shipped, 100_000);
            let k = keys(&["host:mx.smallhost.net"]);
            for t in 0..tenants {
                let how = Teach {
                    vouched: Some(vouch),
                    ..Teach::default()
                };
                ix.teach(&format!("tenant{t}.com"), &k, None, how, 1);
            }
            (1..10_000)
                .find(|&planted| {
                    teach(&mut ix, &format!("planted{planted}.com"), &k, Some("s"), 1);
                    ix.finding("tenant0.com", P).is_some()
                })
                .unwrap()
        };
        // 4 per other vouched tenant seen, at least `min_listed`.
        assert_eq!(
            [1, 2, 10, 30].map(|n| cost(n, true)),
            [5, 5, 36, 116],
            "docs/mx.md states these"
        );
        assert_eq!([1, 30].map(|n| cost(n, false)), [5, 5]);
    }

    #[test]
    fn vouched_neighbours_weaken_a_key_and_unknown_ones_do_not() {
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        let k = keys(&["host:mx.throw.io"]);
        for i in 0..8 {
            teach(&mut ix, &format!("l{i}.com"), &k, Some("s"), 1);
        }
        // Unlisted domains nobody vouches for: each judged, however many.
        for i in 0..30 {
            teach(&mut ix, &format!("u{i}.com"), &k, None, 1);
        }
        let f = ix.finding("u0.com", P).unwrap();
        assert_eq!((f.listed, f.unlisted, f.vouched), (8, 29, 0));
        // Vouched ones dilute: 8 / (8 + 2) is 0.8, 8 / (8 + 3) is not.
        vouched(&mut ix, "v0.com", &k);
        vouched(&mut ix, "v1.com", &k);
        assert!(ix.finding("u0.com", P).is_some());
        assert!(ix.finding("v0.com", P).is_some(), "itself left out");
        vouched(&mut ix, "v2.com", &k);
        assert!(ix.finding("u0.com", P).is_none());
        // A vouched one counts against its key even once the key judged it (a cold start on a
        // shared host ends with its established tenants); an inferred one nobody vouches for
        // counts neither way.
        assert!(ix.judged("v2.com", true, None));
        assert!(ix.finding("u0.com", P).is_none());
        assert!(ix.is_vouched("v2.com") && ix.is_inferred("v2.com"));
        assert!(ix.judged("v2.com", true, Some(false)));
        assert!(ix.finding("u0.com", P).is_some());
        // A shared host: a few listed tenants among many vouched ones judges nobody.
        let shared = keys(&["host:mx.shared.example"]);
        for i in 0..20 {
            vouched(&mut ix, &format!("co{i}.com"), &shared);
        }
        for i in 0..6 {
            teach(&mut ix, &format!("t{i}.com"), &shared, Some("s"), 1);
        }
        teach(&mut ix, "company.com", &shared, None, 1);
        assert_eq!(ix.finding("company.com", P), None);
        let top = ix.top(10);
        assert_eq!(&*top[0].key, "mx.throw.io");
        assert!(top[0].judges && !top[1].judges, "{top:?}");
    }

    /// Teaches `n` listed domains (named `tag0...`) on `k`, each by the one project `p`.
    fn taught_by(ix: &mut NeighbourhoodIndex, (tag, n): (&str, u32), k: &[Box<str>], p: ProjectId) {
        for i in 0..n {
            let how = Teach {
                teachers: Teachers::project(p),
                ..Teach::default()
            };
            ix.teach(&format!("{tag}{i}.com"), k, Some("s"), how, 1);
        }
    }

    #[test]
    fn projects_judge_only_their_own_answers_however_many() {
        let rule = NeighbourhoodRule {
            min_listed: 5,
            ..RULE
        };
        let mut ix = NeighbourhoodIndex::new(rule, 1000);
        let k = keys(&["host:mx.small.example"]);
        teach(&mut ix, "victim.com", &k, None, 1);
        // Ten self-serve accounts plant 20 each on a small host, and all ask for the same
        // planted names too: each one's own answers are judged (on its own word), no one
        // else's, and nothing they do together counts for another project.
        let attackers: Vec<ProjectId> = (0..10).map(|i| project_id(&format!("a{i}"))).collect();
        for (i, a) in attackers.iter().enumerate() {
            taught_by(&mut ix, (&format!("planted{i}-"), 20), &k, *a);
        }
        for a in &attackers {
            for i in 0..10 {
                ix.add_teacher(&format!("planted0-{i}.com"), *a);
            }
        }
        // The first three teachers of a name are remembered (enough to tell one from several).
        let f = ix.finding("victim.com", attackers[1]).unwrap();
        assert!(
            f.grounds == Grounds::Lookups && f.listed == 20 + 10,
            "{f:?}"
        );
        assert_eq!(ix.finding("victim.com", attackers[3]).unwrap().listed, 20);
        assert_eq!(ix.finding("victim.com", P), None);
        assert_eq!(ix.learned_of("planted0-0.com").unwrap().taught_by.len(), 3);
    }

    /// A listed domain alone on its key, re-stood (a second project asks for it, so a teacher
    /// is added): its withdrawal empties the key for a moment, and it must count again after
    /// (before, the emptied key was dropped and the domain counted nowhere: a flaky 4 of 5).
    #[test]
    fn a_domain_alone_on_its_key_still_counts_once_re_stood() {
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        let k = keys(&["host:mx.small.example"]);
        let (a, b) = (project_id("a"), project_id("b"));
        taught_by(&mut ix, ("first", 1), &k, a);
        assert!(ix.add_teacher("first0.com", b));
        taught_by(&mut ix, ("more", 2), &k, a);
        teach(&mut ix, "customer.com", &k, None, 1);
        // 3 listed for A, enough for the rule's min_listed of 3.
        let f = ix.finding("customer.com", a).unwrap();
        assert_eq!(f.listed, 3, "{f:?}");
        assert!(ix.has_listed("host:mx.small.example"));
    }

    #[test]
    fn a_lookup_teaches_its_own_project_and_the_look_every_project() {
        let rule = NeighbourhoodRule {
            min_listed: 5,
            ..RULE
        };
        let mut ix = NeighbourhoodIndex::new(rule, 1000);
        let k = keys(&["host:mx.throw.example"]);
        teach(&mut ix, "new.com", &k, None, 1);
        let (b, c, d) = (project_id("b"), project_id("c"), project_id("d"));
        // Each listed name seen by one project (the long tail of real signups): 2, 2 and 1,
        // each its own word, judging nobody, not even the three together.
        taught_by(&mut ix, ("b", 2), &k, b);
        taught_by(&mut ix, ("c", 2), &k, c);
        taught_by(&mut ix, ("d", 1), &k, d);
        for p in [P, b, c, d] {
            assert_eq!(ix.finding("new.com", p), None);
        }
        assert!(ix.has_own(b) && ix.has_own(d) && !ix.has_own(P));
        // Every project asking for every name: each one's own 5, nobody else's.
        for p in [b, c, d] {
            for name in ["b0", "b1", "c0", "c1", "d0"] {
                ix.add_teacher(&format!("{name}.com"), p);
            }
        }
        let f = ix.finding("new.com", b).unwrap();
        assert!(f.grounds == Grounds::Lookups && f.listed == 5, "{f:?}");
        assert_eq!(ix.finding("new.com", P), None);
        assert!(
            !ix.top(10)[0].judges,
            "judges only its teachers' own answers"
        );
        // A project asking again makes its DNS no truer: nothing changes.
        assert!(!ix.add_teacher("c0.com", b));
        // The gateway's own look at the same names: one fact for every project, counted once
        // with what projects taught, and a finding that an established age outweighs.
        for name in ["b0", "b1", "c0", "c1", "d0"] {
            let how = Teach {
                teachers: Teachers::LOOKED,
                ..Teach::default()
            };
            ix.teach(&format!("{name}.com"), &k, Some("s"), how, 1);
        }
        let f = ix.finding("new.com", P).unwrap();
        assert!(f.grounds == Grounds::Lookups && f.listed == 5, "{f:?}");
        assert_eq!(ix.finding("new.com", b), Some(f.clone()));
        assert!(ix.top(10)[0].judges);
        // Nothing counts as any project's own any more: each asks as every project does.
        assert!(!ix.has_own(b) && !ix.has_own(c) && !ix.has_own(d));
        // Only what the lists' snapshot taught alone rests on the lists.
        let listed = keys(&["host:mx.listed.example"]);
        teach(&mut ix, "unlisted.com", &listed, None, 1);
        for i in 0..5 {
            let how = Teach {
                teachers: Teachers::GLOBAL,
                ..Teach::default()
            };
            ix.teach(&format!("g{i}.com"), &listed, Some("s"), how, 1);
        }
        let f = ix.finding("unlisted.com", P).unwrap();
        assert_eq!((f.grounds, f.listed), (Grounds::Lists, 5));
    }

    #[test]
    fn a_network_counts_only_the_hosts_inside_it() {
        // A throwaway operator's domains name three hosts: one in a VPS provider's /24, two
        // elsewhere. The /24 holds one throwaway host, whatever the others: its tenants stay
        // clear (`min_hosts` 2).
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        let vps = "network:198.51.100.0/24";
        for i in 0..10 {
            let k = keys(&[
                "host:mx1.throw.io",
                "parent:throw.io",
                vps,
                "host:mx2.throw.io",
                "network:192.0.2.0/24",
                "host:mx3.other.example",
                "parent:other.example",
                "network:203.0.113.0/24",
            ]);
            teach(&mut ix, &format!("l{i}.com"), &k, Some("s"), 1);
        }
        let tenant = keys(&["host:mail.tenant.example", vps]);
        teach(&mut ix, "tenant.example", &tenant, None, 1);
        assert_eq!(ix.finding("tenant.example", P), None);
        // The parent `throw.io` holds its two hosts; `other.example`'s host is not inside it.
        let top = ix.top(20);
        let hosts = |key: &str| top.iter().find(|r| &*r.key == key).unwrap().throwaway_hosts;
        assert_eq!(hosts("throw.io"), 2);
        assert_eq!(hosts("198.51.100.0/24"), 1);
        // A second throwaway host inside the /24 and it judges.
        let k = keys(&["host:mx9.throw2.io", vps]);
        teach(&mut ix, "l99.com", &k, Some("s"), 1);
        let f = ix.finding("tenant.example", P).unwrap();
        assert_eq!((f.key_kind, f.throwaway_hosts), (KeyKind::Network, 2));
    }

    #[test]
    fn a_parent_or_network_judges_only_with_several_throwaway_hosts() {
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        let net = "network:203.0.113.0/24";
        // One throwaway host with many listed domains, and a small legitimate host beside it.
        for i in 0..10 {
            teach(
                &mut ix,
                &format!("l{i}.com"),
                &keys(&["host:mx.throw.io", net]),
                Some("s"),
                1,
            );
        }
        teach(
            &mut ix,
            "customer.com",
            &keys(&["host:mail.smallco.example", net]),
            None,
            1,
        );
        assert_eq!(ix.finding("customer.com", P), None);
        // One project plants on two more servers there: its hosts are its own word, left out
        // of every other project's count of hosts as of listed neighbours.
        let a = project_id("a");
        for (i, host) in ["host:srv1.vps.example", "host:srv2.vps.example"]
            .iter()
            .enumerate()
        {
            let how = Teach {
                teachers: Teachers::project(a),
                ..Teach::default()
            };
            ix.teach(
                &format!("planted{i}.com"),
                &keys(&[host, net]),
                Some("s"),
                how,
                1,
            );
        }
        assert_eq!(ix.finding("customer.com", P), None);
        assert_eq!(ix.finding("customer.com", a).unwrap().throwaway_hosts, 3);
        // A second throwaway host the lists taught: two hosts (`min_hosts` 2 here) judge.
        teach(
            &mut ix,
            "l10.com",
            &keys(&["host:mx2.throw2.io", net]),
            Some("s"),
            1,
        );
        let f = ix.finding("customer.com", P).unwrap();
        assert_eq!((f.key_kind, f.throwaway_hosts), (KeyKind::Network, 2));
    }

    #[test]
    fn new_keys_replace_old_ones_and_old_domains_age_out() {
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        let a = keys(&["host:a.io"]);
        teach(&mut ix, "x.com", &a, Some("s"), 1);
        teach(&mut ix, "x.com", &keys(&["host:b.io"]), Some("s"), 2);
        assert_eq!(ix.keys(), 1);
        teach(&mut ix, "y.com", &a, None, 10);
        assert_eq!(ix.expire(12, 5).len(), 1);
        assert!(!ix.knows("x.com") && ix.knows("y.com"));
        assert_eq!(ix.keys(), 1);
        // No keys: known (not resolved again), counted nowhere.
        teach(&mut ix, "y.com", &[], None, 10);
        assert_eq!((ix.domains(), ix.keys()), (1, 0));
        assert!(ix.knows("y.com") && ix.finding("y.com", P).is_none());
    }

    #[test]
    fn the_bound_evicts_the_least_useful_first() {
        let mut ix = NeighbourhoodIndex::new(RULE, 100);
        let k = keys(&["host:mx.throw.io"]);
        for i in 0..10 {
            teach(&mut ix, &format!("l{i}.com"), &k, Some("s"), 1);
        }
        for i in 0..500 {
            teach(
                &mut ix,
                &format!("lone{i}.com"),
                &[format!("host:h{i}.io").into()],
                None,
                2,
            );
        }
        // Left to its owner up to a tenth over the bound; evicted here past that.
        assert!(ix.domains() <= 110, "{}", ix.domains());
        // The listed ones, which teach, stayed.
        assert!((0..10).all(|i| ix.knows(&format!("l{i}.com"))));
        assert!(ix.keys() <= 110);
        assert_eq!(ix.keys_by_kind()[0].1, ix.keys());
        // What the owner evicts: down to nine tenths, least useful first.
        let over = if ix.domains() > 100 {
            ix.domains() - 90
        } else {
            0
        };
        assert_eq!(ix.excess(), over);
        assert_eq!(ix.usefulness_of("l0.com"), Some(2));
        assert_eq!(ix.usefulness_of("lone499.com"), Some(0));
        assert!(ix.forget("lone499.com", Some(2)));
        assert!(!ix.forget("lone499.com", None));
        assert!(!ix.forget("l0.com", Some(0)), "taught after day 0: kept");
    }

    #[test]
    fn learned_lists_listed_domains_first() {
        let mut ix = NeighbourhoodIndex::new(RULE, 100);
        teach(&mut ix, "a.com", &keys(&["host:h.io"]), None, 1);
        teach(&mut ix, "z.com", &keys(&["host:h.io"]), Some("s"), 1);
        let l = ix.learned();
        assert_eq!(
            l.iter().map(|l| &*l.domain).collect::<Vec<_>>(),
            ["z.com", "a.com"]
        );
    }
}
