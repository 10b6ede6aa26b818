//! The one webhook engine (`drg-webhook`) composed for this gateway: its outbox beside the
//! quota state file, and the destinations its messages go to, the operator's configured
//! receivers (`gateway.quota.alerts`, `gateway.changes.webhook`) and each project's own
//! webhooks (`gateway.webhooks`, `/v1/webhooks`). Quota alerts and verdict changes hand their
//! messages to it; the engine's outcomes feed their counters.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use drg_webhook::guard::Listener;
use drg_webhook::{client, Directory, Engine, Message, Observer, Outcome, Sender, Target};

use crate::access::quota::alerts::service::TOPIC as ALERTS;
use crate::changes::delivery::TOPIC as CHANGES;
use crate::config::GatewayConfig;
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
    /// A webhook's URL and secret, if it still exists.
    fn target(&self, project: &str, id: &str) -> Option<(String, Vec<u8>)>;
}

impl ProjectTargets for crate::account::webhooks::ProjectHooks {
    fn subscribed(&self, project: &str, topic: &str) -> Vec<String> {
        crate::account::webhooks::ProjectHooks::subscribed(self, project, topic)
    }

    fn target(&self, project: &str, id: &str) -> Option<(String, Vec<u8>)> {
        crate::account::webhooks::ProjectHooks::target(self, project, id).map(|t| (t.url, t.secret))
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
}

/// A project webhook's destination name: `project:<project>:<id>` (ids hold no `:`).
fn project_destination(project: &str, id: &str) -> String {
    format!("project:{project}:{id}")
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
    fn target(&self, destination: &str) -> Option<Target> {
        match destination {
            OPERATOR_ALERTS => self.alerts.clone(),
            OPERATOR_CHANGES => self.changes.clone(),
            other => {
                let (project, id) = other.strip_prefix("project:")?.rsplit_once(':')?;
                let p = self.projects.get()?;
                let (url, secret) = p.hooks.target(project, id)?;
                Some(Target {
                    url,
                    secret,
                    agent: p.agent.clone(),
                    max_attempts: p.max_attempts,
                })
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
                    .map(|id| project_destination(project, id)),
            );
        }
        out
    }
}

/// The engine's outcomes, counted where each topic's producer counts them.
#[derive(Default)]
pub struct Counts {
    pub alerts: OnceLock<Arc<crate::access::quota::alerts::Counters>>,
    pub changes: OnceLock<Arc<crate::changes::Counters>>,
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
                use crate::changes::Counters as C;
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
        hooks: &crate::account::webhooks::ProjectHooks,
    ) {
        let Some(config) = &gateway.webhooks else {
            return;
        };
        let agent = client::agent(config.timeout, config.policy(&gateway.own_listeners()));
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
    let listeners: Vec<Listener> = gateway.own_listeners();
    let alerts = match &gateway.quota.alerts {
        Some(a) => match (&a.url, a.read_secret()?) {
            (Some(url), Some(secret)) => Some(Target {
                url: url.clone(),
                secret,
                agent: client::agent(a.timeout, a.policy(&listeners)),
                max_attempts: a.max_attempts,
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
        }),
        None => None,
    };
    let destinations = Arc::new(Destinations {
        alerts,
        changes,
        projects: OnceLock::new(),
    });
    let counts = Arc::new(Counts::default());
    let path = outbox_path(&gateway.quota.state_file);
    let (engine, sender) = drg_webhook::engine::open(&path, destinations.clone(), counts.clone())
        .map_err(|e| e.to_string())?;
    let webhooks = Webhooks {
        sender,
        destinations,
        counts,
    };
    Ok(Some((webhooks, engine)))
}
