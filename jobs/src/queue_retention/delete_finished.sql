WITH doomed AS (
    SELECT id FROM apalis.jobs
    WHERE sexton.queue_job_expired(job_type, status, attempts, max_attempts, done_at, run_at, $1)
    LIMIT $2
    FOR UPDATE SKIP LOCKED)
DELETE FROM apalis.jobs j USING doomed WHERE j.id = doomed.id
