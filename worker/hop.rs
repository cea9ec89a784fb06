//! One hop of any job kind, run the same way for all: a slot in the hop budget, the scope lock
//! (at most one hop per job and account — or per global job — fleet-wide, FL-3), the job's
//! `run`, the next hop pushed with a key derived from the pass and hop number (so a retried hop
//! never forks the chain, EX-7, EX-8), the pass ledger, metrics, and one span per hop closed by
//! a `hop done` event (OP-4).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use futures::FutureExt as _;
use sexton_jobs::job::{self, Env, HopOutcome, Job, Position, Reason, Report};
use sexton_jobs::pass;
use sexton_jobs::pass::ArgsOf;
use sqlx::PgConnection;
use sqlx::pool::PoolConnection;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::context::{JobContext, JobFailure};
use crate::ledger;
use crate::queue::{self, PushOptions, PushOutcome, QueueError};
use crate::telemetry::metrics;

/// Advisory-lock class of hops; the key within it is the job and its scope.
const HOP_LOCK_CLASS: i32 = 0x5e77_0001;

/// How long a hop that found its scope busy waits before it is tried again.
const BUSY_SCOPE_DELAY: Duration = Duration::from_secs(5);

/// What a hop's lock is taken on: the job and its account, or the job alone.
fn lock_key(job: &str, account: Option<Uuid>) -> String {
    match account {
        Some(account) => format!("{job}:{account}"),
        None => job.to_owned(),
    }
}

/// The key of a hop: one job per (scope, pass, hop), whoever pushes it.
pub(crate) fn hop_key(position: &Position) -> String {
    let scope = position
        .account
        .map_or_else(|| "global".to_owned(), |a| a.to_string());
    format!(
        "{scope}:{}:{}",
        position.pass_started_at.to_rfc3339(),
        position.hop
    )
}

/// Pushes a hop unless that hop of that pass already exists.
///
/// # Errors
/// [`QueueError`] when the queue refuses the job.
pub async fn push<J: Job>(ctx: &JobContext, args: &ArgsOf<J>) -> Result<PushOutcome, QueueError> {
    push_after::<J>(ctx, args, None).await
}

/// [`push`], to run no sooner than `delay` from now.
async fn push_after<J: Job>(
    ctx: &JobContext,
    args: &ArgsOf<J>,
    delay: Option<Duration>,
) -> Result<PushOutcome, QueueError> {
    push_keyed::<J>(ctx, args, hop_key(&args.position()), delay).await
}

/// Pushes the same hop again a little later, under a key of its own.
async fn defer<J: Job>(ctx: &JobContext, args: &ArgsOf<J>) -> Result<PushOutcome, QueueError> {
    let key = format!("{}:deferred:{}", hop_key(&args.position()), Uuid::new_v4());
    push_keyed::<J>(ctx, args, key, Some(BUSY_SCOPE_DELAY)).await
}

/// Pushes `args` on `J`'s queue under `key`, to run no sooner than `delay` from now.
async fn push_keyed<J: Job>(
    ctx: &JobContext,
    args: &ArgsOf<J>,
    key: String,
    delay: Option<Duration>,
) -> Result<PushOutcome, QueueError> {
    let options = PushOptions {
        idempotency_key: Some(key),
        run_after: delay,
    };
    let queue = job::queue(J::NAME);
    queue::push(&ctx.pool, queue, &ctx.settings.queue, args, options).await
}

/// A connection holding a hop's scope lock. Dropped without [`ScopeLock::release`] — a panic,
/// a cancelled future — it is closed rather than returned to the pool, so the lock dies with
/// it and never outlives the hop.
pub struct ScopeLock {
    conn: Option<PoolConnection<sqlx::Postgres>>,
    key: String,
}

impl ScopeLock {
    /// Takes the lock of `job` for `account` (or the whole job) if it is free; `Ok(None)` if
    /// another hop — of this fleet, or a CLI run — holds it (FL-3).
    ///
    /// # Errors
    /// A database error.
    pub async fn try_take(
        pool: &sqlx::PgPool,
        job: &str,
        account: Option<Uuid>,
    ) -> Result<Option<Self>, sqlx::Error> {
        let key = lock_key(job, account);
        let mut conn = pool.acquire().await?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1, hashtext($2))")
            .bind(HOP_LOCK_CLASS)
            .bind(&key)
            .fetch_one(&mut *conn)
            .await?;
        Ok(locked.then_some(Self {
            conn: Some(conn),
            key,
        }))
    }

    /// The connection that holds the lock, for the hop's own work.
    pub fn conn(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("held until released")
    }

    /// Releases the lock and returns the connection to the pool.
    pub async fn release(mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1, hashtext($2))")
            .bind(HOP_LOCK_CLASS)
            .bind(&self.key)
            .execute(&mut *conn)
            .await;
        if unlocked.is_err() {
            // A connection that cannot unlock must not go back to the pool holding the lock.
            drop(conn.detach());
        }
    }
}

