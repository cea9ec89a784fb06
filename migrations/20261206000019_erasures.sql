-- Erasure on request (SPEC §11, RQ-1 … RQ-8; issue #57): one request removes everything of an
-- account, a conversation, an agent or a session, children first in bounded transactions, what
-- is in flight or held withheld item by item, verified by an independent read, and proven by a
-- chained receipt (sexton.receipts).

-- RQ-1. A request, never deleted. `scope_id` and `account_id` name the subject while the request
-- is open; once it completes both are cleared and only `subject_hash` (HMAC-SHA-256 of the
-- scope id under `[erasure] receipt_key`, whose fingerprint is `key_id`) remains (RQ-6).
CREATE TABLE IF NOT EXISTS sexton.erasures (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    scope text NOT NULL CHECK (scope IN ('account', 'conversation', 'agent', 'session')),
    scope_id uuid NULL,
    account_id uuid NULL,
    subject_hash text NOT NULL,
    key_id text NOT NULL,
    ref text NOT NULL CHECK (btrim(ref) <> ''),
    requested_by text NOT NULL CHECK (btrim(requested_by) <> ''),
    received_at timestamptz NOT NULL DEFAULT now(),
    due_at timestamptz NOT NULL,
    state text NOT NULL DEFAULT 'received'
        CHECK (state IN ('received', 'running', 'waiting', 'verifying', 'completed', 'failed')),
    -- When a `waiting` request's next pass is due (RQ-3: every `[erasure] retry_minutes`).
    next_attempt_at timestamptz NULL,
    verified_at timestamptz NULL,
    completed_at timestamptz NULL,
    -- Rows removed per table, and files and bytes per root, as committed.
    removed jsonb NOT NULL DEFAULT '{}',
    -- Rows kept by law (RQ-2: usage records, the account row as their anchor).
    kept jsonb NOT NULL DEFAULT '{}',
    -- What the last pass withheld, by reason, and the first items with their holds.
    withheld jsonb NOT NULL DEFAULT '{}',
    withheld_items jsonb NOT NULL DEFAULT '[]',
    passes integer NOT NULL DEFAULT 0,
    residues integer NOT NULL DEFAULT 0,
    last_error text NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CHECK ((state = 'completed') = (completed_at IS NOT NULL)),
    CHECK (state <> 'completed' OR (scope_id IS NULL AND account_id IS NULL))
);
-- A second request for a scope with an open one returns the open one (RQ-1).
CREATE UNIQUE INDEX IF NOT EXISTS erasures_open ON sexton.erasures (scope, scope_id)
    WHERE state <> 'completed';
CREATE INDEX IF NOT EXISTS erasures_subject ON sexton.erasures (subject_hash);
CREATE INDEX IF NOT EXISTS erasures_workable ON sexton.erasures (due_at, received_at)
    WHERE state <> 'completed';

CREATE OR REPLACE FUNCTION sexton.keep_erasures() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'erasure requests are never deleted (% refused)', TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              HINT = 'RQ-1: a request stays as the record of what was asked, by whom, and when';
END
$$;
CREATE OR REPLACE TRIGGER sexton_keep_erasures
    BEFORE DELETE ON sexton.erasures
    FOR EACH ROW EXECUTE FUNCTION sexton.keep_erasures();
CREATE OR REPLACE TRIGGER sexton_keep_erasures_truncate
    BEFORE TRUNCATE ON sexton.erasures
    FOR EACH STATEMENT EXECUTE FUNCTION sexton.keep_erasures();

-- RQ-2, what a request covers: the ids of its scope, found once per pass (a fork, a delegated
-- child, a turn found when the pass starts) and kept until the request completes, so that the
-- verification reads every table by the ids the scope had, whatever was deleted since. Removed
-- with the request's completion: nothing here outlives the data (RQ-6).
CREATE TABLE IF NOT EXISTS sexton.erasure_members (
    request_id uuid NOT NULL,
    kind text NOT NULL CHECK (kind IN ('account', 'conversation', 'run', 'turn', 'variant',
                                       'history_request', 'agent', 'session', 'archive')),
    id uuid NOT NULL,
    PRIMARY KEY (request_id, kind, id)
);
CREATE INDEX IF NOT EXISTS erasure_members_id ON sexton.erasure_members (id, kind);

-- Whether `id` of `kind` is in the scope of a running request: the store guard lets such a
-- request through (RQ-3), and nothing else.
CREATE OR REPLACE FUNCTION sexton.erasing(kind text, id uuid) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM sexton.erasure_members m
                   JOIN sexton.erasures e ON e.id = m.request_id
                   WHERE m.id = $2 AND m.kind = $1 AND e.state = 'running')
$$;

