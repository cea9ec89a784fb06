SELECT s.id, s.agent_id, s.last_activity_at,
       sexton.session_verdict(s.id, s.account_id, s.agent_id, s.kind, s.state, s.metadata,
                              s.last_activity_at, $3)
FROM sessions s
WHERE s.account_id = $1 AND s.kind = $2 AND s.last_activity_at < $3
  AND (s.last_activity_at, s.id) > ($4, $5)
ORDER BY s.last_activity_at, s.id
LIMIT $6
