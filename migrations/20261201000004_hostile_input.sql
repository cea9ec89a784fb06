-- sexton's own objects against hostile input (FL-1, EX-3). The trigger that uses
-- sexton.undecodable_job on the queue's table is installed by `sexton migrate` once the queue's
-- schema exists (worker/queue_guard.sql).

-- A file is deleted only when no surviving output_files row still references its path (EX-3):
-- the check looks paths up here. On a large table build it concurrently first (README).
CREATE INDEX IF NOT EXISTS output_files_relative_path ON output_files (relative_path);

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

-- Why the queue could never run a job of sexton's queues, or NULL if it could: its id must be
-- a ULID and its payload JSON. The queue's own poll cannot decode such a row and would fail,
-- restart and re-queue it forever (STACK.md), so it never reaches the poll.
CREATE OR REPLACE FUNCTION sexton.undecodable_job(id text, job bytea) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN id !~ '^[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}$'
            THEN 'job id ' || left(quote_literal(id), 60) || ' is not a ULID'
        WHEN NOT sexton.is_json(job)
            THEN 'payload is not JSON (' || octet_length(job) || ' bytes)'
    END
$$;
