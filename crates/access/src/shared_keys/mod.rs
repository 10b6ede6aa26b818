//! API-made keys on the shared Redis, when the quota store is Redis (`gateway.quota.store:
//! redis`, on its connection settings): the store in place of the managed file, so that
//! gateways sharing only Redis share the keys made through `/v1/keys`, their revocations and
//! their lineage.
//!
//! Layout (see [`layout`]): one hash of rows (key id -> the managed file's row as JSON,
//! hashed secret only), one set of ids per project, one hash of last uses, one hash of
//! tombstones (every revocation, see [`tombstones`]), a version counter moved by every change,
//! and an epoch naming the data set (a Redis emptied or replaced gets a new one, so a gateway
//! never mistakes its version 1 for an old one). Every name carries the one hash tag `{keys}`:
//! the scripts that count, add and revoke touch several of them at once, which Redis Cluster
//! allows only within one slot. API keys are few and rarely change, so one slot holds them
//! easily.
//!
//! Gateways poll the version and epoch (one `MGET`), and read everything at one version when
//! they moved (see `account::keys_api::shared`). This module is the I/O only; what to do with
//! the rows (the cache file, pending revocations, tombstones, publishing) is the keys API's.

use std::time::Duration;

use drg_base::infra::redis::config::RedisConfig;
use drg_base::infra::redis::RedisLink;

use super::managed::{ManagedKey, Tombstone};

pub mod layout;
pub mod pending;
mod script;
pub mod tombstones;

/// Why the shared store did not answer (each one: treat Redis as away).
#[derive(Debug, thiserror::Error)]
pub enum SharedKeysError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis: no answer within {0} ms")]
    TimedOut(u128),
    #[error("redis: a row is not JSON: {0}")]
    Row(#[from] serde_json::Error),
    #[error("no random numbers for a new epoch: {0}")]
    Random(#[from] getrandom::Error),
}

/// Which data set, at which change: two equal stamps read the same keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub epoch: String,
    pub version: u64,
}

/// Everything the store holds, at one stamp.
#[derive(Debug)]
pub struct Snapshot {
    pub stamp: Stamp,
    /// The rows, by id, with their last use filled in.
    pub rows: Vec<ManagedKey>,
    /// Rows that are not a managed key's JSON (left out, for a warning).
    pub unreadable: Vec<String>,
    /// The tombstones of the rows read and of the ids the reader knew.
    pub revoked: Vec<Tombstone>,
}

/// What putting keys back came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// Rows put back.
    pub restored: u64,
    /// Rows a tombstone revoked, removed (with what they made).
    pub removed: u64,
    /// The data set's new name, when asked for one.
    pub epoch: Option<String>,
}

/// A tombstone as Redis keeps it (the id is its field).
#[derive(serde::Serialize, serde::Deserialize)]
struct Stored<'a> {
    project: std::borrow::Cow<'a, str>,
    at: u64,
}

/// What making a key came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    Made,
    /// The project holds `max_keys` keys already.
    Full,
    /// Another key has this id: draw another.
    IdTaken,
}

/// What rotating a key came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotated {
    Rotated,
    /// The project holds more than `max_keys` keys.
    Full,
    /// Another key has the new id: draw another.
    IdTaken,
    /// The old row changed since it was read (rotated elsewhere): read it again.
    Changed,
    /// The old row is gone (revoked meanwhile).
    Gone,
}

/// The shared keys store on the quota's Redis.
pub struct SharedKeys {
    link: drg_base::infra::redis::LazyLink,
    create: redis::Script,
    revoke: redis::Script,
    rotate: redis::Script,
    read: redis::Script,
    save_used: redis::Script,
    restore: redis::Script,
}

/// The least budget of one call: reading every row is bigger than a counting call, and none of
/// these calls is on a lookup's path (the quota's budget is set for those).
const MIN_CALL_BUDGET: Duration = Duration::from_secs(1);

impl SharedKeys {
    /// Nothing is sent before the first call: the gateway starts with Redis away.
    pub fn new(config: &RedisConfig) -> Result<Self, getrandom::Error> {
        Ok(SharedKeys {
            link: drg_base::infra::redis::LazyLink::new(config, MIN_CALL_BUDGET),
            create: redis::Script::new(script::CREATE),
            revoke: redis::Script::new(script::REVOKE),
            rotate: redis::Script::new(script::ROTATE),
            read: redis::Script::new(script::READ),
            save_used: redis::Script::new(script::SAVE_USED),
            restore: redis::Script::new(script::RESTORE),
        })
    }

