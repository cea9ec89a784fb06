-- What each transaction of an erasure removed, committed with it (RQ-5's counts), one row per
-- transaction: an erasure's two lanes append here side by side instead of both updating the
-- request's row, whose lock would make each wait for the other's commit. Folded into
-- `sexton.erasures.removed` at the start of every hop and before the drain, so the request's
-- row lags its deletions by at most one hop and its receipt counts every one.
CREATE TABLE IF NOT EXISTS sexton.erasure_removed (
    request_id uuid NOT NULL,
    removed jsonb NOT NULL
);
CREATE INDEX IF NOT EXISTS erasure_removed_request ON sexton.erasure_removed (request_id);

-- Adds request `request`'s appended counts to its row and removes them, in one statement.
CREATE OR REPLACE FUNCTION sexton.fold_erasure_removed(request uuid) RETURNS void
LANGUAGE sql AS $$
    WITH taken AS (
        DELETE FROM sexton.erasure_removed WHERE request_id = $1 RETURNING removed),
    summed AS (
        SELECT COALESCE(jsonb_object_agg(key, total), '{}'::jsonb) AS removed
        FROM (SELECT c.key, sum(c.value::bigint) AS total
              FROM taken, jsonb_each_text(taken.removed) c GROUP BY c.key) s)
    UPDATE sexton.erasures e
    SET removed = sexton.add_counts(e.removed, summed.removed), updated_at = now()
    FROM summed
    WHERE e.id = $1 AND summed.removed <> '{}'::jsonb
$$;
