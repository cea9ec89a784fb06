//! The database: connection options (DATABASE_URL or libpq's PG* variables), a bounded pool
//! whose every connection carries sexton's timeouts (FL-6) and is a session of its own (ER-5),
//! whether the database takes writes (ER-6), and migrations.

use std::str::FromStr;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection as _, PgConnection, PgPool, Row as _};

use crate::config::DatabaseSettings;

pub mod pooler;
pub mod session;

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
    #[error(
        "{target} is reached through a transaction- or statement-mode pooler: {seen}. sexton \
         keeps state in its sessions (the hops' scope locks, the queue's LISTEN, prepared \
         statements), which transaction pooling cannot carry. Point sexton at the pooler in \
         session mode (PgBouncer: pool_mode = session, with a pool of at least \
         database.max_connections + 1 = {} connections per sexton process: its pool and the \
         writable check's own connection) or \
         straight at the database (a DATABASE_URL for sexton beside the platform's pooled one)",
        .max_connections + 1
    )]
    TransactionPooling {
        target: String,
        seen: session::Pooling,
        max_connections: u32,
    },
    #[error(
        "{target} is reached through {pooler}, whose pool gave sexton no \
         connection within database.acquire_timeout_ms = {acquire_timeout_ms}: \
         each sexton process holds up to database.max_connections + 1 = {needed} server \
         connections (its pool of {max_connections} and the writable check's own connection); \
         {fix}, or lower database.max_connections",
        needed = .max_connections + 1,
        fix = .pooler.fix(.max_connections + 1)
    )]
    PoolTooSmall {
        target: String,
        pooler: pooler::Pooler,
        max_connections: u32,
        acquire_timeout_ms: u128,
        #[source]
        source: sqlx::Error,
    },
    #[error(
        "could not tell whether the connections to {target} are sessions of their own (a probe \
         on three pooled connections)"
    )]
    SessionProbe {
        target: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("{state} at {target}: this command writes; {}", state.fix())]
    ReadOnly { target: String, state: ReadOnly },
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
    Ok(options
        .application_name("sexton")
        .options(session_settings(settings)))
}

