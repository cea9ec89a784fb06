//! What every handler gets and what it may answer: the types shared by the hops, the fan-out
//! and the runtime that calls them, so that no handler imports the runtime.

use sexton_jobs::health::Health;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize};

use serde::de::DeserializeOwned;
use sexton_jobs::clock::SharedClock;
use sqlx::PgPool;
use tokio::sync::Semaphore;

use crate::config::Settings;

/// What every handler gets: the pool, the settings, the clock, the shutdown flag and the hop
/// budget.
#[derive(Clone)]
pub struct JobContext {
    pub pool: PgPool,
    pub settings: Arc<Settings>,
    pub clock: SharedClock,
    /// Raised on SIGTERM/SIGINT: hops stop taking owners and hand over (FL-5).
    pub stopping: Arc<AtomicBool>,
    /// Hops of every queue together: at most `queue.concurrency` run at once, so that the pool
    /// (checked against it at start) always has their connections (FL-6).
    pub hops: Arc<Semaphore>,
    /// The slot of the kinds that run beside the others (`Job::BESIDE`): one hop at a time,
    /// outside `hops`, its connections budgeted apart (FL-6).
    pub beside: Arc<Semaphore>,
    /// The database's health, read by every hop between owner transactions.
    pub health: Arc<Health>,
    /// Jobs this process is handling now, from fetch to settlement: a worker run until idle
    /// waits for them even when their queue rows are gone (deleted by hand), since each may
    /// still push its next hop.
    pub handling: Arc<AtomicUsize>,
    /// Jobs this process settled as failed for good (a fatal failure, a rejected payload, or
    /// its last attempt failed): a worker run until idle exits 1 when there are any.
    pub failed_for_good: Arc<AtomicUsize>,
}

impl JobContext {
    pub fn new(pool: PgPool, settings: Arc<Settings>, clock: SharedClock) -> Self {
        let hops = Arc::new(Semaphore::new(settings.queue.concurrency));
        let health = Arc::new(Health::new(settings.health.clone()));
        Self {
            pool,
            settings,
            clock,
            stopping: Arc::default(),
            hops,
            beside: Arc::new(Semaphore::new(1)),
            health,
            handling: Arc::default(),
            failed_for_good: Arc::default(),
        }
    }
}

/// What a failed job asks the queue to do.
#[derive(Debug, thiserror::Error)]
pub enum JobFailure {
    /// The payload is not a job this version of sexton understands: never retried (FL-1).
    #[error("bad payload for {queue}: {reason}")]
    BadPayload { queue: &'static str, reason: String },
    /// A transient failure (database gone, lock timeout): retried with backoff.
    #[error(transparent)]
    Retryable(anyhow::Error),
    /// A failure that no retry can mend: the job is failed for good and kept for inspection.
    #[error(transparent)]
    Fatal(anyhow::Error),
}

/// Decodes a job's JSON payload into its typed, versioned arguments.
///
/// # Errors
/// [`JobFailure::BadPayload`] naming the queue and what was wrong.
pub fn decode<T: DeserializeOwned>(
    queue: &'static str,
    payload: serde_json::Value,
) -> Result<T, JobFailure> {
    serde_json::from_value(payload).map_err(|e| JobFailure::BadPayload {
        queue,
        reason: e.to_string(),
    })
}
