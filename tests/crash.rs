//! EX-8 for real: worker processes killed with SIGKILL at random points of a pass.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use sexton::seed::{SeedOptions, seed};
use sqlx::PgPool;
use uuid::Uuid;

use crate::common;
use crate::common::fixture::pass_start;

/// Per run: detail rows, whether pruned; kept to compare with the end state.
const SNAPSHOT: &str = "CREATE TABLE audit_before AS
    SELECT r.id, r.details_pruned_at IS NOT NULL AS pruned,
           (SELECT count(*) FROM run_tasks WHERE run_id = r.id)
         + (SELECT count(*) FROM run_task_edges WHERE run_id = r.id)
         + (SELECT count(*) FROM tool_results WHERE run_id = r.id)
         + (SELECT count(*) FROM sealed_requests WHERE run_id = r.id)
         + (SELECT count(*) FROM reasoning_traces WHERE run_id = r.id)
         + (SELECT count(*) FROM invocation_attempts WHERE run_id = r.id)
         + (SELECT count(*) FROM output_files WHERE run_id = r.id) AS detail_rows
    FROM runs r";

/// Runs eligible at the pass start (EX-1, EX-2, EX-5): what a complete pass must have pruned.
const ELIGIBLE: &str = "SELECT r.id FROM runs r JOIN accounts a ON a.id = r.account_id
    WHERE r.conversation_id IS NOT NULL AND r.kind IN ('conversation', 'direct_reply')
      AND (CASE WHEN r.kind = 'conversation' THEN r.completed_at
                WHEN r.settled_at IS NOT NULL THEN r.terminal_at END)
          < $1 - make_interval(days => a.execution_details_retention_days)
      AND NOT EXISTS (SELECT 1 FROM invocation_attempts WHERE run_id = r.id AND status IN ('pending', 'running'))
      AND NOT EXISTS (SELECT 1 FROM settlement_receipts WHERE run_id = r.id AND status = 'pending')
      AND NOT EXISTS (SELECT 1 FROM delegations WHERE parent_run_id = r.id AND status = 'outstanding')
      AND NOT EXISTS (SELECT 1 FROM history_request_sources s JOIN history_requests h ON h.id = s.history_request_id
                      WHERE s.source_run_id = r.id AND h.sealed_at IS NULL)
    ORDER BY r.id";

fn worker(url: &str, dir: &std::path::Path, exit_when_idle: bool) -> tokio::process::Command {
    let mut cmd = common::sexton(url, dir);
    cmd.arg("worker")
        .env("SEXTON_QUEUE__HEARTBEAT_INTERVAL_MS", "300")
        .env("SEXTON_QUEUE__MISSED_HEARTBEATS", "2")
        .env("SEXTON_QUEUE__MAX_ATTEMPTS", "100")
        .env("SEXTON_EXECUTION_DETAILS__WINDOW_SIZE", "10")
        .env("SEXTON_LOG__LEVEL", "warn")
        .stderr(std::process::Stdio::null());
    if exit_when_idle {
        cmd.arg("--exit-when-idle");
    }
    cmd
}

