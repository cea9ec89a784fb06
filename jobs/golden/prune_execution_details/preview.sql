WITH candidates AS (
             SELECT id, isfinite((CASE WHEN kind = 'conversation' THEN completed_at WHEN settled_at IS NOT NULL THEN terminal_at END)) AS finite FROM runs
             WHERE account_id = $1 AND details_pruned_at IS NULL AND conversation_id IS NOT NULL AND kind IN ('conversation', 'direct_reply') AND (CASE WHEN kind = 'conversation' THEN completed_at WHEN settled_at IS NOT NULL THEN terminal_at END) < $2),
         classified AS (
             SELECT c.id, CASE WHEN NOT c.finite THEN 'not_eligible' WHEN EXISTS (SELECT 1 FROM invocation_attempts WHERE run_id = c.id AND status IN ('pending', 'running')) THEN 'pending_work' WHEN EXISTS (SELECT 1 FROM settlement_receipts WHERE run_id = c.id AND status = 'pending') THEN 'pending_settlement' WHEN EXISTS (SELECT 1 FROM delegations WHERE parent_run_id = c.id AND status = 'outstanding') THEN 'outstanding_delegation' WHEN EXISTS (SELECT 1 FROM history_request_sources s JOIN history_requests h ON h.id = s.history_request_id WHERE s.source_run_id = c.id AND h.sealed_at IS NULL) THEN 'active_history_request' ELSE 'eligible' END AS class
             FROM candidates c),
         eligible AS (SELECT id FROM classified WHERE class = 'eligible')
         SELECT class, count(*) FROM classified GROUP BY class
         UNION ALL SELECT 'run_task_edges', count(*) FROM run_task_edges WHERE run_id IN (SELECT id FROM eligible)
         UNION ALL SELECT 'run_tasks', count(*) FROM run_tasks WHERE run_id IN (SELECT id FROM eligible)
         UNION ALL SELECT 'tool_results', count(*) FROM tool_results WHERE run_id IN (SELECT id FROM eligible)
         UNION ALL SELECT 'sealed_requests', count(*) FROM sealed_requests WHERE run_id IN (SELECT id FROM eligible)
         UNION ALL SELECT 'reasoning_traces', count(*) FROM reasoning_traces WHERE run_id IN (SELECT id FROM eligible)
         UNION ALL SELECT 'invocation_attempts', count(*) FROM invocation_attempts WHERE run_id IN (SELECT id FROM eligible)
         UNION ALL SELECT 'output_files', count(*) FROM output_files WHERE run_id IN (SELECT id FROM eligible)
         UNION ALL SELECT 'bytes', COALESCE(sum(bytes), 0)::bigint FROM output_files WHERE run_id IN (SELECT id FROM eligible)
