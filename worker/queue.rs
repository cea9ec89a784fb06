//! The queue (FL-1): apalis-postgres storage, one named queue (`sexton.<job>`) per job kind
//! and one for the nightly slots. This module knows queues by name only, never the jobs.
//!
//! Payloads are stored as JSON and decoded by sexton's own handlers, not by the queue's codec:
//! a payload that does not decode then fails its one job (kept, `Killed`, for inspection)
//! instead of killing the worker that fetched it (STACK.md).

use std::fmt;
use std::time::Duration;

use apalis::prelude::{TaskBuilder, TaskSink, TaskSinkError};
use apalis_postgres::{Config, PostgresStorage};
use serde::Serialize;
use sqlx::PgPool;

use crate::config::QueueSettings;
use crate::telemetry::metrics;

/// The storage of one queue, with the fleet's heartbeat settings (FL-4).
pub fn storage(
    pool: &PgPool,
    queue: &'static str,
    settings: &QueueSettings,
) -> PostgresStorage<serde_json::Value> {
    PostgresStorage::new(pool).with_config(
        Config::default()
            .queue(queue)
            .heartbeat_interval(settings.heartbeat_interval)
            .missed_heartbeats(settings.missed_heartbeats as usize)
            // One job per fetch: apalis does not heartbeat while a fetched job waits for a
            // free slot, so a second job fetched beside a running one would silence the
            // consumer until a running job ends, and other replicas would take its jobs.
            .batch_size(1),
    )
}

/// How a job is pushed.
#[derive(Debug, Clone, Default)]
pub struct PushOptions {
    /// A key unique within the queue: a second push with it is a [`PushOutcome::Duplicate`].
    pub idempotency_key: Option<String>,
    /// Run no earlier than this long from now.
    pub run_after: Option<Duration>,
}

/// Whether a push added a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PushOutcome {
    Enqueued,
    /// A job with the same idempotency key already exists (in any state).
    Duplicate,
}

impl fmt::Display for PushOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PushOutcome::Enqueued => "enqueued",
            PushOutcome::Duplicate => "duplicate",
        })
    }
}

/// Why a job could not be pushed or counted.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("could not encode the payload for {queue}: {source}")]
    Encode {
        queue: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("could not push a job to {queue}: {source}")]
    Push {
        queue: &'static str,
        #[source]
        source: TaskSinkError<apalis_postgres::Error>,
    },
    #[error("could not read the queue: {0}")]
    Read(#[from] sqlx::Error),
}

/// Pushes one job.
///
/// # Errors
/// [`QueueError`] when the payload cannot be encoded or the database refuses the job.
pub async fn push(
    pool: &PgPool,
    queue: &'static str,
    settings: &QueueSettings,
    payload: &impl Serialize,
    options: PushOptions,
) -> Result<PushOutcome, QueueError> {
    let value =
        serde_json::to_value(payload).map_err(|source| QueueError::Encode { queue, source })?;
    // Due by the database's clock, as the queue's poll compares it: the queue would take this
    // host's, and a host clock 40 days ahead would push every job 40 days out.
    let now_ms: i64 =
        sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
            .fetch_one(pool)
            .await?;
    let delay_ms = options.run_after.map_or(0, |delay| {
        i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)
    });
    let run_at = now_ms.saturating_add(delay_ms).max(0) / 1000;
    let mut task = TaskBuilder::new(value)
        .max_attempts(settings.max_attempts as usize)
        .run_at_timestamp(run_at as u64);
    if let Some(key) = options.idempotency_key {
        task = task.idempotency_key(key);
    }
    match storage(pool, queue, settings).push_task(task.build()).await {
        Ok(()) => Ok(PushOutcome::Enqueued),
        Err(err) if is_unique_violation(&err) => Ok(PushOutcome::Duplicate),
        Err(source) => Err(QueueError::Push { queue, source }),
    }
}

/// Pushes many jobs to one queue in one statement, each under its idempotency key; a key
/// already taken (in any state) is passed over. The jobs are due at the database's now.
///
/// # Errors
/// [`QueueError::Read`] when the database refuses the statement.
pub async fn push_many(
    conn: &mut sqlx::PgConnection,
    queue: &'static str,
    settings: &QueueSettings,
    jobs: &[(String, Vec<u8>)],
) -> Result<u64, QueueError> {
    let (keys, payloads): (Vec<&str>, Vec<&[u8]>) = jobs
        .iter()
        .map(|(key, payload)| (key.as_str(), payload.as_slice()))
        .unzip();
    let max_attempts = i32::try_from(settings.max_attempts).unwrap_or(i32::MAX);
    // As apalis-postgres's own push writes a row (queries/task/sink.sql), keyed as one push is.
    let pushed = sqlx::query(
        "INSERT INTO apalis.jobs (id, job_type, job, status, attempts, max_attempts, run_at,
                                  priority, metadata, idempotency_key)
         SELECT apalis.generate_ulid(), $1, j.job, 'Pending', 0, $2, now(), 0, '', j.key
         FROM unnest($3::text[], $4::bytea[]) AS j (key, job)
         ON CONFLICT (job_type, idempotency_key) DO NOTHING",
    )
    .bind(queue)
    .bind(max_attempts)
    .bind(&keys)
    .bind(&payloads)
    .execute(conn)
    .await?
    .rows_affected();
    Ok(pushed)
}