/// sexton's timeouts, for every session it opens, and no JIT compilation.
fn session_settings(settings: &DatabaseSettings) -> [(&'static str, String); 4] {
    [
        // Every statement of sexton's is a bounded batch of a few milliseconds, but the
        // planner's estimates grow with the tables: past `jit_above_cost` a batch would spend
        // about 300 ms compiling (seen on a million-row handoffs table), never repaid.
        ("jit", "off".to_owned()),
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
    ]
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

/// What a command does with the database: a command that writes is refused on a read-only node
/// (ER-6) before it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// A bounded pool; every connection runs with sexton's statement and lock timeouts, and is a
/// session of its own (ER-5: no transaction pooler between sexton and the database). With
/// [`Access::Write`], the database must take writes (ER-6).
///
/// # Errors
/// [`DbError::Connect`] when no connection can be made, [`DbError::TransactionPooling`] behind a
/// transaction or statement pooler, [`DbError::SessionProbe`] when that could not be told,
/// [`DbError::ReadOnly`] for a command that writes on a node that takes no writes.
pub async fn connect(settings: &DatabaseSettings, access: Access) -> Result<PgPool, DbError> {
    let options = connect_options(settings)?;
    let target = describe(&options);
    // One direct connection first: the pool would only say "pool timed out", hiding why
    // (connection refused, authentication failed, no such database).
    let probe = fresh_read_only(&options, settings.acquire_timeout).await;
    // Behind a transaction pooler, a connection's first statement may meet what other clients
    // left on the backend it is handed: that says why, where "could not connect" would not.
    let failed = |target: String, source: sqlx::Error| match session::Pooling::seen_in(&source) {
        Some(seen) => DbError::TransactionPooling {
            target,
            seen,
            max_connections: settings.max_connections,
        },
        None => DbError::Connect { target, source },
    };
    let state = match probe {
        Ok(state) => state,
        Err(source) => return Err(failed(target, source)),
    };
    // The startup packet carries the timeouts too, but a pooler drops it (PgBouncer's
    // ignore_startup_parameters = options): each pooled session sets them again.
    let set = std::sync::Arc::new(
        session_settings(settings)
            .iter()
            .map(|(name, value)| format!("SET {name} = {value};"))
            .collect::<String>(),
    );
    let pool = PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        .before_acquire(|_, meta| Box::pin(async move { Ok(!stale(meta.age)) }))
        .after_connect(move |conn, _| {
            let set = set.clone();
            Box::pin(async move {
                sqlx::raw_sql(sqlx::AssertSqlSafe(set.as_str()))
                    .execute(conn)
                    .await
                    .map(drop)
            })
        })
        .connect_with(options.clone())
        .await;
    let pool = match pool {
        Ok(pool) => pool,
        Err(source @ sqlx::Error::PoolTimedOut) => {
            return Err(pool_timed_out(settings, &options, target, source).await);
        }
        Err(source) => return Err(failed(target, source)),
    };
    let checked = tokio::time::timeout(settings.acquire_timeout, session::probe(&pool))
        .await
        .unwrap_or(Err(sqlx::Error::PoolTimedOut));
    match checked {
        Ok(None) => {}
        Ok(Some(seen)) => {
            pool.close().await;
            return Err(DbError::TransactionPooling {
                target,
                seen,
                max_connections: settings.max_connections,
            });
        }
        Err(source @ sqlx::Error::PoolTimedOut) => {
            pool.close().await;
            return Err(pool_timed_out(settings, &options, target, source).await);
        }
        Err(source) => {
            pool.close().await;
            return Err(DbError::SessionProbe { target, source });
        }
    }
    if access == Access::Write
        && let Some(state) = state
    {
        pool.close().await;
        return Err(DbError::ReadOnly { target, state });
    }
    Ok(pool)
}

/// Why the pool gave no connection in time at start, right after a connection of its own was
/// made: a pooler's pool too small for sexton's, named with the size it needs (ER-5), if a
/// pooler can be told; the pool's own error otherwise.
async fn pool_timed_out(
    settings: &DatabaseSettings,
    options: &PgConnectOptions,
    target: String,
    source: sqlx::Error,
) -> DbError {
    match pooler::find(options, settings.acquire_timeout).await {
        Some(pooler) => DbError::PoolTooSmall {
            target,
            pooler,
            max_connections: settings.max_connections,
            acquire_timeout_ms: settings.acquire_timeout.as_millis(),
            source,
        },
        None => DbError::SessionProbe { target, source },
    }
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

/// Why a node takes no writes (ER-6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOnly {
    /// A standby: `pg_is_in_recovery()` is true.
    InRecovery,
    /// `default_transaction_read_only` is on for the session (the role's, the database's or the
    /// server's setting).
    DefaultReadOnly,
}

impl ReadOnly {
    /// What makes the node take writes, for the person reading the error.
    pub fn fix(self) -> &'static str {
        match self {
            ReadOnly::InRecovery => "point sexton at the primary",
            ReadOnly::DefaultReadOnly => {
                "turn default_transaction_read_only off for sexton's role and database, or \
                 point sexton at a node that takes writes"
            }
        }
    }
}

impl std::fmt::Display for ReadOnly {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReadOnly::InRecovery => {
                "the database is read-only (a standby in recovery: pg_is_in_recovery() is true)"
            }
            ReadOnly::DefaultReadOnly => {
                "the database is read-only (default_transaction_read_only = on)"
            }
        })
    }
}

/// [`read_only`] on a connection of its own, opened for it (a session keeps the read-only
/// default it started with) and closed after, within `limit`.
async fn fresh_read_only(
    options: &PgConnectOptions,
    limit: Duration,
) -> Result<Option<ReadOnly>, sqlx::Error> {
    tokio::time::timeout(limit, async {
        let mut conn = PgConnection::connect_with(options).await?;
        let state = read_only(&mut conn).await;
        let _ = conn.close().await;
        state
    })
    .await
    .unwrap_or(Err(sqlx::Error::PoolTimedOut))
}

