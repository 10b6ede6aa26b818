//! Usage, logs and stats, the account routes' answers as values: `/v1/usage` from the month the
//! access decision counted, `/v1/logs` and `/v1/stats` from the call store. The listener only
//! routes to them and writes what they return.

use chrono::{DateTime, NaiveDate, Utc};
use http::StatusCode;
use serde::Serialize;

use crate::account::calls::{self, Calls, DayCount, LogItem};
use drg_access::keys::KeyEntry;
use drg_access::quota::Usage;
use drg_base::answer::{Answer, ApiError};

/// Which of the optional parts this gateway has on, in `GET /v1/usage`: a part that is off
/// answers `404` on its routes, and a client (the dashboard) that asks only for what is on logs
/// no failed call. What the gateway serves, not what the calling key may do (a browser key is
/// still refused the server-key routes).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Features {
    /// `/v1/logs` and `/v1/stats`.
    pub logs: bool,
    /// `/v1/changes`.
    pub changes: bool,
    /// `/v1/keys`.
    pub keys: bool,
    /// `/v1/overrides`.
    pub overrides: bool,
    /// `/v1/reports`.
    pub reports: bool,
    /// `/v1/webhooks`.
    pub webhooks: bool,
    /// `/v1/audit`.
    pub audit: bool,
}

/// `GET /v1/usage`: the caller's project month. `month_count` and `monthly_limit` are the names
/// existing clients read; `used` and `limit` stay as aliases for callers of the first version.
/// `features` says which optional routes are on, so that a client asks only for those.
pub fn usage(plan: &str, u: &Usage, features: Features) -> Answer {
    #[derive(Serialize)]
    struct UsageBody<'a> {
        month_count: u64,
        monthly_limit: u64,
        reset_at: String,
        plan: &'a str,
        used: u64,
        limit: u64,
        features: Features,
    }
    Answer::json(
        StatusCode::OK,
        &UsageBody {
            month_count: u.used,
            monthly_limit: u.limit,
            reset_at: u.reset_at_iso(),
            plan,
            used: u.used,
            limit: u.limit,
            features,
        },
    )
}

/// `GET /v1/logs`: a page of the project's calls, newest first, within the key's retention; a
/// cursor is the previous page's `next_cursor`, bound to the project it was given to.
pub async fn logs(
    calls: &Calls,
    key: &KeyEntry,
    now: DateTime<Utc>,
    cursor: Option<&str>,
    limit: usize,
) -> Answer {
    #[derive(Serialize)]
    struct LogsBody<'a> {
        items: &'a [LogItem],
        next_cursor: Option<String>,
    }
    let bad_cursor = || {
        ApiError::Validation(
            "cursor is not one this API gave (use next_cursor of the previous page)".into(),
        )
        .into()
    };
    let project = &key.project;
    let before = match cursor.map(|c| calls::decode_cursor(project, c)) {
        Some(None) => return bad_cursor(),
        Some(Some(position)) => Some(position),
        None => None,
    };
    let since = calls::visible_since(now, calls::retention_of(key));
    match calls
        .store
        .page(project, before.as_deref(), limit, since)
        .await
    {
        Ok(Some(page)) => Answer::json(
            StatusCode::OK,
            &LogsBody {
                items: &page.items,
                next_cursor: page
                    .next
                    .as_deref()
                    .map(|n| calls::encode_cursor(project, n)),
            },
        ),
        Ok(None) => bad_cursor(),
        Err(e) => {
            calls.metrics.store_errors.inc();
            ApiError::Internal(e.to_string()).into()
        }
    }
}

/// `GET /v1/stats`: the project's calls and blocked calls per UTC day, the 30 days to `today`,
/// days without calls included.
pub async fn stats(calls: &Calls, project: &str, today: NaiveDate) -> Answer {
    #[derive(Serialize)]
    struct StatsBody {
        chart: Vec<DayCount>,
    }
    match calls
        .store
        .days(project, calls::chart_start(today), today)
        .await
    {
        Ok(counted) => Answer::json(
            StatusCode::OK,
            &StatsBody {
                chart: calls::chart(today, &counted),
            },
        ),
        Err(e) => {
            calls.metrics.store_errors.inc();
            ApiError::Internal(e.to_string()).into()
        }
    }
}
