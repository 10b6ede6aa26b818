//! The records the API returns: `Reason`, `RiskRecord` and the `FlaggedEntry` of top-domains.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Why a domain has its score. Serialised in `snake_case`, as the public API spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    Safe,
    Disposable,
    Undeliverable,
    RoleAccount,
}

impl Reason {
    pub const ALL: [Reason; 4] = [
        Reason::Safe,
        Reason::Disposable,
        Reason::Undeliverable,
        Reason::RoleAccount,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Safe => "safe",
            Reason::Disposable => "disposable",
            Reason::Undeliverable => "undeliverable",
            Reason::RoleAccount => "role_account",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown reason name, as found in a data file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown reason '{0}' (expected safe, disposable, undeliverable or role_account)")]
pub struct UnknownReason(pub String);

impl FromStr for Reason {
    type Err = UnknownReason;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Reason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownReason(s.to_owned()))
    }
}

/// A risk score, 0 (safe) to 100 (confirmed on a blocklist).
pub type RiskScore = u8;
pub const MAX_SCORE: RiskScore = 100;

/// The answer of `GET /v1/public/domain/{domain}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RiskRecord<'a> {
    pub domain: &'a str,
    pub risk_score: RiskScore,
    pub reason: Reason,
    pub is_free_provider: bool,
    pub is_corporate_email: bool,
    pub mx_provider_label: Option<&'a str>,
}

/// One entry of `GET /v1/public/top-domains`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FlaggedEntry {
    pub domain: Box<str>,
    pub risk_score: RiskScore,
    pub reason: Reason,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_round_trips_through_its_name() {
        for r in Reason::ALL {
            assert_eq!(r.as_str().parse::<Reason>(), Ok(r));
            assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{r}\""));
        }
        assert!("Disposable".parse::<Reason>().is_err());
    }

    #[test]
    fn record_serialises_all_six_fields() {
        let rec = RiskRecord {
            domain: "example.com",
            risk_score: 12,
            reason: Reason::Safe,
            is_free_provider: false,
            is_corporate_email: false,
            mx_provider_label: None,
        };
        assert_eq!(
            serde_json::to_string(&rec).unwrap(),
            r#"{"domain":"example.com","risk_score":12,"reason":"safe","is_free_provider":false,"is_corporate_email":false,"mx_provider_label":null}"#
        );
    }
}
