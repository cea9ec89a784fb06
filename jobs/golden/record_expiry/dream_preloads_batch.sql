WITH batch AS (
            SELECT id, created_at FROM dream_preloads
            WHERE created_at < $1 AND (created_at, id) > ($2, $3::uuid)
            ORDER BY created_at, id
            LIMIT $4),
        locked AS (
            SELECT d.id FROM dream_preloads d JOIN batch b ON b.id = d.id
            WHERE d.created_at < $1
            FOR UPDATE OF d SKIP LOCKED),
        gone AS (
            DELETE FROM dream_preloads d USING locked WHERE d.id = locked.id RETURNING 1),
        last AS (
            SELECT b.created_at, b.id::text AS id FROM batch b ORDER BY b.created_at DESC, b.id DESC LIMIT 1)
        SELECT (SELECT count(*) FROM batch) AS read,
               (SELECT count(*) FROM gone) AS deleted,
               (SELECT created_at FROM last) AS last_at,
               (SELECT id FROM last) AS last_id
