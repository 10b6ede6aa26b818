//! The alerts' background service: takes what the request path noticed into the outbox (claimed
//! on this host, and on Redis when the quota store is shared; `intake.rs`), then hands each
//! claimed alert to the webhook engine, one message per destination (the operator's URL, the
//! project's webhooks for `quota.threshold`), every second and as soon as something new arrives. At shutdown what is still on the
//! channel, or held after a failed write, goes into the outbox if it can, for the next start to
//! deliver; what cannot is offered again after the start by the project's next call.

mod intake;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use drg_base::service::{Service, Shutdown};
use tokio::sync::mpsc::Receiver;

use drg_webhook::{Message, Sender};

use super::claim::RedisClaims;
use super::config::AlertsConfig;
use super::held::Held;
use super::ledger::Ledger;
use super::outbox::{Outbox, OutboxError, Row, State};
use super::{Alert, Alerts, Counters, CHANNEL};
use crate::quota::Month;
use drg_base::infra::redis::config::RedisConfig;

/// Rows delivered per pass at most (a pass then runs again at once while more are due).
const PER_PASS: usize = 16;
/// How often due alerts are looked for without news.
const TICK: Duration = Duration::from_secs(1);
/// The topic of an alert's messages.
pub const TOPIC: &str = "quota.threshold";
/// How often settled alerts of past months are forgotten.
const PRUNE_EVERY: Duration = Duration::from_secs(3_600);
/// Alerts held for the outbox at most (past it, one is left to its project's next call).
const HELD_MAX: usize = 4 * CHANNEL;

