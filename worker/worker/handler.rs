//! One queue's handler: decodes a payload, runs the nightly fan-out or a job kind's hop on a task
//! of its own, and settles the outcome (retried, or failed for good and counted).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use apalis::prelude::{AbortError, Attempt, BoxDynError, Data};

use crate::context::{JobContext, JobFailure, decode};
use crate::registry::{self, Kind};
use crate::telemetry::metrics;
use crate::tick::{self, NightlySlot};

/// What one queue's consumer runs: the nightly fan-out, or the hops of one job kind.
#[derive(Clone, Copy)]
pub(super) enum Consumer {
    Nightly,
    Job(&'static dyn Kind),
}

impl Consumer {
    /// Every queue a worker serves.
    pub(super) fn all() -> impl Iterator<Item = Consumer> {
        std::iter::once(Consumer::Nightly).chain(registry::KINDS.iter().map(|k| Consumer::Job(*k)))
    }

    pub(super) fn queue(self) -> &'static str {
        match self {
            Consumer::Nightly => tick::NIGHTLY,
            Consumer::Job(kind) => kind.queue(),
        }
    }

    /// The `kind` label of its metrics.
    pub(super) fn job(self) -> &'static str {
        match self {
            Consumer::Nightly => "nightly",
            Consumer::Job(kind) => kind.name(),
        }
    }
}

/// Turns a job's outcome into what apalis does next: done, retry after a backoff, or give up.
async fn settle(
    ctx: &JobContext,
    consumer: Consumer,
    attempt: &Attempt,
    outcome: Result<(), JobFailure>,
) -> Result<(), BoxDynError> {
    let (queue, job) = (consumer.queue(), consumer.job());
    match outcome {
        Ok(()) => {
            metrics::job_run(job, "succeeded");
            Ok(())
        }
        Err(err @ JobFailure::BadPayload { .. }) => {
            metrics::job_run(job, "rejected");
            ctx.failed_for_good.fetch_add(1, Ordering::SeqCst);
            tracing::error!(queue, error = %err, "job payload rejected; kept for inspection");
            Err(AbortError::new(err).into())
        }
        Err(JobFailure::Fatal(err)) => {
            metrics::job_run(job, "failed");
            ctx.failed_for_good.fetch_add(1, Ordering::SeqCst);
            tracing::error!(
                queue,
                error = format!("{err:#}"),
                "job failed for good; kept for inspection"
            );
            Err(AbortError::new(JobFailure::Fatal(err)).into())
        }
        Err(JobFailure::Retryable(err)) => {
            metrics::job_run(job, "failed");
            let current = attempt.current();
            tracing::warn!(
                queue,
                attempt = current,
                error = format!("{err:#}"),
                "job failed"
            );
            // apalis fetches a failed job again at once: the backoff happens here, while the
            // job is still held (and heartbeating), so no other replica takes it meanwhile.
            if current < ctx.settings.queue.max_attempts as usize {
                let factor = 1u32 << current.saturating_sub(1).min(6);
                tokio::time::sleep(ctx.settings.queue.retry_backoff * factor).await;
            } else {
                ctx.failed_for_good.fetch_add(1, Ordering::SeqCst);
            }
            Err(err.into())
        }
    }
}

/// What one queue's worker holds: the shared context and what it consumes.
#[derive(Clone)]
pub(super) struct QueueWorker {
    pub(super) ctx: JobContext,
    pub(super) consumer: Consumer,
}

/// The one handler of every queue: decodes the payload and runs the queue's job.
pub(super) async fn handle(
    payload: serde_json::Value,
    worker: Data<QueueWorker>,
    attempt: Attempt,
) -> Result<(), BoxDynError> {
    let QueueWorker { ctx, consumer } = &*worker;
    let _handling = Handling::start(&ctx.handling);
    // The job runs on a task of its own: the monitor that polls this handler also pauses a
    // failing consumer before its restart, and a hop must not stall, locks held, meanwhile.
    let job = {
        let (ctx, consumer) = (ctx.clone(), *consumer);
        tokio::spawn(async move {
            match consumer {
                Consumer::Nightly => match decode::<NightlySlot>(tick::NIGHTLY, payload) {
                    Ok(slot) => tick::fan_out(&ctx, &slot)
                        .await
                        .map_err(JobFailure::Retryable),
                    Err(err) => Err(err),
                },
                Consumer::Job(kind) => kind.handle(&ctx, payload).await,
            }
        })
    };
    let outcome = job.await.unwrap_or_else(|err| {
        Err(JobFailure::Retryable(anyhow::anyhow!(
            "the job's task ended abnormally: {err}"
        )))
    });
    settle(ctx, *consumer, &attempt, outcome).await
}

/// Counts a job being handled for as long as it lives.
struct Handling(Arc<AtomicUsize>);

impl Handling {
    fn start(count: &Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count.clone())
    }
}

impl Drop for Handling {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
