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

impl RiskRecord<'_> {
    /// The record as JSON, byte for byte what its `Serialize` renders, written directly: it is
    /// the body of every lookup, so no serializer runs per request. Strings go through
    /// `serde_json` only when they hold a character JSON escapes (a valid domain name never
    /// does).
    pub fn to_json(&self) -> Vec<u8> {
        let label = self.mx_provider_label.map_or(0, str::len);
        let mut out = Vec::with_capacity(136 + self.domain.len() + label);
        self.write_json(&mut out);
        out
    }

    /// [`RiskRecord::to_json`] appended to `out` (a batch writes its records into one body).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"domain\":");
        json_str(out, self.domain);
        out.extend_from_slice(b",\"risk_score\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.risk_score).as_bytes());
        out.extend_from_slice(b",\"reason\":\"");
        out.extend_from_slice(self.reason.as_str().as_bytes());
        out.extend_from_slice(b"\",\"is_free_provider\":");
        out.extend_from_slice(json_bool(self.is_free_provider));
        out.extend_from_slice(b",\"is_corporate_email\":");
        out.extend_from_slice(json_bool(self.is_corporate_email));
        out.extend_from_slice(b",\"mx_provider_label\":");
        match self.mx_provider_label {
            Some(label) => json_str(out, label),
            None => out.extend_from_slice(b"null"),
        }
        out.push(b'}');
    }
}

fn json_bool(b: bool) -> &'static [u8] {
    if b {
        b"true"
    } else {
        b"false"
    }
}

/// A JSON string: as is when nothing in it needs escaping, else as `serde_json` escapes it.
fn json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
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

    proptest::proptest! {
        #[test]
        fn to_json_is_what_serde_renders(
            domain in "\\PC{0,40}|[a-z0-9.-]{1,40}",
            label in proptest::option::of("\\PC{0,20}|[\\x00-\\x7f]{0,20}"),
            risk_score: u8,
            reason in 0..4usize,
            is_free_provider: bool,
            is_corporate_email: bool,
        ) {
            let rec = RiskRecord {
                domain: &domain,
                risk_score,
                reason: Reason::ALL[reason],
                is_free_provider,
                is_corporate_email,
                mx_provider_label: label.as_deref(),
            };
            proptest::prop_assert_eq!(
                String::from_utf8(rec.to_json()).unwrap(),
                serde_json::to_string(&rec).unwrap()
            );
        }
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
