SELECT min(created_at) FROM dream_preloads WHERE created_at < $1 AND created_at > $2
