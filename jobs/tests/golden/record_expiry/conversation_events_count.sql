SELECT count(*) FROM conversation_events
WHERE created_at < $1 AND created_at > $2 AND ($3::uuid[] IS NULL OR conversation_id IN (SELECT id FROM conversations WHERE account_id = ANY($3)))
