SELECT EXTRACT(EPOCH FROM c.past)::float8
         FROM (SELECT r.id, k.cutoff - sexton.run_age(kind, completed_at, terminal_at, settled_at) AS past
               FROM runs r
               CROSS JOIN LATERAL (SELECT (CASE WHEN a.execution_details_retention_days > 0 AND make_interval(days => a.execution_details_retention_days) < $1 - $2 THEN $1 - make_interval(days => a.execution_details_retention_days) END) AS cutoff FROM accounts a
                                   WHERE a.id = r.account_id OFFSET 0) k
               WHERE details_pruned_at IS NULL AND sexton.run_owner(kind, conversation_id)
                 AND sexton.run_age(kind, completed_at, terminal_at, settled_at) < (SELECT (CASE WHEN min(execution_details_retention_days) > 0 AND make_interval(days => min(execution_details_retention_days)) < $1 - $2 THEN $1 - make_interval(days => min(execution_details_retention_days)) END) FROM accounts WHERE execution_details_retention_days > 0)
                 AND sexton.run_age(kind, completed_at, terminal_at, settled_at) < k.cutoff AND sexton.run_age(kind, completed_at, terminal_at, settled_at) > $2
               ORDER BY past DESC OFFSET 0) c
         JOIN runs r ON r.id = c.id
         JOIN accounts a ON a.id = r.account_id
         WHERE (SELECT v.verdict IS NULL FROM sexton.run_verdict(
                 r.id, r.kind, r.conversation_id, r.completed_at, r.terminal_at,
                 r.settled_at, a.execution_details_retention_days, (CASE WHEN a.execution_details_retention_days > 0 AND make_interval(days => a.execution_details_retention_days) < $1 - $2 THEN $1 - make_interval(days => a.execution_details_retention_days) END), $1) v)
         ORDER BY c.past DESC LIMIT 1
