SELECT (SELECT count(*) FROM apalis.jobs
        WHERE sexton.queue_job_expired(job_type, status, attempts, max_attempts, done_at, run_at,
                                       $1)),
       (SELECT count(*) FROM sexton.stale_workers($2))
