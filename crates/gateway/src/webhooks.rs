//! The one webhook engine (`drg-webhook`) composed for this gateway: its outbox beside the
//! quota state file, and the destinations its messages go to, the operator's configured
//! receivers (`gateway.quota.alerts`, `gateway.changes.webhook`) and each project's own
//! webhooks (`gateway.webhooks`, `/v1/webhooks`). Quota alerts and verdict changes hand their
//! messages to it; the engine's outcomes feed their counters.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use drg_webhook::guard::Listener;
use drg_webhook::{client, Directory, Engine, Found, Message, Observer, Outcome, Sender, Target};

use crate::config::GatewayConfig;
use drg_access::quota::alerts::service::TOPIC as ALERTS;
use drg_projects::changes::delivery::TOPIC as CHANGES;
use drg_webhook::Subscribers;

/// The operator's receiver of quota alerts.
pub const OPERATOR_ALERTS: &str = "operator:quota.threshold";
/// The operator's receiver of verdict changes.
pub const OPERATOR_CHANGES: &str = "operator:verdict.changed";

/// The outbox's file: `webhooks.sqlite` beside the quota state file.
pub fn outbox_path(state_file: &Path) -> PathBuf {
    state_file
        .parent()
        .unwrap_or(Path::new("."))
        .join("webhooks.sqlite")
}

/// The projects' own webhooks, as the engine asks for them.
pub trait ProjectTargets: Send + Sync {
    /// The ids of `project`'s webhooks that take `topic`.
    fn subscribed(&self, project: &str, topic: &str) -> Vec<String>;
    /// A webhook's URL and secret while it is in force; or that it was removed, or that this
    /// gateway knows nothing of it (yet).
    fn target(&self, project: &str, id: &str) -> drg_projects::account::webhooks::Lookup;
}

impl ProjectTargets for drg_projects::account::webhooks::ProjectHooks {
    fn subscribed(&self, project: &str, topic: &str) -> Vec<String> {
        drg_projects::account::webhooks::ProjectHooks::subscribed(self, project, topic)
    }

    fn target(&self, project: &str, id: &str) -> drg_projects::account::webhooks::Lookup {
        drg_projects::account::webhooks::ProjectHooks::find(self, project, id)
    }
}

/// The projects' webhooks and the client that posts to them.
struct Projects {
    hooks: Arc<dyn ProjectTargets>,
    agent: ureq::Agent,
    max_attempts: u32,
}

/// Every destination (see the module documentation).
#[derive(Default)]
pub struct Destinations {
    alerts: Option<Target>,
    changes: Option<Target>,
    /// Set once the projects' webhook store is built (after the engine).
    projects: OnceLock<Projects>,
    /// `gateway.webhooks` is on: a project's webhook not set or not known yet is waited for,
    /// not dropped.
    projects_on: bool,
}

impl Destinations {
    /// Hands the projects' webhooks to the engine, posted to with `agent` and given up after
    /// `max_attempts`.
    pub fn set_projects(
        &self,
        hooks: Arc<dyn ProjectTargets>,
        agent: ureq::Agent,
        max_attempts: u32,
    ) {
        let projects = Projects {
            hooks,
            agent,
            max_attempts,
        };
        if self.projects.set(projects).is_err() {
            log::warn!("webhooks: the projects' webhooks were set twice; the first are kept");
        }
    }
}

impl Directory for Destinations {
    fn target(&self, destination: &str) -> Found {
        use drg_projects::account::webhooks::Lookup;
        let operator = |t: &Option<Target>| t.clone().map_or(Found::Gone, Found::Target);
        match destination {
            OPERATOR_ALERTS => operator(&self.alerts),
            OPERATOR_CHANGES => operator(&self.changes),
            other => {
                let Some((project, id)) = drg_webhook::project_of(other) else {
                    return Found::Gone;
                };
                let Some(p) = self.projects.get() else {
                    // Off: nothing will ever send it. On: the store is still being built.
                    return if self.projects_on {
                        Found::NotHere
                    } else {
                        Found::Gone
                    };
                };
                match p.hooks.target(project, id) {
                    Lookup::Live(t) => Found::Target(Target {
                        url: t.url,
                        secret: t.secret,
                        agent: p.agent.clone(),
                        max_attempts: p.max_attempts,
                        legacy_signature: false,
                    }),
                    Lookup::Removed => Found::Gone,
                    Lookup::Unknown => Found::NotHere,
                }
            }
        }
    }
}

