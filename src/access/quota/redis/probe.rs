//! The background probe of Redis: a PING every `breaker_open_ms`, so that what readiness says
//! (a `fail_closed` store refusing every counted call) follows Redis even when no call comes.

use std::sync::atomic::Ordering;

use super::{Failure, FailurePolicy, RedisStore};

impl RedisStore {
    /// Pings Redis under the call budget and books the outcome like a call's: a failure counts
    /// towards the breaker, a success closes it (callers need not wait for their own probe).
    pub async fn probe(&self) {
        let outcome = async {
            let mut conn = self.connection().await?;
            match tokio::time::timeout(
                self.config.call_timeout,
                redis::cmd("PING").query_async::<String>(&mut conn),
            )
            .await
            {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(Failure::from(e)),
                Err(_) => Err(Failure {
                    why: "ping timed out".into(),
                    maybe_ran: false,
                }),
            }
        }
        .await;
        match outcome {
            Ok(()) => self.succeeded(),
            Err(f) => self.failed(&f.why),
        }
    }

    /// Whether every counted call is refused now: `fail_closed` and the last call or probe
    /// failed (until one succeeds, including before the first probe at start).
    pub fn refusing(&self) -> bool {
        self.config.failure_policy == FailurePolicy::FailClosed
            && !self.connected.load(Ordering::Relaxed)
    }
}
