-- The session verdict keeps its plans (PF-6). Before PostgreSQL 18 a SQL function that the
-- planner cannot inline (one whose body holds a sub-select, as these do) is planned again each
-- time its caller's plan starts it: called once per session row, session_verdict re-planned its
-- own body, and with it session_evidence's, per row. A window of 1,600 sessions spent 420 ms in
-- the verdict. PL/pgSQL keeps each statement's plan for the session, which brought the same
-- window to 54 ms. Same rules, same order, same answers (SS-2 … SS-4, HD-4): only the language
-- changes. The holds' covering function is still inlined into the statement that asks it.

-- What a session lacks in evidence (SS-4), or NULL. Every field that is present must be well
-- formed, whichever spelling (flattened or nested) it uses; a task's board tasks named either
-- way must all be done or cancelled with a terminal_at, in the session's account; a completion
-- time must be a date and time not in the future.
CREATE OR REPLACE FUNCTION sexton.session_evidence(kind text, metadata jsonb, account uuid)
RETURNS text LANGUAGE plpgsql STABLE AS $$
DECLARE
    direct uuid;
    nested uuid;
BEGIN
    CASE kind
    WHEN 'main' THEN
        RETURN NULL;
    WHEN 'task' THEN
        IF metadata -> 'board_task_id' IS NULL AND metadata -> 'board_task' -> 'id' IS NULL THEN
            RETURN 'missing_evidence';
        END IF;
        direct := sexton.jsonb_uuid(metadata -> 'board_task_id');
        nested := sexton.jsonb_uuid(metadata -> 'board_task' -> 'id');
        IF (metadata -> 'board_task_id' IS NOT NULL AND direct IS NULL)
           OR (metadata -> 'board_task' -> 'id' IS NOT NULL AND nested IS NULL) THEN
            RETURN 'malformed_evidence';
        END IF;
        IF EXISTS (SELECT 1
                   FROM unnest(ARRAY[direct, nested]) AS t (id)
                   WHERE t.id IS NOT NULL
                     AND NOT EXISTS (
                         SELECT 1 FROM board_tasks b
                         WHERE b.id = t.id AND b.account_id = session_evidence.account
                           AND b.status IN ('done', 'cancelled')
                           AND b.terminal_at IS NOT NULL)) THEN
            RETURN 'task_not_terminal';
        END IF;
        RETURN NULL;
    WHEN 'subagent' THEN
        IF metadata -> 'completed_at' IS NULL
           AND metadata -> 'completion' -> 'completed_at' IS NULL THEN
            RETURN 'missing_evidence';
        END IF;
        IF (metadata -> 'completed_at' IS NOT NULL
            AND COALESCE(sexton.jsonb_timestamptz(metadata -> 'completed_at') > now(), true))
          OR (metadata -> 'completion' -> 'completed_at' IS NOT NULL
            AND COALESCE(sexton.jsonb_timestamptz(metadata -> 'completion' -> 'completed_at')
                         > now(), true)) THEN
            RETURN 'malformed_evidence';
        END IF;
        RETURN NULL;
    ELSE
        RETURN 'not_eligible';
    END CASE;
END
$$;

-- The verdict on one session against the cutoff of its kind (SS-2, SS-3, SS-4), a hold first
-- (HD-4): NULL when it goes, or the reason it stays.
CREATE OR REPLACE FUNCTION sexton.session_verdict(
    session_id uuid, account uuid, agent uuid, kind text, state text, metadata jsonb,
    last_activity_at timestamptz, cutoff timestamptz
) RETURNS text LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF cutoff IS NULL OR NOT (last_activity_at < cutoff) OR NOT isfinite(last_activity_at) THEN
        RETURN 'not_eligible';
    END IF;
    IF EXISTS (SELECT 1 FROM sexton.session_holds(account, agent, session_id)) THEN
        RETURN 'legal_hold';
    END IF;
    IF state IN ('running', 'finalizing') THEN
        RETURN 'protected_state';
    END IF;
    IF EXISTS (SELECT 1 FROM agents a
               WHERE a.current_session_id = session_verdict.session_id
                  OR a.main_session_id = session_verdict.session_id
                  OR a.default_session_id = session_verdict.session_id) THEN
        RETURN 'protected_pointer';
    END IF;
    RETURN sexton.session_evidence(kind, metadata, account);
END
$$;
