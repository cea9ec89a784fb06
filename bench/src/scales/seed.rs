//! A scale's template: `sexton seed` at the scale on a fresh database, with its file tree, and
//! what every method on a copy of it is checked and measured against — the owners and sessions
//! a complete pass removes (`bench_owners`, `bench_sessions`, by the rules' own verdicts), their
//! rows, the owners' output files no surviving run references, and the writers' targets.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::bail;
use sexton_jobs::prune_execution_details::DETAIL_TABLES;
use sqlx::PgPool;
use sqlx::postgres::PgConnectOptions;
use uuid::Uuid;

use super::writers::{session_targets, writer_targets};
use crate::cli::Cli;
use crate::cluster::{connect, recreate};
use crate::sexton::{pass_start, sexton};

/// Owners a complete pass prunes (EX-1, EX-2, EX-5), as in the tests' audit.
const ELIGIBLE: &str = "INSERT INTO bench_owners (id)
    SELECT r.id FROM runs r JOIN accounts a ON a.id = r.account_id
    WHERE r.conversation_id IS NOT NULL AND r.kind IN ('conversation', 'direct_reply')
      AND r.details_pruned_at IS NULL
      AND (CASE WHEN r.kind = 'conversation' THEN r.completed_at
                WHEN r.settled_at IS NOT NULL THEN r.terminal_at END)
          < $1 - make_interval(days => a.execution_details_retention_days)
      AND NOT EXISTS (SELECT 1 FROM invocation_attempts WHERE run_id = r.id AND status IN ('pending', 'running'))
      AND NOT EXISTS (SELECT 1 FROM settlement_receipts WHERE run_id = r.id AND status = 'pending')
      AND NOT EXISTS (SELECT 1 FROM delegations WHERE parent_run_id = r.id AND status = 'outstanding')
      AND NOT EXISTS (SELECT 1 FROM history_request_sources s JOIN history_requests h ON h.id = s.history_request_id
                      WHERE s.source_run_id = r.id AND h.sealed_at IS NULL)";

/// Sessions a complete SessionRetention pass deletes (SS-1 … SS-4), by the job's own verdict.
const ELIGIBLE_SESSIONS: &str = "INSERT INTO bench_sessions (id)
    SELECT s.id FROM sessions s
    JOIN session_retention_policies p ON p.account_id = s.account_id AND p.enabled
    CROSS JOIN LATERAL (SELECT $1 - make_interval(days => CASE s.kind
                                WHEN 'main' THEN COALESCE(p.main_days, 60)
                                WHEN 'task' THEN COALESCE(p.task_days, 30)
                                ELSE COALESCE(p.subagent_days, 7) END) AS cutoff) c
    WHERE sexton.session_verdict(s.id, s.account_id, s.kind, s.state, s.metadata,
                                 s.last_activity_at, c.cutoff) IS NULL";

/// A seeded scale's template, and what the methods on its copies are measured against.
pub struct Template {
    pub scale: u64,
    /// The database each method's copy is made from, and the file tree copied beside it.
    pub name: String,
    pub files: PathBuf,
    /// `sexton seed`, with `migrate`.
    pub seed_seconds: f64,
    pub runs: i64,
    /// The runs a complete pass prunes, and their detail rows.
    pub owners: i64,
    pub detail_rows: i64,
    /// The sessions a complete SessionRetention pass deletes, and their history rows (theirs
    /// included).
    pub sessions: i64,
    pub session_rows: i64,
    /// The owners' output files no surviving run references, under the outputs root.
    pub owner_files: Vec<String>,
    /// The writer's (conversation, run) pairs, and the appending writer's sessions.
    pub targets: Vec<(Uuid, Uuid)>,
    pub session_targets: Vec<Uuid>,
}

