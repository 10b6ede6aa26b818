//! The MX neighbourhood index (pure): which domains share an MX host, the host's registrable
//! parent or the network of its addresses, and how many of those neighbours the blocklists name.
//!
//! Throwaway-mail operators run thousands of domains on a handful of hosts; lists learn of a new
//! domain months late, but its mail host is usually already known. A key (host, parent or
//! network) whose distinct neighbours are mostly listed judges an unlisted domain on it.
//!
//! Counts are of distinct registrable domains: each domain remembers the keys it was counted
//! under, and a new observation replaces its old contribution, so asking again adds nothing.
//! Only lists teach `listed`: traffic can weaken a key (every unlisted domain seen counts
//! against it, the domain being judged left out) but never strengthen one. A domain the
//! gateway itself answered disposable by inference ([`Standing::Inferred`]) counts neither
//! way: throwaway services mint faster than lists follow, and each new one must not make its
//! own host look more legitimate for the next.

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
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

/// When a key judges: at least `min_listed` distinct listed neighbours, and listed ones at
/// least `min_share` of the listed and unlisted together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NeighbourhoodRule {
    pub min_listed: u32,
    pub min_share: f64,
}

impl NeighbourhoodRule {
    fn dominates(&self, listed: u32, unlisted: u32) -> bool {
        let all = f64::from(listed) + f64::from(unlisted);
        listed >= self.min_listed.max(1) && f64::from(listed) >= self.min_share * all
    }

    /// The one test of whether a key judges a domain whose own standing is `own` (left out of
    /// the counts): used by verdicts and by the admin listing alike, so they cannot disagree.
    fn judges(&self, counts: &Counts, own: Option<Standing>) -> bool {
        let (listed, unlisted) = counts.without(own);
        self.dominates(listed, unlisted)
    }
}

/// How a domain counts in its keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// A blocklist names it (the source's index in the index's source names).
    Listed(u16),
    /// No blocklist names it.
    Unlisted,
    /// No blocklist names it and the gateway answered it disposable from its neighbours: it
    /// neither dilutes nor feeds its keys.
    Inferred,
}

/// The counts of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Counts {
    listed: u32,
    unlisted: u32,
    /// Listed neighbours per source (few sources: a small vector).
    sources: Vec<(u16, u32)>,
}

impl Counts {
    fn add(&mut self, standing: Standing) {
        match standing {
            Standing::Listed(s) => {
                self.listed += 1;
                match self.sources.iter_mut().find(|(id, _)| *id == s) {
                    Some((_, n)) => *n += 1,
                    None => self.sources.push((s, 1)),
                }
            }
            Standing::Unlisted => self.unlisted += 1,
            Standing::Inferred => {}
        }
    }

    fn remove(&mut self, standing: Standing) {
        match standing {
            Standing::Listed(s) => {
                self.listed = self.listed.saturating_sub(1);
                if let Some(i) = self.sources.iter().position(|(id, _)| *id == s) {
                    self.sources[i].1 -= 1;
                    if self.sources[i].1 == 0 {
                        self.sources.swap_remove(i);
                    }
                }
            }
            Standing::Unlisted => self.unlisted = self.unlisted.saturating_sub(1),
            Standing::Inferred => {}
        }
    }

    fn is_empty(&self) -> bool {
        self.listed + self.unlisted == 0
    }

    /// Listed and unlisted neighbours, without `own` (the domain being judged).
    fn without(&self, own: Option<Standing>) -> (u32, u32) {
        match own {
            Some(Standing::Listed(_)) => (self.listed.saturating_sub(1), self.unlisted),
            Some(Standing::Unlisted) => (self.listed, self.unlisted.saturating_sub(1)),
            Some(Standing::Inferred) | None => (self.listed, self.unlisted),
        }
    }
}

#[derive(Debug, Clone)]
struct DomainEntry {
    standing: Standing,
    keys: Box<[Arc<str>]>,
    /// Day (since the epoch) it was last taught.
    seen: u32,
}

