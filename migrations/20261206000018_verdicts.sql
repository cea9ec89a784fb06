-- The verdict once per kind (issue #56): each rule a job keeps is stated here, once, and every
-- statement that asks it — a hop's window, its re-check under locks, discovery (`due`), the
-- backlog, `preview` and `explain` — calls the function instead of spelling the rule again, so
-- that `explain` agrees with the pass by construction. Sessions were first (SS-2 … SS-4:
-- `sexton.session_verdict`, migrations 5, 11 and 14); the holds' covering functions (HD-2,
-- migration 11) are asked from here; the queue's own retention (FL-7) reads the queue's tables,
-- which exist only after these migrations, and so is stated in worker/queue_guard.sql. The
-- table of where each rule lives is in docs/jobs.md.
--
-- Written to keep the plans they replace (PF-6). PostgreSQL inlines a SQL function into the
-- statement that calls it when its body is one expression without a sub-select (a scalar
-- function) or one SELECT (a set-returning function called in FROM, not STRICT), declared no
-- more volatile than its body, without SECURITY DEFINER or a SET clause: the planner then sees
-- the rule's own conditions and matches them to the indexes that serve them, as when they were
-- spelled in each statement. A scalar function whose body holds a sub-select is never inlined,
-- and before PostgreSQL 18 is planned again at every call (migration 14): a rule that needs a
-- sub-select is a set-returning function here, asked as `(SELECT … FROM f(…))` or
-- `EXISTS (SELECT 1 FROM f(…))`. Parameters are referenced by position where a body reads a
-- table, so that a column the platform adds never takes a parameter's place.

-- EX-2, who: a run that owns execution detail — of kind `conversation` or `direct_reply`, in a
-- conversation. Standalone and inference runs, and runs without a conversation, are never
-- touched. The window index `runs_execution_details_window` repeats this as its predicate (with
-- `details_pruned_at IS NULL`): an index's predicate is written out where it is created.
CREATE OR REPLACE FUNCTION sexton.run_owner(kind text, conversation uuid) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT conversation IS NOT NULL AND kind IN ('conversation', 'direct_reply')
$$;

-- EX-2, since when: a `conversation` run ages from completed_at (never delivered_at), a
-- `direct_reply` run from terminal_at once settled_at is set; NULL (never a candidate) without
-- that timestamp. The window index's second column is this expression, written out.
CREATE OR REPLACE FUNCTION sexton.run_age(
    kind text, completed_at timestamptz, terminal_at timestamptz, settled_at timestamptz
) RETURNS timestamptz LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN kind = 'conversation' THEN completed_at
                WHEN settled_at IS NOT NULL THEN terminal_at END
$$;

