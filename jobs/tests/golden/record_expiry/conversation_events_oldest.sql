SELECT min(t.created_at) FROM conversation_events t
WHERE sexton.record_expired(t.created_at, false, $1) AND t.created_at > $2 AND NOT EXISTS (SELECT 1 FROM sexton.event_holds(t.conversation_id))