/// Why a piece of work on the outbox did not complete.
#[derive(Debug, thiserror::Error)]
enum RunError {
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    #[error("quota alerts: outbox task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

use drg_webhook::Subscribers;

/// The service (see the module documentation).
pub struct AlertService {
    config: AlertsConfig,
    outbox: Arc<Mutex<Outbox>>,
    rx: tokio::sync::Mutex<Receiver<Alert>>,
    claims: Option<RedisClaims>,
    /// The webhook engine, and who receives what.
    sender: Sender,
    subscribers: Arc<dyn Subscribers>,
    counters: Arc<Counters>,
    /// What the request path knows of the outbox: told when a row is there, or is not coming.
    ledger: Arc<Ledger>,
}

/// The request side and the service of `config`: the outbox opened now, so that a bad one stops
/// the start. `redis`: the shared quota store's, to claim on; `sender`, `subscribers`: the
/// webhook engine and who receives what; `now`: the quota clock's, whose month's alerts the
/// outbox holds already are known to the request path from the start.
pub fn build(
    config: &AlertsConfig,
    outbox_path: PathBuf,
    redis: Option<&RedisConfig>,
    (sender, subscribers): (Sender, Arc<dyn Subscribers>),
    now: DateTime<Utc>,
) -> Result<(Arc<Alerts>, AlertService), String> {
    let mut outbox = Outbox::open(&outbox_path).map_err(|e| e.to_string())?;
    let ledger = Arc::new(Ledger::new(config.thresholds.clone()));
    let month = Month::containing(now);
    match outbox.recorded_in(&month.label()) {
        Ok(rows) => ledger.preload(month.index(), rows),
        // Safe, only slower: each call over a threshold offers it, the outbox says it has it.
        Err(e) => log::warn!("{e}: its alerts of {} are asked for again", month.label()),
    }
    // The service opens its own, in the process that serves (a host may fork before it runs).
    outbox.close();
    let counters = Arc::new(Counters::default());
    let (alerts, rx) = Alerts::with_ledger(ledger.clone(), counters.clone());
    let service = AlertService {
        config: config.clone(),
        outbox: Arc::new(Mutex::new(outbox)),
        rx: tokio::sync::Mutex::new(rx),
        claims: redis.map(RedisClaims::new),
        sender,
        subscribers,
        counters,
        ledger,
    };
    Ok((Arc::new(alerts), service))
}

/// A random alert id: 32 hex digits.
fn alert_id() -> String {
    let (a, b) = (
        getrandom::u64().unwrap_or_default(),
        getrandom::u64().unwrap_or_default(),
    );
    format!("{a:016x}{b:016x}")
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

impl AlertService {
    /// Its counters (the webhook engine's outcomes of its messages are added to them).
    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// Runs `f` on the outbox off the async threads (SQLite waits for the disk).
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Outbox) -> Result<T, OutboxError> + Send + 'static,
    ) -> Result<T, RunError> {
        let outbox = self.outbox.clone();
        let done = tokio::task::spawn_blocking(move || {
            let mut guard = outbox.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut guard)
        })
        .await;
        Ok(done??)
    }

    /// [`AlertService::run`], a failure logged.
    async fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Outbox) -> Result<T, OutboxError> + Send + 'static,
    ) -> Option<T> {
        self.run(f).await.map_err(|e| log::error!("{e}")).ok()
    }

    /// Confirms the claims recorded here on Redis: won, the alert is to deliver; lost, another
    /// gateway delivers it. Redis away: they wait for the next pass.
    async fn confirm_claims(&self) {
        let Some(claims) = &self.claims else {
            return;
        };
        let Some(rows) = self.with(|o| o.claiming(PER_PASS)).await else {
            return;
        };
        for row in rows {
            let won = match claims
                .claim(&row.project, &row.month, row.threshold, &row.id)
                .await
            {
                Ok(won) => won,
                Err(e) => {
                    log::warn!("quota alerts: cannot claim on Redis ({e}); retrying");
                    return;
                }
            };
            let state = if won {
                State::Pending
            } else {
                State::Elsewhere
            };
            self.with(move |o| o.set_state(&row, state)).await;
        }
    }

    /// Hands what is claimed to the webhook engine; returns whether a full pass was taken (more
    /// may be due).
    async fn hand_over_due(&self) -> bool {
        let lease = Duration::from_secs(30);
        let Some(rows) = self
            .with(move |o| o.take_due(now_ms(), lease, PER_PASS))
            .await
        else {
            return false;
        };
        let full = rows.len() == PER_PASS;
        for row in rows {
            self.hand_over(row).await;
        }
        full
    }

    /// One message per destination, keyed by the alert and the destination: handed over again
    /// after a crash, each is still delivered once.
    async fn hand_over(&self, row: Row) {
        let messages: Vec<Message> = self
            .subscribers
            .destinations(&row.project, TOPIC)
            .into_iter()
            .map(|destination| Message {
                key: format!(
                    "{TOPIC}:{}:{}:{}:{destination}",
                    row.project, row.month, row.threshold
                ),
                topic: TOPIC.to_owned(),
                label: "quota alert".to_owned(),
                // One project's alerts in order; another project's beside them.
                lane: format!("{destination}|{}", row.project),
                destination,
                id_header: "X-Alert-Id".to_owned(),
                id: row.id.clone(),
                body: row.body.clone(),
            })
            .collect();
        match self.sender.send(messages).await {
            Ok(_) => {
                self.with(move |o| o.set_state(&row, State::Handed)).await;
            }
            Err(e) => {
                log::error!("quota alerts: {e}; handed over again in a second");
                let next = now_ms() + 1_000;
                let e = e.to_string();
                self.with(move |o| o.attempt_failed(&row, next, false, &e))
                    .await;
            }
        }
    }

    async fn refresh_pending(&self, held: &Held) {
        self.counters
            .held
            .store(held.len() as u64, Ordering::Relaxed);
        let handed = match self.sender.waiting(TOPIC).await {
            Ok(n) => n,
            Err(e) => return log::error!("{e}"),
        };
        if let Some(n) = self.with(|o| o.waiting()).await {
            self.counters.pending.store(n + handed, Ordering::Relaxed);
        }
    }

    async fn prune(&self) {
        let month = crate::quota::Month::containing(Utc::now()).label();
        if let Some(n) = self.with(move |o| o.prune(&month)).await {
            if n > 0 {
                log::info!("quota alerts: forgot {n} settled alerts of past months");
            }
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
        let mut last_prune: Option<tokio::time::Instant> = None;
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
            self.confirm_claims().await;
            while self.hand_over_due().await {}
            self.refresh_pending(&held).await;
            self.counters.passes.fetch_add(1, Ordering::Relaxed);
            if last_prune.is_none_or(|t| t.elapsed() >= PRUNE_EVERY) {
                last_prune = Some(tokio::time::Instant::now());
                self.prune().await;
            }
        }
        self.flush(&mut rx, &mut held).await;
    }
}
