-- The row lease on an object-store traces root (TR-3, OS-2): taken when no cleaner holds it or
-- its holder's lease expired; one statement, so that of two cleaners racing for it one wins.
-- $1 the root's URL, $2 who takes it, $3 a token of this taking, $4 seconds it lasts.
INSERT INTO sexton.trace_leases AS l (root, holder, token, expires_at)
VALUES ($1, $2, $3, now() + make_interval(secs => $4))
ON CONFLICT (root) DO UPDATE
    SET holder = EXCLUDED.holder, token = EXCLUDED.token, expires_at = EXCLUDED.expires_at
    WHERE l.expires_at <= now()
RETURNING l.token
