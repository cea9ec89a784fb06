WITH batch AS (
    SELECT id, updated_at FROM working_records
    WHERE NOT pinned AND updated_at < $1 AND (updated_at, id) > ($2, $3::uuid)
    ORDER BY updated_at, id
    LIMIT $4),
locked AS (
    SELECT t.id, EXISTS (SELECT 1 FROM sexton.agent_record_holds(t.account_id, t.agent_id)) AS held FROM working_records t JOIN batch b ON b.id = t.id
    WHERE NOT t.pinned AND t.updated_at < $1
    FOR UPDATE OF t SKIP LOCKED),
gone AS (
    DELETE FROM working_records t USING locked
    WHERE t.id = locked.id AND NOT locked.held RETURNING 1),
last AS (
    SELECT b.updated_at, b.id::text AS id FROM batch b ORDER BY b.updated_at DESC, b.id DESC LIMIT 1)
SELECT (SELECT count(*) FROM batch) AS read,
       (SELECT count(*) FROM locked WHERE held) AS held,
       (SELECT count(*) FROM gone) AS deleted,
       (SELECT updated_at FROM last) AS last_at,
       (SELECT id FROM last) AS last_id