    async fn link(&self) -> Result<RedisLink, SharedKeysError> {
        Ok(self.link.get().await?)
    }

    /// Runs `call` within the call budget.
    async fn timed<T>(
        &self,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, SharedKeysError> {
        self.link.timed(call).await.map_err(|e| match e {
            drg_base::infra::redis::LinkError::Redis(e) => SharedKeysError::Redis(e),
            drg_base::infra::redis::LinkError::TimedOut(ms) => SharedKeysError::TimedOut(ms),
        })
    }

    /// The stamp now (`None` epoch: nothing was ever read from this Redis).
    pub async fn stamp(&self) -> Result<Option<Stamp>, SharedKeysError> {
        let mut link = self.link().await?;
        let mut cmd = redis::cmd("MGET");
        cmd.arg(layout::EPOCH).arg(layout::VERSION);
        let (epoch, version): (Option<String>, Option<u64>) =
            self.timed(cmd.query_async(&mut link)).await?;
        Ok(epoch.map(|epoch| Stamp {
            epoch,
            version: version.unwrap_or(0),
        }))
    }

    /// Every row at one stamp, with the tombstones of the rows and of the ids in `known` (the
    /// keys the reader knew). A store without an epoch gets a new one, never one named before:
    /// the name of a data set lost is never the name of the next.
    pub async fn read(&self, known: &[&str]) -> Result<Snapshot, SharedKeysError> {
        let epoch = new_epoch()?;
        let mut link = self.link().await?;
        let mut call = self.read.prepare_invoke();
        call.key(layout::ROWS)
            .key(layout::USED)
            .key(layout::VERSION)
            .key(layout::EPOCH)
            .key(layout::REVOKED)
            .arg(epoch);
        for id in known {
            call.arg(*id);
        }
        type Reply = (String, u64, Vec<String>, Vec<String>, Vec<String>);
        let (epoch, version, rows, used, revoked): Reply =
            self.timed(call.invoke_async(&mut link)).await?;
        let mut s = snapshot(Stamp { epoch, version }, &rows, &used);
        s.revoked = tombstones_of(&revoked);
        Ok(s)
    }

    /// After the store lost data: publishes `revoked` (a tombstone there stays), removes every
    /// row a tombstone revokes (with what it made), then puts `rows` back (a gateway's last
    /// known keys) less those revoked; rows still there stay as they are. `anew`: the data set
    /// gets a new epoch, so that every other gateway sees the loss too (a store gone back to an
    /// older state keeps its epoch).
    pub async fn restore(
        &self,
        rows: &[ManagedKey],
        revoked: &[Tombstone],
        anew: bool,
    ) -> Result<Restored, SharedKeysError> {
        let epoch = if anew { new_epoch()? } else { String::new() };
        let mut link = self.link().await?;
        let mut call = self.restore.prepare_invoke();
        call.key(layout::ROWS)
            .key(layout::USED)
            .key(layout::VERSION)
            .key(layout::REVOKED)
            .key(layout::EPOCH);
        let projects: std::collections::BTreeSet<&str> = rows
            .iter()
            .map(|r| r.project.as_str())
            .chain(revoked.iter().map(|t| t.project.as_str()))
            .collect();
        for p in projects {
            call.key(layout::project(p));
        }
        call.arg(tombstones::now_unix())
            .arg(step())
            .arg(tombstones::LIFETIME_SECS)
            .arg(&epoch)
            .arg(revoked.len());
        for t in revoked {
            call.arg(&t.id).arg(stored_tombstone(t)?);
        }
        for row in rows {
            call.arg(&row.id).arg(serde_json::to_string(&stored(row))?);
        }
        let (restored, removed): (u64, u64) = self.timed(call.invoke_async(&mut link)).await?;
        Ok(Restored {
            restored,
            removed,
            epoch: anew.then_some(epoch),
        })
    }

    /// Adds `row` unless its project holds `max` keys with the operator's `operator` ones.
    pub async fn create(
        &self,
        row: &ManagedKey,
        operator: usize,
        max: u32,
    ) -> Result<Made, SharedKeysError> {
        let mut link = self.link().await?;
        let json = serde_json::to_string(&stored(row))?;
        let mut call = self.create.prepare_invoke();
        call.key(layout::ROWS)
            .key(layout::project(&row.project))
            .key(layout::VERSION)
            .key(layout::REVOKED)
            .arg(&row.id)
            .arg(json)
            .arg(operator)
            .arg(max)
            .arg(step());
        let reply: i64 = self.timed(call.invoke_async(&mut link)).await?;
        Ok(match reply {
            -1 => Made::IdTaken,
            0 => Made::Full,
            _ => Made::Made,
        })
    }

    /// The row of `id` as stored (the exact JSON, for [`Self::rotate`] to compare), if any.
    pub async fn row(&self, id: &str) -> Result<Option<String>, SharedKeysError> {
        let mut link = self.link().await?;
        let mut cmd = redis::cmd("HGET");
        cmd.arg(layout::ROWS).arg(id);
        self.timed(cmd.query_async(&mut link)).await
    }

    /// Rotates a key: `old` (its row as read, `expected`) becomes `rotated` and `new` is added,
    /// in one script, only while the old row is still `expected` and the project holds at most
    /// `max` keys with the operator's `operator` ones (the script `ROTATE`).
    pub async fn rotate(
        &self,
        expected: &str,
        rotated: &ManagedKey,
        new: &ManagedKey,
        operator: usize,
        max: u32,
    ) -> Result<Rotated, SharedKeysError> {
        let mut link = self.link().await?;
        let mut call = self.rotate.prepare_invoke();
        call.key(layout::ROWS)
            .key(layout::project(&new.project))
            .key(layout::VERSION)
            .key(layout::REVOKED)
            .arg(&rotated.id)
            .arg(expected)
            .arg(serde_json::to_string(&stored(rotated))?)
            .arg(&new.id)
            .arg(serde_json::to_string(&stored(new))?)
            .arg(operator)
            .arg(max)
            .arg(step());
        let reply: i64 = self.timed(call.invoke_async(&mut link)).await?;
        Ok(match reply {
            -3 => Rotated::Gone,
            -2 => Rotated::Changed,
            -1 => Rotated::IdTaken,
            0 => Rotated::Full,
            _ => Rotated::Rotated,
        })
    }

    /// Revokes the API-made key `id` of `project` and every key it made, recursively, each
    /// kept as a tombstone; so are the ids in `known` (the key's lineage as the caller knows
    /// it), also those Redis has no row of (it may have lost them). The ids of the rows that
    /// went (none: the project has no row `id`).
    pub async fn revoke(
        &self,
        project: &str,
        id: &str,
        known: &[String],
    ) -> Result<Vec<String>, SharedKeysError> {
        let mut link = self.link().await?;
        let mut call = self.revoke.prepare_invoke();
        call.key(layout::ROWS)
            .key(layout::USED)
            .key(layout::VERSION)
            .key(layout::project(project))
            .key(layout::REVOKED)
            .arg(id)
            .arg(project)
            .arg(tombstones::now_unix())
            .arg(step())
            .arg(tombstones::LIFETIME_SECS);
        for k in known {
            call.arg(k);
        }
        self.timed(call.invoke_async(&mut link)).await
    }

    /// Records when keys were last used (id, unix seconds); a later time saved by another
    /// gateway stays.
    pub async fn save_used(&self, used: &[(String, u64)]) -> Result<(), SharedKeysError> {
        if used.is_empty() {
            return Ok(());
        }
        let mut link = self.link().await?;
        let mut call = self.save_used.prepare_invoke();
        call.key(layout::USED).key(layout::ROWS);
        for (id, t) in used {
            call.arg(id).arg(*t);
        }
        let _: i64 = self.timed(call.invoke_async(&mut link)).await?;
        Ok(())
    }
}

/// A fresh name for a data set (64 random bits).
fn new_epoch() -> Result<String, getrandom::Error> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b)?;
    Ok(hex::encode(b))
}

