WITH doomed AS (
    SELECT id FROM apalis.jobs
    WHERE (status IN ('Done', 'Killed') OR (status = 'Failed' AND attempts >= max_attempts))
      AND COALESCE(done_at, run_at) < $1 AND job_type LIKE 'sexton.%'
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
DELETE FROM apalis.jobs j USING doomed WHERE j.id = doomed.id
