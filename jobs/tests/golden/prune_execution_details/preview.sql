WITH candidates AS (
             SELECT r.account_id, r.id, isfinite((CASE WHEN kind = 'conversation' THEN completed_at WHEN settled_at IS NOT NULL THEN terminal_at END)) AS finite
             FROM accounts a JOIN runs r ON r.account_id = a.id
             WHERE ($1::uuid[] IS NULL OR a.id = ANY($1)) AND details_pruned_at IS NULL AND conversation_id IS NOT NULL AND kind IN ('conversation', 'direct_reply') AND (CASE WHEN kind = 'conversation' THEN completed_at WHEN settled_at IS NOT NULL THEN terminal_at END) < (CASE WHEN a.execution_details_retention_days > 0 AND make_interval(days => a.execution_details_retention_days) < $2 - $3 THEN $2 - make_interval(days => a.execution_details_retention_days) END)),
         classified AS (
             SELECT c.account_id, c.id,
                    CASE WHEN NOT c.finite THEN 'not_eligible' WHEN EXISTS (SELECT 1 FROM sexton.run_holds(c.id)) THEN 'legal_hold' WHEN EXISTS (SELECT 1 FROM invocation_attempts WHERE run_id = c.id AND status IN ('pending', 'running')) THEN 'pending_work' WHEN EXISTS (SELECT 1 FROM settlement_receipts WHERE run_id = c.id AND status = 'pending') THEN 'pending_settlement' WHEN EXISTS (SELECT 1 FROM delegations WHERE parent_run_id = c.id AND status = 'outstanding') THEN 'outstanding_delegation' WHEN EXISTS (SELECT 1 FROM history_request_sources s JOIN history_requests h ON h.id = s.history_request_id WHERE s.source_run_id = c.id AND h.sealed_at IS NULL) THEN 'active_history_request' ELSE 'eligible' END AS class
             FROM candidates c),
         eligible AS (SELECT account_id, id FROM classified WHERE class = 'eligible')
         SELECT account_id, class, count(*) FROM classified GROUP BY account_id, class
         UNION ALL SELECT e.account_id, 'run_task_edges', count(*) FROM run_task_edges t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id
         UNION ALL SELECT e.account_id, 'run_tasks', count(*) FROM run_tasks t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id
         UNION ALL SELECT e.account_id, 'tool_results', count(*) FROM tool_results t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id
         UNION ALL SELECT e.account_id, 'sealed_requests', count(*) FROM sealed_requests t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id
         UNION ALL SELECT e.account_id, 'reasoning_traces', count(*) FROM reasoning_traces t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id
         UNION ALL SELECT e.account_id, 'invocation_attempts', count(*) FROM invocation_attempts t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id
         UNION ALL SELECT e.account_id, 'output_files', count(*) FROM output_files t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id
         UNION ALL SELECT e.account_id, 'bytes', COALESCE(sum(f.bytes), 0)::bigint
                   FROM output_files f JOIN eligible e ON f.run_id = e.id GROUP BY e.account_id
