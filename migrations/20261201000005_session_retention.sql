-- SessionRetention (SPEC §3): the rules written once, in the database, for the job, its
-- preview, `sexton sessions prune` and the store guard alike.

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

-- Why a session is protected (SS-3), for people, or NULL: running or finalizing, or any
-- agent's current, main or default session.
CREATE OR REPLACE FUNCTION sexton.session_protection(session_id uuid, state text) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN state IN ('running', 'finalizing') THEN 'its state is ' || state
        ELSE (SELECT 'it is the ' || pointer || ' session of agent ' || agent
              FROM (SELECT 'current' AS pointer, id AS agent FROM agents
                    WHERE current_session_id = session_id
                    UNION ALL
                    SELECT 'main', id FROM agents WHERE main_session_id = session_id
                    UNION ALL
                    SELECT 'default', id FROM agents WHERE default_session_id = session_id
                    LIMIT 1) p)
    END
$$;

-- What a session of `kind` lacks in evidence (SS-4), or NULL when it has enough: a task
-- session's board task (flattened `board_task_id` or nested `board_task.id`) must be done or
-- cancelled with a terminal_at; a subagent session needs `completed_at` or
-- `completion.completed_at`; a main session needs nothing. Reasons: missing_evidence,
-- malformed_evidence, task_not_terminal.
CREATE OR REPLACE FUNCTION sexton.session_evidence(kind text, metadata jsonb, account uuid)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE kind
        WHEN 'main' THEN NULL
        WHEN 'task' THEN
            CASE
                WHEN metadata -> 'board_task_id' IS NULL
                     AND metadata -> 'board_task' -> 'id' IS NULL THEN 'missing_evidence'
                WHEN COALESCE(sexton.jsonb_uuid(metadata -> 'board_task_id'),
                              sexton.jsonb_uuid(metadata -> 'board_task' -> 'id')) IS NULL
                    THEN 'malformed_evidence'
                WHEN NOT EXISTS (
                    SELECT 1 FROM board_tasks b
                    WHERE b.id = COALESCE(sexton.jsonb_uuid(metadata -> 'board_task_id'),
                                          sexton.jsonb_uuid(metadata -> 'board_task' -> 'id'))
                      AND b.account_id = account
                      AND b.status IN ('done', 'cancelled')
                      AND b.terminal_at IS NOT NULL) THEN 'task_not_terminal'
            END
        WHEN 'subagent' THEN
            CASE
                WHEN metadata -> 'completed_at' IS NULL
                     AND metadata -> 'completion' -> 'completed_at' IS NULL
                    THEN 'missing_evidence'
                WHEN COALESCE(sexton.jsonb_timestamptz(metadata -> 'completed_at'),
                              sexton.jsonb_timestamptz(metadata -> 'completion' -> 'completed_at'))
                     IS NULL THEN 'malformed_evidence'
            END
        ELSE 'not_eligible'
    END
$$;

-- The verdict on one session against the cutoff of its kind: NULL when it is to go, else
-- the reason it stays (SS-2, SS-3, SS-4): not_eligible, protected_state, protected_pointer or
-- an evidence reason.
CREATE OR REPLACE FUNCTION sexton.session_verdict(
    session_id uuid, account uuid, kind text, state text, metadata jsonb,
    last_activity_at timestamptz, cutoff timestamptz
) RETURNS text LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN cutoff IS NULL OR NOT (last_activity_at < cutoff) THEN 'not_eligible'
        WHEN state IN ('running', 'finalizing') THEN 'protected_state'
        WHEN EXISTS (SELECT 1 FROM agents WHERE current_session_id = session_id)
             OR EXISTS (SELECT 1 FROM agents WHERE main_session_id = session_id)
             OR EXISTS (SELECT 1 FROM agents WHERE default_session_id = session_id)
            THEN 'protected_pointer'
        ELSE sexton.session_evidence(kind, metadata, account)
    END
$$;

-- The store guard (SS-5): whoever deletes a protected session — sexton, the platform, a
-- hand-written DELETE — is refused, with the session and the reason. Deleting an agent or an
-- account takes its sessions with it (a cascade, trigger depth > 1): that is the platform's
-- own decision about the whole agent, not a deletion of one session.
CREATE OR REPLACE FUNCTION sexton.guard_protected_session() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    reason text;
BEGIN
    IF pg_trigger_depth() > 1 THEN
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
