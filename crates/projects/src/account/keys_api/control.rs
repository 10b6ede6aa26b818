//! `/v1/keys` on the control store (`drg_keys`: SQLite in the state folder, PostgreSQL for
//! several gateways): a row a key made through the API, the key that made it (`parent`) a
//! foreign key that drops a key's descendants with it, its last use a column of its own.
//!
//! - A change (a key made, revoked, rotated) is one transaction: the kind's revision row moved
//!   first (changes of keys go one at a time across every gateway, so `max_keys` counted in it
//!   holds exactly), the project's rows read, the change made on them as values
//!   ([`super::expiry`], [`drg_access::managed::without_descendants`]), what moved written, and its audit
//!   entry with it. `2xx`: committed; `503`: not, then or later (the write's deadline); a
//!   `COMMIT` whose answer was lost is found out before the answer.
//! - Each gateway holds the rows it last read (`KeysApi::held`, which the keys reloader merges
//!   with the operator's keys) and follows the revision as the records do (`NOTIFY`, the poll
//!   behind it): a change names its project in the revision log, so another gateway reads that
//!   project's keys alone; its own change is held at once, never read back. A revision lower
//!   than the one held (a restore from an older backup, a replica that lagged) is served whole
//!   and reported on `/readyz`. Nothing is ever written back.
//! - The rows are written to a cache file in the state folder too, so that a gateway restarted
//!   while the store is away serves the keys it last knew.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

use super::{KeysApi, Refused};
use crate::account::audit::{self, Entry};
use drg_access::keys::{KeyEntry, KeyOrigin};
use drg_access::managed::{Makers, ManagedFile, ManagedKey};
use drg_base::answer::Changed;
use drg_base::infra::control::follow::Follower;
use drg_base::infra::control::{
    changes_since, move_revision, token_at, Control, ControlError, Engine, Owned, Revision,
    Touched, Write,
};
use drg_base::infra::records::snapshot::{went_back, WentBack};

/// The kind's name in the store's revisions (and its `NOTIFY`).
pub const KIND: &str = "keys";

/// Last uses written by one statement (two parameters each: well under either engine's limit).
const LAST_USED_BATCH: usize = 500;

/// Projects a follower reads by themselves at most; past it, the keys are read whole.
const MAX_READ: usize = 200;

/// A failing store is logged at WARN at most this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

type Tx = sqlx::Transaction<'static, sqlx::Any>;

/// The keys API's part on the control store.
pub struct ControlKeys {
    control: Arc<Control>,
    /// Reads of the store and this gateway's changes reach what is held one at a time.
    follow: tokio::sync::Mutex<Follow>,
    /// The revision held (-1: none yet), for the poll's word.
    revision_held: arc_swap::ArcSwapOption<Revision>,
    went_back: ArcSwapOption<WentBack>,
    /// The revisions this gateway's changes made lately, held as they were answered.
    own: Owned,
    /// Last uses written to the store, so that unchanged ones are not written again.
    saved: std::sync::Mutex<HashMap<String, u64>>,
    /// Keys whose maker is gone (see `KeysSource::orphans`), dropped from the store.
    orphans: UnboundedSender<Vec<String>>,
    orphans_rx: tokio::sync::Mutex<UnboundedReceiver<Vec<String>>>,
    /// Orphans told and not dropped yet (the next round drops them first).
    orphans_told: std::sync::Mutex<Vec<String>>,
}

#[derive(Default)]
struct Follow {
    /// The revision last read.
    last: Option<Revision>,
    warned: Option<Instant>,
}

/// A change committed: what the edit gave, the project's rows after it, the revision it made
/// and the token of the one before it (so that it is held only on the history held here).
struct Committed<T> {
    out: T,
    rows: Vec<Arc<ManagedKey>>,
    revision: Revision,
    before: Option<String>,
}

/// What a change or a read brings to what this gateway holds.
pub(super) enum Rows {
    /// Every key, the operator keys retired (a read of the store), and whether the store went
    /// back since the last read (keys gone then were lost with a restore, not revoked).
    All(Vec<Arc<ManagedKey>>, Vec<String>, bool),
    /// Some projects' keys, each whole (a change made here, or the projects another gateway's
    /// changes touched).
    Projects(Vec<(String, Vec<Arc<ManagedKey>>)>),
}

