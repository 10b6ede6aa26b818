//! Operator keys leaving the control store, audited: `key sync` applies a keys file to the
//! store (the keys whose maker the file no longer holds revoked, with theirs, and their makers
//! retired, refused by every gateway, as is an operator key an earlier sync applied that the
//! file no longer holds though it made nothing; a retired key the file holds again brought
//! back), and a
//! revocation an earlier release remembered or one gateway's own keys file decided (SQLite)
//! dropped with an audit entry for every key it takes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use drg_access::managed::ManagedKey;
use drg_base::infra::control::audit::{self, AuditRow};
use drg_base::infra::control::{Control, ControlError, Write};

use super::control::KIND;
use drg_base::infra::control::{move_revision, Touched};

type Tx = sqlx::Transaction<'static, sqlx::Any>;

/// How long these audit entries are kept (the longest plan's retention).
pub const AUDIT_KEEP_DAYS: u32 = 90;

/// Who revoked, and why, as the audit trail says it.
pub struct Why<'a> {
    /// The audit entry's actor (`key sync`, `migrate`, `keys.yaml`).
    pub by: &'a str,
    pub detail: &'a str,
}

/// Revokes the keys `ids` the store holds and every key they made (the foreign key's cascade),
/// with an audit entry for each key gone; the ids gone, roots first.
pub async fn revoke_audited(
    tx: &mut Tx,
    ids: &[String],
    why: &Why<'_>,
) -> Result<Vec<String>, sqlx::Error> {
    let rows: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT id, project, parent FROM drg_keys")
            .fetch_all(&mut **tx)
            .await?;
    let project: HashMap<&str, &str> = rows.iter().map(|(i, p, _)| (&**i, &**p)).collect();
    let mut gone: Vec<String> = Vec::new();
    let at =
        drg_base::infra::units::utc_seconds(chrono::Utc::now().timestamp()).unwrap_or_default();
    for id in ids.iter().filter(|id| project.contains_key(id.as_str())) {
        if gone.contains(id) {
            continue;
        }
        let tree = descendants(&rows, id);
        sqlx::query("DELETE FROM drg_keys WHERE id = $1")
            .bind(id.clone())
            .execute(&mut **tx)
            .await?;
        for (n, key) in tree.iter().enumerate() {
            let detail = if n == 0 {
                why.detail.to_owned()
            } else {
                format!("with the key that made it ({id})")
            };
            let row = AuditRow {
                project: project[key.as_str()].to_owned(),
                id: None,
                at: at.clone(),
                key_id: why.by.to_owned(),
                action: drg_base::answer::Action::KeyRevoked.as_str().to_owned(),
                target: key.clone(),
                detail,
            };
            audit::append(tx, &row, AUDIT_KEEP_DAYS).await?;
        }
        gone.extend(tree);
    }
    Ok(gone)
}

/// `root` and every key below it, by `parent`, root first.
fn descendants(rows: &[(String, String, Option<String>)], root: &str) -> Vec<String> {
    let mut out = vec![root.to_owned()];
    let mut at = 0;
    while at < out.len() {
        let id = out[at].clone();
        for (child, _, parent) in rows {
            if parent.as_deref() == Some(&id) && !out.contains(child) {
                out.push(child.clone());
            }
        }
        at += 1;
    }
    out
}

/// What `key sync` did (or, dry, would do).
#[derive(Debug, Default)]
pub struct Synced {
    /// Operator keys retired now: (id, the keys revoked with what they made).
    pub retired: Vec<(String, Vec<String>)>,
    /// Retired operator keys the file holds again, back in service.
    pub restored: Vec<String>,
}

