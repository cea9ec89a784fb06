//! The pass ledger, `sexton.passes`: one row per (job, scope, slot), opened by the fan-out and
//! updated by every hop. Operators read it (`sexton status`), and the last-success gauge comes
//! from it, the same on every replica (OP-3). It never drives a hop (EX-7).

use chrono::{DateTime, Utc};
use serde::Serialize;
use sexton_jobs::job::{Reason, Report};
use sqlx::PgPool;
use uuid::Uuid;

/// The scope a pass is recorded under: the account, or the nil uuid for a global job.
pub fn scope(account: Option<Uuid>) -> Uuid {
    account.unwrap_or_default()
}

/// Opens the passes a slot fans out, so that a pass whose first hop never ran still counts as
/// unfinished. Opening twice changes nothing.
///
/// # Errors
/// A database error.
pub async fn open<'e>(
    db: impl sqlx::PgExecutor<'e>,
    job: &str,
    scopes: &[Uuid],
    slot: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO sexton.passes (job, scope, slot)
         SELECT $1, scope, $3 FROM unnest($2::uuid[]) AS s (scope)
         ON CONFLICT DO NOTHING",
    )
    .bind(job)
    .bind(scopes)
    .bind(slot)
    .execute(db)
    .await?;
    Ok(())
}

/// Notes that the fan-out of `job` for `slot` began (a retried slot job begins it again).
///
/// # Errors
/// A database error.
pub async fn fan_out_begun<'e>(
    db: impl sqlx::PgExecutor<'e>,
    job: &str,
    slot: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO sexton.fan_outs (job, slot) VALUES ($1, $2)
         ON CONFLICT (job, slot) DO UPDATE SET finished_at = NULL",
    )
    .bind(job)
    .bind(slot)
    .execute(db)
    .await?;
    Ok(())
}

/// Notes that the fan-out of `job` for `slot` went through all `accounts`: what it started is
/// counted from the passes (a retried fan-out finds started ones no longer due).
///
/// # Errors
/// A database error.
pub async fn fan_out_done<'e>(
    db: impl sqlx::PgExecutor<'e>,
    job: &str,
    slot: DateTime<Utc>,
    accounts: u64,
) -> Result<FanOut, sqlx::Error> {
    sqlx::query_as(
        "INSERT INTO sexton.fan_outs AS f (job, slot, finished_at, accounts, started)
         VALUES ($1, $2, now(), $3,
                 (SELECT count(*) FROM sexton.passes WHERE job = $1 AND slot = $2))
         ON CONFLICT (job, slot) DO UPDATE SET
             finished_at = now(), accounts = EXCLUDED.accounts, started = EXCLUDED.started
         RETURNING job, slot, started_at, finished_at, accounts, started",
    )
    .bind(job)
    .bind(slot)
    .bind(i64::try_from(accounts).unwrap_or(i64::MAX))
    .fetch_one(db)
    .await
}

/// Each job's latest fan-out.
///
/// # Errors
/// A database error.
pub async fn latest_fan_outs(pool: &PgPool) -> Result<Vec<FanOut>, sqlx::Error> {
    sqlx::query_as(
        "SELECT DISTINCT ON (job) job, slot, started_at, finished_at, accounts, started
         FROM sexton.fan_outs ORDER BY job, slot DESC",
    )
    .fetch_all(pool)
    .await
}

/// One job's fan-out of one slot.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct FanOut {
    pub job: String,
    pub slot: DateTime<Utc>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Accounts looked at (1 for a global job's one pass).
    pub accounts: i64,
    /// Passes started; the other accounts had nothing due.
    pub started: i64,
}

