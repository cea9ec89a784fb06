WITH locked AS (
             SELECT r.id, r.variant_id, r.details_pruned_at IS NOT NULL AS pruned,
                    (SELECT v.verdict FROM sexton.run_verdict(
                 r.id, r.kind, CASE WHEN r.conversation_id = c.conversation_id THEN r.conversation_id END, r.completed_at, r.terminal_at,
                 r.settled_at, a.execution_details_retention_days, $3, $4) v) AS verdict
             FROM unnest($1::uuid[], $2::uuid[]) AS c (run_id, conversation_id)
             JOIN runs r ON r.id = c.run_id
             JOIN accounts a ON a.id = r.account_id
             WHERE r.account_id = $5
             ORDER BY r.id
             FOR UPDATE OF r SKIP LOCKED),
         prune AS (
             SELECT array_agg(id) AS runs, array_agg(variant_id) AS variants FROM locked
             WHERE NOT pruned AND verdict IS NULL),
         run_task_edges_gone AS (DELETE FROM run_task_edges WHERE run_id = ANY((SELECT runs FROM prune)::uuid[]) RETURNING 1),
         run_tasks_gone AS (DELETE FROM run_tasks WHERE run_id = ANY((SELECT runs FROM prune)::uuid[]) RETURNING 1),
         tool_results_gone AS (DELETE FROM tool_results WHERE run_id = ANY((SELECT runs FROM prune)::uuid[]) RETURNING 1),
         sealed_requests_gone AS (DELETE FROM sealed_requests WHERE run_id = ANY((SELECT runs FROM prune)::uuid[]) RETURNING 1),
         reasoning_traces_gone AS (DELETE FROM reasoning_traces WHERE run_id = ANY((SELECT runs FROM prune)::uuid[]) RETURNING 1),
         invocation_attempts_gone AS (DELETE FROM invocation_attempts WHERE run_id = ANY((SELECT runs FROM prune)::uuid[]) RETURNING 1),
         output_files_gone AS (DELETE FROM output_files WHERE run_id = ANY((SELECT runs FROM prune)::uuid[]) RETURNING relative_path, run_id),
         pending AS (INSERT INTO sexton.pending_file_deletions
                         (root, account_id, relative_path, run_ids, conversation_ids)
                     SELECT 'outputs', $5, g.relative_path, array_agg(DISTINCT g.run_id),
                            array_agg(DISTINCT r.conversation_id)
                     FROM output_files_gone g JOIN runs r ON r.id = g.run_id
                     WHERE NOT EXISTS (
                         SELECT 1 FROM output_files o
                         WHERE sexton.path_key(o.relative_path) = sexton.path_key(g.relative_path)
                           AND o.run_id <> ALL((SELECT runs FROM prune)::uuid[]))
                     GROUP BY g.relative_path),
         run AS (UPDATE runs SET details_pruned_at = $6, runner_effects = $7
                 WHERE id = ANY((SELECT runs FROM prune)::uuid[])),
         variant AS (UPDATE variants v SET details_pruned_at = $6, runner_effects = $7
                     FROM turns t JOIN conversations cv ON cv.id = t.conversation_id
                     WHERE v.id = ANY((SELECT variants FROM prune)::uuid[])
                       AND t.id = v.turn_id AND cv.account_id = $5)
         SELECT id, pruned, verdict IS DISTINCT FROM 'not_eligible' AS eligible, ARRAY[verdict IS NOT DISTINCT FROM 'legal_hold', verdict IS NOT DISTINCT FROM 'pending_work', verdict IS NOT DISTINCT FROM 'pending_settlement', verdict IS NOT DISTINCT FROM 'outstanding_delegation', verdict IS NOT DISTINCT FROM 'active_history_request']::bool[] AS blocked,
                ARRAY[(SELECT count(*) FROM run_task_edges_gone), (SELECT count(*) FROM run_tasks_gone), (SELECT count(*) FROM tool_results_gone), (SELECT count(*) FROM sealed_requests_gone), (SELECT count(*) FROM reasoning_traces_gone), (SELECT count(*) FROM invocation_attempts_gone), (SELECT count(*) FROM output_files_gone)]::bigint[] AS deleted
         FROM locked