/// How far a change moves the version: drawn at random (1 to 2^20), so that two histories of one
/// data set almost never meet at one version (see [`script`]). No random numbers: 1.
fn step() -> u64 {
    let mut b = [0u8; 4];
    match getrandom::fill(&mut b) {
        Ok(()) => u64::from(u32::from_le_bytes(b) >> 12) + 1,
        Err(_) => 1,
    }
}

/// A tombstone's value in Redis.
fn stored_tombstone(t: &Tombstone) -> Result<String, serde_json::Error> {
    serde_json::to_string(&Stored {
        project: std::borrow::Cow::Borrowed(&t.project),
        at: t.at,
    })
}

/// The tombstones of a reply's id/value pairs (one an id, each; a value not understood is
/// left out: it revokes nothing this gateway could check).
fn tombstones_of(pairs: &[String]) -> Vec<Tombstone> {
    let mut out: Vec<Tombstone> = Vec::new();
    for p in pairs.chunks_exact(2) {
        if let Ok(s) = serde_json::from_str::<Stored>(&p[1]) {
            tombstones::add(
                &mut out,
                Tombstone {
                    id: p[0].clone(),
                    project: s.project.into_owned(),
                    at: s.at,
                },
            );
        }
    }
    out
}

/// A row as stored: the last use lives in its own hash (saved often, and no change of the keys).
fn stored(row: &ManagedKey) -> ManagedKey {
    ManagedKey {
        last_used: None,
        ..row.clone()
    }
}

