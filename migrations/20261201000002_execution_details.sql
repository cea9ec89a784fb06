-- sexton's own objects for PruneExecutionDetails (SPEC §2).

CREATE SCHEMA IF NOT EXISTS sexton;

-- The candidate window (EX-7): unpruned conversation-backed owners of an account in (age, id)
-- order. The age expression is the one the job reads with, character for character:
-- a `conversation` run ages from completed_at, a `direct_reply` run from terminal_at once
-- settled_at is set; an owner without that timestamp has a NULL age and is never a candidate.
CREATE INDEX IF NOT EXISTS runs_execution_details_window
    ON runs (account_id,
             (CASE WHEN kind = 'conversation' THEN completed_at
                   WHEN settled_at IS NOT NULL THEN terminal_at END),
             id)
    WHERE details_pruned_at IS NULL
      AND conversation_id IS NOT NULL
      AND kind IN ('conversation', 'direct_reply');

-- Files still to delete (EX-3): written in the owner's transaction, removed once the file is
-- gone. A crash between commit and unlink leaves the row, and the next hop finishes the job;
-- a rolled-back owner leaves no row, so its files are never touched.
CREATE TABLE IF NOT EXISTS sexton.pending_file_deletions (
    id bigserial PRIMARY KEY,
    account_id uuid NOT NULL,
    relative_path text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
