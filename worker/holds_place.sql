-- HD-1: a hold is placed on a scope that exists, and names it by its id. The scope's row is
-- share-locked until the hold commits, so a job's transaction on it (FOR UPDATE, HD-3) is
-- either over before the hold is written (a session it deleted is gone, and the hold refused
-- as naming nothing) or comes after and finds the hold when it checks under its locks.
INSERT INTO sexton.holds (scope, scope_id, case_ref, reason, placed_by)
SELECT $1, $2, $3, $4, $5
WHERE CASE $1
    WHEN 'account' THEN EXISTS (SELECT 1 FROM accounts WHERE id = $2 FOR SHARE)
    WHEN 'conversation' THEN EXISTS (SELECT 1 FROM conversations WHERE id = $2 FOR SHARE)
    WHEN 'agent' THEN EXISTS (SELECT 1 FROM agents WHERE id = $2 FOR SHARE)
    WHEN 'session' THEN EXISTS (SELECT 1 FROM sessions WHERE id = $2 FOR SHARE)
    WHEN 'run' THEN EXISTS (SELECT 1 FROM runs WHERE id = $2 FOR SHARE)
END
RETURNING id, scope, scope_id, case_ref, reason, placed_by, placed_at, released_by, released_at
