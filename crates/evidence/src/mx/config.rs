//! Configuration of MX lookups: resolvers, budget, cache and concurrency.

use std::path::{Path, PathBuf};
use std::time::Duration;

use drg_base::infra::units::{ms, secs};
use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds, DurationSeconds};
use std::net::SocketAddr;

/// DNS lookups of a domain's MX records (for `undeliverable`, provider labels, corporate mail).
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MxConfig {
    /// Look MX records up for domains the table does not decide.
    pub enabled: bool,
    /// DNS servers as `ip:port`; empty: the system's (`/etc/resolv.conf`).
    pub servers: Vec<String>,
    /// A second resolver (`ip:port` list, e.g. a validating or unfiltered one) that must also
    /// say NXDOMAIN before a name or an MX host is taken not to exist (`undeliverable`): a
    /// filtering or split-horizon resolver answers NXDOMAIN for particular names while the
    /// canaries look fine. Empty (default): the first resolver's word is taken.
    pub confirm_servers: Vec<String>,
    /// How long a request waits for DNS, in milliseconds; then it is answered from what is known
    /// and the lookup finishes in the background.
    #[serde(rename = "budget_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub budget: Duration,
    /// Timeout of one DNS query, in milliseconds.
    #[serde(rename = "query_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub query_timeout: Duration,
    /// Lookups in flight at most, those finishing in the background included (each holds its
    /// slot for at most twice `query_timeout_ms`); past it a request is answered at once as if
    /// the budget had run out, so names under a slow nameserver cannot pile up tasks and sockets.
    pub max_inflight: usize,
    /// Cached domains at most.
    pub cache_entries: usize,
    /// Cache lifetime bounds for answers, in seconds (record TTLs are clamped to them).
    #[serde(rename = "min_ttl_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub min_ttl: Duration,
    #[serde(rename = "max_ttl_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub max_ttl: Duration,
    /// Upper bound for negative answers (NXDOMAIN, no records), in seconds.
    #[serde(rename = "negative_max_ttl_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub negative_max_ttl: Duration,
    /// How long a failed lookup (SERVFAIL, timeout) is remembered, in seconds.
    #[serde(rename = "failure_ttl_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub failure_ttl: Duration,
    /// After this many lookups in a row that no DNS server answered (timeouts, unreachable),
    /// the canaries are checked at once instead of at the next interval. A slow zone alone
    /// never switches MX evidence off: only the canaries do.
    pub breaker_failures: u32,
    /// How often the resolver is checked against the canaries (and at start).
    #[serde(rename = "probe_interval_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub probe_interval: Duration,
    /// Names that certainly have MX records (big mail providers' own domains). The resolver is
    /// trusted only while more than half of them come back with MX hosts; a resolver that
    /// answers NXDOMAIN, SERVFAIL or nothing for them is untrusted, and MX evidence is off.
    pub canaries: Vec<String>,
    /// MX lookups one project may hold at once (its share of `max_inflight`; a batch resolves
    /// within it): one caller's slow or silent names cannot take another project's slots.
    pub max_inflight_per_project: usize,
    /// The MX neighbourhood index: unlisted domains judged by their mail infrastructure.
    pub neighbourhood: NeighbourhoodConfig,
}

/// The shipped canaries: the mail domains of the largest consumer providers, whose MX records
/// every honest resolver on the internet returns.
pub const DEFAULT_CANARIES: [&str; 4] = ["gmail.com", "outlook.com", "yahoo.com", "icloud.com"];

/// A share in 0..=1 (an `f64` compared bit for bit, so configs stay `Eq`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Share(pub f64);