/// A key that judges a domain, with its counts (the `evidence` of `rule: mx_neighbourhood`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub key_kind: KeyKind,
    pub key: Box<str>,
    /// Distinct listed neighbours on the key (the domain itself not counted).
    pub listed: u32,
    /// Distinct unlisted neighbours (the domain itself not counted).
    pub unlisted: u32,
    /// `listed / (listed + unlisted)`.
    pub share: f64,
    /// Listed neighbours by the list that names them, most first.
    pub sources: Vec<SourceCount>,
    /// When this verdict was first reached (RFC 3339, UTC): a verdict is kept for a while
    /// (`verdict_hold_seconds`) with the counts it was reached on, so it does not flip back and
    /// forth as the index learns. Set by the service that holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

// `share` is a ratio of counts (never NaN): equality is total.
impl Eq for Finding {}

/// Listed neighbours from one source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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
    pub unlisted: u32,
    /// The key judges unlisted domains under the current rule.
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
}

/// The index (see the module documentation). Not synchronised: the `mx` part holds it behind
/// a lock.
#[derive(Debug)]
pub struct NeighbourhoodIndex {
    keys: HashMap<Arc<str>, Counts>,
    domains: HashMap<Box<str>, DomainEntry>,
    sources: Vec<Box<str>>,
    rule: NeighbourhoodRule,
    max_entries: usize,
    /// Keys by kind (host, parent, network), kept as keys come and go: metrics read them
    /// without a scan of every key under the lock.
    kinds: [usize; 3],
}

