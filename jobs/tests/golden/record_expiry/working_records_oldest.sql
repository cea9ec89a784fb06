SELECT min(updated_at) FROM working_records WHERE NOT pinned AND updated_at < $1 AND updated_at > $2
