DELETE FROM apalis.workers w
WHERE w.id IN (SELECT s.id FROM sexton.stale_workers($1) s LIMIT $2)
