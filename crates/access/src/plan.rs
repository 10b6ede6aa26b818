//! Plans: what a project gets (monthly calls, a per-second rate, how many keys, how long its
//! logs are kept, whether its limits are enforced or only reported), as configured under
//! `gateway.access.plans`.
//!
//! A plan is written either as its monthly limit alone (`pro: 10000`, the form before plans had
//! more to say) or as a mapping (`pro: { monthly_limit: 10000, max_keys: 10,
//! log_retention_hours: 1440, rate_per_second: 20, burst: 40, mode: shadow }`). Whatever a plan
//! leaves out is taken from the defaults of its name (no rate limit, enforced), so configs
//! written before these keys existed keep working unchanged.

use std::fmt;
use std::time::Duration;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::rate::RateConfig;

const HOUR: u64 = 3_600;
const DAY: u64 = 24 * HOUR;

/// The longest log retention a plan may ask for (ten years, in hours).
pub const MAX_LOG_RETENTION_HOURS: u64 = 10 * 366 * 24;
/// The most keys a plan may allow per project.
pub const MAX_MAX_KEYS: u32 = 10_000;
/// The largest `max_overrides` a plan may give (`/v1/overrides`).
pub const MAX_MAX_OVERRIDES: u32 = 100_000;
/// Webhooks a project may hold when its plan does not say (`/v1/webhooks`): whatever the plan's
/// name, since each one is a destination the gateway posts to.
pub const DEFAULT_MAX_WEBHOOKS: u32 = 5;
/// The largest `max_webhooks` a plan may give.
pub const MAX_MAX_WEBHOOKS: u32 = 1_000;

/// How long a project's audit trail is kept when its plan does not say (`/v1/audit`).
pub const DEFAULT_AUDIT_DAYS: u32 = 90;
/// The longest a plan may keep it.
pub const MAX_AUDIT_DAYS: u32 = 3_660;

/// `max_overrides` of a plan name, when the config does not say (`/v1/overrides`).
pub fn default_max_overrides(name: &str) -> u32 {
    match name {
        "starter" => 100,
        "pro" => 1_000,
        "business" => 10_000,
        _ => 10,
    }
}
/// The highest `rate_per_second` and `burst` a plan may set.
pub const MAX_RATE: u32 = 1_000_000;

/// Whether a plan's limits refuse calls or are only reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanMode {
    /// Over a limit: `429`.
    #[default]
    Enforce,
    /// Over a limit: answered as within it, with `X-RateLimit-Would-Reject` and a metric (a
    /// new limit rolled out in the dark first).
    Shadow,
}

/// One plan with every value resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Calls per calendar month (UTC), shared by the keys of a project.
    pub monthly_limit: u64,
    /// Keys a project on this plan may hold (operator keys and API-made keys together).
    pub max_keys: u32,
    /// How long the project's call logs are kept.
    pub log_retention: Duration,
    /// Calls per second per project, shared by its keys (`None`: no rate limit).
    pub rate: Option<RateConfig>,
    pub mode: PlanMode,
}

/// `max_keys` and log retention of a plan name, when the config does not say: the hosted
/// service's plans, and the free plan's (the most cautious) for any other name.
pub fn name_defaults(name: &str) -> (u32, Duration) {
    let (keys, secs) = match name {
        "starter" => (5, 30 * DAY),
        "pro" => (10, 60 * DAY),
        "business" => (10, 90 * DAY),
        _ => (1, 24 * HOUR),
    };
    (keys, Duration::from_secs(secs))
}

/// A plan as written in the config: the limit, and optionally the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanConfig {
    pub monthly_limit: u64,
    pub max_keys: Option<u32>,
    pub log_retention_hours: Option<u64>,
    pub rate_per_second: Option<u32>,
    /// Calls allowed at once after a quiet spell; defaults to one second's worth.
    pub burst: Option<u32>,
    pub mode: Option<PlanMode>,
    /// Overrides a project on this plan may hold (`/v1/overrides`).
    pub max_overrides: Option<u32>,
    /// Webhooks a project on this plan may hold (`/v1/webhooks`).
    pub max_webhooks: Option<u32>,
    /// Days the project's audit trail is kept (`/v1/audit`).
    pub audit_retention_days: Option<u32>,
}