impl NeighbourhoodIndex {
    /// An empty index remembering at most `max_entries` domains.
    pub fn new(rule: NeighbourhoodRule, max_entries: usize) -> Self {
        NeighbourhoodIndex {
            keys: HashMap::new(),
            domains: HashMap::new(),
            sources: Vec::new(),
            rule,
            max_entries: max_entries.max(1),
            kinds: [0; 3],
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
            self.withdraw(&e);
        }
        true
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

    /// Whether `domain` stands as [`Standing::Inferred`].
    pub fn is_inferred(&self, domain: &str) -> bool {
        self.domains
            .get(domain)
            .is_some_and(|e| e.standing == Standing::Inferred)
    }

    /// Records that the gateway answered the unlisted `domain` disposable from its neighbours
    /// (`inferred`) or not: its counts move between unlisted and nothing. Whether anything
    /// changed (a listed or unknown domain is left as it is).
    pub fn set_inferred(&mut self, domain: &str, inferred: bool) -> bool {
        let Some(entry) = self.domains.get(domain) else {
            return false;
        };
        let to = match (entry.standing, inferred) {
            (Standing::Unlisted, true) => Standing::Inferred,
            (Standing::Inferred, false) => Standing::Unlisted,
            _ => return false,
        };
        let (from, keys) = (entry.standing, entry.keys.clone());
        for k in keys.iter() {
            if let Some(c) = self.keys.get_mut(k) {
                c.remove(from);
                c.add(to);
            }
        }
        if let Some(e) = self.domains.get_mut(domain) {
            e.standing = to;
        }
        true
    }

    /// `domain` as the state file keeps it, if it is known.
    pub fn learned_of(&self, domain: &str) -> Option<Learned> {
        self.domains.get(domain).map(|e| Learned {
            domain: domain.into(),
            keys: e.keys.iter().map(|k| (**k).into()).collect(),
            seen: e.seen,
            inferred: e.standing == Standing::Inferred,
        })
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
    /// names the blocklist source when a list names it. Seen on `day` (days since the epoch).
    /// Past the bound, the owner evicts (off the lock's long holds: see [`excess`](Self::excess));
    /// only an index a tenth over it evicts here, and returns what it forgot.
    /// `inferred`: the gateway answered it disposable from its neighbours (kept from an
    /// earlier teach of the same unlisted domain too).
    pub fn teach(
        &mut self,
        domain: &str,
        keys: &[Box<str>],
        listed: Option<&str>,
        inferred: bool,
        day: u32,
    ) -> Vec<Box<str>> {
        let listed = listed.map(|s| self.source_id(s));
        let old = self.domains.remove(domain);
        let inferred = inferred
            || old
                .as_ref()
                .is_some_and(|o| o.standing == Standing::Inferred);
        if let Some(old) = &old {
            self.withdraw(old);
        }
        // A domain with no key (its mail at a shared service) is remembered too, so that it
        // is not resolved again and again to learn nothing. Keys under its own name (from a
        // state file, a snapshot or another gateway older than that rule) are dropped.
        let keys: Box<[Arc<str>]> = keys
            .iter()
            .filter(|k| match KeyKind::split(k) {
                Some((KeyKind::Host | KeyKind::Parent, value)) => !is_own(value, domain),
                _ => true,
            })
            .map(|k| self.intern(k))
            .collect();
        let standing = match listed {
            Some(source) => Standing::Listed(source),
            None if inferred => Standing::Inferred,
            None => Standing::Unlisted,
        };
        for k in keys.iter() {
            if let Some(c) = self.keys.get_mut(k) {
                c.add(standing);
            }
        }
        let seen = old.map_or(day, |o| o.seen.max(day));
        self.domains.insert(
            domain.into(),
            DomainEntry {
                standing,
                keys,
                seen,
            },
        );
        if self.domains.len() > self.max_entries + self.max_entries / 10 {
            return self.evict();
        }
        Vec::new()
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

    fn withdraw(&mut self, entry: &DomainEntry) {
        for k in entry.keys.iter() {
            if let Some(c) = self.keys.get_mut(k) {
                c.remove(entry.standing);
                if c.is_empty() {
                    self.keys.remove(k);
                    if let Some((kind, _)) = KeyKind::split(k) {
                        self.kinds[kind as usize] -= 1;
                    }
                }
            }
        }
    }

    /// The key among `keys` that judges (most listed neighbours first, then host before parent
    /// before network), leaving `own` out of the counts.
    fn dominant<'k>(
        &self,
        keys: &'k [Arc<str>],
        own: Option<Standing>,
    ) -> Option<(&'k Arc<str>, &Counts)> {
        let mut best: Option<(&Arc<str>, &Counts, u32)> = None;
        for k in keys {
            let Some(c) = self.keys.get(k) else { continue };
            let (listed, _) = c.without(own);
            if self.rule.judges(c, own) && best.is_none_or(|(_, _, l)| listed > l) {
                best = Some((k, c, listed));
            }
        }
        best.map(|(k, c, _)| (k, c))
    }

    /// Whether `key` (`kind:value`) has a listed neighbour: the only keys that can judge.
    pub fn has_listed(&self, key: &str) -> bool {
        self.keys.get(key).is_some_and(|c| c.listed > 0)
    }

    /// What the index says of `domain` (a registrable domain): the key that judges it, if one
    /// does. `None` for a listed domain (the lists have spoken) or one never taught.
    pub fn finding(&self, domain: &str) -> Option<Finding> {
        let entry = self.domains.get(domain)?;
        if matches!(entry.standing, Standing::Listed(_)) {
            return None;
        }
        let (key, counts) = self.dominant(&entry.keys, Some(entry.standing))?;
        let (listed, unlisted) = counts.without(Some(entry.standing));
        let (kind, value) = KeyKind::split(key)?;
        Some(Finding {
            key_kind: kind,
            key: value.into(),
            listed,
            unlisted,
            share: f64::from(listed) / f64::from((listed + unlisted).max(1)),
            sources: self.source_counts(counts),
            since: None,
        })
    }

    /// Whether a verdict reached earlier (`finding`) still stands: its key still has at least
    /// `min_listed` listed neighbours and a share within [`HOLD_MARGIN`] of `min_share`. The
    /// margin keeps a verdict from flipping as neighbours trickle in around the threshold;
    /// evidence well against it (a shared host's tenants seen after a cold start) drops it.
    pub fn holds(&self, domain: &str, finding: &Finding) -> bool {
        let Some(entry) = self.domains.get(domain) else {
            return false;
        };
        if matches!(entry.standing, Standing::Listed(_)) {
            return false;
        }
        let key = format!("{}:{}", finding.key_kind.as_str(), finding.key);
        if !entry.keys.iter().any(|k| **k == *key) {
            return false;
        }
        let Some(counts) = self.keys.get(key.as_str()) else {
            return false;
        };
        let (listed, unlisted) = counts.without(Some(entry.standing));
        let relaxed = NeighbourhoodRule {
            min_listed: self.rule.min_listed,
            min_share: (self.rule.min_share - HOLD_MARGIN).max(0.5),
        };
        relaxed.dominates(listed, unlisted)
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
            self.keys.iter().filter(|(_, c)| c.listed > 0).collect();
        ranked.sort_by(|a, b| b.1.listed.cmp(&a.1.listed).then(a.0.cmp(b.0)));
        ranked
            .into_iter()
            .take(limit)
            .filter_map(|(k, c)| {
                let (kind, value) = KeyKind::split(k)?;
                Some(KeyReport {
                    key_kind: kind,
                    key: value.into(),
                    listed: c.listed,
                    unlisted: c.unlisted,
                    // As a verdict on one of its unlisted tenants would see it (that tenant
                    // left out), by the verdict's own test.
                    judges: self
                        .rule
                        .judges(c, (c.unlisted > 0).then_some(Standing::Unlisted)),
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
                self.withdraw(&e);
            }
        }
        old
    }

    /// How much a domain teaches: listed ones most, then unlisted ones on a key with listed
    /// neighbours (they may be what keeps a shared host from judging), then the rest.
    fn usefulness(&self, e: &DomainEntry) -> u8 {
        match e.standing {
            Standing::Listed(_) => 2,
            Standing::Unlisted
                if e.keys
                    .iter()
                    .any(|k| self.keys.get(k).is_some_and(|c| c.listed > 0)) =>
            {
                1
            }
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
                self.withdraw(&e);
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
            .map(|(d, e)| {
                (
                    matches!(e.standing, Standing::Listed(_)),
                    Learned {
                        domain: d.clone(),
                        keys: e.keys.iter().map(|k| (**k).into()).collect(),
                        seen: e.seen,
                        inferred: e.standing == Standing::Inferred,
                    },
                )
            })
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

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: NeighbourhoodRule = NeighbourhoodRule {
        min_listed: 3,
        min_share: 0.8,
    };

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
            ix.teach(&format!("l{i}.com"), &k, Some("list-a"), false, 1);
        }
        ix.teach("new.com", &k, None, false, 1);
        let f = ix.finding("new.com").unwrap();
        assert_eq!((f.key_kind, &*f.key), (KeyKind::Host, "mx.throw.io"));
        assert_eq!((f.listed, f.unlisted), (3, 0));
        assert_eq!(f.sources[0].source.as_ref(), "list-a");
        // Listed domains are not judged; unknown ones neither.
        assert_eq!(ix.finding("l0.com"), None);
        assert_eq!(ix.finding("never.com"), None);
        // Taught again: counted once.
        for _ in 0..5 {
            ix.teach("l0.com", &k, Some("list-a"), false, 2);
        }
        assert_eq!(ix.finding("new.com").unwrap().listed, 3);
    }

    #[test]
    fn keys_under_a_domains_own_name_never_count_for_it() {
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        // Planted: listed domains on the victim's host and on made-up hosts under its name.
        let planted = keys(&["host:mx.victim.com", "parent:victim.com"]);
        for i in 0..10 {
            ix.teach(&format!("l{i}.com"), &planted, Some("s"), false, 1);
        }
        // Taught with those keys anyway (a state file from before the rule): they are dropped.
        ix.teach("victim.com", &planted, None, false, 1);
        assert_eq!(ix.finding("victim.com"), None);
        let sister = keys(&["host:mx.victim.com"]);
        ix.teach("sister.com", &sister, None, false, 1);
        assert!(
            ix.finding("sister.com").is_some(),
            "another domain on it is a tenant"
        );
    }

    /// What flagging a tenant of an unrecognised shared host costs at the shipped rule: listed
    /// domains (each a throwaway domain on a list whose MX the attacker sets: a lapsed one,
    /// re-registered) pointed at the host, per legitimate tenant already seen there.
    #[test]
    fn the_cost_of_flagging_a_shared_hosts_tenants() {
        let shipped = NeighbourhoodRule {
            min_listed: 5,
            min_share: 0.8,
        };
        let cost = |tenants: u32| -> u32 {
            let mut ix = NeighbourhoodIndex::new(shipped, 100_000);
            let k = keys(&["host:mx.smallhost.net"]);
            for t in 0..tenants {
                ix.teach(&format!("tenant{t}.com"), &k, None, false, 1);
            }
            (1..10_000)
                .find(|&planted| {
                    ix.teach(&format!("planted{planted}.com"), &k, Some("s"), false, 1);
                    ix.finding("tenant0.com").is_some()
                })
                .unwrap()
        };
        // 4 per other tenant seen, at least `min_listed`.
        assert_eq!(
            [1, 2, 10, 30].map(cost),
            [5, 5, 36, 116],
            "docs/mx.md states these"
        );
    }

    #[test]
    fn unlisted_neighbours_weaken_a_key_and_legitimate_majorities_judge_nobody() {
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        let k = keys(&["host:mx.throw.io"]);
        for i in 0..8 {
            ix.teach(&format!("l{i}.com"), &k, Some("s"), false, 1);
        }
        // New throwaway domains on the host: each judged (itself left out of the counts)...
        for i in 0..3 {
            ix.teach(&format!("u{i}.com"), &k, None, false, 1);
        }
        assert_eq!(ix.finding("u0.com").unwrap().unlisted, 2);
        // ...until unlisted ones are more than a fifth: 8 / (8 + 2) is 0.8, 8 / (8 + 3) is not.
        ix.teach("u3.com", &k, None, false, 1);
        assert!(ix.finding("u3.com").is_none());
        // A shared host: a few listed tenants among many legitimate ones judges nobody.
        let shared = keys(&["network:198.51.100.0/24"]);
        for i in 0..20 {
            ix.teach(&format!("co{i}.com"), &shared, None, false, 1);
        }
        for i in 0..6 {
            ix.teach(&format!("t{i}.com"), &shared, Some("s"), false, 1);
        }
        ix.teach("company.com", &shared, None, false, 1);
        assert_eq!(ix.finding("company.com"), None);
        let top = ix.top(10);
        assert_eq!(&*top[0].key, "mx.throw.io");
        assert!(!top[0].judges && !top[1].judges, "{top:?}");
    }

    #[test]
    fn new_keys_replace_old_ones_and_old_domains_age_out() {
        let mut ix = NeighbourhoodIndex::new(RULE, 1000);
        let a = keys(&["host:a.io"]);
        ix.teach("x.com", &a, Some("s"), false, 1);
        ix.teach("x.com", &keys(&["host:b.io"]), Some("s"), false, 2);
        assert_eq!(ix.keys(), 1);
        ix.teach("y.com", &a, None, false, 10);
        assert_eq!(ix.expire(12, 5).len(), 1);
        assert!(!ix.knows("x.com") && ix.knows("y.com"));
        assert_eq!(ix.keys(), 1);
        // No keys: known (not resolved again), counted nowhere.
        ix.teach("y.com", &[], None, false, 10);
        assert_eq!((ix.domains(), ix.keys()), (1, 0));
        assert!(ix.knows("y.com") && ix.finding("y.com").is_none());
    }

    #[test]
    fn the_bound_evicts_the_least_useful_first() {
        let mut ix = NeighbourhoodIndex::new(RULE, 100);
        let k = keys(&["host:mx.throw.io"]);
        for i in 0..10 {
            ix.teach(&format!("l{i}.com"), &k, Some("s"), false, 1);
        }
        for i in 0..500 {
            ix.teach(
                &format!("lone{i}.com"),
                &[format!("host:h{i}.io").into()],
                None,
                false,
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
        ix.teach("a.com", &keys(&["host:h.io"]), None, false, 1);
        ix.teach("z.com", &keys(&["host:h.io"]), Some("s"), false, 1);
        let l = ix.learned();
        assert_eq!(
            l.iter().map(|l| &*l.domain).collect::<Vec<_>>(),
            ["z.com", "a.com"]
        );
    }
}
