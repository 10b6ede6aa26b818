//! A kind's revision: a number every write moves, and a token drawn by that write. A restore
//! from an older backup, or a failover to a replica that lagged, takes the number back, and the
//! writes after it may bring it back to, or past, a number a gateway holds (one paused or cut
//! off across it); their tokens differ, and the store keeps the tokens of its recent revisions
//! (`drg_revision_log`), so a gateway tells a history that went another way from one that only
//! moved on, whatever number the counter reaches.

use std::collections::BTreeSet;

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

/// What a write changed of its kind, as the revision log keeps it: what a gateway holding the
/// revision before reads to hold the one after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touched<'a> {
    /// Anything (an import, the keys): the kind is read whole.
    Kind,
    /// Any of the project's records (a write that trimmed its removal markers).
    Project(&'a str),
    /// The one record (its row written or dropped).
    Record { project: &'a str, key: &'a str },
}

impl Touched<'_> {
    fn columns(self) -> (Option<String>, Option<String>) {
        match self {
            Touched::Kind => (None, None),
            Touched::Project(p) => (Some(p.to_owned()), None),
            Touched::Record { project, key } => (Some(project.to_owned()), Some(key.to_owned())),
        }
    }
}

/// Moves `kind`'s revision in `tx` (made at 1 the first time) under a new token, kept in the
/// log with what the write `touched`; on PostgreSQL the row stays locked to the end of the
/// transaction (and carries its deadline). Where it is now.
pub async fn move_revision(
    tx: &mut Tx,
    kind: &str,
    touched: Touched<'_>,
) -> Result<Revision, sqlx::Error> {
    let token = new_token();
    let (project, key) = touched.columns();
    let n: i64 = if tx.backend_name() == "PostgreSQL" {
        // One round trip: PostgreSQL writes both tables in one statement.
        sqlx::query_scalar(
            "WITH r AS (
               INSERT INTO drg_revision (kind, n, token) VALUES ($1, 1, $2)
               ON CONFLICT (kind) DO UPDATE SET n = drg_revision.n + 1, token = $2 RETURNING n)
             INSERT INTO drg_revision_log (kind, n, token, project, key)
             SELECT $1, r.n, $2, $3, $4 FROM r
             ON CONFLICT (kind, n) DO UPDATE SET token = $2, project = $3, key = $4
             RETURNING n",
        )
        .bind(kind.to_owned())
        .bind(token.clone())
        .bind(project)
        .bind(key)
        .fetch_one(&mut **tx)
        .await?
    } else {
        let n = sqlx::query_scalar(
            "INSERT INTO drg_revision (kind, n, token) VALUES ($1, 1, $2)
             ON CONFLICT (kind) DO UPDATE SET n = drg_revision.n + 1, token = $2 RETURNING n",
        )
        .bind(kind.to_owned())
        .bind(token.clone())
        .fetch_one(&mut **tx)
        .await?;
        sqlx::query(
            "INSERT INTO drg_revision_log (kind, n, token, project, key) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (kind, n) DO UPDATE SET token = $3, project = $4, key = $5",
        )
        .bind(kind.to_owned())
        .bind(n)
        .bind(token.clone())
        .bind(project)
        .bind(key)
        .execute(&mut **tx)
        .await?;
        n
    };
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

/// What `kind`'s writes changed after `held`, up to `now`: the projects changed whole and the
/// records changed one by one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub projects: BTreeSet<String>,
    /// `(project, key)`, none of a project in `projects`.
    pub records: BTreeSet<(String, String)>,
}

