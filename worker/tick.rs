//! Slots into the queue: each nightly slot enqueued exactly once fleet-wide — on the schedule's
//! timer, on catch-up at start, or by `sexton tick` — and fanned out into the first hop of every
//! registered job kind (per account, or once for a global kind); and the periods of kinds on a
//! cadence of their own. When a slot falls due is `schedule`'s arithmetic.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sexton_jobs::clock::SharedClock;
use sexton_jobs::job::{self, Cadence, Discovery, Scope};
use sexton_jobs::payload::V1;
use sqlx::PgPool;

use crate::config::Settings;
use crate::context::JobContext;
use crate::queue::{self, PushOptions, PushOutcome, QueueError};
use crate::registry::{self, Kind};
use crate::telemetry::metrics;
use crate::{ledger, schedule};

/// The queue of nightly slots.
pub const NIGHTLY: &str = "sexton.nightly";

/// The payload of a nightly slot job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NightlySlot {
    pub version: V1,
    /// The scheduled moment; every pass of this slot measures its cutoff from it.
    pub slot: DateTime<Utc>,
}

/// What `sexton tick` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ticked {
    pub slot: DateTime<Utc>,
    pub outcome: PushOutcome,
}

/// The idempotency key of a slot: one job per slot, whoever pushes it.
fn slot_key(slot: DateTime<Utc>) -> String {
    format!("nightly:{}", slot.to_rfc3339())
}

/// Enqueues the slot due at `at`, or finds it already enqueued.
///
/// # Errors
/// [`TickError`] when the schedule has no slot before `at` or the queue refuses the job.
pub async fn tick(
    pool: &PgPool,
    settings: &Settings,
    at: DateTime<Utc>,
) -> Result<Ticked, TickError> {
    let slot = schedule::in_slot_range(at)
        .ok()
        .and_then(|at| schedule::slot_at(&settings.schedule, at))
        .ok_or(TickError::NoSlot(at))?;
    let outcome = enqueue_slot(pool, settings, slot).await?;
    Ok(Ticked { slot, outcome })
}

/// Enqueues one slot, or finds it already enqueued: the one path of the schedule, catch-up and
/// `sexton tick` (FL-2).
///
/// # Errors
/// [`QueueError`] when the queue refuses the job.
pub async fn enqueue_slot(
    pool: &PgPool,
    settings: &Settings,
    slot: DateTime<Utc>,
) -> Result<PushOutcome, QueueError> {
    let payload = NightlySlot { version: V1, slot };
    let outcome = queue::push(
        pool,
        NIGHTLY,
        &settings.queue,
        &payload,
        PushOptions {
            idempotency_key: Some(slot_key(slot)),
            ..PushOptions::default()
        },
    )
    .await?;
    tracing::info!(slot = %slot.to_rfc3339(), %outcome, "nightly slot");
    Ok(outcome)
}

/// Runs the nightly schedule until the task is dropped: the slot missed last within the
/// catch-up window once on start, then every slot when it comes (FL-2).
pub async fn run_schedule(pool: PgPool, settings: Arc<Settings>, clock: SharedClock) {
    if let Some(slot) = schedule::catch_up_slot(&settings.schedule, clock.now()) {
        let outcome = enqueue_retrying(&pool, &settings, slot).await;
        metrics::slot(match outcome {
            PushOutcome::Enqueued => "caught_up",
            PushOutcome::Duplicate => "duplicate",
        });
        tracing::info!(event = crate::event::SLOT_CAUGHT_UP, slot = %slot.to_rfc3339(), %outcome, "catch-up of the last missed slot");
    }
    loop {
        let now = clock.now();
        let Some(slot) = schedule::next_slot(&settings.schedule, now) else {
            tracing::warn!("the schedule has no further slot; scheduling stops");
            return;
        };
        tokio::time::sleep((slot - now).to_std().unwrap_or_default()).await;
        let outcome = enqueue_retrying(&pool, &settings, slot).await;
        metrics::slot(match outcome {
            PushOutcome::Enqueued => "enqueued",
            PushOutcome::Duplicate => "duplicate",
        });
    }
}

/// Enqueues a slot, retrying while the database is away: any replica may win, and the key
/// keeps it to one job.
async fn enqueue_retrying(pool: &PgPool, settings: &Settings, slot: DateTime<Utc>) -> PushOutcome {
    loop {
        match enqueue_slot(pool, settings, slot).await {
            Ok(outcome) => return outcome,
            Err(err) => {
                tracing::warn!(slot = %slot.to_rfc3339(), error = %err, "could not enqueue the slot; retrying");
                tokio::time::sleep(Duration::from_secs(10)).await;
            }
        }
    }
}

/// Runs a kind on its own cadence: the current period's pass on start, then one per period, each
/// once fleet-wide (its first hop is keyed by the period's start, TR-4).
pub async fn run_every(ctx: JobContext, kind: &'static dyn Kind, period: chrono::Duration) {
    loop {
        let slot = schedule::period_start(ctx.clock.now(), period);
        loop {
            match start_period(&ctx, kind, slot).await {
                Ok(outcome) => {
                    tracing::info!(event = crate::event::PERIOD_PUSHED, job = kind.name(), slot = %slot.to_rfc3339(), %outcome, "period");
                    break;
                }
                Err(err) => {
                    tracing::warn!(
                        job = kind.name(),
                        error = format!("{err:#}"),
                        "could not start the period; retrying"
                    );
                    tokio::time::sleep(Duration::from_secs(10)).await;
                }
            }
        }
        let wait = (slot + period - ctx.clock.now())
            .to_std()
            .unwrap_or_default();
        tokio::time::sleep(wait).await;
    }
}

