//! The database: connection options (DATABASE_URL or libpq's PG* variables), a bounded pool
//! whose every connection carries sexton's timeouts (FL-6), and migrations.

use std::str::FromStr;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
        .before_acquire(|_, meta| Box::pin(async move { Ok(!stale(meta.age)) }))
        .connect_with(options)
        .await
        .map_err(|source| DbError::Connect { target, source })
}

/// When this process started: what connection ages are measured against.
static STARTED: LazyLock<Instant> = LazyLock::new(Instant::now);
/// Milliseconds after [`STARTED`] at which the pools' connections were last renewed; 0: never.
static RENEWED: AtomicU64 = AtomicU64::new(0);

/// Closes every pooled connection opened before now at its next acquire, so that new ones are
/// opened in its place: a session keeps the `default_transaction_read_only` it started with, so
/// connections opened while the database was read-only stay read-only after it is writable
/// again (ER-6) — up to `max_lifetime`, 30 minutes, if nothing renews them.
pub fn renew_connections() {
    let now = STARTED.elapsed().as_millis().max(1);
    RENEWED.store(u64::try_from(now).unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// Whether a connection `age` old was opened before the last [`renew_connections`].
fn stale(age: Duration) -> bool {
    let renewed = RENEWED.load(Ordering::Relaxed);
    renewed > 0 && STARTED.elapsed().saturating_sub(age).as_millis() < u128::from(renewed)
}

/// Whether the database takes writes: (read only, in recovery) as one session sees it.
async fn read_only<'e>(db: impl sqlx::PgExecutor<'e>) -> Result<(bool, bool), sqlx::Error> {
    sqlx::query_as("SELECT current_setting('transaction_read_only') = 'on', pg_is_in_recovery()")
        .fetch_one(db)
        .await
}

/// Watches, now and every `interval`, whether the pool's connections take writes (ER-6): while
/// they do not, it asks a new connection; if that one does, the database became writable again
/// and the pool's connections are renewed, else the node is read-only and it says so, once per
/// interval, naming why — and returns why if `give_up` (a run until idle would wait forever).
pub async fn watch_writable(
    pool: PgPool,
    settings: DatabaseSettings,
    interval: Duration,
    give_up: bool,
) -> String {
    loop {
        if let Some(why) = writable(&pool, &settings, give_up).await
            && give_up
        {
            return why;
        }
        tokio::time::sleep(interval).await;
    }
}

/// How long [`writable`] waits for a pooled connection before it asks a new one: on a
/// read-only node the queue's consumers keep failing and restarting, and the pool can take
/// longer than its acquire timeout to serve anyone.
const POOLED_CHECK: Duration = Duration::from_secs(1);

/// One check of [`watch_writable`]: why the node is read-only, if it is. `fresh_only` skips the
/// pool (nothing to renew when the run ends on a read-only node anyway).
async fn writable(pool: &PgPool, settings: &DatabaseSettings, fresh_only: bool) -> Option<String> {
    // A pool that cannot serve (every connection busy, or failing) does not say: ask anew.
    let pooled_read_only = if fresh_only {
        false
    } else {
        match tokio::time::timeout(POOLED_CHECK, read_only(pool)).await {
            Ok(Ok((false, _))) => return None,
            Ok(Ok((true, _))) => true,
            Ok(Err(_)) | Err(_) => false,
        }
    };
    let options = connect_options(settings).ok()?;
    let fresh = tokio::time::timeout(settings.acquire_timeout, async {
        let mut conn = PgConnection::connect_with(&options).await?;
        let state = read_only(&mut conn).await;
        let _ = conn.close().await;
        state
    })
    .await
    .unwrap_or(Err(sqlx::Error::PoolTimedOut));
    match fresh {
        Ok((false, _)) => {
            if pooled_read_only {
                renew_connections();
                tracing::info!(
                    event = crate::event::DATABASE_WRITABLE,
                    "the database takes writes again: renewing the connections opened while it \
                     was read-only"
                );
            }
            None
        }
        Ok((true, recovery)) => {
            let why = if recovery {
                "a standby in recovery"
            } else {
                "default_transaction_read_only is on"
            };
            tracing::warn!(
                event = crate::event::DATABASE_READ_ONLY,
                in_recovery = recovery,
                "the database is read-only ({why}): no job can run until it takes writes"
            );
            Some(why.to_owned())
        }
        Err(err) => {
            tracing::warn!(error = %err, "could not open a connection to check whether the database takes writes");
            None
        }
    }
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
                tracing::warn!(event = crate::event::DATABASE_UNREACHABLE, attempt, of = settings.connect_attempts, error = %err, "database unreachable; retrying");
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