impl Drop for ScopeLock {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            drop(conn.detach());
        }
    }
}

/// Runs one hop of `J` and enqueues the next. If another hop of the same scope is running
/// anywhere in the fleet, this one is pushed again a little later instead (FL-3).
///
/// # Errors
/// [`JobFailure::Retryable`] when the database, the queue or a retryable job error fails the
/// hop; [`JobFailure::Fatal`] when the job says no retry can help.
pub async fn run<J: Job>(ctx: &JobContext, args: ArgsOf<J>) -> Result<(), JobFailure> {
    run_with::<J>(ctx, ctx.settings.jobs.get::<J::Settings>(J::NAME), args).await
}

/// [`run`] under `settings` (a kind the worker's configuration does not know, in tests).
///
/// # Errors
/// As [`run`].
pub async fn run_with<J: Job>(
    ctx: &JobContext,
    settings: &J::Settings,
    args: ArgsOf<J>,
) -> Result<(), JobFailure> {
    let position = args.position();
    let span = tracing::info_span!(
        "hop",
        job = J::NAME,
        account = position.account.map(|a| a.to_string()),
        pass = %position.pass_started_at.to_rfc3339(),
        hop = position.hop,
        window = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    let started = Instant::now();
    let hop = std::panic::AssertUnwindSafe(run_locked::<J>(ctx, settings, &args, position))
        .catch_unwind()
        .instrument(span.clone())
        .await;
    let failure = match hop {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(failure)) => failure,
        Err(panic) => JobFailure::Retryable(anyhow::anyhow!(
            "the hop panicked: {}",
            panic_message(panic.as_ref())
        )),
    };
    let _entered = span.enter();
    span.record("outcome", HopOutcome::Failed.as_str());
    metrics::hop_failed(J::NAME, started.elapsed().as_secs_f64());
    let error = format!("{:#}", anyhow_of(&failure));
    if let Err(err) = ledger::record_failure(
        &ctx.pool,
        J::NAME,
        ledger::scope(position.account),
        position.pass_started_at,
        &error,
    )
    .await
    {
        tracing::warn!(error = %err, "could not record the failed hop in the pass ledger");
    }
    Err(failure)
}