/// What a round of following reads next.
enum Step {
    /// The revision held is the store's.
    Unmoved,
    /// Changes that touched these projects alone (perhaps none: this gateway's own), each
    /// read whole, up to this revision.
    Projects(Revision, Vec<(String, Vec<Arc<ManagedKey>>)>),
    /// The log cannot tell what changed (a first read, a restore, a key sync): every key.
    Whole,
}

impl ControlKeys {
    pub fn new(control: &Arc<Control>) -> ControlKeys {
        control.snapshot_opened();
        let (orphans, rx) = tokio::sync::mpsc::unbounded_channel();
        ControlKeys {
            control: control.clone(),
            follow: tokio::sync::Mutex::default(),
            revision_held: ArcSwapOption::empty(),
            own: Owned::default(),
            went_back: ArcSwapOption::empty(),
            saved: std::sync::Mutex::default(),
            orphans,
            orphans_rx: tokio::sync::Mutex::new(rx),
            orphans_told: std::sync::Mutex::default(),
        }
    }

    /// What a maker absent from this gateway's keys file means on this store.
    pub fn makers(&self) -> Makers {
        match self.control.engine() {
            Engine::Sqlite => Makers::Here,
            Engine::Postgres => Makers::Shared,
        }
    }

    /// Where keys whose maker is gone are told (the keys reloader's and the API's merges).
    pub fn orphans(&self) -> UnboundedSender<Vec<String>> {
        self.orphans.clone()
    }

    /// For the admin `/readyz`: the engine and the revision held.
    pub fn status(&self) -> serde_json::Value {
        let held = self.revision_held.load();
        serde_json::json!({
            "store": self.control.engine().name(),
            "revision": held.as_ref().map(|r| r.n),
        })
    }

    /// The last time the store's revision of keys went back, if it did in this run.
    pub fn went_back(&self) -> Option<WentBack> {
        self.went_back.load().as_deref().cloned()
    }

    /// Makes `edit` on `caller`'s project's keys in one transaction, with its audit entry;
    /// held here at once when it committed. `edit` gives what the caller answers and the
    /// change, or a refusal (nothing written).
    pub(super) async fn change<T: Send>(
        &self,
        api: &Arc<KeysApi>,
        caller: &KeyEntry,
        edit: impl FnOnce(&mut ManagedFile) -> Result<(T, Changed), Refused> + Send,
    ) -> Result<(T, Changed), Refused> {
        let project = caller.project.to_string();
        let at = drg_base::infra::units::rfc3339(api.clock.now());
        let keep = api.audit_days(&caller.plan);
        let operator = caller.source == KeyOrigin::Operator;
        let call = self.change_now(&project, (&caller.id, operator), at, keep, edit);
        // Boxed: a request's future would hold the transaction's inline.
        match Box::pin(self.control.within(call)).await {
            Ok(Ok(done)) => {
                let made = (done.revision, done.before);
                // Boxed: a read of the whole kind may follow, which a request's future would
                // otherwise hold (and copy) inline on every call.
                Box::pin(self.hold_change(api, project, done.rows, made)).await;
                Ok(done.out)
            }
            Ok(Err(refused)) => Err(refused),
            Err(e) => {
                log::warn!("keys: the control store did not take a change: {e}");
                Err(Refused::Unavailable)
            }
        }
    }

    async fn change_now<T>(
        &self,
        project: &str,
        (key_id, operator): (&str, bool),
        at: String,
        keep_days: u32,
        edit: impl FnOnce(&mut ManagedFile) -> Result<(T, Changed), Refused>,
    ) -> Result<Result<Committed<(T, Changed)>, Refused>, ControlError> {
        let sql = self.control.sql();
        let until = self.control.deadline();
        let Write {
            mut tx,
            settled,
            xid,
        } = self.control.write_telling(until, Some(KIND)).await?;
        let revision = move_revision(&mut tx, KIND, Touched::Project(project))
            .await
            .map_err(&sql)?;
        let previous = token_at(&mut *tx, KIND, revision.n - 1).await;
        let previous = previous.map_err(&sql)?;
        // A gateway whose keys file still holds a key `key sync` retired has not read it yet.
        if operator && (super::retire::is_retired(&mut tx, key_id).await).map_err(&sql)? {
            return Ok(Err(Refused::Retired));
        }
        let before = project_rows(&mut tx, project).await.map_err(&sql)?;
        let mut file = ManagedFile::with_keys(before.clone());
        // A refusal drops the transaction: nothing written, the revision's move rolled back.
        let (out, changed) = match edit(&mut file) {
            Ok(done) => done,
            Err(refused) => return Ok(Err(refused)),
        };
        let after: Vec<Arc<ManagedKey>> = file.keys.iter().cloned().collect();
        write_rows(&mut tx, &before, &after).await.map_err(&sql)?;
        let mut entry = Entry::of(&changed, key_id, at);
        entry.project = project.to_owned();
        let row = audit::sql::row_of(&entry);
        drg_base::infra::control::audit::append(&mut tx, &row, keep_days)
            .await
            .map_err(&sql)?;
        self.control.commit(Write { tx, settled, xid }).await?;
        Ok(Ok(Committed {
            out: (out, changed),
            rows: after,
            revision,
            before: previous,
        }))
    }