-- EX-5 (and HD-2 first): what holds a run back, one row per thing that does, with its reason,
-- the rank of that reason (the order a pass reports them in, and the order of the branches
-- below) and the row behind it for people (`sexton explain run`). Empty when nothing does. A
-- caller asks whether there is one (EXISTS), the first reason, or all of them; the columns it
-- does not read are never computed.
CREATE OR REPLACE FUNCTION sexton.run_blockers(run uuid)
RETURNS TABLE (reason text, rank integer, detail text) LANGUAGE sql STABLE AS $$
    SELECT 'legal_hold', 1, 'hold ' || h.id || ' on ' || h.scope || ' ' || h.scope_id
    FROM sexton.run_holds($1) h
    UNION ALL
    -- Pending model work.
    SELECT 'pending_work', 2,
           'invocation_attempts ' || i.id || ' ' || i.status || ' since '
           || to_char(i.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
    FROM invocation_attempts i WHERE i.run_id = $1 AND i.status IN ('pending', 'running')
    UNION ALL
    SELECT 'pending_settlement', 3,
           'settlement_receipts ' || s.id || ' status pending since '
           || to_char(s.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
    FROM settlement_receipts s WHERE s.run_id = $1 AND s.status = 'pending'
    UNION ALL
    SELECT 'outstanding_delegation', 4,
           'delegations ' || d.id || ' outstanding since '
           || to_char(d.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
    FROM delegations d WHERE d.parent_run_id = $1 AND d.status = 'outstanding'
    UNION ALL
    -- An active first round: the run is a source of an unsealed history request (inherited
    -- sources included). A sealed request holds nothing back.
    SELECT 'active_history_request', 5,
           'history_requests ' || q.id || ' unsealed, assembling run ' || q.run_id
    FROM history_request_sources r JOIN history_requests q ON q.id = r.history_request_id
    WHERE r.source_run_id = $1 AND q.sealed_at IS NULL
$$;

-- The verdict on a run (EX-1, EX-2, EX-5, HD-2): NULL when its detail goes now, or the reason it
-- stays — `not_eligible` (no owner, no age, not old enough, or a window that is not one) before
-- the first thing that holds it back (`sexton.run_blockers`). `conversation` is the run's own, or
-- NULL where the run no longer belongs to the conversation its caller locked; `days` the
-- account's window; the run is old enough when its age is before `bound` (the stricter of a
-- pass's carried and current cutoff) and, measured back from `reference`, further than the
-- window, compared as an interval so that a window longer than the calendar is "not old enough",
-- never an overflow (EX-1). One row: asked as `(SELECT verdict FROM sexton.run_verdict(…))`.
--
-- The first blocker is the first row of run_blockers' branches, read in their order (rank): a
-- sub-select that names the run it is asked for runs in no parallel plan, and its Append reads
-- its branches one after the other, stopping at the first row. An ORDER BY rank would sort the
-- five probes' rows for every run: 6 µs a run, a third more for a preview of 15,000 owners.
CREATE OR REPLACE FUNCTION sexton.run_verdict(
    run uuid, kind text, conversation uuid, completed_at timestamptz, terminal_at timestamptz,
    settled_at timestamptz, days integer, bound timestamptz, reference timestamptz
) RETURNS TABLE (verdict text) LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN NOT COALESCE(sexton.run_owner($2, $3)
                          AND sexton.run_age($2, $4, $5, $6) < $8
                          AND $7 > 0
                          AND CASE WHEN isfinite(sexton.run_age($2, $4, $5, $6))
                                   THEN $9 - sexton.run_age($2, $4, $5, $6)
                                        > make_interval(days => $7)
                              END,
                          false)
            THEN 'not_eligible'
        ELSE (SELECT b.reason FROM sexton.run_blockers($1) b LIMIT 1)
    END
$$;

-- TTL-1 … TTL-4: a short-lived record has expired when its age — the column its kind is
-- measured from (record_expiry/kinds.rs names it, with the (age, id) index each batch reads) —
-- is a finite moment before the cutoff of its kind, and it is not pinned (TTL-3: pinned working
-- records and cards never expire; a kind without a pin passes false). Inlined, so the batches
-- still read their (age, id) index, and `working_records_expiry` (WHERE NOT pinned) for working
-- records. Finite is a bound of that index's range, `> '-infinity'` (a cutoff is always finite):
-- `isfinite(age)`, a filter the planner takes to drop half the rows, turned the generic plan of
-- the oldest expired working record from the index's first row into an aggregate of them all.
CREATE OR REPLACE FUNCTION sexton.record_expired(
    age timestamptz, pinned boolean, cutoff timestamptz
) RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT NOT pinned AND age < cutoff AND age > '-infinity'
$$;

-- AT-1, the rows: an attachment whose bytes have not expired yet — the rows a pass judges by
-- their file's modification time (which only the file can tell: the job's `verdict`, in Rust)
-- and the only rows it marks. `attachments_expiry` and `attachments_live_path_key` repeat it as
-- their predicate.
CREATE OR REPLACE FUNCTION sexton.attachment_live(bytes_expired_at timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT bytes_expired_at IS NULL
$$;
