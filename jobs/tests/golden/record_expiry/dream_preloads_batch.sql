WITH batch AS (
    SELECT id, created_at FROM dream_preloads
    WHERE created_at < $1 AND (created_at, id) > ($2, $3::uuid)
    ORDER BY created_at, id
    LIMIT $4),
locked AS (
    SELECT t.id, EXISTS (SELECT 1 FROM sexton.agent_record_holds(t.account_id, t.agent_id)) AS held FROM dream_preloads t JOIN batch b ON b.id = t.id
    WHERE t.created_at < $1
    FOR UPDATE OF t SKIP LOCKED),
gone AS (
    DELETE FROM dream_preloads t USING locked
    WHERE t.id = locked.id AND NOT locked.held RETURNING 1),
last AS (
    SELECT b.created_at, b.id::text AS id FROM batch b ORDER BY b.created_at DESC, b.id DESC LIMIT 1)
SELECT (SELECT count(*) FROM batch) AS read,
       (SELECT count(*) FROM locked WHERE held) AS held,
       (SELECT count(*) FROM gone) AS deleted,
       (SELECT created_at FROM last) AS last_at,
       (SELECT id FROM last) AS last_id
