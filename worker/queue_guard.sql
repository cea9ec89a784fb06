-- Installed by `sexton migrate` after the queue's schema and sexton's migrations, every time
-- (idempotent): queue rows that the queue's poll could never decode are killed as they are
-- written, with the reason, instead of failing the poll forever (FL-1, STACK.md); and the index
-- the queue's own retention reads (FL-7).

-- One migrating process at a time (the lock ends with this script's implicit transaction).
SELECT pg_advisory_xact_lock(1584857088);

-- Kills such a row as it is written, keeping it for inspection with the reason (FL-1).
CREATE OR REPLACE FUNCTION sexton.kill_undecodable_job() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    reason text := sexton.undecodable_job(NEW.id, NEW.job);
BEGIN
    IF NEW.job_type LIKE 'sexton.%' AND reason IS NOT NULL THEN
        NEW.status := 'Killed';
        NEW.last_result := jsonb_build_object('Err', 'undecodable job, never run: ' || reason);
        NEW.done_at := now();
        NEW.lock_by := NULL;
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER sexton_kill_undecodable_job
    BEFORE INSERT OR UPDATE OF id, job ON apalis.jobs
    FOR EACH ROW EXECUTE FUNCTION sexton.kill_undecodable_job();

-- Rows written before the guard existed.
UPDATE apalis.jobs
SET status = 'Killed', done_at = now(), lock_by = NULL,
    last_result = jsonb_build_object('Err', 'undecodable job, never run: '
                                            || sexton.undecodable_job(id, job))
WHERE job_type LIKE 'sexton.%' AND status IN ('Pending', 'Queued', 'Running', 'Failed')
  AND sexton.undecodable_job(id, job) IS NOT NULL;

-- The queue's own retention (FL-7) finds finished jobs through this partial index, which holds
-- only done, killed and failed-for-good rows (the queue's schema exists only from here on).
CREATE INDEX IF NOT EXISTS sexton_finished_jobs
    ON apalis.jobs ((COALESCE(done_at, run_at)))
    WHERE status IN ('Done', 'Killed') OR (status = 'Failed' AND attempts >= max_attempts);

-- FL-7, once, for the queue's retention and its preview (the rules of the other kinds are in
-- sexton's migrations; these read the queue's tables, which exist only from here on). A job of
-- sexton's queues goes once it is finished — done, killed (a payload that never decoded) or
-- failed for good (attempts exhausted) — and finished before `before`: pending, running and
-- retrying jobs never do, nor the rows of other queues. One expression, inlined into the delete,
-- which so still reads the index above (its predicate and its expression are this rule's,
-- written out: an index states its own).
CREATE OR REPLACE FUNCTION sexton.queue_job_failed_for_good(
    status text, attempts integer, max_attempts integer
) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT status = 'Killed' OR (status = 'Failed' AND attempts >= max_attempts)
$$;

CREATE OR REPLACE FUNCTION sexton.queue_job_expired(
    job_type text, status text, attempts integer, max_attempts integer, done_at timestamptz,
    run_at timestamptz, before timestamptz
) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT job_type LIKE 'sexton.%'
       AND (status = 'Done' OR sexton.queue_job_failed_for_good(status, attempts, max_attempts))
       AND COALESCE(done_at, run_at) < before
$$;

-- FL-7: the registrations of sexton's workers not seen since `before` that no job names. Rescue
-- re-queues a silent worker's jobs long before (FL-4); a registration still named by a job stays
-- whatever its age, because rescue finds a dead worker's jobs through it (the jobs' foreign key
-- refuses the delete of one named meanwhile).
CREATE OR REPLACE FUNCTION sexton.stale_workers(before timestamptz)
RETURNS TABLE (id text) LANGUAGE sql STABLE AS $$
    SELECT w.id FROM apalis.workers w
    WHERE w.last_seen < $1 AND w.worker_type LIKE 'sexton.%'
      AND NOT EXISTS (SELECT 1 FROM apalis.jobs j WHERE j.lock_by = w.id)
$$;

-- A job whose worker died is put back by the queue's rescue (FL-4), which counts the attempt
-- but never asks whether one is left: a hop that ends its process every time (as a removal
-- that overflowed the stack once did) would then run forever, attempt 6 of 5. The rescue of a
-- job on its last attempt fails it for good instead, with the reason, kept for inspection.
CREATE OR REPLACE FUNCTION sexton.fail_rescued_past_attempts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.job_type LIKE 'sexton.%' AND NEW.status = 'Pending'
       AND OLD.status IN ('Running', 'Queued') AND NEW.attempts >= NEW.max_attempts THEN
        NEW.status := 'Failed';
        NEW.done_at := now();
        NEW.last_result := jsonb_build_object('Err',
            'its worker died during each of its ' || NEW.attempts || ' attempts (heartbeat '
            || 'timeout); failed for good, never run again');
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER sexton_fail_rescued_past_attempts
    BEFORE UPDATE OF status ON apalis.jobs
    FOR EACH ROW EXECUTE FUNCTION sexton.fail_rescued_past_attempts();
