SELECT min(t.created_at) FROM handoffs t
WHERE sexton.record_expired(t.created_at, false, $1) AND t.created_at > $2 AND NOT EXISTS (SELECT 1 FROM sexton.handoff_holds(t.account_id, t.agent_id, t.from_session_id, t.to_session_id))