fn anyhow_of(failure: &JobFailure) -> anyhow::Error {
    match failure {
        JobFailure::Retryable(err) | JobFailure::Fatal(err) => anyhow::anyhow!("{err:#}"),
        other => anyhow::anyhow!("{other}"),
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

/// The hop inside its span: budget, lock, run, hand-over, ledger, metrics.
async fn run_locked<J: Job>(
    ctx: &JobContext,
    settings: &J::Settings,
    args: &ArgsOf<J>,
    position: Position,
) -> Result<(), JobFailure> {
    let retryable = |e: anyhow::Error| JobFailure::Retryable(e);
    let slots = if J::BESIDE { &ctx.beside } else { &ctx.hops };
    let _permit = slots
        .acquire()
        .await
        .context("the hop budget is closed")
        .map_err(retryable)?;
    let Some(mut lock) = ScopeLock::try_take(&ctx.pool, J::NAME, position.account)
        .await
        .context("could not take the hop's scope lock")
        .map_err(retryable)?
    else {
        tracing::Span::current().record("outcome", "account_busy");
        tracing::info!(
            event = crate::event::HOP_DEFERRED,
            "another hop of this scope is running; trying again later"
        );
        defer::<J>(ctx, args)
            .await
            .map_err(|e| retryable(e.into()))?;
        return Ok(());
    };
    let locked_at = ctx.clock.now();
    let started = Instant::now();
    let mut report = Report::new(J::TABLES);
    let result = pass::hop::<J>(
        Env {
            conn: lock.conn(),
            pool: &ctx.pool,
            clock: ctx.clock.as_ref(),
            stop: &ctx.stopping,
            paths: &ctx.settings.paths,
            health: &ctx.health,
        },
        settings,
        args,
        &mut report,
    )
    .await;
    // Read before the release: once released, another replica may take the lock (and read its
    // `locked_at`) before this release's round trip is back.
    let unlocked_at = ctx.clock.now();
    lock.release().await;
    let next = match result {
        Ok(next) => next,
        Err(err) => return Err(failed::<J>(ctx, position, &report, err).await),
    };
    let seconds = started.elapsed().as_secs_f64();
    let hop = Hopped {
        report: &report,
        next: next.as_ref(),
        seconds,
        locked_at,
        unlocked_at,
    };
    hand_over::<J>(ctx, position, hop).await
}

/// A hop whose run failed: what it committed before it failed is done, and counted all the
/// same (metrics, pass ledger); the failure says whether the job is tried again.
async fn failed<J: Job>(
    ctx: &JobContext,
    position: Position,
    report: &Report<J::Reason>,
    err: J::Error,
) -> JobFailure {
    metrics::committed(J::NAME, report);
    if let Err(error) = ledger::record_committed(
        &ctx.pool,
        J::NAME,
        ledger::scope(position.account),
        position.pass_started_at,
        report,
    )
    .await
    {
        tracing::warn!(%error, "could not count a failed hop's work in the pass ledger");
    }
    let retry = J::retryable(&err);
    let err = anyhow::Error::new(err).context(format!("{} hop failed", J::NAME));
    if retry {
        JobFailure::Retryable(err)
    } else {
        JobFailure::Fatal(err)
    }
}

/// A hop that ran: what it did, where its pass goes on, and its scope lock's interval.
struct Hopped<'a, R, A> {
    report: &'a Report<R>,
    next: Option<&'a A>,
    seconds: f64,
    locked_at: DateTime<Utc>,
    unlocked_at: DateTime<Utc>,
}

/// The end of a hop that ran: the next hop pushed (after the backoff when throttled), the hop
/// counted and logged, its pass updated in the ledger.
async fn hand_over<J: Job>(
    ctx: &JobContext,
    position: Position,
    hop: Hopped<'_, J::Reason, ArgsOf<J>>,
) -> Result<(), JobFailure> {
    let Hopped {
        report,
        next,
        seconds,
        locked_at,
        unlocked_at,
    } = hop;
    // The hop's work is done and counted whatever happens to the hand-over.
    // A throttled pass waits before its next hop.
    let delay = report.throttled.map(|_| ctx.settings.health.backoff);
    let pushed = match next {
        Some(next) => push_after::<J>(ctx, next, delay).await.map(|_| ()),
        None => Ok(()),
    };
    if let Some(indicator) = report.throttled {
        metrics::throttled(J::NAME, indicator.as_str());
    }
    let span = tracing::Span::current();
    span.record("window", report.window);
    match &pushed {
        Ok(()) => {
            metrics::hop(J::NAME, report, seconds);
            span.record("outcome", report.outcome.as_str());
        }
        Err(_) => {
            let counted = Report {
                outcome: HopOutcome::Failed,
                ..report.clone()
            };
            metrics::hop(J::NAME, &counted, seconds);
            span.record("outcome", HopOutcome::Failed.as_str());
        }
    }
    log_hop_done(report, seconds, locked_at, unlocked_at);
    let finished = next.is_none();
    record::<J>(ctx, position, locked_at, report, finished).await;
    pushed.map_err(|err| {
        JobFailure::Retryable(anyhow::Error::new(err).context("could not enqueue the next hop"))
    })
}

/// Adds the hop to the pass ledger (`finished`: the pass ended with it), and refreshes the
/// last-success gauge when a pass ended.
async fn record<J: Job>(
    ctx: &JobContext,
    position: Position,
    started: DateTime<Utc>,
    report: &Report<J::Reason>,
    finished: bool,
) {
    let recorded = ledger::record_hop(
        &ctx.pool,
        J::NAME,
        ledger::scope(position.account),
        position.pass_started_at,
        position.hop,
        started,
        report,
        finished,
    )
    .await;
    match recorded {
        Err(err) => tracing::warn!(error = %err, "could not record the hop in the pass ledger"),
        Ok(()) if finished => metrics::publish_last_success(&ctx.pool).await,
        Ok(()) => {}
    }
}

/// The event that closes a hop's span, with its counts, duration and lock interval.
fn log_hop_done<R: Reason>(
    report: &Report<R>,
    seconds: f64,
    locked_at: DateTime<Utc>,
    unlocked_at: DateTime<Utc>,
) {
    tracing::info!(
        event = crate::event::HOP_DONE,
        candidates = report.candidates,
        pruned = report.pruned,
        retained = report.retained_total(),
        files_deleted = report.files.deleted,
        file_errors = report.files.errors,
        bytes = report.files.bytes,
        elapsed_ms = (seconds * 1000.0) as u64,
        owner_ms = (report.owner_seconds * 1000.0) as u64,
        locked_at = %locked_at.to_rfc3339(),
        unlocked_at = %unlocked_at.to_rfc3339(),
        throttled_by = report.throttled.map(|i| i.as_str()),
        "hop done"
    );
}