    /// Holds a change committed at `revision`, made on the revision whose token is `before`:
    /// unless a read holds it already. The revision held moves with it only when it is the
    /// next one on the history held here (else a read fills the gap, or finds a restore).
    async fn hold_change(
        &self,
        api: &Arc<KeysApi>,
        project: String,
        rows: Vec<Arc<ManagedKey>>,
        (revision, before): (Revision, Option<String>),
    ) {
        let mut f = self.follow.lock().await;
        // Told own only once held (still under the lock): a round of following before would
        // take it as read, and this hold would then leave it out.
        let own = revision.clone();
        let next =
            |held: &Revision| held.n + 1 == revision.n && before.as_ref() == Some(&held.token);
        match f.last.clone() {
            Some(held) if held.n >= revision.n => {}
            // Nothing read yet: the store just answered, so read it whole.
            None => {
                self.sync_locked(api, &mut f).await;
            }
            Some(held) => {
                let _ = hold(api, Rows::Projects(vec![(project, rows)])).await;
                if next(&held) {
                    self.revision_held.store(Some(Arc::new(revision.clone())));
                    f.last = Some(revision);
                }
            }
        }
        self.own.made(&own);
    }

    /// One round of following the store: whether it answered (`false`: what is held stays).
    pub(super) async fn sync(&self, api: &Arc<KeysApi>) -> bool {
        let mut f = self.follow.lock().await;
        self.sync_locked(api, &mut f).await
    }

    async fn sync_locked(&self, api: &Arc<KeysApi>, f: &mut Follow) -> bool {
        if let Some(last) = &f.last {
            match Box::pin(self.control.within(self.step_now(last))).await {
                Ok(Step::Unmoved) => {
                    api.vouched().await;
                    return true;
                }
                Ok(Step::Projects(at, projects)) => {
                    if !projects.is_empty() {
                        let _ = hold(api, Rows::Projects(projects)).await;
                    }
                    api.vouched().await;
                    self.revision_held.store(Some(Arc::new(at.clone())));
                    f.last = Some(at);
                    return true;
                }
                Ok(Step::Whole) => {}
                Err(e) => return self.failed(f, &e),
            }
        }
        let (revision, rows, retired) = match Box::pin(self.control.within(self.read_now())).await {
            Ok(read) => read,
            Err(e) => return self.failed(f, &e),
        };
        let mut back = match &f.last {
            Some(from) => Box::pin(went_back(&self.control, KIND, from, &revision)).await,
            None => None,
        };
        let restored = back.is_some();
        let revived = hold(api, Rows::All(rows, retired, restored)).await;
        for id in &revived {
            log::warn!(
                "keys: key {id}, which this gateway saw revoked, is in the control store again \
                 (restored from before its revocation): refused here; revoke it in the store \
                 again with `{}`",
                super::revived::revoke_again(id)
            );
        }
        if let Some(back) = back.as_mut() {
            back.revoke_again = revived
                .iter()
                .map(|id| super::revived::revoke_again(id))
                .collect();
        }
        if let Some(back) = back {
            self.went_back.store(Some(Arc::new(back)));
        }
        api.vouched().await;
        self.revision_held.store(Some(Arc::new(revision.clone())));
        f.last = Some(revision);
        true
    }

