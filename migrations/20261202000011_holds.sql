-- Holds (SPEC §9): what legal or security has frozen stays, whatever a window says. Every rule
-- of what a hold covers (HD-2) is a function here; the jobs, the drains, the store guard and
-- `explain` all ask these.

-- HD-1. A hold names one scope by its id; it is released by filling released_by/_at, and
-- never deleted.
CREATE TABLE IF NOT EXISTS sexton.holds (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    scope text NOT NULL CHECK (scope IN ('account', 'conversation', 'agent', 'session', 'run')),
    scope_id uuid NOT NULL,
    case_ref text NOT NULL CHECK (btrim(case_ref) <> ''),
    reason text NOT NULL CHECK (btrim(reason) <> ''),
    placed_by text NOT NULL CHECK (btrim(placed_by) <> ''),
    placed_at timestamptz NOT NULL DEFAULT now(),
    released_by text NULL CHECK (btrim(released_by) <> ''),
    released_at timestamptz NULL,
    CHECK ((released_by IS NULL) = (released_at IS NULL))
);
-- Every check is a probe of the active holds by scope id: empty when nothing is held.
CREATE INDEX IF NOT EXISTS holds_active ON sexton.holds (scope_id, scope)
    WHERE released_at IS NULL;

-- A hold is written once and released once; nothing deletes or truncates it, nor rewrites what
-- it said (HD-1).
CREATE OR REPLACE FUNCTION sexton.keep_holds() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.released_at IS NULL AND NEW.released_at IS NOT NULL
       AND (NEW.id, NEW.scope, NEW.scope_id, NEW.case_ref, NEW.reason, NEW.placed_by,
            NEW.placed_at)
           IS NOT DISTINCT FROM
           (OLD.id, OLD.scope, OLD.scope_id, OLD.case_ref, OLD.reason, OLD.placed_by,
            OLD.placed_at) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'holds are never deleted or rewritten (% refused)', TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              HINT = 'HD-1: a hold is only released, once, by sexton holds release; released '
                     'holds stay as the record of who held what, when';
END
$$;

CREATE OR REPLACE TRIGGER sexton_keep_holds
    BEFORE UPDATE OR DELETE ON sexton.holds
    FOR EACH ROW EXECUTE FUNCTION sexton.keep_holds();
CREATE OR REPLACE TRIGGER sexton_keep_holds_truncate
    BEFORE TRUNCATE ON sexton.holds
    FOR EACH STATEMENT EXECUTE FUNCTION sexton.keep_holds();

