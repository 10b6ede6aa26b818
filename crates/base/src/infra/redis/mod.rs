//! One Redis connection handle for every feature that keeps shared state in Redis (the quota,
//! the shared top-domains flags, the call logs and stats), so that each of them works on the
//! same deployments: a single server, Redis Cluster, or a primary watched by Sentinel
//! (`gateway.quota.redis.mode`).
//!
//! Code that uses it must stay cluster-safe: a command or script touching several keys names
//! keys of one hash slot only (a common `{tag}` in the key names).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture,
    RedisResult, ServerErrorKind, Value,
};

pub mod config;

use config::{RedisConfig, RedisMode};

/// The first stream id after `id`.
pub fn stream_id_after(id: &str) -> Option<String> {
    let (ms, seq) = id.split_once('-')?;
    let (ms, seq): (u64, u64) = (ms.parse().ok()?, seq.parse().ok()?);
    Some(match seq.checked_add(1) {
        Some(s) => format!("{ms}-{s}"),
        None => format!("{}-0", ms.checked_add(1)?),
    })
}

/// A multiplexed, reconnecting connection to the configured Redis deployment. Cheap to clone.
#[derive(Clone)]
pub enum RedisLink {
    Single(ConnectionManager),
    /// Routes each command by its key's slot and follows the cluster's slot map.
    Cluster(ClusterConnection),
    /// The master the sentinels name, looked up again whenever it stops answering as master.
    Sentinel(Arc<SentinelLink>),
}

impl RedisLink {
    /// Sets the link up without waiting for Redis (the gateway starts when Redis is down).
    /// Must be called inside a Tokio runtime: the connection's driver task is spawned there.
    pub fn connect_lazy(config: &RedisConfig) -> redis::RedisResult<RedisLink> {
        match config.mode {
            RedisMode::Single => {
                let client = redis::Client::open(config.url.as_str())?;
                let manager_config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(config.connect_timeout))
                    .set_response_timeout(Some(config.call_timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(config.breaker_open);
                Ok(RedisLink::Single(ConnectionManager::new_lazy_with_config(
                    client,
                    manager_config,
                )?))
            }
            RedisMode::Cluster => {
                // No command is sent twice: a retried script whose first send ran (the reply was
                // lost with a broken connection) would find its id used and refuse the call it
                // counted. A redirect (MOVED after a failover or resharding) therefore fails that
                // one call, which the failure policy handles, and refreshes the slot map.
                let client = ClusterClientBuilder::new(config.nodes.iter().map(String::as_str))
                    .connection_timeout(config.connect_timeout)
                    .response_timeout(config.call_timeout)
                    .retries(0)
                    .build()?;
                Ok(RedisLink::Cluster(
                    client.get_pending_async_connection_with_config(
                        ClusterConfig::new()
                            .set_connection_timeout(config.connect_timeout)
                            .set_response_timeout(config.call_timeout),
                    ),
                ))
            }
            RedisMode::Sentinel => Ok(RedisLink::Sentinel(Arc::new(SentinelLink::new(config)?))),
        }
    }

    /// The caller doubts that the server it talks to is still the master (a write did not
    /// reach the replicas in time, a call timed out): behind Sentinel, the next command asks
    /// the sentinels first. A failover is then followed within one lookup, not only once the
    /// old master is demoted and drops its clients (which Sentinel does seconds later).
    pub fn recheck(&self) {
        if let RedisLink::Sentinel(s) = self {
            s.forget(None);
        }
    }
}

/// A link made on its first use (the gateway starts with Redis away), and calls bounded by
/// the config's `call_timeout`: what the stores of small shared state (keys, records) call
/// through.
pub struct LazyLink {
    cell: tokio::sync::OnceCell<RedisLink>,
    config: RedisConfig,
}

/// Why a call through a [`LazyLink`] did not answer.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    #[error("redis: no answer within {0} ms")]
    TimedOut(u128),
}

impl LazyLink {
    /// Nothing is sent yet; each call gets at least `min_budget`.
    pub fn new(config: &RedisConfig, min_budget: Duration) -> LazyLink {
        let mut config = config.clone();
        config.call_timeout = config.call_timeout.max(min_budget);
        LazyLink {
            cell: tokio::sync::OnceCell::new(),
            config,
        }
    }

    /// The link, made now if it was not.
    pub async fn get(&self) -> RedisResult<RedisLink> {
        Ok(self
            .cell
            .get_or_try_init(|| async { RedisLink::connect_lazy(&self.config) })
            .await?
            .clone())
    }

    /// How long one call may take.
    pub fn budget(&self) -> Duration {
        self.config.call_timeout
    }

    /// Runs `call` within the call budget.
    pub async fn timed<T>(
        &self,
        call: impl std::future::Future<Output = RedisResult<T>>,
    ) -> Result<T, LinkError> {
        match tokio::time::timeout(self.config.call_timeout, call).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(LinkError::TimedOut(self.config.call_timeout.as_millis())),
        }
    }
}

/// The current master of a Sentinel-watched deployment.
#[derive(Clone)]
struct Master {
    /// Which lookup found it (a failed call forgets only the master it was sent to).
    generation: u64,
    conn: MultiplexedConnection,
}

/// What the lookups share: the sentinels' client and the outcome of the last lookup.
struct Lookup {
    sentinels: SentinelClient,
    generation: u64,
    /// When the last lookup failed and why: callers that asked before it ended take its answer
    /// instead of queueing for a lookup each.
    failed: Option<(Instant, String)>,
}

