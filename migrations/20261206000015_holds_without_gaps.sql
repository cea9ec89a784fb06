-- Holds without gaps (SPEC §9 HD-3, HD-4; issue #55).

-- The hold gate (HD-3: "a hold is in force from the moment `holds place` returns"). Every
-- transaction that removes something a hold could cover — an owner transaction, a batch of
-- short-lived records, a drain's last hold check and its unlinks, the trace cleaner's, a DELETE
-- of a session — takes the gate shared, first, before it asks the holds; `holds place` takes it
-- exclusively, and writes the hold only once it has it. So a hold waits for every deletion that
-- began before it (that deletion commits first, before the hold's `placed_at`), and every
-- deletion that begins after it finds the hold: a shared request queued behind the waiting
-- `holds place` waits for the hold's commit, and its next statement's snapshot then holds it.
-- (In READ COMMITTED every statement takes its own snapshot: the gate is a statement of its
-- own, before the check, never part of it.) An advisory lock of its own class (the hop locks
-- are 0x5e770001), transaction-scoped: a crash, a cancelled hop or a panic releases it with
-- the transaction. The gate is waited for under `statement_timeout` alone, not the owner
-- transactions' short `lock_timeout`: it is closed only while a hold is being placed, for as
-- long as the deletions begun before it take.
CREATE OR REPLACE FUNCTION sexton.enter_deletion() RETURNS void
LANGUAGE sql VOLATILE SET lock_timeout = 0 AS $$
    SELECT pg_advisory_xact_lock_shared(1584857090, 0)
$$;

CREATE OR REPLACE FUNCTION sexton.close_for_hold() RETURNS void
LANGUAGE sql VOLATILE AS $$
    SELECT pg_advisory_xact_lock(1584857090, 0)
$$;

-- A pending file keeps every scope that could hold it, taken when its rows were removed (HD-3):
-- the conversations of its runs as well as the runs, so that a conversation hold placed after
-- the platform deleted a pruned run's row still keeps the file. Records written before this
-- migration take their conversations from the runs that still exist.
ALTER TABLE sexton.pending_file_deletions
    ADD COLUMN IF NOT EXISTS conversation_ids uuid[] NOT NULL DEFAULT '{}';
UPDATE sexton.pending_file_deletions p
SET conversation_ids = ARRAY(SELECT DISTINCT r.conversation_id FROM runs r
                             WHERE r.id = ANY (p.run_ids) AND r.conversation_id IS NOT NULL)
WHERE p.run_ids <> '{}' AND p.conversation_ids = '{}';

-- The holds of a pending file, from its record alone: no platform row is asked, so a row
-- deleted since the record was written loses no hold. The run ids still in `runs` are asked
-- through their rows too (a record written before its conversations were kept).
DROP FUNCTION IF EXISTS sexton.file_holds(uuid, uuid[], uuid, uuid);
CREATE OR REPLACE FUNCTION sexton.file_holds(
    account uuid, conversations uuid[], runs uuid[], agent uuid, session uuid
) RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT held.* FROM (
        SELECT h.* FROM sexton.holds h
        WHERE h.released_at IS NULL
          AND h.scope_id = ANY ($2 || $3 || ARRAY[$1, $4, $5])
          AND CASE h.scope
                  WHEN 'account' THEN h.scope_id = $1
                  WHEN 'conversation' THEN h.scope_id = ANY ($2)
                  WHEN 'run' THEN h.scope_id = ANY ($3)
                  WHEN 'agent' THEN h.scope_id = $4
                  WHEN 'session' THEN h.scope_id = $5
              END
        UNION
        SELECT h.* FROM unnest($3) AS u (run), sexton.run_holds(u.run) h) held
    WHERE EXISTS (SELECT 1 FROM sexton.holds a WHERE a.released_at IS NULL)
$$;

-- A run trace: as before, and where neither its session's row nor its agent's row is left to
-- say which account it was of, every active account hold (HD-3: what sexton cannot tell is
-- held, it keeps).
CREATE OR REPLACE FUNCTION sexton.trace_holds(agent uuid, session uuid)
RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT held.* FROM (SELECT * FROM sexton.holds_of(NULL, NULL, $1, $2, NULL)
                     UNION
                     SELECT h.* FROM (SELECT s.account_id, s.agent_id FROM sessions s WHERE s.id = $2
                                      UNION ALL SELECT g.account_id, NULL FROM agents g WHERE g.id = $1) o,
                                     sexton.holds_of(o.account_id, NULL, o.agent_id, NULL, NULL) h
                     UNION
                     SELECT h.* FROM sexton.holds h
                     WHERE h.released_at IS NULL AND h.scope = 'account'
                       AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.id = $2)
                       AND NOT EXISTS (SELECT 1 FROM agents g WHERE g.id = $1)) held
    WHERE EXISTS (SELECT 1 FROM sexton.holds a WHERE a.released_at IS NULL)
$$;

-- The store guard (SS-5, HD-4). A held session is refused whoever deletes it and however the
-- DELETE reaches it — from a statement, or by cascade from its agent or its account (the
-- session's own columns name its account and agent, whether or not their rows are still
-- there). The gate first: a hold placed while this DELETE waits on a lock (a handoff's
-- `SET NULL`) waits for it. Only the protection of SS-3 still lets a cascade from the
-- session's own agent or account through, as the pointers go with the agent.
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
    IF reason IS NOT NULL THEN
        RAISE EXCEPTION 'session % is protected and cannot be deleted: %', OLD.id, reason
            USING ERRCODE = 'integrity_constraint_violation',
                  HINT = 'SS-3: current, main and default sessions and running or finalizing '
                         'sessions are never deleted';
    END IF;
    RETURN OLD;
END
$$;

-- HD-4: a TRUNCATE of `sessions` — by name, or by CASCADE from `agents` or `accounts` — fires
-- no row trigger; it is refused while any session is protected (SS-3) or held.
CREATE OR REPLACE FUNCTION sexton.guard_truncated_sessions() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    kept uuid;
BEGIN
    PERFORM sexton.enter_deletion();
    SELECT s.id INTO kept FROM sessions s
    WHERE s.state IN ('running', 'finalizing')
       OR EXISTS (SELECT 1 FROM sexton.session_holds(s.account_id, s.agent_id, s.id))
       OR EXISTS (SELECT 1 FROM agents a
                  WHERE s.id IN (a.current_session_id, a.main_session_id, a.default_session_id))
    LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'sessions cannot be truncated: session % (at least) is protected or held',
                        kept
            USING ERRCODE = 'integrity_constraint_violation',
                  HINT = 'SS-5, HD-4: protected and held sessions are never deleted; delete the '
                         'others by id';
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER sexton_guard_truncated_sessions
    BEFORE TRUNCATE ON sessions
    FOR EACH STATEMENT EXECUTE FUNCTION sexton.guard_truncated_sessions();
