SELECT max(EXTRACT(EPOCH FROM (c.cutoff - o.age)))::float8
         FROM (SELECT id, $1 - make_interval(days => execution_details_retention_days) AS cutoff
               FROM accounts
               WHERE execution_details_retention_days > 0
                 AND make_interval(days => execution_details_retention_days) < $1 - $2) c
         CROSS JOIN LATERAL (
             SELECT (CASE WHEN kind = 'conversation' THEN completed_at WHEN settled_at IS NOT NULL THEN terminal_at END) AS age FROM runs r
             WHERE r.account_id = c.id AND details_pruned_at IS NULL AND conversation_id IS NOT NULL AND kind IN ('conversation', 'direct_reply') AND (CASE WHEN kind = 'conversation' THEN completed_at WHEN settled_at IS NOT NULL THEN terminal_at END) < c.cutoff
               AND (CASE WHEN kind = 'conversation' THEN completed_at WHEN settled_at IS NOT NULL THEN terminal_at END) > $2 AND NOT EXISTS (SELECT 1 FROM sexton.run_holds(r.id)) AND NOT EXISTS (SELECT 1 FROM invocation_attempts WHERE run_id = r.id AND status IN ('pending', 'running')) AND NOT EXISTS (SELECT 1 FROM settlement_receipts WHERE run_id = r.id AND status = 'pending') AND NOT EXISTS (SELECT 1 FROM delegations WHERE parent_run_id = r.id AND status = 'outstanding') AND NOT EXISTS (SELECT 1 FROM history_request_sources s JOIN history_requests h ON h.id = s.history_request_id WHERE s.source_run_id = r.id AND h.sealed_at IS NULL)
             ORDER BY (CASE WHEN kind = 'conversation' THEN completed_at WHEN settled_at IS NOT NULL THEN terminal_at END), r.id LIMIT 1) o
