WITH judged AS (
             SELECT r.account_id, r.id, (SELECT v.verdict FROM sexton.run_verdict(
                 r.id, r.kind, r.conversation_id, r.completed_at, r.terminal_at,
                 r.settled_at, a.execution_details_retention_days, k.cutoff, $2) v) AS verdict
             FROM (SELECT * FROM accounts WHERE $1::uuid[] IS NULL
      UNION ALL
      SELECT n.* FROM (SELECT DISTINCT unnest($1::uuid[]) AS id) u
      CROSS JOIN LATERAL (SELECT * FROM accounts WHERE id = u.id OFFSET 0) n) a
             CROSS JOIN LATERAL (SELECT (CASE WHEN a.execution_details_retention_days > 0 AND make_interval(days => a.execution_details_retention_days) < $2 - $3 THEN $2 - make_interval(days => a.execution_details_retention_days) END) AS cutoff) k
             CROSS JOIN LATERAL (SELECT * FROM runs
                                 WHERE account_id = a.id AND details_pruned_at IS NULL AND sexton.run_owner(kind, conversation_id) AND sexton.run_age(kind, completed_at, terminal_at, settled_at) < k.cutoff
                                 OFFSET 0) r),
         eligible AS (SELECT account_id, id FROM judged WHERE verdict IS NULL)
         SELECT account_id, COALESCE(verdict, 'eligible'), count(*) FROM judged
         GROUP BY account_id, verdict
         UNION ALL SELECT e.account_id, 'run_task_edges', count(*) FROM run_task_edges t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id
         UNION ALL SELECT e.account_id, 'run_tasks', count(*) FROM run_tasks t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id
         UNION ALL SELECT e.account_id, 'tool_results', count(*) FROM tool_results t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id
         UNION ALL SELECT e.account_id, 'sealed_requests', count(*) FROM sealed_requests t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id
         UNION ALL SELECT e.account_id, 'reasoning_traces', count(*) FROM reasoning_traces t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id
         UNION ALL SELECT e.account_id, 'invocation_attempts', count(*) FROM invocation_attempts t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id
         UNION ALL SELECT e.account_id, 'output_files', count(*) FROM output_files t JOIN eligible e ON t.run_id = e.id GROUP BY e.account_id
         UNION ALL SELECT e.account_id, 'bytes', COALESCE(sum(f.bytes), 0)::bigint
                   FROM output_files f JOIN eligible e ON f.run_id = e.id GROUP BY e.account_id
