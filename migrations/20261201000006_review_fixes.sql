-- Hardening after review (EX-3, FL-1).

-- A removal that failed for a reason that may pass is tried again by later drains; this
-- counts the tries.
ALTER TABLE sexton.pending_file_deletions ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 0;

-- Whether bytes are a JSON document the worker's decoder (serde_json) reads: valid UTF-8 and
-- JSON, nested at most 127 deep, numbers within a double's range. Anything else would fail the
-- queue's poll rather than the one job (STACK.md), so the guard kills it first.
CREATE OR REPLACE FUNCTION sexton.is_json(bytes bytea) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    doc jsonb;
    too_deep boolean;
    too_big boolean;
BEGIN
    BEGIN
        doc := convert_from(bytes, 'UTF8')::jsonb;
    EXCEPTION WHEN others THEN
        RETURN false;
    END;
    WITH RECURSIVE walk (value, depth) AS (
        SELECT doc, 1
        UNION ALL
        SELECT child.value, walk.depth + 1
        FROM walk,
             LATERAL (SELECT e.value FROM jsonb_array_elements(
                          CASE WHEN jsonb_typeof(walk.value) = 'array'
                               THEN walk.value ELSE '[]'::jsonb END) e
                      UNION ALL
                      SELECT o.value FROM jsonb_each(
                          CASE WHEN jsonb_typeof(walk.value) = 'object'
                               THEN walk.value ELSE '{}'::jsonb END) o) child
        WHERE walk.depth < 130)
    SELECT max(depth) > 127,
           COALESCE(bool_or(jsonb_typeof(value) = 'number'
                            AND abs((value #>> '{}')::numeric) > 1.7976931348623157e308), false)
    INTO too_deep, too_big
    FROM walk;
    RETURN NOT (too_deep OR too_big);
END
$$;
