-- Holds cost nothing while none is active (SPEC §9, PF-6). Every covering function asks
-- sexton.holds_of once per owner: a probe of holds_active, and for a conversation event or a
-- run its conversation or run row looked up first to find its account. Per row of a batch of
-- 2,000 that doubled the short-lived records' delete (10.7 → 20.8 ms a batch for events), and
-- a union of two probes (a handoff's sessions, a trace's owners, a file's runs) also sorts its
-- answer per row.
--
-- So each covering function below first asks whether any hold is active at all. That condition
-- names nothing of the caller: the planner evaluates it once per statement (an InitPlan) and,
-- while it is false, never runs the lookup it gates, joins, unions and sorts included. It is
-- asked again at the top of each union, since a condition inside a union's branches leaves the
-- union's sort to run per row. One statement sees one snapshot: a hold committed before the
-- statement started is seen by both the gate and the probe, one committed after it by neither,
-- as before. (Spelled out in each function: a function around it would not be inlined, since
-- the planner inlines no function whose body holds a sub-select, and would run per row.)
CREATE OR REPLACE FUNCTION sexton.holds_of(
    account uuid, conversation uuid, agent uuid, session uuid, run uuid
) RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT h.* FROM sexton.holds h
    WHERE EXISTS (SELECT 1 FROM sexton.holds a WHERE a.released_at IS NULL)
      AND h.released_at IS NULL
      AND h.scope_id IN ($1, $2, $3, $4, $5)
      AND CASE h.scope
              WHEN 'account' THEN h.scope_id = $1
              WHEN 'conversation' THEN h.scope_id = $2
              WHEN 'agent' THEN h.scope_id = $3
              WHEN 'session' THEN h.scope_id = $4
              WHEN 'run' THEN h.scope_id = $5
          END
$$;

CREATE OR REPLACE FUNCTION sexton.handoff_holds(
    account uuid, agent uuid, from_session uuid, to_session uuid
) RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT held.* FROM (SELECT * FROM sexton.holds_of($1, NULL, $2, $3, NULL)
                     UNION
                     SELECT * FROM sexton.holds_of(NULL, NULL, NULL, $4, NULL)) held
    WHERE EXISTS (SELECT 1 FROM sexton.holds a WHERE a.released_at IS NULL)
$$;

CREATE OR REPLACE FUNCTION sexton.trace_holds(agent uuid, session uuid)
RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT held.* FROM (SELECT * FROM sexton.holds_of(NULL, NULL, $1, $2, NULL)
                     UNION
                     SELECT h.* FROM (SELECT s.account_id, s.agent_id FROM sessions s WHERE s.id = $2
                                      UNION ALL SELECT g.account_id, NULL FROM agents g WHERE g.id = $1) o,
                                     sexton.holds_of(o.account_id, NULL, o.agent_id, NULL, NULL) h) held
    WHERE EXISTS (SELECT 1 FROM sexton.holds a WHERE a.released_at IS NULL)
$$;

CREATE OR REPLACE FUNCTION sexton.file_holds(
    account uuid, runs uuid[], agent uuid, session uuid
) RETURNS SETOF sexton.holds LANGUAGE sql STABLE AS $$
    SELECT held.* FROM (SELECT * FROM sexton.holds_of($1, NULL, $3, $4, NULL)
                     UNION
                     SELECT h.* FROM unnest($2) AS u (run), sexton.run_holds(u.run) h) held
    WHERE EXISTS (SELECT 1 FROM sexton.holds a WHERE a.released_at IS NULL)
$$;
