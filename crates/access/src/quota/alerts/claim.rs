//! Claims on Redis, for gateways sharing the Redis quota store: one key per (project, month,
//! threshold), set only if absent, holding the claimer's alert id; a claimer asking again (after
//! a restart) with the same id still wins. Cluster-safe: the key carries the project's hash tag.

use drg_base::infra::redis::config::RedisConfig;
use drg_base::infra::redis::RedisLink;

/// Claim keys outlive the month they are for by far: a claim must never be taken twice.
const TTL_SECONDS: u64 = 62 * 86_400;

const CLAIM: &str = r#"
local held = redis.call('GET', KEYS[1])
if not held then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  return 1
end
if held == ARGV[1] then return 1 end
return 0
"#;

/// The key of one alert's claim.
pub fn key(project: &str, month: &str, threshold: u32) -> String {
    format!("q:{{{project}}}:{month}:alert:{threshold}")
}

/// Claims on the quota store's Redis.
pub struct RedisClaims {
    link: tokio::sync::OnceCell<RedisLink>,
    config: RedisConfig,
    script: redis::Script,
}

impl RedisClaims {
    pub fn new(config: &RedisConfig) -> Self {
        RedisClaims {
            link: tokio::sync::OnceCell::new(),
            config: config.clone(),
            script: redis::Script::new(CLAIM),
        }
    }

    /// Whether alert `id` holds (or now takes) the claim, under the quota store's call budget.
    pub async fn claim(
        &self,
        project: &str,
        month: &str,
        threshold: u32,
        id: &str,
    ) -> Result<bool, String> {
        let mut link = self
            .link
            .get_or_try_init(|| async { RedisLink::connect_lazy(&self.config) })
            .await
            .map_err(|e| e.to_string())?
            .clone();
        let mut call = self.script.prepare_invoke();
        call.key(key(project, month, threshold))
            .arg(id)
            .arg(TTL_SECONDS);
        match tokio::time::timeout(self.config.call_timeout, call.invoke_async::<u8>(&mut link))
            .await
        {
            Ok(Ok(won)) => Ok(won == 1),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".into()),
        }
    }
}
