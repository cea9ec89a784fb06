-- Derivative cleanup (SPEC §12, DC-1 … DC-5; issue #58): files no row owns.

-- "No pending deletion covers it" (DC-1): a file a drain will remove is the drain's, never an
-- orphan. The scan asks for a batch of paths at once, by the same key as the still-referenced
-- check (`sexton.path_key`, EX-3).
CREATE INDEX IF NOT EXISTS pending_file_deletions_path_key
    ON sexton.pending_file_deletions (root, sexton.path_key(relative_path));

-- The holds of a file whose path names `id` (a directory or file named by a UUID: an account,
-- a run, a conversation, a session, an agent, an attachment), once no row owns the file
-- (DC-2, HD-2): a hold on that very id, and the holds of what a surviving row of that id ties
-- it to (a run's conversation and account, a session's agent and account, …). A hold the rows
-- no longer lead to is not found here: what the scan cannot tie to anything it says so in its
-- docs, and a directory whose owner row is gone is kept under every account hold by its caller
-- (HD-3: what sexton cannot tell is held, it keeps).
CREATE OR REPLACE FUNCTION sexton.id_holds(id uuid)
RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT held.* FROM (
        SELECT h.* FROM sexton.holds h WHERE h.released_at IS NULL AND h.scope_id = $1
        UNION
        SELECT h.* FROM sexton.run_holds($1) h
        UNION
        SELECT h.* FROM conversations c, sexton.holds_of(c.account_id, c.id, NULL, NULL, NULL) h
        WHERE c.id = $1
        UNION
        SELECT h.* FROM sessions s, sexton.session_holds(s.account_id, s.agent_id, s.id) h
        WHERE s.id = $1
        UNION
        SELECT h.* FROM agents g, sexton.holds_of(g.account_id, NULL, g.id, NULL, NULL) h
        WHERE g.id = $1
        UNION
        SELECT h.* FROM attachments a, sexton.holds_of(a.account_id, NULL, NULL, NULL, NULL) h
        WHERE a.id = $1) held
    WHERE EXISTS (SELECT 1 FROM sexton.holds a WHERE a.released_at IS NULL)
$$;

-- What each scan found and did, per root and reason (DC-5): `status` shows the latest, the
-- metrics count the confirmed ones. One row per scan (the background job's, once a period, or
-- `sexton orphans scan`): a few hundred rows a year. Never read by a scan.
CREATE TABLE IF NOT EXISTS sexton.orphan_scans (
    id bigserial PRIMARY KEY,
    started_at timestamptz NOT NULL,
    finished_at timestamptz NOT NULL DEFAULT now(),
    by text NOT NULL,
    confirmed boolean NOT NULL,
    roots jsonb NOT NULL DEFAULT '{}'
);