impl PartialEq for Share {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for Share {}

/// Days a listed name that moved must hold its new hosts when the config does not say:
/// past the 90 days an attacker's hold is measured against (`benches/detection -- --timeline`).
pub const DEFAULT_HOLD_DAYS: u32 = 120;

/// `gateway.mx.neighbourhood`: what is learned of MX hosts, parents and networks, and when a
/// key judges an unlisted domain.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NeighbourhoodConfig {
    pub enabled: bool,
    /// Distinct listed neighbours a key needs before it judges.
    pub min_listed: u32,
    /// Share of listed among listed and vouched-for neighbours a key needs (0.5 to 1).
    pub min_share: Share,
    /// Distinct MX hosts of listed neighbours a parent or a network needs before it judges
    /// (hosting providers put unrelated tenants in one /24: one throwaway host says nothing).
    pub min_hosts: u32,
    /// An unlisted neighbour the registry shows registered at least this many days ago is
    /// vouched for: it dilutes its keys (few throwaway domains live that long unlisted; a
    /// neighbour of unknown age dilutes nothing).
    pub vouch_age_days: u32,
    /// Domains remembered at most (each adds at most 16 keys; typically 2 to 4).
    pub max_entries: usize,
    /// A domain not seen again for this many days is forgotten.
    pub max_age_days: u32,
    /// Where the index is kept across restarts (written atomically, mode 0600). Default:
    /// `mx_neighbourhood.jsonl` beside the quota's `state_file`.
    pub state_file: Option<PathBuf>,
    /// A snapshot from `mx-snapshot`, loaded at start (optional).
    pub snapshot: Option<PathBuf>,
    /// Listed names waiting to be resolved in the background, at most (beyond: dropped, taught
    /// the next time one is asked).
    pub queue: usize,
    /// Background resolutions of listed names at once, of those traffic asked (the look has
    /// its own `look.concurrency`).
    pub concurrency: usize,
    /// Background resolutions of listed names started per second at most, after a first
    /// `queue` at once (0: no bound). Learning is sampled, not lost: a name not resolved now is
    /// queued again the next time it is asked, and a cluster teaches through any of its names;
    /// the bound keeps a stream of listed names from spending the workers' core on DNS.
    pub learn_per_second: u32,
    #[serde(rename = "save_interval_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub save_interval: Duration,
    /// With `quota.store: redis`: how often gateways exchange what they learned.
    #[serde(rename = "share_interval_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub share_interval: Duration,
    /// A domain judged disposable by its neighbourhood keeps that verdict (and the counts it
    /// was reached on) this long, whatever the index learns meanwhile: no back and forth.
    /// 0: judged afresh on every lookup.
    #[serde(rename = "verdict_hold_seconds")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub verdict_hold: Duration,
    /// Retired (issue 85): plans whose projects' lookups taught the index for every project.
    /// Who carried a lookup makes its fact no truer: a lookup now teaches its own project's
    /// answers only, and the lists and the gateway's own look teach everyone. Still read, so
    /// an old file loads; a warning at start says it decides nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_plans: Option<serde_yaml::Value>,
    /// Retired with `trusted_plans`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trusted_projects: Option<serde_yaml::Value>,
    /// Days a listed domain the gateway saw with no mail, or on other hosts, must hold its new
    /// hosts before it counts there (a lapsed name re-registered and pointed at someone's host
    /// counts for nobody until then). 120: past the 90 days an attacker's hold is measured
    /// against, so that holding names on a host that long flags no customer of unknown age.
    /// Unset: 120, or `max_age_days` when that is shorter (a config written before the default
    /// rose, with a short memory, still starts; a warning says so). Read it with
    /// [`NeighbourhoodConfig::hold_days`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_days: Option<u32>,
    /// The gateway's own look at every listed name.
    pub look: LookConfig,
}

/// `gateway.mx.neighbourhood.look`: the gateway's own look at every listed name, at start and
/// then every `every_secs`: where each one's mail goes, the baseline a listed name re-pointed
/// later is measured against.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LookConfig {
    pub enabled: bool,
    /// Listed names started per second at first; the pace then grows while the resolver
    /// answers as fast as it does unloaded, and halves when it slows or fails (never below a
    /// quarter of this).
    pub rate: u32,
    /// Listed names started per second at most, however fast the resolver answers. Most
    /// listed names have lapsed (one query, NXDOMAIN); a live one costs up to four (MX, then
    /// its new hosts' addresses and reverse DNS), so 800 is ~800 and at most ~3,200 queries a
    /// second to the resolver, and a pass over the shipped lists' ~57,000 names takes about
    /// 80 s on a resolver that keeps up. A `rate` above it is the ceiling too.
    pub max_rate: u32,
    /// The look's lookups at once, its own slots (the learning from traffic keeps
    /// `concurrency`): at its ceiling of 800 a second and 20-40 ms a lookup, 32 keep it busy.
    pub concurrency: usize,
    /// A new pass starts this long after the last one began.
    #[serde(rename = "every_secs")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub every: Duration,
}

