//! The end-state audit of EX-8 and FL-5: no half-pruned owner, no retained row lost, no file
//! left for a pruned run, no file deleted for a run that kept its rows.

use std::path::Path;

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

const DETAIL_ROWS: &str = "(SELECT count(*) FROM run_tasks WHERE run_id = r.id)
     + (SELECT count(*) FROM run_task_edges WHERE run_id = r.id)
     + (SELECT count(*) FROM tool_results WHERE run_id = r.id)
     + (SELECT count(*) FROM sealed_requests WHERE run_id = r.id)
     + (SELECT count(*) FROM reasoning_traces WHERE run_id = r.id)
     + (SELECT count(*) FROM invocation_attempts WHERE run_id = r.id)
     + (SELECT count(*) FROM output_files WHERE run_id = r.id)";

/// Runs eligible at `pass_start` (EX-1, EX-2, EX-5): what a complete pass must have pruned.
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

/// What the database held before the pass.
pub struct Before {
    pub files: Vec<(Uuid, String)>,
    pub eligible: Vec<Uuid>,
}

/// Records every run's detail rows (table `audit_before`), the output files and the owners a
/// complete pass at `pass_start` must prune.
pub async fn snapshot(pool: &PgPool, pass_start: DateTime<Utc>) -> Before {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE audit_before AS SELECT r.id, {DETAIL_ROWS} AS detail_rows FROM runs r"
    )))
    .execute(pool)
    .await
    .unwrap();
    let files = sqlx::query_as("SELECT run_id, relative_path FROM output_files")
        .fetch_all(pool)
        .await
        .unwrap();
    let eligible = sqlx::query_scalar(ELIGIBLE)
        .bind(pass_start)
        .fetch_all(pool)
        .await
        .unwrap();
    Before { files, eligible }
}

pub async fn pruned_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM runs WHERE details_pruned_at IS NOT NULL")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Every owner is whole or pruned, and files agree with rows; with `complete`, exactly the
/// eligible owners were pruned and nothing is left to delete. Read while no worker runs: the
/// rows and then the files, which a running pass may change in between.
pub async fn verify(pool: &PgPool, output_root: &Path, before: &Before, complete: bool) {
    whole_or_pruned(pool).await;

    let pruned = pruned_runs(pool).await;
    assert!(
        pruned
            .iter()
            .all(|id| before.eligible.binary_search(id).is_ok()),
        "a run that was not eligible was pruned"
    );
    let pending: Vec<String> =
        sqlx::query_scalar("SELECT relative_path FROM sexton.pending_file_deletions")
            .fetch_all(pool)
            .await
            .unwrap();
    for (run, relative) in &before.files {
        let exists = output_root.join(relative).exists();
        let was_pruned = pruned.binary_search(run).is_ok();
        if was_pruned {
            assert!(
                !exists || pending.contains(relative),
                "{relative}: file of a pruned run neither deleted nor recorded for deletion"
            );
        } else {
            assert!(
                exists,
                "{relative}: file of a run that kept its rows was deleted"
            );
        }
    }
    if complete {
        assert_eq!(pruned, before.eligible, "the pass did not complete");
        assert!(pending.is_empty(), "files left to delete: {pending:?}");
    }
}

/// Every owner is whole or pruned, read in one statement: true at any instant, also while a
/// pass runs.
pub async fn whole_or_pruned(pool: &PgPool) {
    let broken: Vec<(Uuid, bool, i64, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT r.id, r.details_pruned_at IS NOT NULL, b.detail_rows, {DETAIL_ROWS}
         FROM runs r JOIN audit_before b ON b.id = r.id
         WHERE (r.details_pruned_at IS NOT NULL AND ({DETAIL_ROWS} > 0
                 OR r.runner_effects->>'reason' IS DISTINCT FROM 'execution_details_pruned'
                 OR EXISTS (SELECT 1 FROM variants v WHERE v.id = r.variant_id AND v.details_pruned_at IS NULL)))
            OR (r.details_pruned_at IS NULL AND {DETAIL_ROWS} <> b.detail_rows)"
    )))
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(
        broken.is_empty(),
        "half-pruned or damaged owners: {broken:?}"
    );
}

/// No file of a run that kept its rows is gone: the files are looked at first, then the rows,
/// so that this holds at any instant, also while a pass prunes and drains.
pub async fn no_file_lost(pool: &PgPool, output_root: &Path, before: &Before) {
    let gone: Vec<&(Uuid, String)> = before
        .files
        .iter()
        .filter(|(_, relative)| !output_root.join(relative).exists())
        .collect();
    let pruned = pruned_runs(pool).await;
    let lost: Vec<&String> = gone
        .into_iter()
        .filter(|(run, _)| pruned.binary_search(run).is_err())
        .map(|(_, relative)| relative)
        .collect();
    assert!(
        lost.is_empty(),
        "files of runs that kept their rows are gone: {lost:?}"
    );
}

/// The runs whose detail is pruned, by id.
async fn pruned_runs(pool: &PgPool) -> Vec<Uuid> {
    sqlx::query_scalar("SELECT id FROM runs WHERE details_pruned_at IS NOT NULL ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}
