SELECT max(EXTRACT(EPOCH FROM (c.cutoff - o.age)))::float8
         FROM (SELECT id, execution_details_retention_days AS days,
                      $1 - make_interval(days => execution_details_retention_days) AS cutoff
               FROM accounts
               WHERE execution_details_retention_days > 0
                 AND make_interval(days => execution_details_retention_days) < $1 - $2) c
         CROSS JOIN LATERAL (
             SELECT sexton.run_age(kind, completed_at, terminal_at, settled_at) AS age FROM runs r
             WHERE r.account_id = c.id AND details_pruned_at IS NULL AND sexton.run_owner(kind, conversation_id) AND sexton.run_age(kind, completed_at, terminal_at, settled_at) < c.cutoff
               AND sexton.run_age(kind, completed_at, terminal_at, settled_at) > $2 AND (SELECT v.verdict IS NULL FROM sexton.run_verdict(
                 r.id, r.kind, r.conversation_id, r.completed_at, r.terminal_at,
                 r.settled_at, c.days, c.cutoff, $1) v)
             ORDER BY sexton.run_age(kind, completed_at, terminal_at, settled_at), r.id LIMIT 1) o