impl Default for LookConfig {
    fn default() -> Self {
        LookConfig {
            enabled: true,
            rate: 20,
            max_rate: 800,
            concurrency: 32,
            every: Duration::from_secs(86_400),
        }
    }
}

impl Default for NeighbourhoodConfig {
    fn default() -> Self {
        NeighbourhoodConfig {
            enabled: true,
            min_listed: 10,
            min_share: Share(0.8),
            min_hosts: 3,
            vouch_age_days: 730,
            max_entries: 200_000,
            max_age_days: 180,
            state_file: None,
            snapshot: None,
            queue: 4096,
            concurrency: 8,
            learn_per_second: 100,
            save_interval: Duration::from_secs(60),
            share_interval: Duration::from_millis(2_000),
            verdict_hold: Duration::from_secs(3_600),
            trusted_plans: None,
            trusted_projects: None,
            hold_days: None,
            look: LookConfig::default(),
        }
    }
}

impl NeighbourhoodConfig {
    /// The state file: relative to `base`, or beside the quota's state file by default.
    pub fn resolve_paths(&mut self, base: &Path, quota_state_file: &Path) {
        self.state_file = Some(match self.state_file.take() {
            Some(p) if p.is_relative() => base.join(p),
            Some(p) => p,
            None => quota_state_file
                .parent()
                .unwrap_or(base)
                .join("mx_neighbourhood.jsonl"),
        });
        if let Some(p) = &mut self.snapshot {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }

    /// The warning for retired keys a config still sets (`trusted_plans`, `trusted_projects`).
    pub fn retired(&self) -> Option<String> {
        let set: Vec<&str> = [
            ("trusted_plans", &self.trusted_plans),
            ("trusted_projects", &self.trusted_projects),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.is_some().then_some(k))
        .collect();
        (!set.is_empty()).then(|| {
            format!(
                "gateway.mx.neighbourhood.{}: retired and ignored; a lookup teaches the project that made it, for its own answers only, whatever its plan; the lists and the gateway's own look teach every project (docs/mx.md, \"Who controls the evidence\")",
                set.join(", ")
            )
        })
    }

    /// Days a listed name that moved must hold its new hosts: `hold_days` when set, else
    /// [`DEFAULT_HOLD_DAYS`] capped at `max_age_days` (a name is forgotten after that).
    pub fn hold_days(&self) -> u32 {
        self.hold_days
            .unwrap_or_else(|| DEFAULT_HOLD_DAYS.min(self.max_age_days))
    }

    /// The warning for a default `hold_days` capped by a short `max_age_days`.
    pub fn hold_capped(&self) -> Option<String> {
        (self.hold_days.is_none() && self.max_age_days < DEFAULT_HOLD_DAYS).then(|| {
            format!(
                "gateway.mx.neighbourhood.hold_days: unset, so {} (max_age_days) rather than the default {DEFAULT_HOLD_DAYS}: names held on a host {} days by an attacker count against its customers of unknown age; raise max_age_days to 180 (the default) or set hold_days (docs/mx.md, \"hold_days\")",
                self.max_age_days, self.max_age_days
            )
        })
    }

    /// The state file (after [`NeighbourhoodConfig::resolve_paths`]).
    pub fn state_path(&self) -> PathBuf {
        self.state_file
            .clone()
            .unwrap_or_else(|| PathBuf::from("mx_neighbourhood.jsonl"))
    }

    fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let key = "gateway.mx.neighbourhood";
        if self.min_listed == 0 {
            out.push(format!("{key}.min_listed: must be at least 1"));
        }
        if self.min_hosts == 0 {
            out.push(format!("{key}.min_hosts: must be at least 1"));
        }
        if self.vouch_age_days == 0 {
            out.push(format!("{key}.vouch_age_days: must be at least 1"));
        }
        if !(0.5..=1.0).contains(&self.min_share.0) {
            out.push(format!(
                "{key}.min_share: {} is outside 0.5..=1 (below one half, legitimate neighbours could be the majority)",
                self.min_share.0
            ));
        }
        if self.max_entries == 0 {
            out.push(format!("{key}.max_entries: must be at least 1"));
        }
        if self.max_age_days == 0 {
            out.push(format!("{key}.max_age_days: must be at least 1"));
        }
        if self.queue == 0 || self.concurrency == 0 {
            out.push(format!("{key}.queue and concurrency: must be at least 1"));
        }
        if let Some(hold) = self.hold_days.filter(|h| *h > self.max_age_days) {
            out.push(format!(
                "{key}.hold_days: {hold} is more than max_age_days ({}): a name that moved would be forgotten, history and all, before it had held",
                self.max_age_days
            ));
        }
        if !(1..=10_000).contains(&self.look.rate) {
            out.push(format!(
                "{key}.look.rate: {} is outside 1..=10000",
                self.look.rate
            ));
        }
        if !(1..=10_000).contains(&self.look.max_rate) {
            out.push(format!(
                "{key}.look.max_rate: {} is outside 1..=10000",
                self.look.max_rate
            ));
        }
        if !(1..=1_024).contains(&self.look.concurrency) {
            out.push(format!(
                "{key}.look.concurrency: {} is outside 1..=1024",
                self.look.concurrency
            ));
        }
        if self.look.every < Duration::from_secs(1) {
            out.push(format!("{key}.look.every_secs: must be at least 1"));
        }
        if self.save_interval.is_zero() || self.share_interval.is_zero() {
            out.push(format!(
                "{key}.save_interval_seconds and share_interval_ms: must be at least 1"
            ));
        }
        out
    }
}