    fn failed(&self, f: &mut Follow, e: &ControlError) -> bool {
        if f.warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            f.warned = Some(Instant::now());
            log::warn!("keys: the control store did not answer ({e}); serving the keys held");
        } else {
            log::debug!("keys: {e}");
        }
        false
    }

    /// What a gateway holding `held` reads next, on one connection: the projects the log
    /// says others' changes touched since, or every key when it cannot tell.
    async fn step_now(&self, held: &Revision) -> Result<Step, ControlError> {
        let sql = self.control.sql();
        let mut conn = self.control.pool().await?.acquire().await.map_err(&sql)?;
        let now = drg_base::infra::control::revision(&mut *conn, KIND)
            .await
            .map_err(&sql)?;
        if *held == now {
            return Ok(Step::Unmoved);
        }
        let changes = changes_since(&mut *conn, KIND, held, &now, &self.own.list())
            .await
            .map_err(&sql)?;
        // Key changes name their project; a key sync, an import or orphans dropped name none.
        let Some(changes) = changes.filter(|c| c.records.is_empty() && c.len() <= MAX_READ) else {
            return Ok(Step::Whole);
        };
        let mut read: Vec<(String, Vec<Arc<ManagedKey>>)> = (changes.projects.iter())
            .map(|p| (p.clone(), Vec::new()))
            .collect();
        if !read.is_empty() {
            let rows = projects_rows(&changes.projects)
                .fetch_all(&mut *conn)
                .await
                .map_err(&sql)?;
            for (project, body, used) in rows {
                let at = read.binary_search_by(|(p, _)| p.as_str().cmp(&project));
                if let (Ok(i), Some(key)) = (at, row_of((body, used))) {
                    read[i].1.push(Arc::new(key));
                }
            }
        }
        Ok(Step::Projects(now, read))
    }

    /// Every key, the operator keys retired, and the revision they are at.
    async fn read_now(
        &self,
    ) -> Result<(Revision, Vec<Arc<ManagedKey>>, Vec<String>), ControlError> {
        let sql = self.control.sql();
        let mut tx = self.control.pool().await?.begin().await.map_err(&sql)?;
        // The revision first: rows read after it are as new or newer, never older.
        let n = drg_base::infra::control::revision(&mut *tx, KIND)
            .await
            .map_err(&sql)?;
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT body, last_used FROM drg_keys ORDER BY project, id")
                .fetch_all(&mut *tx)
                .await
                .map_err(&sql)?;
        let retired = super::retire::retired(&mut tx).await.map_err(&sql)?;
        tx.commit().await.map_err(&sql)?;
        let rows = rows.into_iter().filter_map(row_of).map(Arc::new).collect();
        Ok((n, rows, retired))
    }

    /// Drops keys whose maker left this gateway's keys file (one gateway's own store: see
    /// [`Makers::Here`]), and theirs, in one transaction, each audited.
    async fn drop_orphans(&self, ids: &[String]) {
        let call = async {
            let sql = self.control.sql();
            let until = self.control.deadline();
            let Write { mut tx, .. } = self.control.write_telling(until, Some(KIND)).await?;
            move_revision(&mut tx, KIND, Touched::Kind)
                .await
                .map_err(&sql)?;
            let why = super::retire::Why {
                by: "keys.yaml",
                detail: "the key that made it left the keys file",
            };
            let gone = super::retire::revoke_audited(&mut tx, ids, &why)
                .await
                .map_err(&sql)?;
            if gone.is_empty() {
                // Dropped already: no revision to move.
                return Ok(0);
            }
            tx.commit().await.map_err(&sql)?;
            Ok::<_, ControlError>(gone.len())
        };
        match Box::pin(self.control.within(call)).await {
            Ok(0) => {}
            Ok(n) => log::info!("keys: {n} API-made keys revoked with the key that made them"),
            // The next merge finds them again.
            Err(e) => log::warn!("keys: keys whose maker is gone not dropped yet: {e}"),
        }
    }

    /// Writes the last uses this gateway saw that moved on since it last wrote them (no
    /// revision moves: a last use changes no key's standing).
    pub(super) async fn save_last_used(&self, api: &KeysApi) {
        let seen: Vec<(String, u64)> = (api.keys.load().entries())
            .filter(|k| k.source == KeyOrigin::Api)
            .filter_map(|k| k.last_used_at().map(|t| (k.id.to_string(), t)))
            .collect();
        let moved: Vec<(String, u64)> = {
            let saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
            (seen.into_iter())
                .filter(|(id, t)| saved.get(id).is_none_or(|s| s < t))
                .collect()
        };
        if moved.is_empty() {
            return;
        }
        let call = async {
            let sql = self.control.sql();
            let mut w = self.control.write(self.control.deadline()).await?;
            // A statement a batch, not one a key: the flush stays within one call's budget
            // however many keys were used.
            for batch in moved.chunks(LAST_USED_BATCH) {
                let rows: Vec<String> = (0..batch.len())
                    .map(|i| format!("(${}, ${})", 2 * i + 1, 2 * i + 2))
                    .collect();
                let text = format!(
                    "UPDATE drg_keys SET last_used = v.column2 FROM (VALUES {}) AS v
                     WHERE drg_keys.id = v.column1 AND drg_keys.last_used < v.column2",
                    rows.join(", ")
                );
                let mut update = sqlx::query(sqlx::AssertSqlSafe(text));
                for (id, t) in batch {
                    update = update
                        .bind(id.clone())
                        .bind(i64::try_from(*t).unwrap_or(i64::MAX));
                }
                update.execute(&mut *w.tx).await.map_err(&sql)?;
            }
            w.tx.commit().await.map_err(&sql)?;
            Ok::<_, ControlError>(())
        };
        match Box::pin(self.control.within(call)).await {
            Ok(()) => {
                log::debug!("keys: saved the last use of {} keys", moved.len());
                let mut saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
                saved.extend(moved);
            }
            Err(e) => log::warn!("keys: when keys were last used was not saved: {e}"),
        }
    }
}

