//! A kind's revision: a number every write moves, and a token drawn by that write. A restore
//! from an older backup, or a failover to a replica that lagged, takes the number back, and the
//! writes after it may bring it back to, or past, a number a gateway holds (one paused or cut
//! off across it); their tokens differ, and the store keeps the tokens of its recent revisions
//! (`drg_revision_log`), so a gateway tells a history that went another way from one that only
//! moved on, whatever number the counter reaches.

use super::Tx;

/// Revisions whose tokens the store keeps, a kind: a gateway behind by more can no longer
/// tell whether the history it held is the store's (it reads the kind again all the same).
const KEPT: i64 = 512;

/// Where a kind is: the number, and the token of the write that made it (empty before the
/// first write, and for a revision made before tokens were kept).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revision {
    pub n: i64,
    pub token: String,
}

impl Revision {
    /// The poll's word for `kind` at this revision (see `watch.rs`).
    pub fn word(&self, kind: &str) -> String {
        format!("{kind}@{}@{}", self.n, self.token)
    }

    /// The revision the poll's word `said` tells of `kind`, if it is of that kind.
    pub fn told(said: &str, kind: &str) -> Option<Revision> {
        let rest = said.strip_prefix(kind)?.strip_prefix('@')?;
        let (n, token) = rest.split_once('@').unwrap_or((rest, ""));
        Some(Revision {
            n: n.parse().ok()?,
            token: token.to_owned(),
        })
    }
}

/// Where `kind`'s revision is (0 before its first write), read on `conn` (a pool, or a
/// transaction whose other reads it must agree with).
pub async fn revision<'c, E>(conn: E, kind: &str) -> Result<Revision, sqlx::Error>
where
    E: sqlx::Executor<'c, Database = sqlx::Any>,
{
    let row: Option<(i64, String)> =
        sqlx::query_as("SELECT n, token FROM drg_revision WHERE kind = $1")
            .bind(kind.to_owned())
            .fetch_optional(conn)
            .await?;
    Ok(row.map_or_else(Revision::default, |(n, token)| Revision { n, token }))
}

/// Moves `kind`'s revision in `tx` (made at 1 the first time) under a new token, kept in the
/// log; on PostgreSQL the row stays locked to the end of the transaction (and carries its
/// deadline). Where it is now.
pub async fn move_revision(tx: &mut Tx, kind: &str) -> Result<Revision, sqlx::Error> {
    let token = new_token();
    let n: i64 = sqlx::query_scalar(
        "INSERT INTO drg_revision (kind, n, token) VALUES ($1, 1, $2)
         ON CONFLICT (kind) DO UPDATE SET n = drg_revision.n + 1, token = $2 RETURNING n",
    )
    .bind(kind.to_owned())
    .bind(token.clone())
    .fetch_one(&mut **tx)
    .await?;
    sqlx::query(
        "INSERT INTO drg_revision_log (kind, n, token) VALUES ($1, $2, $3)
         ON CONFLICT (kind, n) DO UPDATE SET token = $3",
    )
    .bind(kind.to_owned())
    .bind(n)
    .bind(token.clone())
    .execute(&mut **tx)
    .await?;
    sqlx::query("DELETE FROM drg_revision_log WHERE kind = $1 AND n <= $2")
        .bind(kind.to_owned())
        .bind(n - KEPT)
        .execute(&mut **tx)
        .await?;
    Ok(Revision { n, token })
}

/// Whether the store's history of `kind`, now at `now`, is not the one `held` was read from:
/// the number went back, came back to it under another token, or went past it by a revision
/// whose token at `held`'s number differs. `false` when it cannot tell (`held` made before
/// tokens were kept, or older than the log).
pub async fn diverged<'c, E>(
    conn: E,
    kind: &str,
    held: &Revision,
    now: &Revision,
) -> Result<bool, sqlx::Error>
where
    E: sqlx::Executor<'c, Database = sqlx::Any>,
{
    if now.n < held.n {
        return Ok(true);
    }
    if held.token.is_empty() {
        return Ok(false);
    }
    if now.n == held.n {
        return Ok(now.token != held.token);
    }
    let then = token_at(conn, kind, held.n).await?;
    Ok(then.is_some_and(|t| t != held.token))
}

/// The token of `kind`'s revision `n`, if the log still holds it.
pub async fn token_at<'c, E>(conn: E, kind: &str, n: i64) -> Result<Option<String>, sqlx::Error>
where
    E: sqlx::Executor<'c, Database = sqlx::Any>,
{
    sqlx::query_scalar("SELECT token FROM drg_revision_log WHERE kind = $1 AND n = $2")
        .bind(kind.to_owned())
        .bind(n)
        .fetch_optional(conn)
        .await
}

/// 16 hex digits from the system's random source (a clock's when it fails: a token only needs
/// to differ from the one a restore brings back).
fn new_token() -> String {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        let t = chrono::Utc::now().timestamp_nanos_opt().unwrap_or_default();
        b = t.to_le_bytes();
    }
    hex::encode(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_polls_word_carries_the_token_and_reads_back() {
        let r = Revision {
            n: 12,
            token: "00ff".into(),
        };
        assert_eq!(Revision::told(&r.word("overrides"), "overrides"), Some(r));
        assert_eq!(Revision::told("overrides@3", "overrides").unwrap().n, 3);
        assert_eq!(Revision::told("keys@3@x", "overrides"), None);
        assert_eq!(Revision::told("overridesx@3@x", "overrides"), None);
        assert_ne!(new_token(), new_token());
    }
}
