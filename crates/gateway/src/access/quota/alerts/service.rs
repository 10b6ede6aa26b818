//! The alerts' background service: takes what the request path noticed into the outbox (claimed
//! on this host, and on Redis when the quota store is shared; `intake.rs`), then delivers what is
//! due, every second and as soon as something new arrives. At shutdown what is still on the
//! channel, or held after a failed write, goes into the outbox if it can, for the next start to
//! deliver; what cannot is offered again after the start by the project's next call.

mod intake;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use tokio::sync::mpsc::Receiver;

use super::claim::RedisClaims;
use super::config::AlertsConfig;
use super::deliver::AttemptError;
use super::destination::Listener;
use super::held::Held;
use super::ledger::Ledger;
use super::outbox::{Outbox, OutboxError, Row, State};
use super::{deliver, Alert, Alerts, Counters, CHANNEL};
use crate::access::quota::Month;
use crate::infra::redis::config::RedisConfig;

/// Rows delivered per pass at most (a pass then runs again at once while more are due).
const PER_PASS: usize = 16;
/// How often due alerts are looked for without news.
const TICK: Duration = Duration::from_secs(1);
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

/// The service (see the module documentation).
pub struct AlertService {
    config: AlertsConfig,
    secret: Vec<u8>,
    outbox: Arc<Mutex<Outbox>>,
    rx: tokio::sync::Mutex<Receiver<Alert>>,
    claims: Option<RedisClaims>,
    agent: ureq::Agent,
    counters: Arc<Counters>,
    /// What the request path knows of the outbox: told when a row is there, or is not coming.
    ledger: Arc<Ledger>,
}

/// The request side and the service of `config`: the secret read and the outbox opened now, so
/// that a bad one stops the start. `redis`: the shared quota store's, to claim on; `listeners`:
/// the gateway's own, never a receiver; `now`: the quota clock's, whose month's alerts the
/// outbox holds already are known to the request path from the start.
pub fn build(
    config: &AlertsConfig,
    outbox_path: PathBuf,
    redis: Option<&RedisConfig>,
    listeners: &[Listener],
    now: DateTime<Utc>,
) -> Result<(Arc<Alerts>, AlertService), String> {
    let secret = config.read_secret()?;
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
        secret,
        outbox: Arc::new(Mutex::new(outbox)),
        rx: tokio::sync::Mutex::new(rx),
        claims: redis.map(RedisClaims::new),
        agent: deliver::agent(config.timeout, config.policy(listeners)),
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

    /// Delivers what is due; returns whether a full pass was taken (more may be due).
    async fn deliver_due(&self) -> bool {
        let lease = self.config.timeout + Duration::from_secs(10);
        let Some(rows) = self
            .with(move |o| o.take_due(now_ms(), lease, PER_PASS))
            .await
        else {
            return false;
        };
        let full = rows.len() == PER_PASS;
        for row in rows {
            self.attempt(row).await;
        }
        full
    }

    async fn attempt(&self, row: Row) {
        let (agent, url, secret) = (
            self.agent.clone(),
            self.config.url.clone(),
            self.secret.clone(),
        );
        let (id, body) = (row.id.clone(), row.body.clone());
        let result = tokio::task::spawn_blocking(move || {
            deliver::post(&agent, &url, ("X-Alert-Id", &id), &body, &secret)
        })
        .await
        .unwrap_or_else(|e| Err(AttemptError::Failed(e.to_string())));
        let what = format!(
            "project {} month {} threshold {}%",
            row.project, row.month, row.threshold
        );
        match result {
            Ok(()) => {
                self.counters.sent.fetch_add(1, Ordering::Relaxed);
                log::info!("quota alert sent: {what}");
                self.with(move |o| o.set_state(&row, State::Sent)).await;
            }
            Err(e) => self.failed(row, &what, e).await,
        }
    }

    /// Records a failed attempt: retried after a backoff, given up after `max_attempts`, or at
    /// once when the destination was refused (logged once, without the URL's path or query).
    async fn failed(&self, row: Row, what: &str, e: AttemptError) {
        self.counters.attempt_errors.fetch_add(1, Ordering::Relaxed);
        let refused = matches!(e, AttemptError::Refused(_));
        let give_up = refused || row.attempts + 1 >= self.config.max_attempts;
        if refused {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            log::error!("quota alert refused, given up: {what}: {e}");
        } else if give_up {
            log::error!(
                "quota alert given up after {} attempts: {what}: {e}",
                row.attempts + 1
            );
        } else {
            log::warn!(
                "quota alert attempt {} failed: {what}: {e}",
                row.attempts + 1
            );
        }
        if give_up {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
        }
        let wait = deliver::backoff(row.attempts);
        let next = now_ms() + i64::try_from(wait.as_millis()).unwrap_or(i64::MAX / 2);
        let e = e.to_string();
        self.with(move |o| o.attempt_failed(&row, next, give_up, &e))
            .await;
    }

    async fn refresh_pending(&self, held: &Held) {
        self.counters
            .held
            .store(held.len() as u64, Ordering::Relaxed);
        if let Some(n) = self.with(|o| o.waiting()).await {
            self.counters.pending.store(n, Ordering::Relaxed);
        }
    }

    async fn prune(&self) {
        let month = crate::access::quota::Month::containing(Utc::now()).label();
        if let Some(n) = self.with(move |o| o.prune(&month)).await {
            if n > 0 {
                log::info!("quota alerts: forgot {n} settled alerts of past months");
            }
        }
    }
}

#[async_trait]
impl BackgroundService for AlertService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
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
            while self.deliver_due().await {}
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
