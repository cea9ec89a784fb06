-- HD-1: a hold is placed on a scope that exists, and names it by its id. Run once the hold
-- gate is closed (HD-3, `sexton.close_for_hold()`): no deletion is in flight, so its time is
-- this statement's, after every deletion begun before it committed, and no deletion begun
-- after it can miss it.
INSERT INTO sexton.holds (scope, scope_id, case_ref, reason, placed_by, placed_at)
SELECT $1, $2, $3, $4, $5, statement_timestamp()
WHERE CASE $1
    WHEN 'account' THEN EXISTS (SELECT 1 FROM accounts WHERE id = $2)
    WHEN 'conversation' THEN EXISTS (SELECT 1 FROM conversations WHERE id = $2)
    WHEN 'agent' THEN EXISTS (SELECT 1 FROM agents WHERE id = $2)
    WHEN 'session' THEN EXISTS (SELECT 1 FROM sessions WHERE id = $2)
    WHEN 'run' THEN EXISTS (SELECT 1 FROM runs WHERE id = $2)
END
RETURNING id, scope, scope_id, case_ref, reason, placed_by, placed_at, released_by, released_at