/// Holds `rows` (on a blocking thread: the cache file is written under the publishing lock):
/// the keys seen revoked that they brought back, kept out.
async fn hold(api: &Arc<KeysApi>, rows: Rows) -> Vec<String> {
    let api = api.clone();
    match tokio::task::spawn_blocking(move || api.hold_blocking(rows)).await {
        Ok(revived) => revived,
        Err(e) => {
            log::error!("keys: the keys read were not held: {e}");
            Vec::new()
        }
    }
}

/// Follows the store's keys (run as `follow::Following`): when they are told moved (`NOTIFY`, the
/// poll's word), at each poll while a round failed, and when merges find keys whose maker is
/// gone (dropped from the store first).
pub struct KeysFollow(pub Arc<KeysApi>);

#[async_trait::async_trait]
impl Follower for KeysFollow {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn control(&self) -> &Control {
        &self.0.store.control
    }

    fn held(&self) -> Option<Arc<Revision>> {
        self.0.store.revision_held.load_full()
    }

    async fn sync(&self) -> bool {
        let keys = &self.0.store;
        let told =
            std::mem::take(&mut *keys.orphans_told.lock().unwrap_or_else(|e| e.into_inner()));
        if !told.is_empty() {
            keys.drop_orphans(&told).await;
        }
        keys.sync(&self.0).await
    }

    async fn asked(&self) {
        let keys = &self.0.store;
        let mut rx = keys.orphans_rx.lock().await;
        match rx.recv().await {
            // Kept at once, with no await between: the race with the store's news may drop
            // this future only while it waits.
            Some(ids) => (keys.orphans_told.lock().unwrap_or_else(|e| e.into_inner())).extend(ids),
            None => std::future::pending().await,
        }
    }
}

/// `project`'s keys as held in the store.
async fn project_rows(tx: &mut Tx, project: &str) -> Result<Vec<Arc<ManagedKey>>, sqlx::Error> {
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT body, last_used FROM drg_keys WHERE project = $1 ORDER BY id")
            .bind(project.to_owned())
            .fetch_all(&mut **tx)
            .await?;
    Ok(rows.into_iter().filter_map(row_of).map(Arc::new).collect())
}

/// The rows of `projects`' keys: project, body, last use.
fn projects_rows<'q>(
    projects: &std::collections::BTreeSet<String>,
) -> sqlx::query::QueryAs<'q, sqlx::Any, (String, String, i64), sqlx::any::AnyArguments> {
    let marks: Vec<String> = (1..=projects.len()).map(|i| format!("${i}")).collect();
    let query = format!(
        "SELECT project, body, last_used FROM drg_keys WHERE project IN ({}) ORDER BY project, id",
        marks.join(", ")
    );
    let mut q = sqlx::query_as(sqlx::AssertSqlSafe(query));
    for p in projects {
        q = q.bind(p.clone());
    }
    q
}

/// A key of a row (one that does not read, another release's, is as none).
fn row_of((body, used): (String, i64)) -> Option<ManagedKey> {
    let mut key: ManagedKey = serde_json::from_str(&body).ok()?;
    key.last_used = u64::try_from(used).ok().filter(|t| *t > 0);
    Some(key)
}

/// A key's row as stored: its last use is the column's.
fn body_of(key: &ManagedKey) -> String {
    let mut key = key.clone();
    key.last_used = None;
    serde_json::to_string(&key).unwrap_or_default()
}

