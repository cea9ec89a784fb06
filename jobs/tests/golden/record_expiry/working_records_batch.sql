WITH batch AS (
    SELECT t.id, t.updated_at FROM working_records t
    WHERE sexton.record_expired(t.updated_at, t.pinned, $1) AND (t.updated_at, t.id) > ($2, $3::uuid)
    ORDER BY t.updated_at, t.id
    LIMIT $4),
last AS (
    SELECT b.updated_at, b.id FROM batch b ORDER BY b.updated_at DESC, b.id DESC LIMIT 1),
locked AS (
    SELECT t.ctid, EXISTS (SELECT 1 FROM sexton.agent_record_holds(t.account_id, t.agent_id)) AS held FROM working_records t
    WHERE sexton.record_expired(t.updated_at, t.pinned, $1) AND (t.updated_at, t.id) > ($2, $3::uuid)
      AND t.updated_at <= (SELECT updated_at FROM last)
      AND (t.updated_at, t.id) <= ((SELECT updated_at FROM last), (SELECT id FROM last))
    FOR UPDATE OF t SKIP LOCKED),
gone AS (
    DELETE FROM working_records t
    WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM locked WHERE NOT held)) RETURNING 1)
SELECT (SELECT count(*) FROM batch) AS read,
       (SELECT count(*) FROM locked WHERE held) AS held,
       (SELECT count(*) FROM gone) AS deleted,
       (SELECT updated_at FROM last) AS last_at,
       (SELECT id::text FROM last) AS last_id