impl Subscribers for Destinations {
    fn destinations(&self, project: &str, topic: &str) -> Vec<String> {
        let operator = match topic {
            ALERTS => self.alerts.as_ref().map(|_| OPERATOR_ALERTS),
            CHANGES => self.changes.as_ref().map(|_| OPERATOR_CHANGES),
            _ => None,
        };
        let mut out: Vec<String> = operator.into_iter().map(str::to_owned).collect();
        if let Some(p) = self.projects.get() {
            out.extend(
                p.hooks
                    .subscribed(project, topic)
                    .iter()
                    .map(|id| drg_webhook::project_destination(project, id)),
            );
        }
        out
    }
}

/// The engine's outcomes, counted where each topic's producer counts them.
#[derive(Default)]
pub struct Counts {
    pub alerts: OnceLock<Arc<drg_access::quota::alerts::Counters>>,
    pub changes: OnceLock<Arc<drg_projects::changes::Counters>>,
}

impl Observer for Counts {
    fn observe(&self, message: &Message, outcome: Outcome) {
        use std::sync::atomic::Ordering::Relaxed;
        let failed = matches!(
            outcome,
            Outcome::Retrying | Outcome::GivenUp | Outcome::Refused
        );
        let given_up = matches!(outcome, Outcome::GivenUp | Outcome::Refused);
        match &*message.topic {
            ALERTS => {
                let Some(c) = self.alerts.get() else { return };
                let add = |counter: &std::sync::atomic::AtomicU64, yes: bool| {
                    counter.fetch_add(u64::from(yes), Relaxed);
                };
                add(&c.sent, outcome == Outcome::Sent);
                add(&c.attempt_errors, failed);
                add(&c.failed, given_up);
                add(&c.refused, outcome == Outcome::Refused);
            }
            CHANGES => {
                let Some(c) = self.changes.get() else { return };
                use drg_projects::changes::Counters as C;
                C::add(&c.messages_sent, u64::from(outcome == Outcome::Sent));
                C::add(&c.attempt_errors, u64::from(failed));
                C::add(&c.messages_failed, u64::from(given_up));
            }
            _ => {}
        }
    }
}

/// The engine, its producers' handle, who receives what and the counts of its outcomes.
pub struct Webhooks {
    pub sender: Sender,
    pub destinations: Arc<Destinations>,
    pub counts: Arc<Counts>,
}

impl Webhooks {
    /// Hands the projects' webhooks (`/v1/webhooks`) to the engine, with `gateway.webhooks`'s
    /// client.
    pub fn with_projects(
        &self,
        gateway: &GatewayConfig,
        hooks: &drg_projects::account::webhooks::ProjectHooks,
    ) {
        let Some(config) = &gateway.webhooks else {
            return;
        };
        let agent = client::agent(config.timeout, config.policy(&guarded(gateway)));
        self.destinations
            .set_projects(Arc::new(hooks.clone()), agent, config.max_attempts);
    }

    /// What a producer needs: the engine's handle and who receives a project's messages.
    pub fn producer(&self) -> (Sender, Arc<dyn Subscribers>) {
        (self.sender.clone(), self.destinations.clone())
    }
}

/// Whether anything sends webhooks: the operator's receivers or the projects' own.
pub fn wanted(gateway: &GatewayConfig) -> bool {
    gateway.quota.alerts.is_some()
        || gateway.changes.webhook.is_some()
        || gateway.webhooks.is_some()
}

