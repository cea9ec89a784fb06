//! The database: connection options (DATABASE_URL or libpq's PG* variables), a bounded pool
//! whose every connection carries sexton's timeouts (FL-6), and migrations.

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool};

use crate::config::DatabaseSettings;

/// sexton's own migrations: the reference schema and the objects its jobs need.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Why the database could not be reached or prepared.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("DATABASE_URL is not a valid PostgreSQL URL: {0}")]
    BadUrl(#[source] sqlx::Error),
    #[error("could not connect to PostgreSQL at {target}: {source}")]
    Connect {
        target: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("could not apply sexton's migrations: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    #[error("could not apply the queue's (apalis-postgres) migrations: {0}")]
    QueueMigrate(#[source] apalis_postgres::Error),
    #[error("could not install the guard on the queue's table: {0}")]
    QueueGuard(#[source] sqlx::Error),
}

/// Connection options from `DATABASE_URL` if set, else from the libpq `PG*` variables.
///
/// # Errors
/// [`DbError::BadUrl`] when `DATABASE_URL` cannot be parsed.
pub fn connect_options(settings: &DatabaseSettings) -> Result<PgConnectOptions, DbError> {
    let options = match std::env::var("DATABASE_URL") {
        Ok(url) if !url.is_empty() => PgConnectOptions::from_str(&url).map_err(DbError::BadUrl)?,
        _ => PgConnectOptions::new(),
    };
    Ok(options.application_name("sexton").options([
        (
            "statement_timeout",
            settings.statement_timeout.as_millis().to_string(),
        ),
        (
            "lock_timeout",
            settings.lock_timeout.as_millis().to_string(),
        ),
        // A session left idle inside a transaction (a stalled worker) must not hold locks.
        (
            "idle_in_transaction_session_timeout",
            (settings.statement_timeout.as_millis() * 2).to_string(),
        ),
    ]))
}

/// Where the options point, for error messages (never the password).
pub fn describe(options: &PgConnectOptions) -> String {
    format!(
        "{}:{}/{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("(default database)")
    )
}

/// A bounded pool; every connection runs with sexton's statement and lock timeouts.
///
/// # Errors
/// [`DbError::Connect`] when no connection can be made.
pub async fn connect(settings: &DatabaseSettings) -> Result<PgPool, DbError> {
    let options = connect_options(settings)?;
    let target = describe(&options);
    // One direct connection first: the pool would only say "pool timed out", hiding why
    // (connection refused, authentication failed, no such database).
    let probe = tokio::time::timeout(
        settings.acquire_timeout,
        PgConnection::connect_with(&options),
    )
    .await
    .unwrap_or(Err(sqlx::Error::PoolTimedOut));
    match probe {
        Ok(conn) => {
            let _ = conn.close().await;
        }
        Err(source) => return Err(DbError::Connect { target, source }),
    }
    PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        .connect_with(options)
        .await
        .map_err(|source| DbError::Connect { target, source })
}

/// Like [`connect`], retrying with a doubling wait (500 ms up to 10 s) for
/// `database.connect_attempts` tries, so that a fleet started before its database waits (ER-2).
///
/// # Errors
/// The last [`DbError`] once every attempt failed.
pub async fn connect_with_retry(settings: &DatabaseSettings) -> Result<PgPool, DbError> {
    let mut delay = std::time::Duration::from_millis(500);
    let mut attempt = 1;
    loop {
        match connect(settings).await {
            Ok(pool) => return Ok(pool),
            Err(err @ DbError::BadUrl(_)) => return Err(err),
            Err(err) if attempt >= settings.connect_attempts => return Err(err),
            Err(err) => {
                tracing::warn!(attempt, of = settings.connect_attempts, error = %err, "database unreachable; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(std::time::Duration::from_secs(10));
                attempt += 1;
            }
        }
    }
}

/// Applies the queue's schema (schema `apalis`, its own migration table), then sexton's
/// migrations, then the guard on the queue's table. Idempotent.
///
/// # Errors
/// [`DbError::QueueMigrate`] or [`DbError::Migrate`] when a migration fails.
pub async fn migrate(pool: &PgPool) -> Result<(), DbError> {
    apalis_postgres::PostgresStorage::setup(pool)
        .await
        .map_err(DbError::QueueMigrate)?;
    MIGRATOR.run(pool).await.map_err(DbError::Migrate)?;
    sqlx::raw_sql(QUEUE_GUARD)
        .execute(pool)
        .await
        .map_err(DbError::QueueGuard)?;
    Ok(())
}

/// The guard on the queue's table that kills rows its poll could never decode (FL-1).
const QUEUE_GUARD: &str = include_str!("queue_guard.sql");
