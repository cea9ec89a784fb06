SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT 1 FROM sexton.agent_record_holds(t.account_id, t.agent_id))) FROM working_records t
WHERE sexton.record_expired(t.updated_at, t.pinned, $1) AND t.updated_at > $2 AND ($3::uuid[] IS NULL OR account_id = ANY($3))
