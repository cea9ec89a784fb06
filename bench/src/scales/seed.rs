//! What every method on a copy of a scale's template is checked and measured against: the
//! owners and sessions a complete pass removes (`bench_owners`, `bench_sessions`, by the rules'
//! own verdicts), and the owners' detail rows.

use sexton_jobs::prune_execution_details::DETAIL_TABLES;
use sqlx::PgPool;

/// Owners a complete pass prunes (EX-1, EX-2, EX-5), as in the tests' audit.
pub const ELIGIBLE: &str = "INSERT INTO bench_owners (id)
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
pub const ELIGIBLE_SESSIONS: &str = "INSERT INTO bench_sessions (id)
    SELECT s.id FROM sessions s
    JOIN session_retention_policies p ON p.account_id = s.account_id AND p.enabled
    CROSS JOIN LATERAL (SELECT $1 - make_interval(days => CASE s.kind
                                WHEN 'main' THEN COALESCE(p.main_days, 60)
                                WHEN 'task' THEN COALESCE(p.task_days, 30)
                                ELSE COALESCE(p.subagent_days, 7) END) AS cutoff) c
    WHERE sexton.session_verdict(s.id, s.account_id, s.kind, s.state, s.metadata,
                                 s.last_activity_at, c.cutoff) IS NULL";

/// The owners' detail rows, over every detail table.
pub async fn detail_rows(pool: &PgPool) -> anyhow::Result<i64> {
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
