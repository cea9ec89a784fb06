//! Wires PruneExecutionDetails to the queue: one hop per job, the next hop pushed with a key
//! derived from the pass and hop number, so a retried hop never forks the chain (EX-7, EX-8).

use chrono::{DateTime, Utc};
use sexton_jobs::prune_execution_details::{self as job, Args, HopReport, HopSettings, Preview};
use tracing::Instrument as _;
use uuid::Uuid;

use crate::config::Settings;
use crate::queue::{self, PushOptions, PushOutcome, Queue, QueueError};
use crate::worker::{JobContext, JobFailure};

/// The hop limits from configuration.
pub fn hop_settings(settings: &Settings) -> HopSettings {
    HopSettings {
        window_size: settings.execution_details.window_size,
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
    queue::push(
        &ctx.pool,
        Queue::PruneExecutionDetails,
        &ctx.settings.queue,
        args,
        PushOptions {
            idempotency_key: Some(hop_key(args.account_id, args.pass_started_at, args.hop)),
            ..PushOptions::default()
        },
    )
    .await
}

/// Runs one hop and enqueues the next.
///
/// # Errors
/// [`JobFailure::Retryable`] when the database or queue fails; the hop is then run again.
pub async fn hop(ctx: &JobContext, args: Args) -> Result<HopReport, JobFailure> {
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
        let started = std::time::Instant::now();
        let report = job::run(
            &ctx.pool,
            ctx.clock.as_ref(),
            &hop_settings(&ctx.settings),
            &args,
        )
        .await
        .map_err(|e| JobFailure::Retryable(e.into()))?;
        if let Some(next) = &report.next {
            push_hop(ctx, next)
                .await
                .map_err(|e| JobFailure::Retryable(e.into()))?;
        }
        tracing::Span::current().record("outcome", report.outcome.as_str());
        tracing::info!(
            candidates = report.candidates,
            pruned = report.pruned,
            retained = report.retained.values().sum::<u32>(),
            files_deleted = report.files_deleted,
            bytes = report.bytes_reclaimed,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "hop done"
        );
        Ok(report)
    }
    .instrument(span)
    .await
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
