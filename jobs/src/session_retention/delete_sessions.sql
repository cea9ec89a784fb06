WITH locked AS (
    SELECT s.id, sexton.session_verdict(s.id, s.account_id, s.agent_id, s.kind, s.state, s.metadata,
                                        s.last_activity_at, $4) AS verdict
    FROM sessions s
    WHERE s.id = ANY($1) AND s.account_id = $2 AND s.kind = $3
    ORDER BY s.id
    FOR UPDATE OF s SKIP LOCKED),
doomed AS (SELECT COALESCE(array_agg(id), '{}') AS ids FROM locked WHERE verdict IS NULL),
archive_entries_gone AS (
    DELETE FROM conversation_archive_entries
    WHERE archive_id IN (SELECT id FROM conversation_archives
                         WHERE session_id = ANY((SELECT ids FROM doomed)::uuid[]))
    RETURNING 1),
archives_gone AS (
    DELETE FROM conversation_archives WHERE session_id = ANY((SELECT ids FROM doomed)::uuid[])
    RETURNING 1),
entries_gone AS (
    DELETE FROM conversation_entries WHERE session_id = ANY((SELECT ids FROM doomed)::uuid[])
    RETURNING 1),
unlinked AS (
    SELECT count(*) AS n FROM handoffs
    WHERE from_session_id = ANY((SELECT ids FROM doomed)::uuid[])
       OR to_session_id = ANY((SELECT ids FROM doomed)::uuid[])),
sessions_gone AS (
    DELETE FROM sessions WHERE id = ANY((SELECT ids FROM doomed)::uuid[])
    RETURNING id, agent_id),
frames AS (
    INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path, agent_id,
                                               session_id)
    SELECT 'sessions', $2, id::text, agent_id, id FROM sessions_gone)
SELECT verdict,
       ARRAY[(SELECT count(*) FROM entries_gone),
             (SELECT count(*) FROM archive_entries_gone),
             (SELECT count(*) FROM archives_gone),
             (SELECT count(*) FROM sessions_gone),
             (SELECT n FROM unlinked)]::bigint[] AS counts
FROM locked