/// A connection to whichever server the sentinels call master.
pub struct SentinelLink {
    master: Mutex<Option<Master>>,
    lookup: tokio::sync::Mutex<Lookup>,
    connection: AsyncConnectionConfig,
    /// Budget of one lookup (asking the sentinels, checking the role, connecting).
    lookup_budget: Duration,
    db: i64,
}

impl SentinelLink {
    fn new(config: &RedisConfig) -> RedisResult<SentinelLink> {
        // The master's credentials and db come from `url` (its address is the sentinels' call).
        let data = config.url.as_str().into_connection_info()?;
        let db = data.redis_settings().db();
        let sentinels = SentinelClient::build(
            config.sentinel.nodes.clone(),
            config.sentinel.master_name.clone(),
            Some(
                SentinelNodeConnectionInfo::default()
                    .set_redis_connection_info(data.redis_settings().clone()),
            ),
            SentinelServerType::Master,
        )?;
        Ok(SentinelLink {
            master: Mutex::new(None),
            lookup: tokio::sync::Mutex::new(Lookup {
                sentinels,
                generation: 0,
                failed: None,
            }),
            connection: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(config.connect_timeout))
                .set_response_timeout(Some(config.call_timeout)),
            lookup_budget: config.connect_timeout,
            db,
        })
    }

    fn current(&self) -> Option<Master> {
        self.master
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The master, looked up first if none is known. The lookup runs in its own task: a caller
    /// that gives up (its call budget is shorter) does not abort it for the next one.
    async fn master(self: &Arc<Self>) -> RedisResult<Master> {
        if let Some(m) = self.current() {
            return Ok(m);
        }
        let link = Arc::clone(self);
        let asked = Instant::now();
        tokio::spawn(async move { link.look_up(asked).await })
            .await
            .map_err(|e| refused(&format!("sentinel lookup task: {e}")))?
    }

    async fn look_up(&self, asked: Instant) -> RedisResult<Master> {
        let mut lookup = self.lookup.lock().await;
        if let Some(m) = self.current() {
            return Ok(m);
        }
        if let Some((at, why)) = &lookup.failed {
            if *at >= asked {
                return Err(refused(why));
            }
        }
        let found = tokio::time::timeout(self.lookup_budget, async {
            let client = lookup.sentinels.async_get_client().await?;
            let conn = client
                .get_multiplexed_async_connection_with_config(&self.connection)
                .await?;
            Ok::<_, RedisError>((client.get_connection_info().addr().to_string(), conn))
        })
        .await;
        match found {
            Ok(Ok((addr, conn))) => {
                lookup.generation += 1;
                lookup.failed = None;
                let m = Master {
                    generation: lookup.generation,
                    conn,
                };
                *self.master.lock().unwrap_or_else(|p| p.into_inner()) = Some(m.clone());
                log::info!("redis: the sentinels name {addr} as master");
                Ok(m)
            }
            Ok(Err(e)) => {
                let why = format!("no master from the sentinels: {e}");
                lookup.failed = Some((Instant::now(), why.clone()));
                Err(refused(&why))
            }
            Err(_) => {
                let why = "no master from the sentinels within connect_timeout_ms".to_owned();
                lookup.failed = Some((Instant::now(), why.clone()));
                Err(refused(&why))
            }
        }
    }

    /// After `e` on the master of `generation`: forgets it if `e` says it is gone or no longer
    /// master, so that the next call asks the sentinels again.
    fn after_error(&self, generation: u64, e: &RedisError) {
        let lost = e.is_io_error()
            || e.is_connection_dropped()
            || matches!(
                e.kind(),
                ErrorKind::Server(
                    ServerErrorKind::ReadOnly
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::BusyLoading
                )
            );
        if lost {
            self.forget(Some(generation));
        }
    }

    /// Forgets the master (only the one of `generation`, if given).
    fn forget(&self, generation: Option<u64>) {
        let mut m = self.master.lock().unwrap_or_else(|p| p.into_inner());
        if m.as_ref()
            .is_some_and(|m| generation.is_none_or(|g| m.generation == g))
        {
            *m = None;
        }
    }

    async fn send(self: &Arc<Self>, cmd: &Cmd) -> RedisResult<Value> {
        let mut m = self.master().await?;
        let r = m.conn.req_packed_command(cmd).await;
        if let Err(e) = &r {
            self.after_error(m.generation, e);
        }
        r
    }

    async fn send_pipeline(
        self: &Arc<Self>,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let mut m = self.master().await?;
        let r = m.conn.req_packed_commands(pipeline, offset, count).await;
        if let Err(e) = &r {
            self.after_error(m.generation, e);
        }
        r
    }
}

/// An error that says the command never reached a server (so it cannot have run).
fn refused(why: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        why.to_owned(),
    ))
}

impl ConnectionLike for RedisLink {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisLink::Single(c) => c.req_packed_command(cmd),
            RedisLink::Cluster(c) => c.req_packed_command(cmd),
            RedisLink::Sentinel(s) => Box::pin(s.send(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisLink::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisLink::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            RedisLink::Sentinel(s) => Box::pin(s.send_pipeline(pipeline, offset, count)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisLink::Single(c) => c.get_db(),
            RedisLink::Cluster(c) => c.get_db(),
            RedisLink::Sentinel(s) => s.db,
        }
    }
}
