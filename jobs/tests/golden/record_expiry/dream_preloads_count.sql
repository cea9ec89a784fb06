SELECT count(*) FROM dream_preloads
WHERE created_at < $1 AND created_at > $2 AND ($3::uuid[] IS NULL OR account_id = ANY($3))
