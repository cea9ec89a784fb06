//! A fleet member (`sexton worker`): the schedule, the HTTP endpoints and one apalis worker per
//! queue under one monitor, until SIGTERM/SIGINT — or, with `--exit-when-idle`, only the queue
//! workers, until the queue is empty.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use apalis::layers::WorkerBuilderExt;
use apalis::prelude::{
    AbortError, Attempt, BackendExt, BoxDynError, Data, Monitor, Strategy, WorkerBuilder,
};
use apalis_postgres::Pubsub;
use serde::de::DeserializeOwned;
use sexton_jobs::clock::{SharedClock, SystemClock};
use sexton_jobs::prune_execution_details;
use sqlx::PgPool;
use tokio::net::TcpListener;

use crate::config::Settings;
use crate::execution_details;
use crate::http::{self, Health};
use crate::queue::{self, Queue};
use crate::telemetry::metrics;
use crate::tick::{self, NightlySlot};
use crate::{db, schedule};

/// What every handler gets: the pool, the settings, the clock and the shutdown flag.
#[derive(Clone)]
pub struct JobContext {
    pub pool: PgPool,
    pub settings: Arc<Settings>,
    pub clock: SharedClock,
    /// Raised on SIGTERM/SIGINT: hops stop taking owners and hand over (FL-5).
    pub stopping: Arc<AtomicBool>,
}

/// What a failed job asks the queue to do.
#[derive(Debug, thiserror::Error)]
pub enum JobFailure {
    /// The payload is not a job this version of sexton understands: never retried (FL-1).
    #[error("bad payload for {queue}: {reason}")]
    BadPayload { queue: Queue, reason: String },
    /// A transient failure (database gone, lock timeout): retried with backoff.
    #[error(transparent)]
    Retryable(anyhow::Error),
}

/// Decodes a job's JSON payload into its typed, versioned arguments.
///
/// # Errors
/// [`JobFailure::BadPayload`] naming the queue and what was wrong.
pub fn decode<T: DeserializeOwned>(
    queue: Queue,
    payload: serde_json::Value,
) -> Result<T, JobFailure> {
    serde_json::from_value(payload).map_err(|e| JobFailure::BadPayload {
        queue,
        reason: e.to_string(),
    })
}

/// Turns a job's outcome into what apalis does next: done, retry after a backoff, or give up.
async fn settle(
    ctx: &JobContext,
    queue: Queue,
    attempt: &Attempt,
    outcome: Result<(), JobFailure>,
) -> Result<(), BoxDynError> {
    match outcome {
        Ok(()) => {
            metrics::job_run(queue.job(), "succeeded");
            Ok(())
        }
        Err(err @ JobFailure::BadPayload { .. }) => {
            metrics::job_run(queue.job(), "rejected");
            tracing::error!(queue = queue.name(), error = %err, "job payload rejected; kept for inspection");
            Err(AbortError::new(err).into())
        }
        Err(JobFailure::Retryable(err)) => {
            metrics::job_run(queue.job(), "failed");
            let current = attempt.current();
            tracing::warn!(
                queue = queue.name(),
                attempt = current,
                error = format!("{err:#}"),
                "job failed"
            );
            // apalis fetches a failed job again at once: the backoff happens here, while the
            // job is still held (and heartbeating), so no other replica takes it meanwhile.
            if current < ctx.settings.queue.max_attempts as usize {
                let factor = 1u32 << current.saturating_sub(1).min(6);
                tokio::time::sleep(ctx.settings.queue.retry_backoff * factor).await;
            }
            Err(err.into())
        }
    }
}

/// What one queue's worker holds: the shared context and the queue it serves.
#[derive(Clone)]
struct QueueWorker {
    ctx: JobContext,
    queue: Queue,
}

/// The one handler of every queue: decodes the payload and runs the queue's job.
async fn handle(
    payload: serde_json::Value,
    worker: Data<QueueWorker>,
    attempt: Attempt,
) -> Result<(), BoxDynError> {
    let QueueWorker { ctx, queue } = &*worker;
    let outcome = match queue {
        Queue::Nightly => match decode::<NightlySlot>(*queue, payload) {
            Ok(slot) => tick::fan_out(ctx, &slot)
                .await
                .map_err(JobFailure::Retryable),
            Err(err) => Err(err),
        },
        Queue::PruneExecutionDetails => match decode(*queue, payload) {
            Ok(args) => execution_details::hop(ctx, args).await,
            Err(err) => Err(err),
        },
    };
    settle(ctx, *queue, &attempt, outcome).await
}

/// This process's name in the fleet: configured, or host name and process id.
pub fn worker_name(settings: &Settings) -> String {
    if !settings.queue.worker_name.is_empty() {
        return settings.queue.worker_name.clone();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".to_owned());
    format!("sexton-{host}-{}", std::process::id())
}

/// How a worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A fleet member: schedule, HTTP endpoints, queue consumers until SIGTERM/SIGINT.
    Fleet,
    /// A one-shot run: queue consumers only, until no job is pending or running.
    UntilIdle,
}

