-- SessionRetention (SPEC §3): the rules written once, in the database, for the job, its
-- preview, `sexton sessions prune` and the store guard alike. Parameters are referenced by
-- position: a column the platform adds to agents, sessions or board_tasks (the contract allows
-- new columns) must never take a parameter's place inside these functions.

-- The candidate window: an account's sessions of one kind in (last activity, id) order.
CREATE INDEX IF NOT EXISTS sessions_retention_window
    ON sessions (account_id, kind, last_activity_at, id);

-- A JSON value that is a string holding a uuid, as a uuid; anything else (a number, an object,
-- a malformed string) is NULL, never an error (SS-4).
CREATE OR REPLACE FUNCTION sexton.jsonb_uuid(value jsonb) RETURNS uuid
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN jsonb_typeof(value) = 'string'
             AND value #>> '{}' ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
        THEN (value #>> '{}')::uuid
    END
$$;

-- A JSON value that is a string holding a finite date and time, as a timestamptz; anything
-- else (a number, "now", "infinity", 2026-13-45) is NULL, never an error (SS-4).
CREATE OR REPLACE FUNCTION sexton.jsonb_timestamptz(value jsonb) RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
DECLARE
    parsed timestamptz;
BEGIN
    IF jsonb_typeof(value) IS DISTINCT FROM 'string'
       OR value #>> '{}' !~ '^\d{4}-\d{2}-\d{2}' THEN
        RETURN NULL;
    END IF;
    parsed := (value #>> '{}')::timestamptz;
    RETURN CASE WHEN isfinite(parsed) THEN parsed END;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;

-- Why a session is protected (SS-3), for people, or NULL.
CREATE OR REPLACE FUNCTION sexton.session_protection(session_id uuid, state text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN $2 IN ('running', 'finalizing') THEN 'its state is ' || $2
        ELSE (SELECT 'it is the ' || p.pointer || ' session of agent ' || p.agent
              FROM (SELECT 'current' AS pointer, a.id AS agent FROM agents a
                    WHERE a.current_session_id = $1
                    UNION ALL
                    SELECT 'main', a.id FROM agents a WHERE a.main_session_id = $1
                    UNION ALL
                    SELECT 'default', a.id FROM agents a WHERE a.default_session_id = $1
                    LIMIT 1) p)
    END
$$;

-- What a session lacks in evidence (SS-4), or NULL. Every field that is present must be well
-- formed, whichever spelling (flattened or nested) it uses; a task's board tasks named either
-- way must all be done or cancelled with a terminal_at, in the session's account; a completion
-- time must be a date and time not in the future.
CREATE OR REPLACE FUNCTION sexton.session_evidence(kind text, metadata jsonb, account uuid)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE $1
        WHEN 'main' THEN NULL
        WHEN 'task' THEN
            CASE
                WHEN $2 -> 'board_task_id' IS NULL AND $2 -> 'board_task' -> 'id' IS NULL
                    THEN 'missing_evidence'
                WHEN ($2 -> 'board_task_id' IS NOT NULL
                      AND sexton.jsonb_uuid($2 -> 'board_task_id') IS NULL)
                  OR ($2 -> 'board_task' -> 'id' IS NOT NULL
                      AND sexton.jsonb_uuid($2 -> 'board_task' -> 'id') IS NULL)
                    THEN 'malformed_evidence'
                WHEN EXISTS (
                    SELECT 1
                    FROM unnest(ARRAY[sexton.jsonb_uuid($2 -> 'board_task_id'),
                                      sexton.jsonb_uuid($2 -> 'board_task' -> 'id')]) AS t (id)
                    WHERE t.id IS NOT NULL
                      AND NOT EXISTS (
                          SELECT 1 FROM board_tasks b
                          WHERE b.id = t.id AND b.account_id = $3
                            AND b.status IN ('done', 'cancelled')
                            AND b.terminal_at IS NOT NULL)) THEN 'task_not_terminal'
            END
        WHEN 'subagent' THEN
            CASE
                WHEN $2 -> 'completed_at' IS NULL
                     AND $2 -> 'completion' -> 'completed_at' IS NULL THEN 'missing_evidence'
                WHEN ($2 -> 'completed_at' IS NOT NULL
                      AND COALESCE(sexton.jsonb_timestamptz($2 -> 'completed_at') > now(), true))
                  OR ($2 -> 'completion' -> 'completed_at' IS NOT NULL
                      AND COALESCE(sexton.jsonb_timestamptz($2 -> 'completion' -> 'completed_at')
                                   > now(), true))
                    THEN 'malformed_evidence'
            END
        ELSE 'not_eligible'
    END
$$;

-- The verdict on one session against the cutoff of its kind (SS-2, SS-3, SS-4).
CREATE OR REPLACE FUNCTION sexton.session_verdict(
    session_id uuid, account uuid, kind text, state text, metadata jsonb,
    last_activity_at timestamptz, cutoff timestamptz
) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN $7 IS NULL OR NOT ($6 < $7) OR NOT isfinite($6) THEN 'not_eligible'
        WHEN $4 IN ('running', 'finalizing') THEN 'protected_state'
        WHEN EXISTS (SELECT 1 FROM agents a WHERE a.current_session_id = $1)
             OR EXISTS (SELECT 1 FROM agents a WHERE a.main_session_id = $1)
             OR EXISTS (SELECT 1 FROM agents a WHERE a.default_session_id = $1)
            THEN 'protected_pointer'
        ELSE sexton.session_evidence($3, $5, $2)
    END
$$;

-- The store guard (SS-5). A DELETE of a protected session is refused whoever issues it — from
-- a statement, a function or another trigger. Only the platform deleting the session's own
-- agent or account (whose row is gone by the time the cascade reaches the session) passes.
CREATE OR REPLACE FUNCTION sexton.guard_protected_session() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    reason text;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agents a WHERE a.id = OLD.agent_id)
       OR NOT EXISTS (SELECT 1 FROM accounts c WHERE c.id = OLD.account_id) THEN
        RETURN OLD;
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

CREATE OR REPLACE TRIGGER sexton_guard_protected_session
    BEFORE DELETE ON sessions
    FOR EACH ROW EXECUTE FUNCTION sexton.guard_protected_session();

-- A write that points an agent at a session takes a key-share lock on that session's row until
-- it commits (SS-5): a pass then finds the session busy instead of deleting it under a pointer
-- it cannot see yet. A pointer may still be written before its session exists.
CREATE OR REPLACE FUNCTION sexton.lock_pointed_sessions() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM sessions s
    WHERE s.id IN (NEW.current_session_id, NEW.main_session_id, NEW.default_session_id)
    FOR KEY SHARE;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER sexton_lock_pointed_sessions
    BEFORE INSERT OR UPDATE OF current_session_id, main_session_id, default_session_id
    ON agents
    FOR EACH ROW EXECUTE FUNCTION sexton.lock_pointed_sessions();
