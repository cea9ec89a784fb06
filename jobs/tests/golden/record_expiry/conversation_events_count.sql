SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT 1 FROM sexton.event_holds(t.conversation_id))) FROM conversation_events t
WHERE sexton.record_expired(t.created_at, false, $1) AND t.created_at > $2 AND ($3::uuid[] IS NULL OR conversation_id IN (SELECT id FROM conversations WHERE account_id = ANY($3)))
