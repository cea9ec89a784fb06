SELECT min(created_at) FROM handoffs WHERE created_at < $1 AND created_at > $2
