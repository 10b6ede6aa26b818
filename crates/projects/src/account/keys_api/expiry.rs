//! Keys that expire, as values: a new key's `expires_at`, and what a rotation does to the rows
//! (the successor made from the old key, the old key's overlap), or why a key cannot be
//! rotated. Time is passed in; nothing here reads a clock or a store.
//!
//! Expiry is not revocation: a key past its `expires_at` is refused (`401`), but it stays in
//! the rows (listed, deletable). The keys it made expire no later (a key never makes one that
//! outlives it: [`super::lineage`]), so nothing it made outlives it either. Only a `DELETE` (or
//! the operator's keys file) revokes, with the lineage.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use drg_access::keys::{hash_secret, key_prefix};
// RFC 3339, UTC, to the second: the fraction dropped, so an expiry is never later than asked.
use drg_access::managed::ManagedKey;
use drg_base::infra::units::rfc3339;

/// The `expires_at` of a key made at `now` to live `days` days.
pub fn expires_after(now: DateTime<Utc>, days: u32) -> String {
    rfc3339(now + chrono::Duration::days(i64::from(days)))
}

/// Why a key of the caller's project cannot be rotated (a `409` each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotRotatable {
    /// It was rotated already, and its successor is still there.
    Rotated { to: String },
    /// It expired (at this RFC 3339 time): a successor would bring a dead key back.
    Expired { at: String },
}

/// Whether `old` may be rotated at `now`; `successor_there`: whether the key it was rotated to
/// (if any) is still a key. A key whose successor was revoked may be rotated again (its
/// earlier expiry kept): a rotation undone, or a successor lost, must not leave the project
/// without a way to replace the key before it expires.
pub fn rotatable(
    old: &ManagedKey,
    successor_there: bool,
    now: DateTime<Utc>,
) -> Result<(), NotRotatable> {
    if let Some(at) = &old.expires_at {
        let expired = DateTime::parse_from_rfc3339(at).map_or(true, |t| t <= now);
        if expired {
            return Err(NotRotatable::Expired { at: at.clone() });
        }
    }
    match &old.rotated_to {
        Some(to) if successor_there => Err(NotRotatable::Rotated { to: to.clone() }),
        _ => Ok(()),
    }
}

/// The successor of `old` (its id still to be drawn): the same project, plan, label, origins
/// and maker, so it takes the old key's place in the lineage (revoking the old key later does
/// not take it along); a new secret; the old key's lifetime counted from `now` again.
/// Fields of a newer gateway are carried too: they may narrow what the key may do, and a
/// successor must never be wider than the key it replaces.
pub fn successor(old: &ManagedKey, secret: &str, now: DateTime<Utc>) -> ManagedKey {
    ManagedKey {
        id: String::new(),
        project: old.project.clone(),
        plan: old.plan.clone(),
        label: old.label.clone(),
        sha256: hex::encode(hash_secret(secret)),
        prefix: key_prefix(secret).to_owned(),
        created_at: rfc3339(now),
        last_used: None,
        origins: old.origins.clone(),
        created_by: old.created_by.clone(),
        expires_at: old.expires_in_days.map(|d| expires_after(now, d)),
        expires_in_days: old.expires_in_days,
        rotated_to: None,
        unknown: old.unknown.clone(),
    }
}

/// `old` once rotated to `to` at `now`: it works for `overlap_hours` more (to the second), or
/// until its own expiry if that comes first.
pub fn rotated(old: &ManagedKey, to: &str, now: DateTime<Utc>, overlap_hours: f64) -> ManagedKey {
    // Milliseconds: 0.001 h is 3.6 s. At most 720 h, checked by the body's parser.
    let overlap = chrono::Duration::milliseconds((overlap_hours * 3_600_000.0).round() as i64);
    let end = now + overlap;
    let earlier = old
        .expires_at
        .as_deref()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
        .filter(|t| *t < end);
    ManagedKey {
        expires_at: Some(rfc3339(earlier.unwrap_or(end))),
        rotated_to: Some(to.to_owned()),
        ..old.clone()
    }
}

