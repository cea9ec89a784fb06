//! Wires PruneExecutionDetails to the queue: one hop per job, the next hop pushed with a key
//! derived from the pass and hop number, so a retried hop never forks the chain (EX-7, EX-8).

use chrono::{DateTime, Utc};
use sexton_jobs::prune_execution_details::{self as job, Args, HopSettings, Preview};
use tracing::Instrument as _;
use uuid::Uuid;

use crate::config::Settings;
use crate::queue::{self, PushOptions, PushOutcome, Queue, QueueError};
use crate::telemetry::metrics;
use crate::worker::{JobContext, JobFailure};

/// The hop limits from configuration.
pub fn hop_settings(settings: &Settings) -> HopSettings {
    HopSettings {
        window_size: settings.execution_details.window_size,
        owners_per_transaction: settings.execution_details.owners_per_transaction,
        transaction_target: settings.execution_details.transaction_target,
        budget: settings.execution_details.hop_budget,
        owner_lock_timeout: settings.execution_details.owner_lock_timeout,
        output_root: settings.paths.output_root.clone(),
    }
}

/// The key of a hop: one job per (account, pass, hop), whoever pushes it.
fn hop_key(account_id: Uuid, pass_started_at: DateTime<Utc>, hop: u32) -> String {
    format!("{account_id}:{}:{hop}", pass_started_at.to_rfc3339())
}

/// Pushes a hop unless that hop of that pass already exists.
///
/// # Errors
/// [`QueueError`] when the queue refuses the job.
pub async fn push_hop(ctx: &JobContext, args: &Args) -> Result<PushOutcome, QueueError> {
    let key = hop_key(args.account_id, args.pass_started_at, args.hop);
    push(ctx, args, key, None).await
}

async fn push(
    ctx: &JobContext,
    args: &Args,
    idempotency_key: String,
    run_after: Option<std::time::Duration>,
) -> Result<PushOutcome, QueueError> {
    let options = PushOptions {
        idempotency_key: Some(idempotency_key),
        run_after,
    };
    queue::push(
        &ctx.pool,
        Queue::PruneExecutionDetails,
        &ctx.settings.queue,
        args,
        options,
    )
    .await
}

/// Advisory-lock class of execution-details hops: with the account, at most one hop per
/// account runs at a time across the fleet (FL-3).
const HOP_LOCK_CLASS: i32 = 0x5e77_0001;

/// How long a hop that found its account busy waits before it is tried again.
const BUSY_ACCOUNT_DELAY: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs one hop and enqueues the next. If another hop of the same account is running anywhere
/// in the fleet, this one is pushed again a little later instead (FL-3).
///
/// # Errors
/// [`JobFailure::Retryable`] when the database or queue fails; the hop is then run again.
pub async fn hop(ctx: &JobContext, args: Args) -> Result<(), JobFailure> {
    let span = tracing::info_span!(
        "hop",
        job = Queue::PruneExecutionDetails.job(),
        account = %args.account_id,
        pass = %args.pass_started_at.to_rfc3339(),
        hop = args.hop,
        window = ctx.settings.execution_details.window_size,
        outcome = tracing::field::Empty,
    );
    async {
        let retryable = |e: anyhow::Error| JobFailure::Retryable(e);
        // The lock lives on its own connection: if this process dies, PostgreSQL releases it.
        let mut lock = ctx.pool.acquire().await.map_err(|e| retryable(e.into()))?;
        let account_key = args.account_id.to_string();
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
            .bind(HOP_LOCK_CLASS)
            .bind(&account_key)
            .fetch_one(&mut *lock)
            .await
            .map_err(|e| retryable(e.into()))?;
        if !locked {
            tracing::Span::current().record("outcome", "account_busy");
            tracing::info!("another hop of this account is running; trying again later");
            defer(ctx, &args).await.map_err(|e| retryable(e.into()))?;
            return Ok(());
        }
        let locked_at = chrono::Utc::now();
        let started = std::time::Instant::now();
        let result = job::run(
            &ctx.pool,
            ctx.clock.as_ref(),
            &hop_settings(&ctx.settings),
            &args,
            &ctx.stopping,
        )
        .await;
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1, hashtext($2))")
            .bind(HOP_LOCK_CLASS)
            .bind(&account_key)
            .execute(&mut *lock)
            .await;
        let unlocked_at = chrono::Utc::now();
        if unlocked.is_err() {
            // A connection that cannot unlock must not go back to the pool holding the lock.
            lock.detach();
        }
        let seconds = started.elapsed().as_secs_f64();
        let report = match result {
            Ok(report) => report,
            Err(err) => {
                metrics::hop_failed(seconds);
                return Err(retryable(err.into()));
            }
        };
        if let Some(next) = &report.next {
            push_hop(ctx, next).await.map_err(|e| retryable(e.into()))?;
        }
        metrics::hop(&report, seconds);
        tracing::Span::current().record("outcome", report.outcome.as_str());
        tracing::info!(
            candidates = report.candidates,
            pruned = report.pruned,
            retained = report.retained.values().sum::<u32>(),
            files_deleted = report.files_deleted,
            file_errors = report.file_errors,
            bytes = report.bytes_reclaimed,
            elapsed_ms = (seconds * 1000.0) as u64,
            owner_ms = (report.owner_seconds * 1000.0) as u64,
            locked_at = %locked_at.to_rfc3339(),
            unlocked_at = %unlocked_at.to_rfc3339(),
            "hop done"
        );
        Ok(())
    }
    .instrument(span)
    .await
}

/// Pushes the same hop again a little later, under a key of its own.
async fn defer(ctx: &JobContext, args: &Args) -> Result<PushOutcome, QueueError> {
    let key = hop_key(args.account_id, args.pass_started_at, args.hop);
    let key = format!("{key}:deferred:{}", Uuid::new_v4());
    push(ctx, args, key, Some(BUSY_ACCOUNT_DELAY)).await
}

/// Prints previews for people (`sexton preview`, `sexton demo`).
pub fn print_preview(previews: &[Preview]) {
    println!("PruneExecutionDetails");
    for p in previews {
        let Some(cutoff) = p.cutoff else {
            println!(
                "  account {} ({}): retention disabled",
                p.account_name, p.account_id
            );
            continue;
        };
        println!(
            "  account {} ({}), {} days, cutoff {}: {} owners eligible, {} bytes of output files",
            p.account_name,
            p.account_id,
            p.retention_days.unwrap_or_default(),
            cutoff.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            p.eligible_owners,
            p.bytes
        );
        for (reason, n) in &p.retained {
            println!("    retained {:<24} {n:>10}", reason.as_str());
        }
        for (table, n) in &p.rows {
            println!("    rows     {table:<24} {n:>10}");
        }
    }
}
