SELECT min(t.created_at) FROM dream_preloads t
WHERE sexton.record_expired(t.created_at, false, $1) AND t.created_at > $2 AND NOT EXISTS (SELECT 1 FROM sexton.agent_record_holds(t.account_id, t.agent_id))