/// Hands the keys `old` made to `new` (a rotation: the successor takes the old key's place as
/// their maker, so revoking the old key after its overlap keeps them).
pub fn hand_children<'a>(
    keys: impl IntoIterator<Item = &'a mut Arc<ManagedKey>>,
    old: &str,
    new: &str,
) {
    for k in keys {
        if k.created_by.as_deref() == Some(old) && k.id != new {
            Arc::make_mut(k).created_by = Some(new.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drg_access::managed::test_key;

    fn at(t: &str) -> DateTime<Utc> {
        t.parse().unwrap()
    }

    fn old() -> ManagedKey {
        ManagedKey {
            label: Some("ci".into()),
            origins: vec!["https://app.example".into()],
            expires_in_days: Some(30),
            expires_at: Some("2026-03-01T00:00:00Z".into()),
            unknown: [("scopes".to_owned(), serde_json::json!(["lookup"]))].into(),
            ..test_key("key_old", "acme", Some("server"))
        }
    }

    #[test]
    fn a_new_key_expires_whole_days_later_to_the_second() {
        let now = at("2026-01-31T10:20:30.999Z");
        assert_eq!(expires_after(now, 1), "2026-02-01T10:20:30Z");
        assert_eq!(expires_after(now, 3_650), "2036-01-29T10:20:30Z");
    }

    #[test]
    fn the_successor_takes_the_old_keys_place_with_a_new_secret_and_a_fresh_lifetime() {
        let now = at("2026-02-01T12:00:00Z");
        let s = successor(&old(), "drg_new_secret_xxxxxxxxxxxxxxxx", now);
        assert_eq!(
            (s.project.as_str(), s.plan.as_str(), s.label.as_deref()),
            ("acme", "free", Some("ci"))
        );
        assert_eq!(s.origins, ["https://app.example"]);
        assert_eq!(
            s.created_by.as_deref(),
            Some("server"),
            "the old key's maker"
        );
        assert_eq!(s.created_at, "2026-02-01T12:00:00Z");
        assert_eq!(s.expires_at.as_deref(), Some("2026-03-03T12:00:00Z"));
        assert_eq!(s.expires_in_days, Some(30));
        assert_eq!(s.rotated_to, None);
        assert_eq!(s.prefix, "drg_new_secr");
        assert_eq!(
            s.sha256,
            hex::encode(hash_secret("drg_new_secret_xxxxxxxxxxxxxxxx"))
        );
        assert_eq!(s.unknown, old().unknown, "a newer gateway's fields carried");
        let forever = successor(&test_key("k", "acme", None), "drg_s", now);
        assert_eq!((forever.expires_at, forever.expires_in_days), (None, None));
    }

    #[test]
    fn the_old_key_works_for_the_overlap_unless_it_expires_first() {
        let now = at("2026-02-01T12:00:00.400Z");
        let r = rotated(&old(), "key_new", now, 0.001);
        assert_eq!(
            r.expires_at.as_deref(),
            Some("2026-02-01T12:00:04Z"),
            "3.6 s"
        );
        assert_eq!(r.rotated_to.as_deref(), Some("key_new"));
        assert_eq!(r.sha256, old().sha256, "the old secret stays its own");
        let at_once = rotated(&old(), "key_new", now, 0.0);
        assert_eq!(at_once.expires_at.as_deref(), Some("2026-02-01T12:00:00Z"));
        let later = rotated(&old(), "key_new", now, 720.0);
        assert_eq!(
            later.expires_at.as_deref(),
            Some("2026-03-01T00:00:00Z"),
            "its own expiry is earlier"
        );
        let forever = rotated(&test_key("k", "acme", None), "key_new", now, 24.0);
        assert_eq!(forever.expires_at.as_deref(), Some("2026-02-02T12:00:00Z"));
    }

    #[test]
    fn expired_keys_and_keys_whose_successor_is_there_are_not_rotated() {
        let now = at("2026-02-01T12:00:00Z");
        assert_eq!(rotatable(&old(), false, now), Ok(()));
        let gone = ManagedKey {
            expires_at: Some("2026-02-01T12:00:00Z".into()),
            ..old()
        };
        assert_eq!(
            rotatable(&gone, false, now),
            Err(NotRotatable::Expired {
                at: "2026-02-01T12:00:00Z".into()
            })
        );
        let unreadable = ManagedKey {
            expires_at: Some("soon".into()),
            ..old()
        };
        assert!(matches!(
            rotatable(&unreadable, false, now),
            Err(NotRotatable::Expired { .. })
        ));
        let r = rotated(&old(), "key_new", now, 1.0);
        assert_eq!(
            rotatable(&r, true, now),
            Err(NotRotatable::Rotated {
                to: "key_new".into()
            })
        );
        assert_eq!(
            rotatable(&r, false, now),
            Ok(()),
            "its successor was revoked"
        );
        let again = rotated(&r, "key_newer", now + chrono::Duration::minutes(30), 1.0);
        assert_eq!(
            again.expires_at, r.expires_at,
            "the earlier overlap's end is kept"
        );
    }
}