fn counts(pairs: &[(&'static str, u64)]) -> serde_json::Value {
    pairs
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| ((*k).to_owned(), serde_json::Value::from(*n)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Adds what one hop did to its pass. A hop delivered twice adds what each run did — the rows
/// one run removed are gone for the other, so nothing is counted twice but the hop itself — and
/// a late duplicate of an earlier hop never reopens a finished pass.
///
/// # Errors
/// A database error.
#[allow(clippy::too_many_arguments)]
pub async fn record_hop<R: Reason>(
    pool: &PgPool,
    job: &str,
    scope: Uuid,
    slot: DateTime<Utc>,
    hop: u32,
    started: DateTime<Utc>,
    report: &Report<R>,
    finished: bool,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO sexton.passes AS p
             (job, scope, slot, started_at, finished_at, outcome, hops, last_hop, candidates,
              pruned, retained, rows_deleted, files_deleted, bytes_reclaimed, file_errors,
              throttles, last_throttled_at, last_throttled_by)
         VALUES ($1, $2, $3, $14, CASE WHEN $4 THEN now() END, $5, 1, $6, $7, $8, $9, $10,
                 $11, $12, $13, CASE WHEN $15::text IS NULL THEN 0 ELSE 1 END,
                 CASE WHEN $15::text IS NOT NULL THEN now() END, $15)
         ON CONFLICT (job, scope, slot) DO UPDATE SET
             started_at = COALESCE(p.started_at, EXCLUDED.started_at),
             updated_at = now(),
             finished_at = COALESCE(p.finished_at, EXCLUDED.finished_at),
             outcome = CASE WHEN p.finished_at IS NULL OR EXCLUDED.last_hop >= p.last_hop
                            THEN EXCLUDED.outcome ELSE p.outcome END,
             hops = p.hops + 1,
             last_hop = GREATEST(p.last_hop, EXCLUDED.last_hop),
             candidates = p.candidates + EXCLUDED.candidates,
             pruned = p.pruned + EXCLUDED.pruned,
             retained = sexton.add_counts(p.retained, EXCLUDED.retained),
             rows_deleted = sexton.add_counts(p.rows_deleted, EXCLUDED.rows_deleted),
             files_deleted = p.files_deleted + EXCLUDED.files_deleted,
             bytes_reclaimed = p.bytes_reclaimed + EXCLUDED.bytes_reclaimed,
             file_errors = p.file_errors + EXCLUDED.file_errors,
             throttles = p.throttles + EXCLUDED.throttles,
             last_throttled_at = COALESCE(EXCLUDED.last_throttled_at, p.last_throttled_at),
             last_throttled_by = COALESCE(EXCLUDED.last_throttled_by, p.last_throttled_by),
             last_error = NULL",
    )
    .bind(job)
    .bind(scope)
    .bind(slot)
    .bind(finished)
    .bind(report.outcome.as_str())
    .bind(i64::from(hop))
    .bind(report.candidates as i64)
    .bind(report.pruned as i64)
    .bind(counts(&report.retained_by_label()))
    .bind(counts(&report.rows))
    .bind(report.files.deleted as i64)
    .bind(report.files.bytes as i64)
    .bind(report.files.errors as i64)
    .bind(started)
    .bind(report.throttled.map(|i| i.as_str()))
    .execute(pool)
    .await?;
    Ok(())
}

/// Adds what a failed hop committed before it failed to its pass (it is done; the retry finds
/// it gone): counts only, not a hop.
///
/// # Errors
/// A database error.
pub async fn record_committed<R: Reason>(
    pool: &PgPool,
    job: &str,
    scope: Uuid,
    slot: DateTime<Utc>,
    report: &Report<R>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO sexton.passes AS p
             (job, scope, slot, started_at, candidates, pruned, retained, rows_deleted,
              files_deleted, bytes_reclaimed, file_errors)
         VALUES ($1, $2, $3, now(), $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT (job, scope, slot) DO UPDATE SET
             started_at = COALESCE(p.started_at, now()),
             updated_at = now(),
             candidates = p.candidates + EXCLUDED.candidates,
             pruned = p.pruned + EXCLUDED.pruned,
             retained = sexton.add_counts(p.retained, EXCLUDED.retained),
             rows_deleted = sexton.add_counts(p.rows_deleted, EXCLUDED.rows_deleted),
             files_deleted = p.files_deleted + EXCLUDED.files_deleted,
             bytes_reclaimed = p.bytes_reclaimed + EXCLUDED.bytes_reclaimed,
             file_errors = p.file_errors + EXCLUDED.file_errors",
    )
    .bind(job)
    .bind(scope)
    .bind(slot)
    .bind(report.candidates as i64)
    .bind(report.pruned as i64)
    .bind(counts(&report.retained_by_label()))
    .bind(counts(&report.rows))
    .bind(report.files.deleted as i64)
    .bind(report.files.bytes as i64)
    .bind(report.files.errors as i64)
    .execute(pool)
    .await?;
    Ok(())
}

/// Notes that a hop of an unfinished pass failed, and why; it will be retried.
///
/// # Errors
/// A database error.
pub async fn record_failure(
    pool: &PgPool,
    job: &str,
    scope: Uuid,
    slot: DateTime<Utc>,
    error: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO sexton.passes AS p (job, scope, slot, started_at, outcome, last_error)
         VALUES ($1, $2, $3, now(), 'failed', $4)
         ON CONFLICT (job, scope, slot) DO UPDATE SET
             started_at = COALESCE(p.started_at, now()),
             updated_at = now(), outcome = 'failed', last_error = EXCLUDED.last_error
         WHERE p.finished_at IS NULL",
    )
    .bind(job)
    .bind(scope)
    .bind(slot)
    .bind(error)
    .execute(pool)
    .await?;
    Ok(())
}

/// The latest slot of each job, not in the future, whose fan-out went through and whose every
/// started pass finished (OP-3): an account found with nothing due counts as finished, and a
/// slot ticked ahead of time must not hide tonight's.
///
/// # Errors
/// A database error.
pub async fn last_success(pool: &PgPool) -> Result<Vec<(String, DateTime<Utc>)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT f.job, max(f.slot) FROM sexton.fan_outs f
         WHERE f.slot <= now() AND f.finished_at IS NOT NULL
           AND NOT EXISTS (SELECT 1 FROM sexton.passes p
                           WHERE p.job = f.job AND p.slot = f.slot AND p.finished_at IS NULL)
         GROUP BY f.job ORDER BY f.job",
    )
    .fetch_all(pool)
    .await
}

