WITH locked AS (
        SELECT id FROM attachments
        WHERE id = ANY($1) AND account_id = $2 AND bytes_expired_at IS NULL
        ORDER BY id
        FOR UPDATE SKIP LOCKED),
    marked AS (
        UPDATE attachments a SET bytes_expired_at = now()
        FROM locked WHERE a.id = locked.id
        RETURNING a.id, a.relative_path),
    recorded AS (
        INSERT INTO sexton.pending_file_deletions (root, account_id, relative_path)
        SELECT 'attachments', $2, relative_path FROM marked)
    SELECT id FROM marked
