//! The control store on PostgreSQL (`gateway.control`): what a project creates through the API
//! and must not lose (here: its overrides, webhooks, reports and the accepted verdicts), kept
//! in one database every gateway of a deployment reads, instead of Redis with a copy per
//! gateway. A write is one transaction (the record, its project's bound, the kind's revision);
//! each gateway follows the revision into its snapshot and never writes its copy back: the
//! database is the truth, its loss the operator's restore.
//!
//! This module holds the connection pool and the schema's migrations, versioned here and
//! applied once by whichever gateway starts first (`drg_schema`). The records themselves are
//! `records/postgres.rs`.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{serde_as, DurationMilliSeconds};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// `gateway.control`: where the control store is.
#[serde_as]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlConfig {
    /// `postgres://user:password@host:port/database` (libpq's URL; `?sslmode=require` for
    /// TLS). Never logged: it may hold a password.
    pub url: String,
    /// One call's budget, the database's own `statement_timeout` included: past it a write
    /// answers `503` and the database has rolled it back.
    #[serde(rename = "call_timeout_ms", default = "default_call_timeout")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub call_timeout: Duration,
    /// Connections of this gateway at most.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
}

fn default_call_timeout() -> Duration {
    Duration::from_millis(2_000)
}

fn default_max_connections() -> u32 {
    8
}

impl ControlConfig {
    /// Problems of the section, each naming its key.
    pub fn problems(&self, at: &str) -> Vec<String> {
        let mut out = Vec::new();
        let scheme = ["postgres://", "postgresql://"]
            .iter()
            .any(|s| self.url.starts_with(s));
        if !scheme || self.url.parse::<PgConnectOptions>().is_err() {
            out.push(format!(
                "{at}.url: not a postgres:// URL (postgres://user:password@host:5432/database)"
            ));
        }
        let ms = crate::infra::units::ms(self.call_timeout);
        if !(50..=60_000).contains(&ms) {
            out.push(format!("{at}.call_timeout_ms: {ms}; 50 to 60000"));
        }
        if !(1..=256).contains(&self.max_connections) {
            out.push(format!(
                "{at}.max_connections: {}; 1 to 256",
                self.max_connections
            ));
        }
        out
    }
}

/// Why the control store did not answer.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("postgres: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("postgres: no answer within {0} ms")]
    TimedOut(u64),
}

/// The schema, one migration a version, in order; each runs once, in a transaction.
const MIGRATIONS: &[(i32, &str)] = &[(
    1,
    "CREATE TABLE drg_records (
       kind TEXT NOT NULL,
       project TEXT NOT NULL,
       key TEXT NOT NULL,
       stamp BIGINT NOT NULL,
       removed BOOLEAN NOT NULL,
       body TEXT NOT NULL,
       PRIMARY KEY (kind, project, key));
     CREATE INDEX drg_records_removed ON drg_records (kind, project, removed, stamp);
     CREATE TABLE drg_revision (
       kind TEXT PRIMARY KEY,
       n BIGINT NOT NULL CHECK (n >= 0));",
)];

/// Any fixed number: the advisory lock two gateways starting at once take to migrate in turn.
const MIGRATION_LOCK: i64 = 0x0064_7267_5f63_746c;

/// The control store: a pool on the database, made and the schema migrated at first use (in
/// the process and runtime that serve: a host may fork after building, and the pool's tasks
/// need a runtime).
pub struct Control {
    options: PgConnectOptions,
    max_connections: u32,
    call_timeout: Duration,
    pool: tokio::sync::OnceCell<PgPool>,
}

impl Control {
    /// The store `config` names (nothing is connected yet: the first call connects, so a
    /// database down at start delays no start).
    pub fn new(config: &ControlConfig) -> Result<Arc<Control>, ControlError> {
        let ms = crate::infra::units::ms(config.call_timeout);
        let options = config
            .url
            .parse::<PgConnectOptions>()?
            .application_name("domain-risk-gateway")
            // The database ends a statement past the budget, so a call answered `503` never
            // commits later.
            .options([
                ("statement_timeout", ms.to_string()),
                ("idle_in_transaction_session_timeout", ms.to_string()),
            ]);
        Ok(Arc::new(Control {
            options,
            max_connections: config.max_connections,
            call_timeout: config.call_timeout,
            pool: tokio::sync::OnceCell::new(),
        }))
    }

    /// The pool, the schema migrated.
    pub async fn pool(&self) -> Result<&PgPool, ControlError> {
        self.pool
            .get_or_try_init(|| async {
                let pool = PgPoolOptions::new()
                    .max_connections(self.max_connections)
                    .acquire_timeout(self.call_timeout)
                    .connect_lazy_with(self.options.clone());
                self.within(migrate(&pool)).await?;
                Ok::<_, ControlError>(pool)
            })
            .await
    }

    /// `call` within the call budget.
    pub async fn within<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, ControlError>>,
    ) -> Result<T, ControlError> {
        let ms = crate::infra::units::ms(self.call_timeout);
        tokio::time::timeout(self.call_timeout, call)
            .await
            .unwrap_or(Err(ControlError::TimedOut(ms)))
    }
}

/// Applies the migrations the database lacks, one transaction each, under a lock.
async fn migrate(pool: &PgPool) -> Result<(), ControlError> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS drg_schema (
           version INTEGER PRIMARY KEY,
           applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
    )
    .execute(&mut *tx)
    .await?;
    let at: Option<i32> = sqlx::query_scalar("SELECT max(version) FROM drg_schema")
        .fetch_one(&mut *tx)
        .await?;
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| Some(*v) > at) {
        sqlx::raw_sql(*sql).execute(&mut *tx).await?;
        sqlx::query("INSERT INTO drg_schema (version) VALUES ($1)")
            .bind(version)
            .execute(&mut *tx)
            .await?;
        log::info!("control store: schema version {version} applied");
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_takes_defaults_and_names_each_problem() {
        let c: ControlConfig =
            serde_yaml::from_str("{ url: 'postgres://drg:pw@127.0.0.1:5432/drg' }").unwrap();
        assert_eq!(c.call_timeout, Duration::from_millis(2_000));
        assert_eq!(c.max_connections, 8);
        assert!(c.problems("gateway.control").is_empty());
        let bad: ControlConfig =
            serde_yaml::from_str("{ url: 'redis://x', call_timeout_ms: 10, max_connections: 0 }")
                .unwrap();
        let p = bad.problems("gateway.control").join("\n");
        for key in ["url", "call_timeout_ms", "max_connections"] {
            assert!(p.contains(&format!("gateway.control.{key}")), "{p}");
        }
        assert!(serde_yaml::from_str::<ControlConfig>("{ url: x, other: 1 }").is_err());
    }

    #[test]
    fn migrations_are_numbered_in_order() {
        let versions: Vec<i32> = MIGRATIONS.iter().map(|(v, _)| *v).collect();
        assert!(versions.windows(2).all(|w| w[0] < w[1]) && versions[0] == 1);
    }
}