/// Forgets passes of slots older than `before` (FL-7's age), in bounded batches.
///
/// # Errors
/// A database error.
pub async fn prune(pool: &PgPool, before: DateTime<Utc>) -> Result<u64, sqlx::Error> {
    let mut deleted = 0;
    loop {
        let n = sqlx::query(
            "DELETE FROM sexton.passes WHERE ctid = ANY(ARRAY(
                 SELECT ctid FROM sexton.passes WHERE slot < $1 LIMIT 1000))",
        )
        .bind(before)
        .execute(pool)
        .await?
        .rows_affected();
        deleted += n;
        if n == 0 {
            break;
        }
    }
    sqlx::query("DELETE FROM sexton.fan_outs WHERE slot < $1")
        .bind(before)
        .execute(pool)
        .await?;
    Ok(deleted)
}

/// One pass as the ledger holds it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
pub struct Pass {
    pub job: String,
    /// The account, or null for a global job.
    pub account_id: Option<Uuid>,
    pub account_name: Option<String>,
    pub slot: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// `pending` (no hop ran yet), `running`, `failed` (retrying) or `finished`.
    pub state: String,
    /// The last hop's outcome (`continued`, `finished`, `disabled`, `account_gone`, `failed`, …).
    pub outcome: String,
    pub hops: i32,
    pub candidates: i64,
    pub pruned: i64,
    pub retained: serde_json::Value,
    pub rows_deleted: serde_json::Value,
    pub files_deleted: i64,
    pub bytes_reclaimed: i64,
    pub file_errors: i64,
    pub last_error: Option<String>,
    /// Hops that stopped early on a red health indicator, the last of them, and why.
    pub throttles: i32,
    pub last_throttled_at: Option<DateTime<Utc>>,
    pub last_throttled_by: Option<String>,
}

