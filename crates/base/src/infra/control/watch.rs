//! The poll behind the notifications: every `gateway.control.poll_ms` one query reads every
//! kind's revision, and each kind whose revision moved (or went back, or went) is told to the
//! snapshots ([`Control::moved`]), which then read it. One query a poll for every kind, not one
//! a kind: the poll runs all the time, and what runs all the time is paid by every request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Control, ControlError};
use crate::service::{Service, Shutdown};

/// A failing store is logged at WARN at most this often.
const WARN_EVERY: Duration = Duration::from_secs(30);

/// The revisions' poll of a control store.
pub struct Revisions(pub Arc<Control>);

impl Revisions {
    async fn read(&self) -> Result<HashMap<String, i64>, ControlError> {
        let pool = self.0.pool().await?;
        let rows: Vec<(String, i64)> = sqlx::query_as("SELECT kind, n FROM drg_revision")
            .fetch_all(pool)
            .await
            .map_err(self.0.sql())?;
        Ok(rows.into_iter().collect())
    }
}

#[async_trait::async_trait]
impl Service for Revisions {
    async fn run(&self, mut shutdown: Shutdown) {
        let mut last: HashMap<String, i64> = HashMap::new();
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
            let moved = (now.iter())
                .filter(|(kind, n)| last.get(*kind) != Some(n))
                .map(|(kind, _)| kind.clone())
                .chain(last.keys().filter(|k| !now.contains_key(*k)).cloned())
                .collect::<Vec<_>>();
            for kind in moved {
                let _ = self.0.moved.send(kind);
            }
            last = now;
        }
    }
}