/// Applies the keys file's operator keys (id -> project) to the store, in one transaction:
/// every API-made key whose maker is an operator key the file does not hold is revoked with
/// what it made (audited, by `key sync`), that maker retired (every gateway refuses it,
/// whatever its own keys file says), and so is an operator key an earlier sync applied that
/// the file lacks, though it made nothing (audited too: the store knew it only from that
/// sync); a retired key the file holds is brought back, and the file's keys are recorded as
/// the ones applied. `dry`: rolled back.
pub async fn sync_makers(
    control: &Arc<Control>,
    operator: &BTreeMap<String, String>,
    dry: bool,
) -> Result<Synced, ControlError> {
    let sql = control.sql();
    let call = async {
        let until = control.deadline();
        let Write { mut tx, .. } = control.write_telling(until, Some(KIND)).await?;
        move_revision(&mut tx, KIND, Touched::Kind)
            .await
            .map_err(&sql)?;
        let roots: Vec<String> =
            sqlx::query_scalar("SELECT body FROM drg_keys WHERE parent IS NULL")
                .fetch_all(&mut *tx)
                .await
                .map_err(&sql)?;
        // Each maker the file lacks, with the keys it made (oldest rows keep no maker: they
        // follow their project, as the gateways serve them).
        let mut gone: Vec<(String, Vec<String>)> = Vec::new();
        for key in roots
            .iter()
            .filter_map(|b| serde_json::from_str::<ManagedKey>(b).ok())
        {
            let Some(maker) = key.created_by.filter(|m| !operator.contains_key(m)) else {
                continue;
            };
            match gone.iter_mut().find(|(m, _)| *m == maker) {
                Some((_, made)) => made.push(key.id),
                None => gone.push((maker, vec![key.id])),
            }
        }
        let mut synced = Synced::default();
        let at =
            drg_base::infra::units::utc_seconds(chrono::Utc::now().timestamp()).unwrap_or_default();
        for (maker, made) in gone {
            let detail =
                format!("its maker, operator key {maker}, is not in the keys file applied");
            let why = Why {
                by: "key sync",
                detail: &detail,
            };
            let revoked = revoke_audited(&mut tx, &made, &why).await.map_err(&sql)?;
            retire(&mut tx, &maker, &at).await.map_err(&sql)?;
            synced.retired.push((maker, revoked));
        }
        let already = retired(&mut tx).await.map_err(&sql)?;
        let applied = apply_keys(&mut tx, operator, &already, &at).await;
        synced.retired.extend(applied.map_err(&sql)?);
        for id in already.into_iter().filter(|id| operator.contains_key(id)) {
            sqlx::query("DELETE FROM drg_retired WHERE id = $1")
                .bind(id.clone())
                .execute(&mut *tx)
                .await
                .map_err(&sql)?;
            synced.restored.push(id);
        }
        if dry {
            tx.rollback().await.map_err(&sql)?;
        } else {
            tx.commit().await.map_err(&sql)?;
        }
        Ok::<_, ControlError>(synced)
    };
    control.within(call).await
}

/// Retires, audited, the operator keys an earlier sync applied that `operator` (the file
/// applied now) lacks, though they made nothing (those `already` retired, the makers this sync
/// retired among them, left as they are), and records `operator` as the keys applied: the
/// keys retired.
async fn apply_keys(
    tx: &mut Tx,
    operator: &BTreeMap<String, String>,
    already: &[String],
    at: &str,
) -> Result<Vec<(String, Vec<String>)>, sqlx::Error> {
    let applied: Vec<(String, String)> =
        sqlx::query_as("SELECT id, project FROM drg_applied_keys ORDER BY id")
            .fetch_all(&mut **tx)
            .await?;
    let mut out = Vec::new();
    for (id, project) in applied {
        if operator.contains_key(&id) || already.contains(&id) {
            continue;
        }
        retire(tx, &id, at).await?;
        let row = AuditRow {
            project,
            id: None,
            at: at.to_owned(),
            key_id: "key sync".to_owned(),
            action: drg_base::answer::Action::KeyRevoked.as_str().to_owned(),
            target: id.clone(),
            detail: "operator key retired: not in the keys file applied".to_owned(),
        };
        audit::append(tx, &row, AUDIT_KEEP_DAYS).await?;
        out.push((id, Vec::new()));
    }
    sqlx::query("DELETE FROM drg_applied_keys")
        .execute(&mut **tx)
        .await?;
    for (id, project) in operator {
        sqlx::query("INSERT INTO drg_applied_keys (id, project) VALUES ($1, $2)")
            .bind(id.clone())
            .bind(project.clone())
            .execute(&mut **tx)
            .await?;
    }
    Ok(out)
}

/// Revokes the API-made key `id` and what it made, by the operator (`key revoke`: a key a
/// restore brought back, a key whose holder is gone), audited: the keys gone.
pub async fn revoke_by_operator(
    control: &Arc<Control>,
    id: &str,
) -> Result<Vec<String>, ControlError> {
    let sql = control.sql();
    let call = async {
        let until = control.deadline();
        let Write { mut tx, .. } = control.write_telling(until, Some(KIND)).await?;
        move_revision(&mut tx, KIND, Touched::Kind)
            .await
            .map_err(&sql)?;
        let why = Why {
            by: "key revoke",
            detail: "revoked by the operator",
        };
        let gone = revoke_audited(&mut tx, &[id.to_owned()], &why)
            .await
            .map_err(&sql)?;
        tx.commit().await.map_err(&sql)?;
        Ok::<_, ControlError>(gone)
    };
    control.within(call).await
}

/// Records `id` retired (a second sync keeps the first time).
async fn retire(tx: &mut Tx, id: &str, at: &str) -> Result<(), sqlx::Error> {
    sqlx::query("INSERT INTO drg_retired (id, at) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING")
        .bind(id.to_owned())
        .bind(at.to_owned())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The operator keys the store retired.
pub async fn retired(tx: &mut Tx) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM drg_retired ORDER BY id")
        .fetch_all(&mut **tx)
        .await
}

/// Whether the store retired operator key `id` (a gateway whose keys file still holds it must
/// not make keys with it).
pub async fn is_retired(tx: &mut Tx, id: &str) -> Result<bool, sqlx::Error> {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM drg_retired WHERE id = $1")
        .bind(id.to_owned())
        .fetch_one(&mut **tx)
        .await?;
    Ok(n > 0)
}