-- The active holds on any of these scopes (NULL: none of that kind). Every other covering
-- function is this one, given the owner's scopes. A caller asks whether there is one (EXISTS)
-- or lists them (explain, the guard's message). An unreadable hold table is an error, never
-- "not held" (HD-3: fail closed).
--
-- Written for a probe per owner at any number of holds: a plain statement with plain arguments
-- inlines into its caller, and its IN list of parameters stays one `scope_id = ANY (ARRAY[…])`
-- index condition on holds_active whatever the caller passes (the owner's columns, a
-- parameter). Spelled with the caller's columns (`IN (r.id, r.account_id)`), or over
-- concatenated arrays, the planner reads the whole active set per owner instead.
CREATE OR REPLACE FUNCTION sexton.holds_of(
    account uuid, conversation uuid, agent uuid, session uuid, run uuid
) RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT h.* FROM sexton.holds h
    WHERE h.released_at IS NULL
      AND h.scope_id IN ($1, $2, $3, $4, $5)
      AND CASE h.scope
              WHEN 'account' THEN h.scope_id = $1
              WHEN 'conversation' THEN h.scope_id = $2
              WHEN 'agent' THEN h.scope_id = $3
              WHEN 'session' THEN h.scope_id = $4
              WHEN 'run' THEN h.scope_id = $5
          END
$$;

-- The plans above rest on the table's statistics: a hold table never analyzed looks nearly
-- empty, and the planner then scans every active hold per owner. Holds change rarely: analyze
-- after any change (`sexton holds` also analyzes after placing or releasing).
ALTER TABLE sexton.holds SET (autovacuum_analyze_threshold = 0,
                              autovacuum_analyze_scale_factor = 0);

-- HD-2, owner by owner. A run (its execution detail and output files): its account, its
-- conversation, itself.
CREATE OR REPLACE FUNCTION sexton.run_holds(run uuid)
RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT h.* FROM runs r, sexton.holds_of(r.account_id, r.conversation_id, NULL, NULL, r.id) h
    WHERE r.id = $1
$$;

-- A session (its history, archive frames and directory): its account, its agent, itself.
CREATE OR REPLACE FUNCTION sexton.session_holds(account uuid, agent uuid, session uuid)
RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT * FROM sexton.holds_of($1, NULL, $2, $3, NULL)
$$;

-- A handoff: its account, its agent, and either session it names (each hold once, when both
-- name the same session).
CREATE OR REPLACE FUNCTION sexton.handoff_holds(
    account uuid, agent uuid, from_session uuid, to_session uuid
) RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT * FROM sexton.holds_of($1, NULL, $2, $3, NULL)
    UNION
    SELECT * FROM sexton.holds_of(NULL, NULL, NULL, $4, NULL)
$$;

-- A dream preload or a working record: its account, its agent.
CREATE OR REPLACE FUNCTION sexton.agent_record_holds(account uuid, agent uuid)
RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT * FROM sexton.holds_of($1, NULL, $2, NULL, NULL)
$$;

-- A conversation event: its conversation and that conversation's account.
CREATE OR REPLACE FUNCTION sexton.event_holds(conversation uuid)
RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT h.* FROM conversations c, sexton.holds_of(c.account_id, c.id, NULL, NULL, NULL) h
    WHERE c.id = $1
$$;

-- An attachment's bytes follow their account.
CREATE OR REPLACE FUNCTION sexton.account_holds(account uuid)
RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT * FROM sexton.holds_of($1, NULL, NULL, NULL, NULL)
$$;

-- A run trace, by its signature's agent (NULL when that is not a UUID) and session: the session,
-- the agent, and the account (and agent) of the session's and the agent's rows while they exist.
CREATE OR REPLACE FUNCTION sexton.trace_holds(agent uuid, session uuid)
RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT * FROM sexton.holds_of(NULL, NULL, $1, $2, NULL)
    UNION
    SELECT h.* FROM (SELECT s.account_id, s.agent_id FROM sessions s WHERE s.id = $2
                     UNION ALL SELECT g.account_id, NULL FROM agents g WHERE g.id = $1) o,
                    sexton.holds_of(o.account_id, NULL, o.agent_id, NULL, NULL) h
$$;

-- A file whose rows are gone keeps the owners they had (HD-3): the drains ask this before each
-- unlink, and keep the file and its record while it answers a hold.
ALTER TABLE sexton.pending_file_deletions
    ADD COLUMN IF NOT EXISTS run_ids uuid[] NOT NULL DEFAULT '{}',
    ADD COLUMN IF NOT EXISTS agent_id uuid NULL,
    ADD COLUMN IF NOT EXISTS session_id uuid NULL;

CREATE OR REPLACE FUNCTION sexton.file_holds(
    account uuid, runs uuid[], agent uuid, session uuid
) RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT * FROM sexton.holds_of($1, NULL, $3, $4, NULL)
    UNION
    SELECT h.* FROM unnest($2) AS u (run), sexton.run_holds(u.run) h
$$;

-- SS-3 and HD-2 in one verdict, given the session's agent: a session a hold covers is retained as
-- legal_hold before any other reason is asked. Written for a per-row call's cost: each sub-select
-- here is set up at every call, so the three pointers are asked in one.
CREATE OR REPLACE FUNCTION sexton.session_verdict(
    session_id uuid, account uuid, agent uuid, kind text, state text, metadata jsonb,
    last_activity_at timestamptz, cutoff timestamptz
) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN $8 IS NULL OR NOT ($7 < $8) OR NOT isfinite($7) THEN 'not_eligible'
        WHEN EXISTS (SELECT 1 FROM sexton.session_holds($2, $3, $1)) THEN 'legal_hold'
        WHEN $5 IN ('running', 'finalizing') THEN 'protected_state'
        WHEN EXISTS (SELECT 1 FROM agents a
                     WHERE a.current_session_id = $1 OR a.main_session_id = $1
                        OR a.default_session_id = $1)
            THEN 'protected_pointer'
        ELSE sexton.session_evidence($4, $6, $2)
    END
$$;

-- The verdict as it was called before holds, for callers that do not have the session's agent
-- at hand: it looks the agent up.
CREATE OR REPLACE FUNCTION sexton.session_verdict(
    session_id uuid, account uuid, kind text, state text, metadata jsonb,
    last_activity_at timestamptz, cutoff timestamptz
) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT sexton.session_verdict($1, $2, (SELECT s.agent_id FROM sessions s WHERE s.id = $1),
                                  $3, $4, $5, $6, $7)
$$;

-- The store guard (SS-5, HD-4): a DELETE of a protected session, or of one a hold covers, is
-- refused whoever issues it. Only the platform deleting the session's own agent or account
-- (whose row is gone by the time the cascade reaches the session) passes.
CREATE OR REPLACE FUNCTION sexton.guard_protected_session() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    reason text;
    hold sexton.holds;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agents a WHERE a.id = OLD.agent_id)
       OR NOT EXISTS (SELECT 1 FROM accounts c WHERE c.id = OLD.account_id) THEN
        RETURN OLD;
    END IF;
    SELECT * INTO hold FROM sexton.session_holds(OLD.account_id, OLD.agent_id, OLD.id) h
    ORDER BY h.placed_at, h.id LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'session % is held and cannot be deleted: hold % on % %, case %, by %',
                        OLD.id, hold.id, hold.scope, hold.scope_id, hold.case_ref, hold.placed_by
            USING ERRCODE = 'integrity_constraint_violation',
                  HINT = 'HD-4: a session a hold covers is never deleted; release the hold '
                         'with sexton holds release';
    END IF;
    reason := sexton.session_protection(OLD.id, OLD.state);
    IF reason IS NOT NULL THEN
        RAISE EXCEPTION 'session % is protected and cannot be deleted: %', OLD.id, reason
            USING ERRCODE = 'integrity_constraint_violation',
                  HINT = 'SS-3: current, main and default sessions and running or finalizing '
                         'sessions are never deleted';
    END IF;
    RETURN OLD;
END
$$;