/// Seeds the template of scale `scale` (`sexton migrate`, then `sexton seed` at
/// [`pass_start`]) and reads from it what its methods are measured against.
pub async fn seed(
    cli: &Cli,
    admin: &PgPool,
    base: &PgConnectOptions,
    scale: u64,
) -> anyhow::Result<Template> {
    let name = format!("bench_template_{scale}");
    let files = cli.scratch.join(format!("files-{scale}"));
    recreate(admin, &name, None).await?;
    let _ = std::fs::remove_dir_all(&files);
    eprintln!("scale {scale}: seeding");
    let started = Instant::now();
    sexton(&cli.sexton, &name, &files, &["migrate"])
        .status()
        .await?;
    let seeded = sexton(
        &cli.sexton,
        &name,
        &files,
        &[
            "seed",
            "--json",
            "--scale",
            &scale.to_string(),
            "--now",
            &pass_start().to_rfc3339(),
        ],
    )
    .status()
    .await?;
    if !seeded.success() {
        bail!("seeding scale {scale} failed");
    }
    let seed_seconds = started.elapsed().as_secs_f64();
    let pool = connect(base, &name, "bench").await?;
    mark(&pool).await?;
    place_holds(&pool, cli.holds).await?;
    let template = Template {
        scale,
        name,
        files,
        seed_seconds,
        runs: count(&pool, "runs").await?,
        owners: count(&pool, "bench_owners").await?,
        detail_rows: detail_rows(&pool).await?,
        sessions: count(&pool, "bench_sessions").await?,
        session_rows: session_rows(&pool).await?,
        targets: writer_targets(&pool).await?,
        owner_files: owner_files(&pool).await?,
        session_targets: session_targets(&pool).await?,
    };
    pool.close().await;
    Ok(template)
}

/// Places `holds` active holds on scopes that hold nothing ([`Cli::holds`]).
async fn place_holds(pool: &PgPool, holds: u32) -> anyhow::Result<()> {
    if holds == 0 {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO sexton.holds (scope, scope_id, case_ref, reason, placed_by)
         SELECT (ARRAY['account', 'conversation', 'agent', 'session', 'run'])[1 + i % 5],
                gen_random_uuid(), 'BENCH-' || i, 'benchmark', 'sexton-bench'
         FROM generate_series(1, $1) AS i",
    )
    .bind(i64::from(holds))
    .execute(pool)
    .await?;
    // As `sexton holds place` and autovacuum leave it: the probes plan on these statistics.
    sqlx::query("ANALYZE sexton.holds").execute(pool).await?;
    eprintln!("{holds} active holds placed");
    Ok(())
}

/// Marks what a complete pass removes (`bench_owners`, `bench_sessions`), and sets the session
/// policies aside (`bench_policies`).
async fn mark(pool: &PgPool) -> anyhow::Result<()> {
    sqlx::query("CREATE TABLE bench_owners (id uuid PRIMARY KEY)")
        .execute(pool)
        .await?;
    sqlx::query(ELIGIBLE)
        .bind(pass_start())
        .execute(pool)
        .await?;
    sqlx::query("CREATE TABLE bench_sessions (id uuid PRIMARY KEY)")
        .execute(pool)
        .await?;
    sqlx::query(ELIGIBLE_SESSIONS)
        .bind(pass_start())
        .execute(pool)
        .await?;
    // The execution-details methods compare that job alone: sessions wait for their own rows.
    sqlx::query("CREATE TABLE bench_policies AS SELECT * FROM session_retention_policies")
        .execute(pool)
        .await?;
    sqlx::query("UPDATE session_retention_policies SET enabled = false")
        .execute(pool)
        .await?;
    sqlx::query("ANALYZE").execute(pool).await?;
    Ok(())
}

/// The rows of `table`.
async fn count(pool: &PgPool, table: &str) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(pool)
            .await?,
    )
}

/// The owners' detail rows, over every detail table.
async fn detail_rows(pool: &PgPool) -> anyhow::Result<i64> {
    let mut total = 0;
    for table in DETAIL_TABLES {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE run_id IN (SELECT id FROM bench_owners)"
        )))
        .fetch_one(pool)
        .await?;
        total += n;
    }
    Ok(total)
}

/// The history rows of the sessions a pass deletes, the sessions' own included.
async fn session_rows(pool: &PgPool) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM conversation_entries WHERE session_id IN (SELECT id FROM bench_sessions))
              + (SELECT count(*) FROM conversation_archives WHERE session_id IN (SELECT id FROM bench_sessions))
              + (SELECT count(*) FROM conversation_archive_entries e JOIN conversation_archives a
                 ON a.id = e.archive_id WHERE a.session_id IN (SELECT id FROM bench_sessions))
              + (SELECT count(*) FROM bench_sessions)",
    )
    .fetch_one(pool)
    .await?)
}

/// The owners' output files no surviving run references: sexton's end state has none of them
/// on disk, and neither has the floor that unlinks.
async fn owner_files(pool: &PgPool) -> anyhow::Result<Vec<String>> {
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT o.relative_path FROM output_files o JOIN bench_owners b ON b.id = o.run_id
         WHERE NOT EXISTS (SELECT 1 FROM output_files s
                           WHERE s.relative_path = o.relative_path
                             AND NOT EXISTS (SELECT 1 FROM bench_owners c WHERE c.id = s.run_id))",
    )
    .fetch_all(pool)
    .await?)
}