impl Default for MxConfig {
    fn default() -> Self {
        MxConfig {
            enabled: true,
            servers: Vec::new(),
            confirm_servers: Vec::new(),
            budget: Duration::from_millis(250),
            query_timeout: Duration::from_millis(2_000),
            max_inflight: 256,
            cache_entries: 100_000,
            min_ttl: Duration::from_secs(60),
            max_ttl: Duration::from_secs(86_400),
            negative_max_ttl: Duration::from_secs(3_600),
            failure_ttl: Duration::from_secs(30),
            breaker_failures: 3,
            probe_interval: Duration::from_secs(30),
            canaries: DEFAULT_CANARIES.iter().map(|s| (*s).to_owned()).collect(),
            max_inflight_per_project: 64,
            neighbourhood: NeighbourhoodConfig::default(),
        }
    }
}

impl MxConfig {
    /// Problems of `gateway.mx`, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for server in self.servers.iter().chain(&self.confirm_servers) {
            if server.parse::<SocketAddr>().is_err() {
                out.push(format!("gateway.mx.servers: '{server}' is not ip:port"));
            }
        }
        if !(1..=10_000).contains(&ms(self.budget)) {
            out.push(format!(
                "gateway.mx.budget_ms: {} is outside 1..=10000",
                ms(self.budget)
            ));
        }
        if !(1..=30_000).contains(&ms(self.query_timeout)) {
            out.push(format!(
                "gateway.mx.query_timeout_ms: {} is outside 1..=30000",
                ms(self.query_timeout)
            ));
        }
        if !(1..=1_000_000).contains(&self.max_inflight) {
            out.push(format!(
                "gateway.mx.max_inflight: {} is outside 1..=1000000",
                self.max_inflight
            ));
        }
        if self.cache_entries == 0 {
            out.push("gateway.mx.cache_entries: must be at least 1".to_owned());
        }
        if secs(self.min_ttl) > secs(self.max_ttl) {
            out.push("gateway.mx.min_ttl_seconds: larger than max_ttl_seconds".to_owned());
        }
        if self.breaker_failures == 0 || self.probe_interval.is_zero() {
            out.push(
                "gateway.mx.breaker_failures and probe_interval_seconds: must be at least 1"
                    .to_owned(),
            );
        }
        if self.enabled && self.canaries.is_empty() {
            out.push(
                "gateway.mx.canaries: at least one name is needed (MX evidence is believed only \
                 from a resolver that shows their MX records)"
                    .to_owned(),
            );
        }
        for c in &self.canaries {
            if drg_domain::DomainName::parse(c).is_err() {
                out.push(format!("gateway.mx.canaries: '{c}' is not a domain name"));
            }
        }
        // Above `max_inflight` it is `max_inflight` (one project may then take every slot).
        if self.max_inflight_per_project == 0 {
            out.push("gateway.mx.max_inflight_per_project: must be at least 1".to_owned());
        }
        if self.enabled && self.neighbourhood.enabled {
            out.extend(self.neighbourhood.problems());
        }
        out
    }
}
