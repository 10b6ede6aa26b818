//! `Idempotency-Key` on the project routes that write (`PUT`/`DELETE /v1/overrides/{domain}`,
//! `POST`/`DELETE /v1/webhooks`, `POST /v1/reports`): a client that lost an answer retries
//! with the same key and gets the first answer (`Idempotent-Replayed: true`), the write made
//! once; the same key on another request is `422`. A key's value belongs to the API key that
//! sent it ([`scoped`]): another API key's retry is a write of its own. The first answer is kept with the write, in
//! its transaction (`drg_base::infra::records::once`), and so is the audit entry of every write
//! (a change and its entry commit together or not at all).

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};

use drg_access::keys::KeyEntry;
use drg_base::answer::{Answer, ApiError, Changed};
use drg_base::infra::control::audit::AuditRow;
use drg_base::infra::records::once::{Once, Outcome, Remembered};
use drg_base::infra::records::snapshot::Snapshot;
use drg_base::infra::records::{Audited, Put, Record, RecordsError};

/// What a write asked, for its fingerprint: the method, what it names, its body.
pub struct Asked<'a> {
    pub method: &'static str,
    pub target: &'a str,
    pub body: &'a [u8],
}

/// The key an `Idempotency-Key` is kept under: the calling API key's id with it. A replay
/// belongs to the key that made the write: another key of the same project (another server
/// key, an API-made key of another lineage) sending the same value makes a write of its own,
/// and is never handed the first one's answer (a webhook's secret among them).
pub fn scoped(caller: &str, key: &str) -> String {
    format!("{caller}/{key}")
}

impl Asked<'_> {
    /// The write's key with this request's fingerprint.
    fn once<'a>(
        &self,
        key: &'a str,
        remember: &'a (dyn Fn(&Put) -> Option<Remembered> + Sync),
    ) -> Once<'a> {
        Once {
            key,
            fingerprint: drg_base::infra::records::once::fingerprint(
                self.method,
                self.target,
                self.body,
            ),
            remember,
        }
    }
}

/// Who writes: the calling key, when, and how long its project keeps the audit trail.
pub struct Who<'a> {
    pub key: &'a KeyEntry,
    /// RFC 3339, UTC, seconds.
    pub at: String,
    pub keep_days: u32,
}

impl<'a> Who<'a> {
    /// `key` writing at `now` (unix seconds), its plan among `plans`.
    pub fn new(
        key: &'a KeyEntry,
        now: i64,
        plans: &std::collections::BTreeMap<String, drg_access::plan::PlanConfig>,
    ) -> Who<'a> {
        Who {
            key,
            at: drg_base::infra::units::utc_seconds(now).unwrap_or_default(),
            keep_days: crate::account::audit::keep_days(plans, &key.plan),
        }
    }

    /// The audit entry of `change`, made by this key.
    fn row(&self, change: &Changed) -> AuditRow {
        AuditRow {
            project: self.key.project.to_string(),
            id: None,
            at: self.at.clone(),
            key_id: self.key.id.to_string(),
            action: change.action.as_str().to_owned(),
            target: change.target.clone(),
            detail: change.detail.clone(),
        }
    }
}

/// Writes `record` (within `max` for its project), with the audit entry of the change `answer`
/// names, and answers with `answer`; with `key`, a retry of a write that committed is answered
/// what it was first.
pub async fn write<R: Record>(
    snapshot: &Snapshot<R>,
    record: R,
    max: u32,
    key: Option<&str>,
    asked: Asked<'_>,
    who: &Who<'_>,
    answer: impl Fn(Result<Put, RecordsError>) -> Answer + Sync,
) -> Answer {
    let kept = |a: &Answer| remembered(a);
    write_keeping(snapshot, record, (max, key), asked, who, answer, kept).await
}

/// [`write()`], keeping of the first answer what `kept` makes of it (a secret the answer shows
/// once is not kept: the replay takes it from where it lives).
pub async fn write_keeping<R: Record>(
    snapshot: &Snapshot<R>,
    record: R,
    (max, key): (u32, Option<&str>),
    asked: Asked<'_>,
    who: &Who<'_>,
    answer: impl Fn(Result<Put, RecordsError>) -> Answer + Sync,
    kept: impl Fn(&Answer) -> Option<Remembered> + Sync,
) -> Answer {
    let entry = |put: &Put| answer(Ok(*put)).changed.map(|c| who.row(&c));
    let audited = Audited {
        entry: &entry,
        keep_days: who.keep_days,
    };
    let outcome = match key {
        None => snapshot.put_with(record, max, None, Some(&audited)).await,
        Some(key) => {
            let remember = |put: &Put| kept(&answer(Ok(*put)));
            let key = scoped(&who.key.id, key);
            let once = asked.once(&key, &remember);
            (snapshot.put_with(record, max, Some(&once), Some(&audited))).await
        }
    };
    match outcome {
        Ok(Outcome::Put(put)) => answer(Ok(put)),
        Ok(Outcome::Replay(first)) => replayed(first),
        Ok(Outcome::Reused) => reused(),
        Err(e) => answer(Err(e)),
    }
}

/// The answer to a write by `caller` (the calling key) that found nothing to change
/// (`otherwise`, a `404`), unless it is that key's retry of one that changed it: then that
/// one's first answer.
pub async fn replay_or<R: Record>(
    snapshot: &Snapshot<R>,
    caller: &KeyEntry,
    key: Option<&str>,
    asked: Asked<'_>,
    otherwise: Answer,
) -> Answer {
    let Some(key) = key else { return otherwise };
    let never = |_: &Put| None;
    let key = scoped(&caller.id, key);
    let once = asked.once(&key, &never);
    match snapshot.seen(&caller.project, &once).await {
        Ok(Some(Outcome::Replay(first))) => replayed(first),
        Ok(Some(Outcome::Reused)) => reused(),
        _ => otherwise,
    }
}

fn reused() -> Answer {
    ApiError::Validation("Idempotency-Key: already used by this key for another request".into())
        .into()
}

/// Whether `a` is a first answer given again ([`replayed`]).
pub fn is_replay(a: &Answer) -> bool {
    a.headers.iter().any(|(n, _)| n == "idempotent-replayed")
}

/// An answer worth keeping: one that changed something (`2xx`).
pub fn remembered(a: &Answer) -> Option<Remembered> {
    a.status.is_success().then(|| Remembered {
        status: a.status.as_u16(),
        body: String::from_utf8_lossy(&a.body).into_owned(),
    })
}

/// The first answer again, said to be one (it changes nothing, so the audit trail gets no
/// second row).
fn replayed(first: Remembered) -> Answer {
    let status = StatusCode::from_u16(first.status).unwrap_or(StatusCode::OK);
    let empty = first.body.is_empty();
    let mut a = Answer::raw(status, Bytes::from(first.body));
    if !empty {
        a = a.with_header(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    a.with_header(
        HeaderName::from_static("idempotent-replayed"),
        HeaderValue::from_static("true"),
    )
}
