//! The poll behind the notifications: every `gateway.control.poll_ms` one query reads every
//! kind's revision, and each kind is told with its revision (`<kind>@<n>@<token>`,
//! [`Control::moved`], [`super::Revision::word`]);
//! a snapshot that holds another revision reads the kind. Each snapshot compares with what it
//! holds, not with what this poll saw last: writes between two polls followed by a restore to
//! the revision the poll last saw would otherwise go unnoticed. One query a poll for every
//! kind, not one a kind: the poll runs all the time, and what runs all the time is paid by
//! every request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Control, ControlError, Revision};
use crate::service::{Service, Shutdown};

/// A failing store is logged at WARN at most this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// The revisions' poll of a control store.
pub struct Revisions(pub Arc<Control>);

impl Revisions {
    async fn read(&self) -> Result<HashMap<String, Revision>, ControlError> {
        let pool = self.0.pool().await?;
        let rows: Vec<(String, i64, String)> =
            sqlx::query_as("SELECT kind, n, token FROM drg_revision")
                .fetch_all(pool)
                .await
                .map_err(self.0.sql())?;
        Ok((rows.into_iter())
            .map(|(kind, n, token)| (kind, Revision { n, token }))
            .collect())
    }
}

#[async_trait::async_trait]
impl Service for Revisions {
    async fn run(&self, mut shutdown: Shutdown) {
        let mut last: HashMap<String, Revision> = HashMap::new();
        let mut warned: Option<Instant> = None;
        let mut ticks = crate::periodic::Ticks::new(self.0.poll());
        while ticks.next(&mut shutdown).await.is_some() {
            let now = match self.0.within(self.read()).await {
                Ok(now) => now,
                Err(e) => {
                    if warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                        warned = Some(Instant::now());
                        log::warn!(
                            "control store: the revisions could not be read ({e}); serving what \
                             is held"
                        );
                    }
                    continue;
                }
            };
            // A kind whose row went (a database restored from before its first write) is at 0.
            let gone = (last.keys())
                .filter(|k| !now.contains_key(*k))
                .map(|k| Revision::default().word(k));
            let told = now.iter().map(|(k, r)| r.word(k));
            for word in told.chain(gone).collect::<Vec<_>>() {
                let _ = self.0.moved.send(word);
            }
            last = now;
        }
    }
}
