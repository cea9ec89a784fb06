SELECT count(*) FROM working_records
WHERE NOT pinned AND updated_at < $1 AND updated_at > $2 AND ($3::uuid[] IS NULL OR account_id = ANY($3))