#[sqlx::test]
async fn ex8_workers_killed_with_sigkill_mid_pass_lose_nothing_and_the_pass_completes(
    pool: PgPool,
) {
    common::migrate(&pool).await;
    let dir = tempfile::tempdir().unwrap();
    let settings = common::settings(dir.path());
    let options = SeedOptions {
        scale: 1,
        seed: 3,
        now: pass_start(),
        show_progress: false,
    };
    seed(&pool, &settings.paths, &options).await.unwrap();
    sqlx::query(SNAPSHOT).execute(&pool).await.unwrap();
    let files: Vec<(Uuid, String)> =
        sqlx::query_as("SELECT run_id, relative_path FROM output_files")
            .fetch_all(&pool)
            .await
            .unwrap();
    let eligible: Vec<Uuid> = sqlx::query_scalar(ELIGIBLE)
        .bind(pass_start())
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(eligible.len() > 500, "a backlog worth killing workers over");
    sexton::tick::tick(&pool, &settings, pass_start())
        .await
        .unwrap();

    let url = common::database_url(&pool).await;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(8);
    let mut kills_mid_pass = 0;
    for _ in 0..20 {
        let mut child = worker(&url, dir.path(), false).spawn().unwrap();
        let delay = Duration::from_millis(rng.random_range(100..700));
        tokio::time::sleep(delay).await; // fault injection at a random instant, not synchronisation
        child.start_kill().unwrap();
        child.wait().await.unwrap();
        let pruned: i64 =
            sqlx::query_scalar("SELECT count(*) FROM runs WHERE details_pruned_at IS NOT NULL")
                .fetch_one(&pool)
                .await
                .unwrap();
        if (pruned as usize) < eligible.len() {
            kills_mid_pass += 1;
        }
    }
    assert!(
        kills_mid_pass >= 5,
        "only {kills_mid_pass} kills landed mid-pass"
    );

    let mut child = worker(&url, dir.path(), true).spawn().unwrap();
    let status = common::wait(&mut child, Duration::from_secs(180)).await;
    assert!(status.success(), "the last worker exited with {status}");

    // No half-pruned owner, no retained row lost.
    let broken: Vec<(Uuid, bool, i64, i64)> = sqlx::query_as(
        "SELECT r.id, r.details_pruned_at IS NOT NULL, b.detail_rows,
                (SELECT count(*) FROM run_tasks WHERE run_id = r.id)
              + (SELECT count(*) FROM run_task_edges WHERE run_id = r.id)
              + (SELECT count(*) FROM tool_results WHERE run_id = r.id)
              + (SELECT count(*) FROM sealed_requests WHERE run_id = r.id)
              + (SELECT count(*) FROM reasoning_traces WHERE run_id = r.id)
              + (SELECT count(*) FROM invocation_attempts WHERE run_id = r.id)
              + (SELECT count(*) FROM output_files WHERE run_id = r.id) AS now_rows
         FROM runs r JOIN audit_before b ON b.id = r.id
         WHERE (r.details_pruned_at IS NOT NULL AND (
                    (SELECT count(*) FROM run_tasks WHERE run_id = r.id) > 0
                 OR (SELECT count(*) FROM invocation_attempts WHERE run_id = r.id) > 0
                 OR (SELECT count(*) FROM output_files WHERE run_id = r.id) > 0
                 OR r.runner_effects->>'reason' IS DISTINCT FROM 'execution_details_pruned'
                 OR EXISTS (SELECT 1 FROM variants v WHERE v.id = r.variant_id AND v.details_pruned_at IS NULL)))
            OR (r.details_pruned_at IS NULL AND
                (SELECT count(*) FROM run_tasks WHERE run_id = r.id)
              + (SELECT count(*) FROM run_task_edges WHERE run_id = r.id)
              + (SELECT count(*) FROM tool_results WHERE run_id = r.id)
              + (SELECT count(*) FROM sealed_requests WHERE run_id = r.id)
              + (SELECT count(*) FROM reasoning_traces WHERE run_id = r.id)
              + (SELECT count(*) FROM invocation_attempts WHERE run_id = r.id)
              + (SELECT count(*) FROM output_files WHERE run_id = r.id) <> b.detail_rows)",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        broken.is_empty(),
        "half-pruned or damaged owners: {broken:?}"
    );

    // Exactly the eligible owners went: the pass completed and pruned nothing else.
    let pruned: Vec<Uuid> =
        sqlx::query_scalar("SELECT id FROM runs WHERE details_pruned_at IS NOT NULL ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(pruned, eligible);

    // No file left for a pruned run, no file deleted for a run that kept its rows.
    for (run, relative) in &files {
        let exists = settings.paths.output_root.join(relative).exists();
        let was_pruned = pruned.binary_search(run).is_ok();
        assert_eq!(exists, !was_pruned, "{relative} (run pruned: {was_pruned})");
    }
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM sexton.pending_file_deletions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(pending, 0);
    let failed: i64 =
        sqlx::query_scalar("SELECT count(*) FROM apalis.jobs WHERE status IN ('Failed', 'Killed')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(failed, 0);
}