impl PlanConfig {
    /// A plan given by its limit alone (the short form).
    pub const fn limit(monthly_limit: u64) -> Self {
        PlanConfig {
            monthly_limit,
            max_keys: None,
            log_retention_hours: None,
            rate_per_second: None,
            burst: None,
            mode: None,
            max_overrides: None,
            max_webhooks: None,
            audit_retention_days: None,
        }
    }

    /// Days the audit trail of a project on this plan is kept.
    pub fn audit_retention_days(&self) -> u32 {
        self.audit_retention_days.unwrap_or(DEFAULT_AUDIT_DAYS)
    }

    /// Overrides a project on this plan (named `name`) may hold.
    pub fn max_overrides(&self, name: &str) -> u32 {
        self.max_overrides
            .unwrap_or_else(|| default_max_overrides(name))
    }

    /// Webhooks a project on this plan may hold.
    pub fn max_webhooks(&self) -> u32 {
        self.max_webhooks.unwrap_or(DEFAULT_MAX_WEBHOOKS)
    }

    /// Whether only the monthly limit is written (then it serialises in the short form).
    fn is_short(&self) -> bool {
        *self == PlanConfig::limit(self.monthly_limit)
    }

    /// Problems of the plan named `name`, each naming its key.
    pub fn problems(&self, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(n) = self.max_keys {
            if !(1..=MAX_MAX_KEYS).contains(&n) {
                out.push(format!(
                    "gateway.access.plans.{name}.max_keys: {n} is outside 1..={MAX_MAX_KEYS}"
                ));
            }
        }
        if let Some(n) = self.max_overrides {
            if n > MAX_MAX_OVERRIDES {
                out.push(format!(
                    "gateway.access.plans.{name}.max_overrides: {n} is outside 0..={MAX_MAX_OVERRIDES}"
                ));
            }
        }
        if let Some(n) = self.max_webhooks {
            if n > MAX_MAX_WEBHOOKS {
                out.push(format!(
                    "gateway.access.plans.{name}.max_webhooks: {n} is outside 0..={MAX_MAX_WEBHOOKS}"
                ));
            }
        }
        if let Some(d) = self.audit_retention_days {
            if !(1..=MAX_AUDIT_DAYS).contains(&d) {
                out.push(format!(
                    "gateway.access.plans.{name}.audit_retention_days: {d} is outside 1..={MAX_AUDIT_DAYS}"
                ));
            }
        }
        if let Some(h) = self.log_retention_hours {
            if !(1..=MAX_LOG_RETENTION_HOURS).contains(&h) {
                out.push(format!(
                    "gateway.access.plans.{name}.log_retention_hours: {h} is outside 1..={MAX_LOG_RETENTION_HOURS}"
                ));
            }
        }
        if let Some(r) = self.rate_per_second {
            if !(1..=MAX_RATE).contains(&r) {
                out.push(format!(
                    "gateway.access.plans.{name}.rate_per_second: {r} is outside 1..={MAX_RATE} (leave it out for no rate limit)"
                ));
            }
        }
        if let Some(b) = self.burst {
            if !(1..=MAX_RATE).contains(&b) {
                out.push(format!(
                    "gateway.access.plans.{name}.burst: {b} is outside 1..={MAX_RATE}"
                ));
            }
            if self.rate_per_second.is_none() {
                out.push(format!(
                    "gateway.access.plans.{name}.burst: needs rate_per_second beside it"
                ));
            }
        }
        out
    }
}

/// Anything the keys file can be checked against: a configured plan, or (in tests and
/// benchmarks) a bare monthly limit.
pub trait AsPlan {
    /// The plan with every value resolved, `name` giving the defaults.
    fn resolve(&self, name: &str) -> Plan;
}