impl Changes {
    /// How many projects and records there are to read.
    pub fn len(&self) -> usize {
        self.projects.len() + self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A revision this gateway made itself, and holds since (its write is held as it answered).
pub type Own = (i64, String);

/// The revisions of a kind this gateway's writes made lately (the last [`OWN_KEPT`]): its
/// follower leaves them out, and one that fell further behind its own writes reads them.
#[derive(Debug, Default)]
pub struct Owned(std::sync::Mutex<std::collections::VecDeque<Own>>);

/// Own revisions remembered.
const OWN_KEPT: usize = 64;

impl Owned {
    /// Notes revision `at`, made by this gateway's write: the caller holds the write as it
    /// answers, so this gateway need not read it back.
    pub fn made(&self, at: &Revision) {
        let mut own = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if own.len() == OWN_KEPT {
            own.pop_front();
        }
        own.push_back((at.n, at.token.clone()));
    }

    /// The revisions noted, oldest first.
    pub fn list(&self) -> Vec<Own> {
        (self.0.lock().unwrap_or_else(|e| e.into_inner()))
            .iter()
            .cloned()
            .collect()
    }
}

/// What `kind`'s writes changed after `held`, up to `now`, when the log tells it all: `held`'s
/// own token still there (the history it was read from is the store's), every revision
/// between logged, each naming what it touched. The revisions in `own` are left out. `None`:
/// the kind is read whole.
pub async fn changes_since<'c, E>(
    conn: E,
    kind: &str,
    held: &Revision,
    now: &Revision,
    own: &[Own],
) -> Result<Option<Changes>, sqlx::Error>
where
    E: sqlx::Executor<'c, Database = sqlx::Any>,
{
    if held.token.is_empty() || now.n <= held.n {
        return Ok(None);
    }
    let rows: Vec<LogRow> = sqlx::query_as(
        "SELECT n, token, project, key FROM drg_revision_log
         WHERE kind = $1 AND n >= $2 AND n <= $3 ORDER BY n",
    )
    .bind(kind.to_owned())
    .bind(held.n)
    .bind(now.n)
    .fetch_all(conn)
    .await?;
    Ok(changed(&rows, held, now, own))
}

/// A row of the revision log: number, token, project, key.
type LogRow = (i64, String, Option<String>, Option<String>);

/// What [`changes_since`] makes of the log's `rows` from `held` to `now`.
fn changed(rows: &[LogRow], held: &Revision, now: &Revision, own: &[Own]) -> Option<Changes> {
    let whole = usize::try_from(now.n - held.n + 1).ok()?;
    let (first, rest) = rows.split_first()?;
    let (last_n, last_token, ..) = rows.last()?;
    let ours = first.0 == held.n && first.1 == held.token;
    if !ours || rows.len() != whole || *last_n != now.n || *last_token != now.token {
        return None;
    }
    let mut changes = Changes::default();
    for (n, token, project, key) in rest {
        if own.iter().any(|(m, t)| m == n && t == token) {
            continue;
        }
        match (project.clone()?, key) {
            (p, Some(k)) => {
                changes.records.insert((p, k.clone()));
            }
            (p, None) => {
                changes.projects.insert(p);
            }
        }
    }
    let projects = &changes.projects;
    changes.records.retain(|(p, _)| !projects.contains(p));
    Some(changes)
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
    fn what_changed_is_told_only_from_a_whole_log_of_the_history_held() {
        let rev = |n: i64, t: &str| Revision { n, token: t.into() };
        let row = |n: i64, t: &str, p: Option<&str>, k: Option<&str>| {
            (n, t.to_owned(), p.map(str::to_owned), k.map(str::to_owned))
        };
        let rows = [
            row(4, "a", Some("x"), Some("k")),
            row(5, "b", Some("p"), None),
            row(6, "c", Some("q"), Some("k1")),
            row(7, "d", Some("p"), Some("k2")),
        ];
        let told = changed(&rows, &rev(4, "a"), &rev(7, "d"), &[]).unwrap();
        assert_eq!(told.projects.into_iter().collect::<Vec<_>>(), ["p"]);
        let records: Vec<_> = told.records.into_iter().collect();
        assert_eq!(
            records,
            [("q".to_owned(), "k1".to_owned())],
            "p's is in p whole"
        );
        // This gateway's own revisions are held already.
        let own = [(5, "b".to_owned()), (6, "c".to_owned())];
        let told = changed(&rows, &rev(4, "a"), &rev(7, "d"), &own).unwrap();
        assert!(told.projects.is_empty());
        assert_eq!(told.records.len(), 1);
        let all = [
            (5, "b".to_owned()),
            (6, "c".to_owned()),
            (7, "d".to_owned()),
        ];
        assert!(changed(&rows, &rev(4, "a"), &rev(7, "d"), &all)
            .unwrap()
            .is_empty());
        // A token that is not the one this gateway drew is another's write.
        let other = [(5, "z".to_owned())];
        let told = changed(&rows, &rev(4, "a"), &rev(7, "d"), &other).unwrap();
        assert_eq!(told.projects.len(), 1);
        // Another history at the number held, a gap, the whole kind, a newer end.
        assert_eq!(changed(&rows, &rev(4, "z"), &rev(7, "d"), &[]), None);
        let gap = [rows[0].clone(), rows[2].clone(), rows[3].clone()];
        assert_eq!(changed(&gap, &rev(4, "a"), &rev(7, "d"), &[]), None);
        let kind = [rows[0].clone(), row(5, "b", None, None), rows[2].clone()];
        assert_eq!(changed(&kind, &rev(4, "a"), &rev(6, "c"), &[]), None);
        assert_eq!(changed(&rows, &rev(4, "a"), &rev(8, "e"), &[]), None);
    }
}
