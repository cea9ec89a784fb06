-- Erasure on request, visible and on time (SPEC §11, RQ-7): what the worker's gauges read of
-- `sexton.erasures` stays bounded however many requests completed. The open requests are read
-- through `erasures_workable` (by state, and the earliest due date); the completed ones are
-- counted by their receipts' `seq` (one receipt per completed request, RQ-6); the residues that
-- verification found (`sexton_erasure_residues_total`) are summed through this index, which
-- holds only the requests that ever had one.
CREATE INDEX IF NOT EXISTS erasures_residues ON sexton.erasures (id) INCLUDE (residues)
    WHERE residues > 0;