impl AsPlan for PlanConfig {
    fn resolve(&self, name: &str) -> Plan {
        let (keys, retention) = name_defaults(name);
        Plan {
            monthly_limit: self.monthly_limit,
            max_keys: self.max_keys.unwrap_or(keys),
            log_retention: self
                .log_retention_hours
                .map_or(retention, |h| Duration::from_secs(h.saturating_mul(HOUR))),
            rate: self.rate_per_second.map(|per_second| RateConfig {
                per_second,
                burst: self.burst.unwrap_or(per_second).max(1),
            }),
            mode: self.mode.unwrap_or_default(),
        }
    }
}

impl AsPlan for u64 {
    fn resolve(&self, name: &str) -> Plan {
        PlanConfig::limit(*self).resolve(name)
    }
}

impl AsPlan for Plan {
    fn resolve(&self, _name: &str) -> Plan {
        *self
    }
}

/// The long form, with unknown keys refused.
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct LongForm {
    monthly_limit: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_keys: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    log_retention_hours: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rate_per_second: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    burst: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mode: Option<PlanMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_overrides: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_webhooks: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    audit_retention_days: Option<u32>,
}

impl<'de> Deserialize<'de> for PlanConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct PlanVisitor;
        impl<'de> Visitor<'de> for PlanVisitor {
            type Value = PlanConfig;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a monthly limit (a number) or { monthly_limit, max_keys, log_retention_hours }",
                )
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PlanConfig, E> {
                Ok(PlanConfig::limit(v))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PlanConfig, E> {
                u64::try_from(v)
                    .map(PlanConfig::limit)
                    .map_err(|_| E::custom(format!("monthly limit {v} is negative")))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<PlanConfig, A::Error> {
                let long = LongForm::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(PlanConfig {
                    monthly_limit: long.monthly_limit,
                    max_keys: long.max_keys,
                    log_retention_hours: long.log_retention_hours,
                    rate_per_second: long.rate_per_second,
                    burst: long.burst,
                    mode: long.mode,
                    max_overrides: long.max_overrides,
                    max_webhooks: long.max_webhooks,
                    audit_retention_days: long.audit_retention_days,
                })
            }
        }
        d.deserialize_any(PlanVisitor)
    }
}

impl Serialize for PlanConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.is_short() {
            return s.serialize_u64(self.monthly_limit);
        }
        LongForm {
            monthly_limit: self.monthly_limit,
            max_keys: self.max_keys,
            log_retention_hours: self.log_retention_hours,
            rate_per_second: self.rate_per_second,
            burst: self.burst,
            mode: self.mode,
            max_overrides: self.max_overrides,
            max_webhooks: self.max_webhooks,
            audit_retention_days: self.audit_retention_days,
        }
        .serialize(s)
    }
}

