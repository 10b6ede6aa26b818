//! The alerts' background service: hands what the request path noticed to the webhook engine's
//! outbox (`intake.rs`): one hold per alert, the alert's only durable record, and one message per
//! destination (the operator's URL, the project's webhooks for `quota.threshold`). With the Redis
//! quota store the hold is written held, the claim asked for after (`claim.rs`: only the first
//! gateway wins), and the hold then released or dropped; a crash in between leaves it held with
//! the claim's token, asked again after the restart, so the claim is exactly once. It runs every
//! second and as soon as something new arrives. At its first pass it carries over what the
//! previous release's own outbox held (`migrate.rs`). At shutdown what is still on the channel,
//! or held after a failed write, goes into the outbox if it can, for the next start to deliver;
//! what cannot is offered again after the start by the project's next call.

mod intake;
mod migrate;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use drg_base::service::{Service, Shutdown};
use tokio::sync::mpsc::Receiver;

use drg_webhook::engine::EngineError;
use drg_webhook::{Sender, Subscribers};

use super::claim::RedisClaims;
use super::config::AlertsConfig;
use super::handover::parse_key;
pub use super::handover::TOPIC;
use super::held::Held;
use super::ledger::Ledger;
use super::{Alert, Alerts, Counters, CHANNEL};
use crate::quota::Month;
use drg_base::infra::redis::config::RedisConfig;
pub use migrate::MigrateError;

/// Held holds confirmed per pass at most (a pass runs every second).
const PER_PASS: usize = 16;
/// How often the service passes without news.
const TICK: Duration = Duration::from_secs(1);
/// Alerts held for the outbox at most (past it, one is left to its project's next call).
const HELD_MAX: usize = 4 * CHANNEL;

/// Why a piece of work on the outbox did not complete.
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Migrate(#[from] MigrateError),
    #[error("quota alerts: previous outbox task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Why the service could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Engine(#[from] drg_webhook::outbox::OutboxError),
    #[error(transparent)]
    Migrate(#[from] MigrateError),
}

/// The service (see the module documentation).
pub struct AlertService {
    config: AlertsConfig,
    rx: tokio::sync::Mutex<Receiver<Alert>>,
    claims: Option<RedisClaims>,
    /// The webhook engine, and who receives what.
    sender: Sender,
    subscribers: Arc<dyn Subscribers>,
    counters: Arc<Counters>,
    /// What the request path knows of the outbox: told when a hold is there, or is not coming.
    ledger: Arc<Ledger>,
    /// The previous release's outbox, until its alerts are carried over.
    previous: PathBuf,
    carried: AtomicBool,
}

/// The request side and the service of `config`. `previous`: the previous release's own alerts
/// outbox, whose alerts are carried over at the first pass; `redis`: the shared quota store's,
/// to claim on; `sender`, `subscribers`: the webhook engine and who receives what; `now`: the
/// quota clock's, whose month's alerts the outbox (and the previous one) hold already are known
/// to the request path from the start. An outbox that cannot be read stops the start.
pub fn build(
    config: &AlertsConfig,
    previous: PathBuf,
    redis: Option<&RedisConfig>,
    (sender, subscribers): (Sender, Arc<dyn Subscribers>),
    now: DateTime<Utc>,
) -> Result<(Arc<Alerts>, AlertService), BuildError> {
    let ledger = Arc::new(Ledger::new(config.thresholds.clone()));
    let month = Month::containing(now);
    let label = month.label();
    let keys = sender.at_start(|o| o.hold_keys(TOPIC))?;
    let mut rows: Vec<(String, u32)> = keys
        .iter()
        .filter_map(|k| parse_key(k))
        .filter(|(_, m, _)| *m == label)
        .map(|(project, _, threshold)| (project.to_owned(), threshold))
        .collect();
    rows.extend(migrate::recorded_in(&previous, &label)?);
    ledger.preload(month.index(), rows);
    let counters = Arc::new(Counters::default());
    let (alerts, rx) = Alerts::with_ledger(ledger.clone(), counters.clone());
    let service = AlertService {
        config: config.clone(),
        rx: tokio::sync::Mutex::new(rx),
        claims: redis.map(RedisClaims::new),
        sender,
        subscribers,
        counters,
        ledger,
        previous,
        carried: AtomicBool::new(false),
    };
    Ok((Arc::new(alerts), service))
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

impl AlertService {
    /// Its counters (the webhook engine's outcomes of its messages are added to them).
    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// Confirms the held holds on Redis: won, the alert's messages are released; lost, another
    /// gateway delivers it, they are dropped (the hold stays: the threshold is done). Redis
    /// away: they wait for the next pass. Asked with the hold's token, a claim this gateway won
    /// before a crash is won again.
    async fn confirm_claims(&self) {
        let Some(claims) = &self.claims else {
            return;
        };
        let held = match self.sender.held_rows(TOPIC, PER_PASS).await {
            Ok(held) => held,
            Err(e) => return log::error!("{e}"),
        };
        for row in held {
            let Some((project, month, threshold)) = parse_key(&row.key) else {
                continue;
            };
            let won = match claims.claim(project, month, threshold, &row.token).await {
                Ok(won) => won,
                Err(e) => {
                    log::warn!("quota alerts: cannot claim on Redis ({e}); retrying");
                    return;
                }
            };
            let done = match won {
                true => self.sender.release(row.key).await,
                false => self.sender.drop_held(row.key).await,
            };
            if let Err(e) = done {
                log::error!("{e}");
            }
        }
    }

    async fn refresh_pending(&self, held: &Held) {
        self.counters
            .held
            .store(held.len() as u64, Ordering::Relaxed);
        match self.sender.waiting(TOPIC).await {
            Ok(n) => self.counters.pending.store(n, Ordering::Relaxed),
            Err(e) => log::error!("{e}"),
        }
    }

    /// Carries the previous release's outbox over, once (tried again each pass until it is).
    async fn carry_over_once(&self) {
        if self.carried.load(Ordering::Relaxed) {
            return;
        }
        match self.carry_over().await {
            Ok(0) => self.carried.store(true, Ordering::Relaxed),
            Ok(n) => {
                log::info!(
                    "quota alerts: {n} alerts of the previous outbox {} carried into the webhook outbox",
                    self.previous.display()
                );
                self.carried.store(true, Ordering::Relaxed);
            }
            Err(e) => log::error!("{e}; tried again in a second"),
        }
    }
}

#[async_trait]
impl Service for AlertService {
    async fn run(&self, mut shutdown: Shutdown) {
        let mut rx = self.rx.lock().await;
        let mut held = Held::new(HELD_MAX);
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                alert = rx.recv() => match alert {
                    Some(alert) => self.take_in(alert.into(), &mut held).await,
                    None => break,
                },
                _ = tick.tick() => {}
                _ = shutdown.changed() => break,
            }
            while let Ok(alert) = rx.try_recv() {
                self.take_in(alert.into(), &mut held).await;
            }
            self.retry_held(&mut held).await;
            self.ledger.fold();
            self.carry_over_once().await;
            self.confirm_claims().await;
            self.refresh_pending(&held).await;
            self.counters.passes.fetch_add(1, Ordering::Relaxed);
        }
        self.flush(&mut rx, &mut held).await;
    }
}
