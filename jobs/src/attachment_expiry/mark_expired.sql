WITH judged AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $4::text[]) AS j (id, relative_path, etag)),
locked AS (
    SELECT a.id, j.etag FROM attachments a JOIN judged j ON j.id = a.id
    WHERE a.account_id = $3 AND sexton.attachment_live(a.bytes_expired_at)
      AND a.relative_path = j.relative_path
    ORDER BY a.id
    FOR UPDATE OF a SKIP LOCKED),
held AS (
    SELECT EXISTS (SELECT 1 FROM sexton.account_holds($3)) AS held),
marked AS (
    UPDATE attachments a SET bytes_expired_at = now()
    FROM locked WHERE a.id = locked.id AND NOT (SELECT held FROM held)
    RETURNING a.id, a.relative_path, locked.etag),
recorded AS (
    INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path, etag)
    SELECT 'attachments', $3, relative_path, etag FROM marked)
SELECT (SELECT held FROM held) AS held, ARRAY(SELECT id FROM marked) AS marked
