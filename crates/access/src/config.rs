//! Configuration of access: the keys file, plans, the demo key and the account routes' rate.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::quota::config::QuotaStoreKind;
use serde::{Deserialize, Serialize};

/// API keys and the plans they are on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AccessConfig {
    /// The keys file (hot-reloaded). Relative to the config file.
    pub keys_file: PathBuf,
    /// Plan name -> its calls per calendar month, written alone (`pro: 10000`) or with the
    /// rest of the plan (`pro: { monthly_limit: 10000, max_keys: 10, log_retention_hours: 1440 }`);
    /// what is left out comes from the plan's name (see [`crate::plan`]).
    pub plans: BTreeMap<String, crate::plan::PlanConfig>,
    /// Accept the public demo key on a non-loopback listener (never do this in production).
    pub allow_demo_key: bool,
    /// Per key, the calls to the account routes (`/v1/usage`, `/v1/logs`, `/v1/stats`,
    /// `/v1/keys`): not counted in the month, but each costs a store read or a keys-file
    /// rewrite. Over it: `429 rate_limited` with `Retry-After`. `per_second: 0` turns it off.
    pub account_rate: crate::rate::RateConfig,
}

impl Default for AccessConfig {
    fn default() -> Self {
        AccessConfig {
            keys_file: PathBuf::from("keys.yaml"),
            plans: crate::plan::default_plans(),
            allow_demo_key: false,
            account_rate: crate::rate::RateConfig {
                per_second: 5,
                burst: 30,
            },
        }
    }
}

impl AccessConfig {
    /// Problems of `gateway.access`; `store` bounds the monthly limits (the embedded store's counter is 40 bits).
    pub fn problems(&self, store: QuotaStoreKind) -> Vec<String> {
        let mut out = Vec::new();
        if self.plans.is_empty() {
            out.push("gateway.access.plans: at least one plan is needed".to_owned());
        }
        for (name, plan) in &self.plans {
            out.extend(plan.problems(name));
            // The embedded store's counter word holds 40 bits of count next to the month (one
            // compare-and-swap updates both); a larger limit could never be reached, i.e. would
            // mean unlimited without saying so. Refused rather than widened: a wider word is a
            // new file format every gateway sharing the file must agree on, and 2^40 calls a
            // month (~420,000 a second for 31 days) is beyond what one host serves.
            use crate::quota::local::MAX_MONTHLY_LIMIT;
            if store == QuotaStoreKind::Local && plan.monthly_limit > MAX_MONTHLY_LIMIT {
                out.push(format!(
                    "gateway.access.plans.{name}.monthly_limit: {} is above {MAX_MONTHLY_LIMIT}, the largest limit the embedded quota store (quota.store: local) counts",
                    plan.monthly_limit
                ));
            }
        }
        out.extend(self.account_rate.problems("gateway.access.account_rate"));
        out
    }
}
