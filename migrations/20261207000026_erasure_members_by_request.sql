-- An erasure's ids are found through their request alone (RQ-8). The store guard's question —
-- is this id in the scope of a running request? — goes through the running requests, a few at
-- any time, and each one's key; so the second index by id, a third of what a request's plan
-- writes, goes.
CREATE OR REPLACE FUNCTION sexton.erasing(kind text, id uuid) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM sexton.erasures e
                   JOIN sexton.erasure_members m
                     ON m.request_id = e.id AND m.kind = $1 AND m.id = $2
                   WHERE e.state = 'running')
$$;

DROP INDEX IF EXISTS sexton.erasure_members_id;
