WITH batch AS (
    SELECT t.id, t.created_at FROM conversation_events t
    WHERE sexton.record_expired(t.created_at, false, $1) AND (t.created_at, t.id) > ($2, $3::bigint)
    ORDER BY t.created_at, t.id
    LIMIT $4),
last AS (
    SELECT b.created_at, b.id FROM batch b ORDER BY b.created_at DESC, b.id DESC LIMIT 1),
locked AS (
    SELECT t.ctid, EXISTS (SELECT 1 FROM sexton.event_holds(t.conversation_id)) AS held FROM conversation_events t
    WHERE sexton.record_expired(t.created_at, false, $1) AND (t.created_at, t.id) > ($2, $3::bigint)
      AND t.created_at <= (SELECT created_at FROM last)
      AND (t.created_at, t.id) <= ((SELECT created_at FROM last), (SELECT id FROM last))
    FOR UPDATE OF t SKIP LOCKED),
gone AS (
    DELETE FROM conversation_events t
    WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM locked WHERE NOT held)) RETURNING 1)
SELECT (SELECT count(*) FROM batch) AS read,
       (SELECT count(*) FROM locked WHERE held) AS held,
       (SELECT count(*) FROM gone) AS deleted,
       (SELECT created_at FROM last) AS last_at,
       (SELECT id::text FROM last) AS last_id
