SELECT min(t.created_at) FROM conversation_events t
WHERE t.created_at < $1 AND t.created_at > $2 AND NOT EXISTS (SELECT 1 FROM sexton.event_holds(t.conversation_id))