/// The columns of a [`Pass`], from `sexton.passes p` joined to `accounts a`.
const PASS: &str = "p.job, NULLIF(p.scope, '00000000-0000-0000-0000-000000000000') AS account_id,
                a.name AS account_name, p.slot, p.started_at, p.finished_at,
                CASE WHEN p.finished_at IS NOT NULL THEN 'finished'
                     WHEN p.outcome = 'failed' THEN 'failed'
                     WHEN p.hops = 0 THEN 'pending'
                     ELSE 'running' END AS state,
                p.outcome, p.hops, p.candidates, p.pruned, p.retained, p.rows_deleted,
                p.files_deleted, p.bytes_reclaimed, p.file_errors, p.last_error,
                p.throttles, p.last_throttled_at, p.last_throttled_by";

/// The latest pass of every job and scope: a row per account that had a pass within the
/// ledger's age (`sexton status --all`).
///
/// # Errors
/// A database error.
pub async fn latest(pool: &PgPool) -> Result<Vec<Pass>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT DISTINCT ON (p.job, p.scope) {PASS}
         FROM sexton.passes p LEFT JOIN accounts a ON a.id = p.scope
         ORDER BY p.job, p.scope, p.slot DESC"
    )))
    .fetch_all(pool)
    .await
}

/// One account's latest pass of every job (`sexton status --account`), read through the
/// ledger's key.
///
/// # Errors
/// A database error.
pub async fn latest_of(pool: &PgPool, account: Uuid) -> Result<Vec<Pass>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT DISTINCT ON (p.job) {PASS}
         FROM sexton.passes p LEFT JOIN accounts a ON a.id = p.scope
         WHERE p.scope = $1
         ORDER BY p.job, p.slot DESC"
    )))
    .bind(account)
    .fetch_all(pool)
    .await
}

/// The passes that did not finish and are their scope's latest, newest slot first, at most
/// `limit` per job: read through `passes_unfinished`, however many accounts finished theirs.
///
/// # Errors
/// A database error.
pub async fn unfinished(
    pool: &PgPool,
    jobs: &[&str],
    limit: i64,
) -> Result<Vec<Pass>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT {PASS}
         FROM unnest($1::text[]) AS j (job)
         CROSS JOIN LATERAL (
             SELECT * FROM sexton.passes u
             WHERE u.job = j.job AND u.finished_at IS NULL
               AND NOT EXISTS (SELECT 1 FROM sexton.passes n
                               WHERE n.job = u.job AND n.scope = u.scope AND n.slot > u.slot)
             ORDER BY u.slot DESC LIMIT $2) p
         LEFT JOIN accounts a ON a.id = p.scope"
    )))
    .bind(jobs)
    .bind(limit)
    .fetch_all(pool)
    .await
}

/// The passes of one job's slot that did not finish, by state (`pending`, `running`,
/// `failed`), counting at most `cap` of them: read through `passes_unfinished`.
///
/// # Errors
/// A database error.
pub async fn unfinished_states(
    pool: &PgPool,
    job: &str,
    slot: DateTime<Utc>,
    cap: i64,
) -> Result<Vec<(String, i64)>, sqlx::Error> {
    sqlx::query_as(
        "SELECT state, count(*) FROM (
             SELECT CASE WHEN outcome = 'failed' THEN 'failed'
                         WHEN hops = 0 THEN 'pending'
                         ELSE 'running' END AS state
             FROM sexton.passes
             WHERE job = $1 AND slot = $2 AND finished_at IS NULL
             LIMIT $3) u
         GROUP BY state",
    )
    .bind(job)
    .bind(slot)
    .bind(cap)
    .fetch_all(pool)
    .await
}