/// The plans shipped as defaults: the hosted service's four.
pub fn default_plans() -> std::collections::BTreeMap<String, PlanConfig> {
    [
        ("free", 100),
        ("starter", 1_000),
        ("pro", 10_000),
        ("business", 100_000),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), PlanConfig::limit(v)))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn parse(yaml: &str) -> Result<BTreeMap<String, PlanConfig>, String> {
        serde_yaml::from_str(yaml).map_err(|e| e.to_string())
    }

    #[test]
    fn the_short_form_takes_the_defaults_of_its_name() {
        let plans =
            parse("{ free: 100, starter: 1000, pro: 10000, business: 100000, gold: 5 }").unwrap();
        let got: Vec<(u64, u32, u64)> = ["free", "starter", "pro", "business", "gold"]
            .iter()
            .map(|n| {
                let p = plans[*n].resolve(n);
                (
                    p.monthly_limit,
                    p.max_keys,
                    p.log_retention.as_secs() / HOUR,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (100, 1, 24),
                (1_000, 5, 30 * 24),
                (10_000, 10, 60 * 24),
                (100_000, 10, 90 * 24),
                (5, 1, 24),
            ]
        );
    }

    #[test]
    fn the_long_form_overrides_what_it_names() {
        let plans =
            parse("{ pro: { monthly_limit: 7, max_keys: 3 }, team: { monthly_limit: 9, log_retention_hours: 2 } }")
                .unwrap();
        let pro = plans["pro"].resolve("pro");
        assert_eq!((pro.monthly_limit, pro.max_keys), (7, 3));
        assert_eq!(pro.log_retention, Duration::from_secs(60 * DAY));
        let team = plans["team"].resolve("team");
        assert_eq!(
            (team.max_keys, team.log_retention),
            (1, Duration::from_secs(2 * HOUR))
        );
        // Written back the way it was read.
        let yaml = serde_yaml::to_string(&plans).unwrap();
        assert_eq!(parse(&yaml).unwrap(), plans);
    }

    #[test]
    fn bad_plans_are_refused_naming_what_is_wrong() {
        for (yaml, needle) in [
            (
                "{ pro: { monthly_limit: 1, max_key: 3 } }",
                "unknown field `max_key`",
            ),
            ("{ pro: { max_keys: 3 } }", "missing field `monthly_limit`"),
            ("{ pro: -1 }", "negative"),
            ("{ pro: lots }", "a monthly limit (a number)"),
        ] {
            let err = parse(yaml).unwrap_err();
            assert!(err.contains(needle), "{yaml}: {err}");
        }
        let zero = PlanConfig {
            max_keys: Some(0),
            log_retention_hours: Some(0),
            rate_per_second: Some(0),
            burst: Some(0),
            ..PlanConfig::limit(1)
        };
        let problems = zero.problems("pro").join("\n");
        assert!(
            problems.contains("gateway.access.plans.pro.max_keys: 0"),
            "{problems}"
        );
        assert!(
            problems.contains("gateway.access.plans.pro.log_retention_hours: 0"),
            "{problems}"
        );
        assert!(
            problems.contains("gateway.access.plans.pro.rate_per_second: 0"),
            "{problems}"
        );
        assert!(
            problems.contains("gateway.access.plans.pro.burst: 0"),
            "{problems}"
        );
        let lone_burst = PlanConfig {
            burst: Some(5),
            ..PlanConfig::limit(1)
        };
        assert!(lone_burst.problems("pro")[0].contains("needs rate_per_second"));
        assert!(PlanConfig::limit(5).problems("x").is_empty());
    }

    #[test]
    fn a_rate_and_a_mode_are_read_and_default_sensibly() {
        let plans = parse(
            "{ pro: { monthly_limit: 10000, rate_per_second: 20, burst: 40, mode: shadow }, team: { monthly_limit: 9, rate_per_second: 3 }, free: 100 }",
        )
        .unwrap();
        let pro = plans["pro"].resolve("pro");
        assert_eq!(
            pro.rate,
            Some(RateConfig {
                per_second: 20,
                burst: 40
            })
        );
        assert_eq!(pro.mode, PlanMode::Shadow);
        let team = plans["team"].resolve("team");
        assert_eq!(team.rate.map(|r| r.burst), Some(3), "a second's worth");
        assert_eq!(team.mode, PlanMode::Enforce);
        let free = plans["free"].resolve("free");
        assert_eq!((free.rate, free.mode), (None, PlanMode::Enforce));
        assert!(parse("{ pro: { monthly_limit: 1, mode: loud } }").is_err());
        let yaml = serde_yaml::to_string(&plans).unwrap();
        assert_eq!(parse(&yaml).unwrap(), plans);
    }

    #[test]
    fn max_webhooks_is_five_unless_the_plan_says_and_is_bounded() {
        let plans = parse("{ pro: { monthly_limit: 7, max_webhooks: 0 }, free: 100 }").unwrap();
        assert_eq!(plans["pro"].max_webhooks(), 0);
        assert_eq!(plans["free"].max_webhooks(), DEFAULT_MAX_WEBHOOKS);
        let yaml = serde_yaml::to_string(&plans).unwrap();
        assert_eq!(parse(&yaml).unwrap(), plans);
        let many = PlanConfig {
            max_webhooks: Some(MAX_MAX_WEBHOOKS + 1),
            ..PlanConfig::limit(1)
        };
        assert!(many.problems("pro")[0].contains("gateway.access.plans.pro.max_webhooks: 1001"));
    }
}