/// The engine of `gateway` (`None`: nothing sends webhooks): the operator's secrets read and the
/// outbox opened now, so that a bad one stops the start.
pub fn build(gateway: &GatewayConfig) -> Result<Option<(Webhooks, Engine)>, String> {
    if !wanted(gateway) {
        return Ok(None);
    }
    let listeners: Vec<Listener> = guarded(gateway);
    let alerts = match &gateway.quota.alerts {
        Some(a) => match (&a.url, a.read_secret()?) {
            (Some(url), Some(secret)) => Some(Target {
                url: url.clone(),
                secret,
                agent: client::agent(a.timeout, a.policy(&listeners)),
                max_attempts: a.max_attempts,
                legacy_signature: true,
            }),
            _ => None,
        },
        None => None,
    };
    let changes = match &gateway.changes.webhook {
        Some(hook) => Some(Target {
            url: hook.url.clone(),
            secret: hook.read_secret("gateway.changes.webhook")?,
            agent: client::agent(hook.timeout, hook.policy(&listeners)),
            max_attempts: hook.max_attempts,
            legacy_signature: true,
        }),
        None => None,
    };
    let destinations = Arc::new(Destinations {
        alerts,
        changes,
        projects: OnceLock::new(),
        projects_on: gateway.webhooks.is_some(),
    });
    let counts = Arc::new(Counts::default());
    let path = outbox_path(&gateway.quota.state_file);
    let (engine, sender) = drg_webhook::engine::open(&path, destinations.clone(), counts.clone())
        .map_err(|e| e.to_string())?;
    let engine = engine.with_settle_pause(settle_pause()?);
    let webhooks = Webhooks {
        sender,
        destinations,
        counts,
    };
    Ok(Some((webhooks, engine)))
}

/// Tests only: holds the webhook engine this many milliseconds between a receiver's answer and
/// its record in the outbox, where a test's `kill -9` lands (never set it in production: every
/// delivery waits that long to be settled).
pub const SETTLE_PAUSE_ENV: &str = "DOMAIN_RISK_GATEWAY_WEBHOOK_SETTLE_PAUSE_MS";

/// The pause [`SETTLE_PAUSE_ENV`] asks for, if any.
fn settle_pause() -> Result<Option<std::time::Duration>, String> {
    let Ok(ms) = std::env::var(SETTLE_PAUSE_ENV) else {
        return Ok(None);
    };
    let ms: u64 = ms
        .parse()
        .map_err(|e| format!("{SETTLE_PAUSE_ENV}: '{ms}' is not a number of milliseconds: {e}"))?;
    log::warn!("{SETTLE_PAUSE_ENV} is set: every webhook delivery waits {ms} ms to be settled");
    Ok(Some(std::time::Duration::from_millis(ms)))
}

/// The gateway's listeners and every address it talks to (the `/v1/check` upstream, Redis,
/// the OTLP collector, the DNS servers, RDAP servers named in config), which the webhook guard
/// refuses as destinations even with `allow_private`: a project's webhook must never make the
/// gateway post signed JSON, with a path the project chooses, to its own backends. Literal
/// addresses and `localhost` are taken as written; a host name is resolved once, at start (a
/// name that does not resolve then adds nothing; the receivers' own names are judged at each
/// send).
pub fn guarded(gateway: &GatewayConfig) -> Vec<Listener> {
    let mut out = gateway.own_listeners();
    let mut add = |key: &'static str, text: &str, default_port: u16| {
        for addr in addresses(text, default_port) {
            out.push(Listener { key, addr });
        }
    };
    add("gateway.upstream.address", &gateway.upstream.address, 80);
    let redis = &gateway.quota.redis;
    if gateway.quota.store == drg_access::quota::config::QuotaStoreKind::Redis {
        add("gateway.quota.redis.url", &redis.url, 6379);
        for node in redis.nodes.iter().chain(&redis.sentinel.nodes) {
            add("gateway.quota.redis.nodes", node, 6379);
        }
    }
    if let Some(otlp) = &gateway.tracing.otlp_endpoint {
        add("gateway.tracing.otlp_endpoint", otlp, 4318);
    }
    for server in gateway.mx.servers.iter().chain(&gateway.mx.confirm_servers) {
        add("gateway.mx.servers", server, 53);
    }
    for url in gateway.rdap.servers.values() {
        add("gateway.rdap.servers", url, 443);
    }
    out
}