fn is_unique_violation(err: &TaskSinkError<apalis_postgres::Error>) -> bool {
    matches!(
        err,
        TaskSinkError::PushError(apalis_postgres::Error::Database(sqlx::Error::Database(db)))
            if db.is_unique_violation()
    )
}

/// Jobs of sexton's queues by state, as `apalis.jobs` holds them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct QueueCounts {
    /// Waiting to run: pending, fetched but not started, or failed with attempts left.
    pub pending: i64,
    pub running: i64,
    pub done: i64,
    /// Failed for good (attempts exhausted) or killed (bad payload): kept for inspection.
    pub failed: i64,
}

impl QueueCounts {
    /// Nothing left to do.
    pub fn idle(&self) -> bool {
        self.pending == 0 && self.running == 0
    }

    /// Sets `sexton_queue_jobs` by state to these counts (OP-3).
    pub fn publish(&self) {
        for (state, jobs) in [
            ("pending", self.pending),
            ("running", self.running),
            ("done", self.done),
            ("failed", self.failed),
        ] {
            metrics::queue_jobs(state, jobs);
        }
    }
}

/// The queues of sexton, as `apalis.jobs.job_type` matches them.
pub const SEXTON_QUEUES: &str = "sexton.%";

const COUNTS: &str = "count(*) FILTER (WHERE status IN ('Pending', 'Queued')
                              OR (status = 'Failed' AND attempts < max_attempts)),
             count(*) FILTER (WHERE status = 'Running'),
             count(*) FILTER (WHERE status = 'Done'),
             count(*) FILTER (WHERE sexton.queue_job_failed_for_good(status, attempts,
                                                                     max_attempts))";

/// Counts the jobs of every sexton queue by state.
///
/// # Errors
/// [`QueueError::Read`] on a database error.
pub async fn counts(pool: &PgPool) -> Result<QueueCounts, QueueError> {
    let (pending, running, done, failed) =
        sqlx::query_as::<_, (i64, i64, i64, i64)>(sqlx::AssertSqlSafe(format!(
            "SELECT {COUNTS} FROM apalis.jobs WHERE job_type LIKE $1"
        )))
        .bind(SEXTON_QUEUES)
        .fetch_one(pool)
        .await?;
    Ok(QueueCounts {
        pending,
        running,
        done,
        failed,
    })
}

/// Counts the jobs of each sexton queue by state.
///
/// # Errors
/// [`QueueError::Read`] on a database error.
pub async fn counts_by_queue(
    pool: &PgPool,
) -> Result<std::collections::BTreeMap<String, QueueCounts>, QueueError> {
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT job_type, {COUNTS} FROM apalis.jobs WHERE job_type LIKE $1 GROUP BY job_type"
    )))
    .bind(SEXTON_QUEUES)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(queue, pending, running, done, failed)| {
            let counts = QueueCounts {
                pending,
                running,
                done,
                failed,
            };
            (queue, counts)
        })
        .collect())
}

/// A job failed for good (attempts exhausted) or killed (bad payload), kept for inspection.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct FailedJob {
    pub id: String,
    pub queue: String,
    pub status: String,
    pub attempts: i32,
    pub max_attempts: i32,
    pub last_error: Option<String>,
    pub run_at: chrono::DateTime<chrono::Utc>,
}

/// The most recent jobs failed for good, newest first, at most `limit`.
///
/// # Errors
/// [`QueueError::Read`] on a database error.
pub async fn failed(pool: &PgPool, limit: i64) -> Result<Vec<FailedJob>, QueueError> {
    Ok(sqlx::query_as(
        "SELECT id, job_type AS queue, status, attempts, max_attempts,
                COALESCE(last_result ->> 'Err', last_result::text) AS last_error, run_at
         FROM apalis.jobs
         WHERE job_type LIKE $1
           AND sexton.queue_job_failed_for_good(status, attempts, max_attempts)
         ORDER BY run_at DESC LIMIT $2",
    )
    .bind(SEXTON_QUEUES)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}

/// One worker process of the fleet as the queue's heartbeats show it: its consumers (one per
/// queue, each registered by apalis under `<process>.<job>`) and the newest heartbeat of them.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct FleetWorker {
    /// The process's name (`[queue] worker_name` or host and process id, and a suffix drawn at
    /// its start).
    pub name: String,
    /// Its consumers registered (a consumer restarted after a failure counts again).
    pub consumers: i64,
    pub last_heartbeat: chrono::DateTime<chrono::Utc>,
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// The worker processes of sexton's queues, the most recently heard from first, at most
/// `limit`; and how many there are.
///
/// # Errors
/// [`QueueError::Read`] on a database error.
pub async fn workers(pool: &PgPool, limit: i64) -> Result<(i64, Vec<FleetWorker>), QueueError> {
    // A consumer registers as `<process>.<job>`, and again as `<process>.<job>.r<n>` after its
    // n-th restart: the process is what is left without them.
    let processes = "SELECT regexp_replace(id, '\\.[a-z_]+(\\.r[0-9]+)?$', '') AS name,
                            count(*) AS consumers, max(last_seen) AS last_heartbeat,
                            min(started_at) AS started_at
                     FROM apalis.workers WHERE worker_type LIKE $1 GROUP BY 1";
    let total: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM ({processes}) w"
    )))
    .bind(SEXTON_QUEUES)
    .fetch_one(pool)
    .await?;
    let shown = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "{processes} ORDER BY last_heartbeat DESC, name LIMIT $2"
    )))
    .bind(SEXTON_QUEUES)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok((total, shown))
}