/// Why a slot could not be enqueued.
#[derive(Debug, thiserror::Error)]
pub enum TickError {
    /// A usage error: the moment is before the schedule's first slot, or outside the years a
    /// schedule names.
    #[error("the schedule has no slot at or before {}: {}", .0.to_rfc3339(), no_slot_hint(*.0))]
    NoSlot(DateTime<Utc>),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// What to ask for instead of a moment with no slot.
fn no_slot_hint(at: DateTime<Utc>) -> String {
    match schedule::in_slot_range(at) {
        Ok(_) => "ask for a moment after the schedule's first slot".to_owned(),
        Err(range) => range,
    }
}

impl TickError {
    /// Whether the moment asked for was wrong (exit 2), rather than the queue (exit 1).
    pub fn is_usage(&self) -> bool {
        matches!(self, TickError::NoSlot(_))
    }
}

/// Starts the passes of every job kind for a slot: one for a global kind; for a per-account
/// kind, one for each account its discovery finds something due for (FL-8), read from the
/// candidates' side and taken in batches of `queue.fan_out_batch` — each batch's ledger rows
/// and first hops in one transaction, every hop under a key derived from the slot, so that a
/// retried slot job adds nothing twice and misses nothing. Passes older than the queue's
/// retention are forgotten on the way (FL-7).
///
/// # Errors
/// A database or queue error; the slot job is then retried.
pub async fn fan_out(ctx: &JobContext, slot: &NightlySlot) -> anyhow::Result<()> {
    tracing::info!(slot = %slot.slot.to_rfc3339(), "fanning out nightly slot");
    let mut accounts = None;
    for kind in registry::KINDS {
        if kind.cadence(&ctx.settings) != Cadence::Nightly {
            continue;
        }
        let done = match kind.scope() {
            Scope::Account => fan_out_accounts(ctx, *kind, slot.slot, &mut accounts).await?,
            Scope::Global => start_global(ctx, *kind, slot.slot).await?.1,
        };
        tracing::info!(
            job = kind.name(),
            slot = %slot.slot.to_rfc3339(),
            accounts = done.accounts,
            started = done.started,
            nothing_due = done.accounts - done.started,
            "fanned out nightly slot"
        );
    }
    let forgotten = ledger::prune(
        &ctx.pool,
        slot.slot - ctx.settings.queue.finished_job_retention,
    )
    .await?;
    if forgotten > 0 {
        tracing::info!(
            passes = forgotten,
            "forgot passes past the queue's retention"
        );
    }
    Ok(())
}

/// The fan-out of one per-account kind: its discovery, read batch by batch in account id order,
/// on the one connection the schedule's fan-out is budgeted (FL-6). The accounts are counted
/// once per slot (`accounts`), for the ledger.
async fn fan_out_accounts(
    ctx: &JobContext,
    kind: &'static dyn Kind,
    slot: DateTime<Utc>,
    accounts: &mut Option<u64>,
) -> anyhow::Result<ledger::FanOut> {
    let mut conn = ctx.pool.acquire().await?;
    ledger::fan_out_begun(&mut *conn, kind.name(), slot).await?;
    let due = Discovery::open(&mut conn, kind.due(&ctx.settings, slot)).await?;
    loop {
        let batch = due
            .next(&mut conn, ctx.settings.queue.fan_out_batch)
            .await?;
        if batch.is_empty() {
            break;
        }
        let hops = kind.first_hops(&batch, slot)?;
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        ledger::open(&mut *tx, kind.name(), &batch, slot).await?;
        queue::push_many(&mut tx, kind.queue(), &ctx.settings.queue, &hops).await?;
        tx.commit().await?;
    }
    due.close(&mut conn).await?;
    let accounts = match *accounts {
        Some(n) => n,
        None => *accounts.insert(job::accounts(&mut conn).await?),
    };
    Ok(ledger::fan_out_done(&mut *conn, kind.name(), slot, accounts).await?)
}

/// Starts the pass of a kind with a cadence of its own for the period beginning at `slot`: its
/// ledger row and first hop, keyed by the period, so that a period runs once fleet-wide.
///
/// # Errors
/// A database or queue error.
pub async fn start_period(
    ctx: &JobContext,
    kind: &'static dyn Kind,
    slot: DateTime<Utc>,
) -> anyhow::Result<PushOutcome> {
    Ok(start_global(ctx, kind, slot).await?.0)
}

/// The one pass of a global kind for `slot`, recorded as a fan-out of one.
async fn start_global(
    ctx: &JobContext,
    kind: &'static dyn Kind,
    slot: DateTime<Utc>,
) -> anyhow::Result<(PushOutcome, ledger::FanOut)> {
    ledger::fan_out_begun(&ctx.pool, kind.name(), slot).await?;
    ledger::open(&ctx.pool, kind.name(), &[ledger::scope(None)], slot).await?;
    let outcome = kind.push_first(ctx, None, slot).await?;
    let done = ledger::fan_out_done(&ctx.pool, kind.name(), slot, 1).await?;
    Ok((outcome, done))
}
