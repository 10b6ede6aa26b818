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

/// The log is trimmed at every revision whose number this divides.
const TRIM_EVERY: i64 = 32;

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
/// log with the `project` the write changed (`None`: any, the whole kind is read again); on
/// PostgreSQL the row stays locked to the end of the transaction (and carries its deadline).
/// Where it is now.
pub async fn move_revision(
    tx: &mut Tx,
    kind: &str,
    project: Option<&str>,
) -> Result<Revision, sqlx::Error> {
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
        "INSERT INTO drg_revision_log (kind, n, token, project) VALUES ($1, $2, $3, $4)
         ON CONFLICT (kind, n) DO UPDATE SET token = $3, project = $4",
    )
    .bind(kind.to_owned())
    .bind(n)
    .bind(token.clone())
    .bind(project.map(str::to_owned))
    .execute(&mut **tx)
    .await?;
    // Trimmed every [`TRIM_EVERY`] revisions, not at each: a round trip fewer a write, and
    // the log holds at most that many past [`KEPT`].
    if n % TRIM_EVERY == 0 {
        sqlx::query("DELETE FROM drg_revision_log WHERE kind = $1 AND n <= $2")
            .bind(kind.to_owned())
            .bind(n - KEPT)
            .execute(&mut **tx)
            .await?;
    }
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

/// The projects `kind`'s writes changed after `held`, up to `now`, when the log tells them
/// all: `held`'s own token still there (the history it was read from is the store's), every
/// revision between logged, each naming its project. `None`: the kind is read whole.
pub async fn projects_since<'c, E>(
    conn: E,
    kind: &str,
    held: &Revision,
    now: &Revision,
) -> Result<Option<std::collections::BTreeSet<String>>, sqlx::Error>
where
    E: sqlx::Executor<'c, Database = sqlx::Any>,
{
    if held.token.is_empty() || now.n <= held.n {
        return Ok(None);
    }
    let rows: Vec<(i64, String, Option<String>)> = sqlx::query_as(
        "SELECT n, token, project FROM drg_revision_log
         WHERE kind = $1 AND n >= $2 AND n <= $3 ORDER BY n",
    )
    .bind(kind.to_owned())
    .bind(held.n)
    .bind(now.n)
    .fetch_all(conn)
    .await?;
    Ok(changed_projects(&rows, held, now))
}

/// What [`projects_since`] makes of the log's `rows` from `held` to `now`.
fn changed_projects(
    rows: &[(i64, String, Option<String>)],
    held: &Revision,
    now: &Revision,
) -> Option<std::collections::BTreeSet<String>> {
    let whole = usize::try_from(now.n - held.n + 1).ok()?;
    let (first, rest) = rows.split_first()?;
    let (last_n, last_token, _) = rows.last()?;
    let ours = first.0 == held.n && first.1 == held.token;
    if !ours || rows.len() != whole || *last_n != now.n || *last_token != now.token {
        return None;
    }
    rest.iter().map(|(_, _, p)| p.clone()).collect()
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

    #[test]
    fn the_projects_changed_are_told_only_from_a_whole_log_of_the_history_held() {
        let rev = |n: i64, t: &str| Revision { n, token: t.into() };
        let row = |n: i64, t: &str, p: Option<&str>| (n, t.to_owned(), p.map(str::to_owned));
        let rows = [
            row(4, "a", Some("x")),
            row(5, "b", Some("p")),
            row(6, "c", Some("q")),
        ];
        let told = changed_projects(&rows, &rev(4, "a"), &rev(6, "c")).unwrap();
        assert_eq!(told.into_iter().collect::<Vec<_>>(), ["p", "q"]);
        // Another history at the number held, a gap, an unknown project, a newer end.
        assert_eq!(changed_projects(&rows, &rev(4, "z"), &rev(6, "c")), None);
        assert_eq!(
            changed_projects(
                &[rows[0].clone(), rows[2].clone()],
                &rev(4, "a"),
                &rev(6, "c")
            ),
            None
        );
        let whole = [rows[0].clone(), row(5, "b", None), rows[2].clone()];
        assert_eq!(changed_projects(&whole, &rev(4, "a"), &rev(6, "c")), None);
        assert_eq!(changed_projects(&rows, &rev(4, "a"), &rev(7, "d")), None);
    }
}
