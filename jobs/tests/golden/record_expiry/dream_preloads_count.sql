SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT 1 FROM sexton.agent_record_holds(t.account_id, t.agent_id))) FROM dream_preloads t
WHERE sexton.record_expired(t.created_at, false, $1) AND t.created_at > $2 AND ($3::uuid[] IS NULL OR account_id = ANY($3))