-- RQ-3, RQ-4: why a run of a request stays for now, one row per reason (empty: it goes). A
-- hold (HD-2, the run's own holds), the run itself in flight, a model attempt in flight, and a
-- history request not yet sealed, the run's own or one reading it.
CREATE OR REPLACE FUNCTION sexton.erasure_run_withheld(run uuid, status text)
RETURNS TABLE (reason text, hold uuid) LANGUAGE sql STABLE AS $$
    SELECT 'legal_hold', h.id FROM sexton.run_holds($1) h
    UNION ALL
    SELECT 'in_flight', NULL WHERE $2 IN ('pending', 'running')
    UNION ALL
    SELECT 'in_flight', NULL
    WHERE EXISTS (SELECT 1 FROM invocation_attempts i
                  WHERE i.run_id = $1 AND i.status IN ('pending', 'running'))
    UNION ALL
    SELECT 'in_flight', NULL
    WHERE EXISTS (SELECT 1 FROM history_requests q WHERE q.run_id = $1 AND q.sealed_at IS NULL)
       OR EXISTS (SELECT 1 FROM history_request_sources r
                  JOIN history_requests q ON q.id = r.history_request_id
                  WHERE r.source_run_id = $1 AND q.sealed_at IS NULL)
$$;

-- A conversation stays while a hold covers it or any run of it is left (withheld).
CREATE OR REPLACE FUNCTION sexton.erasure_conversation_withheld(conversation uuid, account uuid)
RETURNS TABLE (reason text, hold uuid) LANGUAGE sql STABLE AS $$
    SELECT 'legal_hold', h.id FROM sexton.holds_of($2, $1, NULL, NULL, NULL) h
    UNION ALL
    SELECT 'withheld_child', NULL
    WHERE EXISTS (SELECT 1 FROM runs r WHERE r.conversation_id = $1)
$$;

-- A session stays while a hold covers it (its account, agent, itself), while it runs or
-- finalizes, or while an agent points at it (SS-3) — unless that agent is erased by the same
-- request.
CREATE OR REPLACE FUNCTION sexton.erasure_session_withheld(
    request uuid, session uuid, account uuid, agent uuid, state text
) RETURNS TABLE (reason text, hold uuid) LANGUAGE sql STABLE AS $$
    SELECT 'legal_hold', h.id FROM sexton.session_holds($3, $4, $2) h
    UNION ALL
    SELECT 'in_flight', NULL WHERE $5 IN ('running', 'finalizing')
    UNION ALL
    SELECT 'pointed_at', NULL
    WHERE EXISTS (SELECT 1 FROM agents a
                  WHERE $2 IN (a.current_session_id, a.main_session_id, a.default_session_id)
                    AND NOT EXISTS (SELECT 1 FROM sexton.erasure_members m
                                    WHERE m.request_id = $1 AND m.kind = 'agent'
                                      AND m.id = a.id))
$$;

-- An agent's records stay while a hold on the agent or its account covers them; the agent's
-- row also while any session of it is left.
CREATE OR REPLACE FUNCTION sexton.erasure_agent_withheld(agent uuid, account uuid)
RETURNS TABLE (reason text, hold uuid) LANGUAGE sql STABLE AS $$
    SELECT 'legal_hold', h.id FROM sexton.agent_record_holds($2, $1) h
    UNION ALL
    SELECT 'withheld_child', NULL WHERE EXISTS (SELECT 1 FROM sessions s WHERE s.agent_id = $1)
$$;

-- The store guard (SS-5, HD-4) as before, and one way through: a session an agent points at is
-- deleted by a running erasure of that agent (its pointers go with it). A hold still refuses.
CREATE OR REPLACE FUNCTION sexton.guard_protected_session() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    reason text;
    hold sexton.holds;
BEGIN
    PERFORM sexton.enter_deletion();
    SELECT * INTO hold FROM sexton.session_holds(OLD.account_id, OLD.agent_id, OLD.id) h
    ORDER BY h.placed_at, h.id LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'session % is held and cannot be deleted: hold % on % %, case %, by %',
                        OLD.id, hold.id, hold.scope, hold.scope_id, hold.case_ref, hold.placed_by
            USING ERRCODE = 'integrity_constraint_violation',
                  HINT = 'HD-4: a session a hold covers is never deleted, nor its agent or '
                         'account while it is; release the hold with sexton holds release';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM agents a WHERE a.id = OLD.agent_id)
       OR NOT EXISTS (SELECT 1 FROM accounts c WHERE c.id = OLD.account_id) THEN
        RETURN OLD;
    END IF;
    reason := sexton.session_protection(OLD.id, OLD.state);
    IF reason IS NOT NULL AND OLD.state NOT IN ('running', 'finalizing')
       AND sexton.erasing('session', OLD.id)
       AND NOT EXISTS (SELECT 1 FROM agents a
                       WHERE OLD.id IN (a.current_session_id, a.main_session_id,
                                        a.default_session_id)
                         AND NOT sexton.erasing('agent', a.id)) THEN
        RETURN OLD;
    END IF;
    IF reason IS NOT NULL THEN
        RAISE EXCEPTION 'session % is protected and cannot be deleted: %', OLD.id, reason
            USING ERRCODE = 'integrity_constraint_violation',
                  HINT = 'SS-3: current, main and default sessions and running or finalizing '
                         'sessions are never deleted';
    END IF;
    RETURN OLD;
END
$$;

-- Indexes an erasure reads its scope through (RQ-8: bounded hops without a scan per batch).
-- On a platform database, build them with CREATE INDEX CONCURRENTLY first (docs/operating.md).
CREATE INDEX IF NOT EXISTS usage_records_run_id ON usage_records (run_id) WHERE run_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS usage_records_conversation_id ON usage_records (conversation_id)
    WHERE conversation_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS handoffs_agent_id ON handoffs (agent_id);
CREATE INDEX IF NOT EXISTS dream_preloads_agent_id ON dream_preloads (agent_id);
CREATE INDEX IF NOT EXISTS working_records_agent_id ON working_records (agent_id);
CREATE INDEX IF NOT EXISTS brain_memories_agent_id ON brain_memories (agent_id);
CREATE INDEX IF NOT EXISTS board_tasks_account_id ON board_tasks (account_id);
CREATE INDEX IF NOT EXISTS attachments_account_id ON attachments (account_id);
CREATE INDEX IF NOT EXISTS follow_ups_fragments ON follow_ups USING gin (body jsonb_path_ops);
