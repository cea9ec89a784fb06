SELECT min(t.updated_at) FROM working_records t
WHERE NOT t.pinned AND t.updated_at < $1 AND t.updated_at > $2 AND NOT EXISTS (SELECT 1 FROM sexton.agent_record_holds(t.account_id, t.agent_id))
