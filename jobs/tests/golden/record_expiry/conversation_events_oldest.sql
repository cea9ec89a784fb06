SELECT min(created_at) FROM conversation_events WHERE created_at < $1 AND created_at > $2
