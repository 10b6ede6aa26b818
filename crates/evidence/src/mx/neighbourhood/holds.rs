//! Held verdicts shared by the gateways on one Redis: one verdict for a domain, whichever
//! gateway is asked. A gateway that reaches a neighbourhood verdict claims it for the hold
//! (`SET NX PX`, `drg:mx:held:<domain>`); a gateway whose own index judges nothing (it has not
//! pulled the new evidence yet, or the counts moved after the verdict was reached) answers the
//! verdict another gateway holds. Without it, two gateways answered one name differently for
//! the few seconds until the index was shared, and for the whole hold after a verdict.
//!
//! Only the verdicts every project gets are shared (a project's finding on its own lookups
//! stays its own). Redis failing or slow never fails an answer: the gateway answers
//! from its own index, as it does without Redis. Expiring state only: Redis loses nothing
//! here that the gateways cannot reach again.

use std::time::Duration;

use drg_base::infra::redis::config::RedisConfig;
use drg_base::infra::redis::RedisLink;
use drg_domain::neighbour_index::Finding;

/// The key of `domain`'s held verdict.
fn key(domain: &str) -> String {
    format!("drg:mx:held:{domain}")
}

/// A verdict held on Redis, and how long it still holds.
pub type Held = (Finding, Duration);

/// The Redis side of held verdicts (see the module documentation).
pub struct SharedHolds {
    link: tokio::sync::OnceCell<RedisLink>,
    config: RedisConfig,
}

impl SharedHolds {
    pub fn new(config: &RedisConfig) -> Self {
        SharedHolds {
            link: tokio::sync::OnceCell::new(),
            config: config.clone(),
        }
    }

    async fn link(&self) -> redis::RedisResult<RedisLink> {
        self.link
            .get_or_try_init(|| async { RedisLink::connect_lazy(&self.config) })
            .await
            .cloned()
    }

    /// Claims `finding` for `domain` for `hold`, unless a gateway holds a verdict already: the
    /// verdict in force (this one, or the one held before, with its time left).
    pub async fn claim(
        &self,
        domain: &str,
        finding: &Finding,
        hold: Duration,
    ) -> redis::RedisResult<Held> {
        let mut link = self.link().await?;
        let body = serde_json::to_string(finding).unwrap_or_default();
        let ms = u64::try_from(hold.as_millis()).unwrap_or(u64::MAX).max(1);
        let took: Option<String> = redis::cmd("SET")
            .arg(key(domain))
            .arg(&body)
            .arg("NX")
            .arg("PX")
            .arg(ms)
            .query_async(&mut link)
            .await?;
        if took.is_some() {
            return Ok((finding.clone(), hold));
        }
        // Held already: that verdict stands (gone meanwhile, this one is as good).
        Ok(self.held(domain).await?.unwrap_or((finding.clone(), hold)))
    }

    /// The verdict a gateway holds for `domain`, with its time left.
    pub async fn held(&self, domain: &str) -> redis::RedisResult<Option<Held>> {
        let mut link = self.link().await?;
        let (body, ms): (Option<String>, i64) = redis::pipe()
            .get(key(domain))
            .cmd("PTTL")
            .arg(key(domain))
            .query_async(&mut link)
            .await?;
        let left = u64::try_from(ms).ok().map(Duration::from_millis);
        Ok(body.as_deref().and_then(read).zip(left))
    }

    /// Gives up `domain`'s held verdict: the gateway that reached it saw its evidence go (a
    /// key well past the hold's margin).
    pub async fn release(&self, domain: &str) -> redis::RedisResult<()> {
        let mut link = self.link().await?;
        redis::cmd("DEL")
            .arg(key(domain))
            .query_async(&mut link)
            .await
    }
}

/// A held verdict as written (a value that does not read is no verdict).
fn read(body: &str) -> Option<Finding> {
    serde_json::from_str(body).ok()
}
