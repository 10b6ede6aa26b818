//! `gateway.webhooks`: projects' own webhooks (`/v1/webhooks`) on or off (absent: off, the routes
//! answer 404), where their URLs may point, and how each delivery is tried.

use std::time::Duration;

use drg_webhook::guard::{Listener, Policy};
use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds};

/// The operator's bounds on the webhooks projects make. A project's URL is judged by the same
/// guard as the operator's receivers: loopback, private, shared, documentation, benchmarking and
/// reserved addresses are refused unless `allow_private`; link-local (cloud metadata) and the
/// gateway's own listeners always. A name is judged again on every address it resolves to when
/// a message is sent.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksConfig {
    /// Let projects' webhooks point at loopback or private networks (a gateway serving only the
    /// operator's own teams). Default `false`: on a public gateway a project could otherwise
    /// make it post into the operator's network.
    #[serde(default)]
    pub allow_private: bool,
    /// One delivery attempt's budget, connection included, in milliseconds.
    #[serde(
        rename = "timeout_ms",
        default = "drg_webhook::config::default_timeout"
    )]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub timeout: Duration,
    /// Attempts per message before it is given up.
    #[serde(default = "drg_webhook::config::default_attempts")]
    pub max_attempts: u32,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        WebhooksConfig {
            allow_private: false,
            timeout: drg_webhook::config::default_timeout(),
            max_attempts: drg_webhook::config::default_attempts(),
        }
    }
}

impl WebhooksConfig {
    /// Problems of the section, each naming its key. `_listeners`: the gateway's own, which
    /// [`policy`](Self::policy) refuses; nothing configured here is a URL to judge against them.
    pub fn problems(&self, _listeners: &[Listener]) -> Vec<String> {
        drg_webhook::config::delivery_problems("gateway.webhooks", self.timeout, self.max_attempts)
    }

    /// Where projects' webhooks may point.
    pub fn policy(&self, listeners: &[Listener]) -> Policy {
        Policy {
            allow_private: self.allow_private,
            listeners: listeners.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_section_takes_the_defaults_and_unknown_keys_are_refused() {
        let c: WebhooksConfig = serde_yaml::from_str("{}").unwrap();
        assert_eq!(c, WebhooksConfig::default());
        assert_eq!(
            (c.allow_private, c.timeout.as_millis(), c.max_attempts),
            (false, 5_000, 12)
        );
        assert!(c.problems(&[]).is_empty());
        let c: WebhooksConfig =
            serde_yaml::from_str("{allow_private: true, timeout_ms: 50, max_attempts: 0}").unwrap();
        assert!(c.policy(&[]).allow_private);
        let problems = c.problems(&[]).join("\n");
        assert!(
            problems.contains("gateway.webhooks.timeout_ms: 50"),
            "{problems}"
        );
        assert!(
            problems.contains("gateway.webhooks.max_attempts: 0"),
            "{problems}"
        );
        assert!(serde_yaml::from_str::<WebhooksConfig>("{url: x}").is_err());
    }
}
