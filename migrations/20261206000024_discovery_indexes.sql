-- Discovery from the candidates' side (FL-8, PF-5): a slot's fan-out and `sexton preview` find
-- the accounts that have something due through indexes whose leading column is the age, and
-- read no row of an account with nothing due. Each per-account kind first takes its latest
-- cutoff — from the shortest window any account's setting gives, read at one end of an index on
-- that setting — then reads the candidates older than it in age order, the account beside each
-- (index-only), and checks each account found against its own window. The account ids travel
-- in the index so that the candidates' rows are not visited.

-- Execution details (EX-1, EX-2): unpruned owners by age, the window index's predicate and age
-- expression written out (`sexton.run_owner`, `sexton.run_age`).
CREATE INDEX IF NOT EXISTS runs_execution_details_due
    ON runs ((CASE WHEN kind = 'conversation' THEN completed_at
                   WHEN settled_at IS NOT NULL THEN terminal_at END),
             account_id)
    WHERE details_pruned_at IS NULL
      AND conversation_id IS NOT NULL
      AND kind IN ('conversation', 'direct_reply');

-- The shortest window of any account (its latest cutoff), and the accounts whose window is 0 or
-- less (their pass reports it, EX-1).
CREATE INDEX IF NOT EXISTS accounts_execution_details_retention_days
    ON accounts (execution_details_retention_days);

-- Sessions by kind, then age (SS-2): each kind has its own ages, so its candidates are one
-- range of this index.
CREATE INDEX IF NOT EXISTS sessions_retention_due
    ON sessions (kind, last_activity_at, account_id);

-- The shortest age of each kind any enabled policy gives (a missing one falls back: NULLs are
-- found at the index's end), and the enabled policies with an age of 0 or less (SS-1).
CREATE INDEX IF NOT EXISTS session_retention_policies_main_days
    ON session_retention_policies (main_days) WHERE enabled;
CREATE INDEX IF NOT EXISTS session_retention_policies_task_days
    ON session_retention_policies (task_days) WHERE enabled;
CREATE INDEX IF NOT EXISTS session_retention_policies_subagent_days
    ON session_retention_policies (subagent_days) WHERE enabled;
