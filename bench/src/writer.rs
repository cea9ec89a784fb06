//! The application writer beside every method: transactions at a fixed rate over a set of
//! targets ([`at_rate`]), what they saw, its idle baseline alone on a fresh copy, and
//! [`beside`], which starts it with the sampler of the deleter's longest write transaction.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{PgConnection, PgPool, Postgres};

use crate::cli::Cli;
use crate::cluster::{connect, drop_db, recreate, wal_position};
use crate::sampler::{Longest, longest_transaction};

/// What the application writer saw: each transaction's latency, and how long it waited for its
/// locks ([`TimedLock`]), in ms.
pub struct Writes {
    pub total_ms: Vec<f64>,
    pub lock_wait_ms: Vec<f64>,
}

/// An application at a fixed `rate` until `stop`: one transaction per tick, over `targets` in
/// turn. `transaction` runs one (from its `BEGIN` to its commit) and returns how long it waited
/// for its locks in ms ([`TimedLock`]); its whole latency is measured here.
pub async fn at_rate<T, F, Fut>(
    rate: u32,
    stop: Arc<AtomicBool>,
    targets: Vec<T>,
    mut transaction: F,
) -> anyhow::Result<Writes>
where
    T: Clone,
    F: FnMut(T) -> Fut,
    Fut: Future<Output = anyhow::Result<f64>>,
{
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut writes = Writes {
        total_ms: Vec::new(),
        lock_wait_ms: Vec::new(),
    };
    for target in targets.iter().cycle() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        tick.tick().await;
        let started = Instant::now();
        let lock_wait = transaction(target.clone()).await?;
        writes
            .total_ms
            .push(started.elapsed().as_secs_f64() * 1000.0);
        writes.lock_wait_ms.push(lock_wait);
    }
    Ok(writes)
}

/// A writer's lock (a `SELECT … FOR UPDATE` of one row by `$1`) and how long it waited for it,
/// by the server's own clock ([`TimedLock::take`]).
#[derive(Debug, Clone)]
pub struct TimedLock {
    /// The lock taken only if it is free at once (`SKIP LOCKED`): how many rows it locked, and
    /// whether the row is there at all.
    free: String,
    /// The lock as the application takes it, waiting, and the wait in ms: from the statement's
    /// arrival (`statement_timestamp()`) to the aggregate over the locked rows, which runs once
    /// the lock is taken or the row is gone.
    waited: String,
}

impl TimedLock {
    /// The lock of the row `row` selects (`SELECT 1 FROM … WHERE id = $1`), `FOR UPDATE`.
    pub fn new(row: &str) -> Self {
        let lock = format!("{row} FOR UPDATE");
        Self {
            free: format!(
                "SELECT (SELECT count(*) FROM ({lock} SKIP LOCKED) locked), EXISTS ({row})"
            ),
            waited: format!(
                "SELECT count(*), (extract(epoch FROM clock_timestamp() - statement_timestamp()) * 1000)::float8 \
                 FROM ({lock}) locked"
            ),
        }
    }

    /// Takes the lock on row `id`: how many rows it locked, and how long it waited in ms. A
    /// lock free at once waited 0 ms, whatever its statement took to read the row's pages (on a
    /// cold cache, under the method's reads, tens of ms at scale 400, with no lock held by
    /// anyone), and so did a row already gone; one that was held is taken again, waiting, and
    /// timed by the server, its pages now read. So the wait is a wait for a row someone holds:
    /// neither the round trip, nor the scheduling of the writer and of its backend on two loaded
    /// cores, nor a read from disk, nor a row deleted before the writer came.
    pub async fn take<T>(&self, conn: &mut PgConnection, id: T) -> anyhow::Result<(i64, f64)>
    where
        T: for<'q> sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres> + Send + Clone,
    {
        let (locked, there): (i64, bool) = sqlx::query_as(sqlx::AssertSqlSafe(self.free.as_str()))
            .bind(id.clone())
            .fetch_one(&mut *conn)
            .await?;
        if locked > 0 || !there {
            return Ok((locked, 0.0));
        }
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(self.waited.as_str()))
            .bind(id)
            .fetch_one(&mut *conn)
            .await?)
    }
}

/// The writer's idle baseline: `writes` alone for `baseline_seconds` on a fresh copy `db` of
/// `template`, and the WAL bytes per second the cluster wrote meanwhile.
pub async fn idle_baseline<F, Fut>(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    template: &str,
    db: &str,
    writes: F,
) -> anyhow::Result<(Writes, f64)>
where
    F: FnOnce(PgPool, Arc<AtomicBool>) -> Fut,
    Fut: Future<Output = anyhow::Result<Writes>> + Send + 'static,
{
    recreate(admin, db, Some(template)).await?;
    let pool = connect(base, db, "bench-writer").await?;
    let stop = Arc::new(AtomicBool::new(false));
    let (started, wal) = (Instant::now(), wal_position(admin).await?);
    let writer = tokio::spawn(writes(pool.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_secs(cli.baseline_seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let idle = writer.await??;
    let wal_per_s = (wal_position(admin).await? - wal) as f64 / started.elapsed().as_secs_f64();
    pool.close().await;
    drop_db(admin, db).await?;
    Ok((idle, wal_per_s))
}

/// What runs beside a method until `stop`: the application's `writes` and the sampler of the
/// deleter's longest write transaction.
pub async fn beside(
    base: &PgConnectOptions,
    db: &str,
    writes: impl Future<Output = anyhow::Result<Writes>> + Send + 'static,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<(
    tokio::task::JoinHandle<anyhow::Result<Writes>>,
    tokio::task::JoinHandle<anyhow::Result<Longest>>,
)> {
    let writer = tokio::spawn(writes);
    let sampler = tokio::spawn(longest_transaction(
        connect(base, db, "bench-sampler").await?,
        stop.clone(),
    ));
    Ok((writer, sampler))
}
