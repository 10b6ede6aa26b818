//! The background probe of Redis: a PING every `breaker_open_ms`, so that what readiness says
//! (a `fail_closed` store refusing every counted call) follows Redis even when no call comes;
//! and with it Redis's `maxmemory-policy` (`INFO memory`), since any policy but `noeviction`
//! lets Redis drop API-made keys and month counts silently under memory pressure.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{Failure, RedisStore};
use drg_base::infra::redis::config::EvictionPolicyCheck;
use drg_base::infra::redis::config::FailurePolicy;

/// A slow link is looked into at most this often.
const DIAGNOSE_EVERY: Duration = Duration::from_secs(60);
/// How long the look may take (connecting and one PING).
const DIAGNOSE_WITHIN: Duration = Duration::from_secs(5);

/// The `maxmemory_policy` field of an `INFO memory` reply.
pub fn eviction_policy(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|l| l.strip_prefix("maxmemory_policy:"))
        .map(str::trim)
        .filter(|p| !p.is_empty())
}

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
            Ok(()) => {
                self.succeeded();
                self.check_eviction_policy().await;
            }
            Err(f) => {
                self.failed(&f.why);
                self.diagnose_slow_link().await;
            }
        }
    }

    /// After a failed probe, at most once a minute (single-server mode): whether Redis answers
    /// at all when given time. A link slower than `connect_timeout_ms` or `call_timeout_ms`
    /// fails every call although Redis is up; the log then says so, with the times measured,
    /// instead of only "unreachable".
    async fn diagnose_slow_link(&self) {
        use drg_base::infra::redis::config::RedisMode;
        if self.config.mode != RedisMode::Single {
            return;
        }
        {
            let mut last = self.diagnosed.lock().unwrap_or_else(|p| p.into_inner());
            if last.is_some_and(|t| t.elapsed() < DIAGNOSE_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        let Ok(client) = redis::Client::open(self.config.url.as_str()) else {
            return;
        };
        let measured = tokio::time::timeout(DIAGNOSE_WITHIN, async {
            let started = Instant::now();
            // Budgets of the look's own: the point is to see how slow it is.
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(DIAGNOSE_WITHIN))
                .set_response_timeout(Some(DIAGNOSE_WITHIN));
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            let connected = started.elapsed();
            let ping = Instant::now();
            redis::cmd("PING").query_async::<String>(&mut conn).await?;
            Ok::<_, redis::RedisError>((connected, ping.elapsed()))
        })
        .await;
        let Ok(Ok((connect, ping))) = measured else {
            return;
        };
        if connect > self.config.connect_timeout || ping > self.config.call_timeout {
            log::warn!(
                "quota store: Redis answers, but slower than the budgets: connecting took {} ms \
                 (connect_timeout_ms {}), a PING {} ms (call_timeout_ms {}); until they are \
                 raised every call skips Redis and is counted locally",
                connect.as_millis(),
                self.config.connect_timeout.as_millis(),
                ping.as_millis(),
                self.config.call_timeout.as_millis()
            );
        }
    }

    /// Reads Redis's `maxmemory-policy` and says so when it is not `noeviction`: a WARN when
    /// first seen and on each change. A reply without it (a proxy, a managed service that hides
    /// `INFO`) leaves what was known; one failed read is nothing.
    async fn check_eviction_policy(&self) {
        let Ok(mut conn) = self.connection().await else {
            return;
        };
        let asked = tokio::time::timeout(
            self.config.call_timeout,
            redis::cmd("INFO")
                .arg("memory")
                .query_async::<String>(&mut conn),
        )
        .await;
        let Ok(Ok(info)) = asked else { return };
        let Some(policy) = eviction_policy(&info) else {
            return;
        };
        let mut known = self
            .eviction_policy
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if known.as_deref() == Some(policy) {
            return;
        }
        if policy == "noeviction" {
            log::info!("quota store: Redis maxmemory-policy is noeviction");
        } else {
            log::warn!(
                "quota store: Redis maxmemory-policy is {policy}: under memory pressure Redis may \
                 evict API-made keys and month counts without a word; set it to noeviction \
                 (docs/scaling.md){}",
                if self.config.on_eviction_policy == EvictionPolicyCheck::Unready {
                    "; not ready until then (on_eviction_policy: unready)"
                } else {
                    ""
                }
            );
        }
        *known = Some(policy.into());
    }

    /// Redis's `maxmemory-policy` as last read, if it was.
    pub fn eviction_policy(&self) -> Option<String> {
        self.eviction_policy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_deref()
            .map(str::to_owned)
    }

    /// Not ready because Redis may evict (`on_eviction_policy: unready`).
    pub fn unready_for_eviction(&self) -> bool {
        self.config.on_eviction_policy == EvictionPolicyCheck::Unready
            && self.eviction_policy().is_some_and(|p| p != "noeviction")
    }

    /// Whether every counted call is refused now: `fail_closed` and the last call or probe
    /// failed (until one succeeds, including before the first probe at start).
    pub fn refusing(&self) -> bool {
        self.config.failure_policy == FailurePolicy::FailClosed
            && !self.connected.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::eviction_policy;

    #[test]
    fn the_policy_is_read_from_info_memory() {
        let info =
            "# Memory\r\nused_memory:1000\r\nmaxmemory:0\r\nmaxmemory_policy:allkeys-lru\r\n";
        assert_eq!(eviction_policy(info), Some("allkeys-lru"));
        assert_eq!(eviction_policy("# Memory\r\nused_memory:1\r\n"), None);
        assert_eq!(eviction_policy("maxmemory_policy:\r\n"), None);
    }
}