/// Runs this process as a fleet member until SIGTERM/SIGINT, or until idle.
///
/// # Errors
/// The database stayed unreachable at start, the HTTP address cannot be bound, or the
/// monitor failed.
pub async fn run(settings: &Settings, mode: Mode) -> anyhow::Result<()> {
    let settings = Arc::new(settings.clone());
    let health = Arc::new(Health::default());
    let (http_stop, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let http = match mode {
        Mode::Fleet => {
            let listener = TcpListener::bind(settings.http.listen)
                .await
                .with_context(|| {
                    format!("http.listen: cannot listen on {}", settings.http.listen)
                })?;
            tracing::info!(address = %listener.local_addr()?, "serving /metrics, /healthz, /readyz");
            let serve = http::serve(listener, metrics::install(), health.clone(), async {
                let _ = http_stopped.await;
            });
            Some(tokio::spawn(serve))
        }
        Mode::UntilIdle => None,
    };

    let pool = db::connect_with_retry(&settings.database).await?;
    health.connected(&pool);
    let ctx = JobContext {
        pool: pool.clone(),
        settings: settings.clone(),
        clock: Arc::new(SystemClock),
        stopping: Arc::default(),
    };
    let background = match mode {
        Mode::Fleet => vec![
            tokio::spawn(schedule::run(
                pool.clone(),
                settings.clone(),
                ctx.clock.clone(),
            )),
            tokio::spawn(refresh_gauges(ctx.clone())),
        ],
        Mode::UntilIdle => Vec::new(),
    };

    let name = worker_name(&settings);
    let monitor = monitor(&ctx, &name);

    tracing::info!(worker = %name, queues = Queue::ALL.len(), "worker started");
    health.consuming(true);
    let stopping = ctx.stopping.clone();
    let stop = async move {
        let result = tokio::select! {
            signal = shutdown_signal() => signal,
            idle = wait_until_idle(&pool), if mode == Mode::UntilIdle => idle,
        };
        // Running hops finish the owner in hand and hand the rest over (FL-5).
        stopping.store(true, Ordering::Relaxed);
        result
    };
    let outcome = monitor.run_with_signal(stop).await;
    health.consuming(false);
    for task in background {
        task.abort();
    }
    let _ = http_stop.send(());
    if let Some(http) = http {
        http.await??;
    }
    outcome.context("the worker monitor failed")?;
    tracing::info!(worker = %name, "worker stopped");
    Ok(())
}

/// One apalis worker per queue under one monitor, which stops claiming on shutdown and waits
/// up to the grace for running jobs (FL-5).
fn monitor(ctx: &JobContext, name: &str) -> Monitor {
    let poll = ctx.settings.queue.poll_interval;
    let concurrency = ctx.settings.queue.concurrency;
    let mut monitor = Monitor::new();
    for queue in Queue::ALL {
        let ctx = ctx.clone();
        let worker = format!("{name}.{}", queue.job());
        monitor = monitor.register(move |restarts| {
            let backend = queue::storage(&ctx.pool, queue, &ctx.settings.queue).poll_with_strategy(
                Strategy::new()
                    .stream(Pubsub::new(ctx.pool.clone(), queue.name().to_owned()))
                    .interval(poll),
            );
            // A restarted worker takes a new name, so that the jobs its predecessor held are
            // seen as orphans and rescued (a live name never has its own jobs rescued).
            let name = match restarts {
                0 => worker.clone(),
                n => format!("{worker}.r{n}"),
            };
            WorkerBuilder::new(name)
                .backend(backend)
                .data(QueueWorker {
                    ctx: ctx.clone(),
                    queue,
                })
                .concurrency(concurrency)
                .build(handle)
        });
    }
    // A worker stops when its backend fails (the database went away, ER-2): start it again.
    // While the database is down each start waits out the pool's acquire timeout, which paces
    // the restarts.
    monitor
        .should_restart(|worker, err| {
            tracing::warn!(worker = %worker.name(), restarts = worker.restarts(), error = %err, "queue worker failed; restarting it");
            true
        })
        .shutdown_timeout(ctx.settings.queue.shutdown_grace)
}

/// Keeps the queue and backlog gauges current (OP-3).
async fn refresh_gauges(ctx: JobContext) {
    loop {
        match queue::counts(&ctx.pool).await {
            Ok(counts) => metrics::queue(&counts),
            Err(err) => tracing::warn!(error = %err, "could not count queue jobs"),
        }
        match prune_execution_details::backlog_seconds(&ctx.pool, ctx.clock.now()).await {
            Ok(seconds) => metrics::backlog(metrics::EXECUTION_DETAILS, seconds),
            Err(err) => tracing::warn!(error = %err, "could not measure the backlog"),
        }
        tokio::time::sleep(ctx.settings.http.refresh_interval).await;
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => Ok(()),
        result = tokio::signal::ctrl_c() => result,
    }
}

/// Resolves once no job of any sexton queue is pending or running.
async fn wait_until_idle(pool: &PgPool) -> std::io::Result<()> {
    loop {
        match queue::counts(pool).await {
            Ok(counts) if counts.idle() => return Ok(()),
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "could not read the queue"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