/// The socket addresses of `text`: `ip:port`, `host:port`, or a URL (`redis://u:p@host:6379/0`,
/// `https://rdap.example/`), its port or the scheme's (`default_port` when none is known).
fn addresses(text: &str, default_port: u16) -> Vec<SocketAddr> {
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return vec![addr];
    }
    let Some((host, port)) = host_port(text, default_port) else {
        return Vec::new();
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        return vec![SocketAddr::new(ip, port)];
    }
    if host.eq_ignore_ascii_case("localhost") {
        return vec![
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port),
        ];
    }
    (host.as_str(), port)
        .to_socket_addrs()
        .map(Iterator::collect)
        .unwrap_or_default()
}

/// The host (IPv6 without brackets) and port of a URL or `host:port`.
fn host_port(text: &str, default_port: u16) -> Option<(String, u16)> {
    let with_scheme = if text.contains("://") {
        text.to_owned()
    } else {
        format!("tcp://{text}")
    };
    let uri = with_scheme.parse::<http::Uri>().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("https") => 443,
        Some("http") => 80,
        _ => default_port,
    });
    Some((host.to_owned(), port))
}

#[cfg(test)]
mod peer_tests {
    use super::*;

    #[test]
    fn addresses_are_read_from_every_shape_config_uses() {
        let a = |t: &str, p| addresses(t, p);
        assert_eq!(a("127.0.0.1:9090", 80), ["127.0.0.1:9090".parse().unwrap()]);
        assert_eq!(
            a("redis://user:pw@127.0.0.1:6390/0", 6379),
            ["127.0.0.1:6390".parse().unwrap()]
        );
        assert_eq!(
            a("redis://10.0.0.5", 6379),
            ["10.0.0.5:6379".parse().unwrap()]
        );
        assert_eq!(
            a("http://[::1]:4318/v1/traces", 4318),
            ["[::1]:4318".parse().unwrap()]
        );
        assert_eq!(
            a("https://10.1.1.1/rdap/", 443),
            ["10.1.1.1:443".parse().unwrap()]
        );
        assert_eq!(a("localhost:9090", 80).len(), 2);
        assert!(a("not a url", 80).is_empty());
    }
}

#[cfg(test)]
mod directory_tests {
    use super::*;
    use drg_projects::account::webhooks::{HookTarget, Lookup};

    /// One webhook in force (`live`) and one removed (`gone`) of project `acme`.
    struct Hooks;

    impl ProjectTargets for Hooks {
        fn subscribed(&self, _: &str, _: &str) -> Vec<String> {
            Vec::new()
        }

        fn target(&self, project: &str, id: &str) -> Lookup {
            match (project, id) {
                ("acme", "live") => Lookup::Live(HookTarget {
                    url: "https://hooks.example.com/".into(),
                    secret: b"s".to_vec(),
                }),
                ("acme", "gone") => Lookup::Removed,
                _ => Lookup::Unknown,
            }
        }
    }

    fn destinations(on: bool) -> Destinations {
        Destinations {
            projects_on: on,
            ..Destinations::default()
        }
    }

    fn found(d: &Destinations, destination: &str) -> &'static str {
        match d.target(destination) {
            Found::Target(_) => "target",
            Found::Gone => "gone",
            Found::NotHere => "not here",
        }
    }

    #[test]
    fn a_webhook_not_known_here_is_waited_for_and_only_a_removed_one_is_gone() {
        let hook = |id| drg_webhook::project_destination("acme", id);
        // Projects' webhooks on, their store not built yet (a restart's first round): waited for.
        let d = destinations(true);
        assert_eq!(found(&d, &hook("live")), "not here");
        // Off: nothing will ever send it.
        assert_eq!(found(&destinations(false), &hook("live")), "gone");
        let agent = client::agent(
            std::time::Duration::from_secs(1),
            drg_webhook::guard::Policy::default(),
        );
        d.set_projects(Arc::new(Hooks), agent, 3);
        assert_eq!(found(&d, &hook("live")), "target");
        assert_eq!(found(&d, &hook("gone")), "gone");
        // Not read here yet (made on another gateway a moment ago): waited for, not dropped.
        assert_eq!(found(&d, &hook("made-elsewhere")), "not here");
        // The operator's receivers: configured or not.
        assert_eq!(found(&d, OPERATOR_ALERTS), "gone");
    }
}