/// The rows of a [`script::READ`] reply (field/value pairs), last uses filled in, by id.
fn snapshot(stamp: Stamp, rows: &[String], used: &[String]) -> Snapshot {
    let used: std::collections::HashMap<&str, u64> = used
        .chunks_exact(2)
        .filter_map(|p| Some((p[0].as_str(), p[1].parse().ok()?)))
        .collect();
    let mut out = Vec::with_capacity(rows.len() / 2);
    let mut unreadable = Vec::new();
    for pair in rows.chunks_exact(2) {
        match serde_json::from_str::<ManagedKey>(&pair[1]) {
            Ok(mut row) if row.id == pair[0] => {
                row.last_used = used.get(row.id.as_str()).copied();
                out.push(row);
            }
            _ => unreadable.push(pair[0].clone()),
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Snapshot {
        stamp,
        rows: out,
        unreadable,
        revoked: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str) -> ManagedKey {
        ManagedKey {
            last_used: Some(7),
            ..crate::managed::test_key(id, "acme", Some("server"))
        }
    }

    #[test]
    fn tombstones_are_read_from_id_value_pairs_and_steps_stay_in_range() {
        let pairs = [
            "key_a",
            r#"{"project":"acme","at":5}"#,
            "key_b",
            "not json",
            "key_a",
            r#"{"project":"other","at":9}"#,
        ]
        .map(String::from);
        let t = tombstones_of(&pairs);
        let a = Tombstone {
            id: "key_a".into(),
            project: "acme".into(),
            at: 5,
        };
        assert_eq!(t.len(), 1, "once each");
        assert_eq!(t[0], a, "the first wins");
        assert_eq!(
            stored_tombstone(&a).unwrap(),
            r#"{"project":"acme","at":5}"#
        );
        for _ in 0..1_000 {
            assert!((1..=1 << 20).contains(&step()));
        }
        assert_ne!(new_epoch().unwrap(), new_epoch().unwrap());
    }

    #[test]
    fn a_reply_becomes_rows_by_id_with_their_last_use_and_bad_rows_are_named() {
        let json = |r: &ManagedKey| serde_json::to_string(&stored(r)).unwrap();
        let (b, a) = (row("key_b"), row("key_a"));
        let rows = [
            "key_b".to_owned(),
            json(&b),
            "key_a".to_owned(),
            json(&a),
            "key_x".to_owned(),
            "{not json".to_owned(),
            "key_y".to_owned(),
            json(&a),
        ];
        let used = ["key_a".to_owned(), "42".to_owned()];
        let stamp = Stamp {
            epoch: "e".into(),
            version: 3,
        };
        let s = snapshot(stamp.clone(), &rows, &used);
        assert_eq!(s.stamp, stamp);
        let ids: Vec<_> = s.rows.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["key_a", "key_b"]);
        assert_eq!(s.rows[0].last_used, Some(42));
        assert_eq!(s.rows[1].last_used, None, "stored rows carry no last use");
        assert_eq!(
            s.unreadable,
            ["key_x", "key_y"],
            "a row under another id is bad too"
        );
    }
}
