DELETE FROM apalis.workers w
WHERE w.id IN (SELECT s.id FROM apalis.workers s
               WHERE s.last_seen < $1 AND s.worker_type LIKE 'sexton.%'
                 AND NOT EXISTS (SELECT 1 FROM apalis.jobs j WHERE j.lock_by = s.id)
               LIMIT $2)
  AND NOT EXISTS (SELECT 1 FROM apalis.jobs j WHERE j.lock_by = w.id)