/// Writes what moved from `before` to `after` (one project's keys): new rows first (a
/// successor before the children handed to it), then changed ones, then removals (each takes
/// its descendants: the foreign key's cascade).
async fn write_rows(
    tx: &mut Tx,
    before: &[Arc<ManagedKey>],
    after: &[Arc<ManagedKey>],
) -> Result<(), sqlx::Error> {
    let was: HashMap<&str, &ManagedKey> = before.iter().map(|k| (k.id.as_str(), &**k)).collect();
    let ids: HashSet<&str> = after.iter().map(|k| k.id.as_str()).collect();
    let parent = |k: &ManagedKey| (k.created_by.clone()).filter(|by| ids.contains(by.as_str()));
    for k in after.iter().filter(|k| !was.contains_key(k.id.as_str())) {
        insert(tx, k, parent(k)).await?;
    }
    let changed =
        |k: &&Arc<ManagedKey>| (was.get(k.id.as_str())).is_some_and(|w| body_of(w) != body_of(k));
    for k in after.iter().filter(changed) {
        sqlx::query("UPDATE drg_keys SET parent = $2, body = $3 WHERE id = $1")
            .bind(k.id.clone())
            .bind(parent(k))
            .bind(body_of(k))
            .execute(&mut **tx)
            .await?;
    }
    for k in before.iter().filter(|k| !ids.contains(k.id.as_str())) {
        sqlx::query("DELETE FROM drg_keys WHERE id = $1")
            .bind(k.id.clone())
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

async fn insert(tx: &mut Tx, k: &ManagedKey, parent: Option<String>) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO drg_keys (id, project, parent, last_used, body) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(k.id.clone())
    .bind(k.project.clone())
    .bind(parent)
    .bind(i64::try_from(k.last_used.unwrap_or(0)).unwrap_or(i64::MAX))
    .bind(body_of(k))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Takes an earlier release's keys in (`migrate`), once a source: each key whose id the store
/// does not hold, makers before the keys they made (a key whose maker is an operator key
/// comes in with no parent). A key of `revoked` the store holds (taken by a run before that
/// missed its revocation) is revoked there, with what it made, and audited. How many were
/// taken; `None`: `source` was taken before.
pub async fn import(
    control: &Arc<Control>,
    source: &str,
    keys: &[ManagedKey],
    revoked: &HashSet<String>,
) -> Result<Option<usize>, ControlError> {
    let what = Imported { keys, revoked };
    drg_base::infra::control::import::import(control, source, &what).await
}

/// An earlier release's keys, and the revocations it knew (see [`import`]).
struct Imported<'a> {
    keys: &'a [ManagedKey],
    revoked: &'a HashSet<String>,
}

#[async_trait::async_trait]
impl drg_base::infra::control::import::Import for Imported<'_> {
    fn kind(&self) -> &'static str {
        KIND
    }

    async fn always(&self, tx: &mut Tx) -> Result<bool, sqlx::Error> {
        let revoked: Vec<String> = self.revoked.iter().cloned().collect();
        let why = super::retire::Why {
            by: "migrate",
            detail: "revoked before the migration",
        };
        let gone = super::retire::revoke_audited(tx, &revoked, &why).await?;
        Ok(!gone.is_empty())
    }

    async fn take(&self, tx: &mut Tx) -> Result<usize, sqlx::Error> {
        let held: Vec<String> = sqlx::query_scalar("SELECT id FROM drg_keys")
            .fetch_all(&mut **tx)
            .await?;
        let mut there: HashSet<String> = held.into_iter().collect();
        let api_made: HashSet<String> = (self.keys.iter().map(|k| k.id.clone()))
            .chain(there.iter().cloned())
            .collect();
        let mut left: Vec<&ManagedKey> = (self.keys.iter())
            .filter(|k| !there.contains(&k.id))
            .collect();
        let mut taken = 0;
        // Makers before the keys they made: a pass takes every key whose maker is in.
        loop {
            let before = left.len();
            let mut next = Vec::new();
            for k in left {
                let maker = k.created_by.clone().filter(|by| api_made.contains(by));
                match maker {
                    Some(m) if !there.contains(&m) => next.push(k),
                    parent => {
                        insert(tx, k, parent).await?;
                        there.insert(k.id.clone());
                        taken += 1;
                    }
                }
            }
            left = next;
            if left.len() == before || left.is_empty() {
                break;
            }
        }
        Ok(taken)
    }
}