/// Whether one session's transactions may write.
async fn read_only<'e>(db: impl sqlx::PgExecutor<'e>) -> Result<Option<ReadOnly>, sqlx::Error> {
    // A plain query: it runs before the session probe, and a prepared statement fails behind a
    // transaction pooler with an error that does not say why.
    let row = sqlx::raw_sql(
        "SELECT current_setting('transaction_read_only') = 'on', pg_is_in_recovery()",
    )
    .fetch_one(db)
    .await?;
    let (read_only, in_recovery): (bool, bool) = (row.try_get(0)?, row.try_get(1)?);
    Ok(match (read_only, in_recovery) {
        (_, true) => Some(ReadOnly::InRecovery),
        (true, false) => Some(ReadOnly::DefaultReadOnly),
        (false, false) => None,
    })
}

/// Watches whether the database takes writes (ER-6), as a new session sees it: a role's or
/// database's `default_transaction_read_only` reaches only sessions opened after it changed.
/// Clones share what was seen last.
#[derive(Debug, Clone)]
pub struct Writable {
    settings: DatabaseSettings,
    was_read_only: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Writable {
    pub fn new(settings: &DatabaseSettings) -> Self {
        Self {
            settings: settings.clone(),
            was_read_only: std::sync::Arc::default(),
        }
    }

    /// One check on a new connection: why the node takes no writes, if it does not, said in
    /// the log each time. The first check that finds it writable again renews the pool's
    /// connections opened meanwhile (they stay read-only) and says so. A node that cannot be
    /// reached counts as writable: the queue's consumers retry what fails (ER-2).
    pub async fn check(&self) -> Option<ReadOnly> {
        let options = connect_options(&self.settings).ok()?;
        let fresh = fresh_read_only(&options, self.settings.acquire_timeout).await;
        match fresh {
            Ok(None) => {
                if self.was_read_only.swap(false, Ordering::Relaxed) {
                    renew_connections();
                    tracing::info!(
                        event = crate::event::DATABASE_WRITABLE,
                        "the database takes writes again: renewing the connections opened \
                         while it was read-only, and taking jobs"
                    );
                }
                None
            }
            Ok(Some(state)) => {
                self.was_read_only.store(true, Ordering::Relaxed);
                tracing::warn!(
                    event = crate::event::DATABASE_READ_ONLY,
                    in_recovery = state == ReadOnly::InRecovery,
                    "{state}: taking no job until it takes writes ({})",
                    state.fix()
                );
                Some(state)
            }
            Err(err) => {
                tracing::warn!(error = %err, "could not open a connection to check whether the database takes writes");
                None
            }
        }
    }

    /// Resolves with why, at the first check (every `interval`) that finds the node read-only.
    pub async fn until_read_only(self, interval: Duration) -> ReadOnly {
        loop {
            tokio::time::sleep(interval).await;
            if let Some(state) = self.check().await {
                return state;
            }
        }
    }

    /// Resolves at the first check (now, then every `interval`) that finds the node writable.
    pub async fn until_writable(&self, interval: Duration) {
        while self.check().await.is_some() {
            tokio::time::sleep(interval).await;
        }
    }
}

/// The waits between a worker's attempts at start to reach what it needs (the database, its
/// object stores): doubling from 500 ms up to 10 s, `database.connect_attempts` tries in all
/// (ER-2).
pub fn start_backoff() -> impl Iterator<Item = Duration> {
    std::iter::successors(Some(Duration::from_millis(500)), |delay| {
        Some((*delay * 2).min(Duration::from_secs(10)))
    })
}

/// Like [`connect`], retrying with [`start_backoff`] for `database.connect_attempts` tries, so
/// that a fleet started before its database waits (ER-2).
///
/// # Errors
/// The last [`DbError`] once every attempt failed.
pub async fn connect_with_retry(
    settings: &DatabaseSettings,
    access: Access,
) -> Result<PgPool, DbError> {
    let mut delays = start_backoff();
    let mut attempt = 1;
    loop {
        match connect(settings, access).await {
            Ok(pool) => return Ok(pool),
            Err(
                err @ (DbError::BadUrl(_)
                | DbError::TransactionPooling { .. }
                | DbError::PoolTooSmall { .. }
                | DbError::ReadOnly { .. }),
            ) => return Err(err),
            Err(err) if attempt >= settings.connect_attempts => return Err(err),
            Err(err) => {
                tracing::warn!(event = crate::event::DATABASE_UNREACHABLE, attempt, of = settings.connect_attempts, error = %err, "database unreachable; retrying");
                tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(10))).await;
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
