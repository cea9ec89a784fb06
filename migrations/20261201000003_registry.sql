-- sexton's own objects shared by every job kind: the one file-removal mechanism and the pass
-- ledger.

-- Files still to delete, for every root (outputs, sessions, attachments, traces): written in
-- the transaction that removes the rows owning them, removed once the path is gone. account_id
-- is the nil uuid for a global job's files.
ALTER TABLE sexton.pending_file_deletions
    ADD COLUMN IF NOT EXISTS root text NOT NULL DEFAULT 'outputs';
-- A removal that failed for a reason that may pass is tried again by later drains; this
-- counts the tries.
ALTER TABLE sexton.pending_file_deletions
    ADD COLUMN IF NOT EXISTS attempts integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS pending_file_deletions_scope
    ON sexton.pending_file_deletions (root, account_id, id);

-- The pass ledger (OP-1 `status`, OP-3 last success): one row per job, scope and slot, opened
-- by the fan-out and updated by every hop. It records progress for operators and never drives a
-- hop: a hop's payload is its only state (EX-7). scope is the account, or the nil uuid for a
-- global job. last_hop is the furthest hop recorded.
CREATE TABLE IF NOT EXISTS sexton.passes (
    job text NOT NULL,
    scope uuid NOT NULL,
    slot timestamptz NOT NULL,
    started_at timestamptz NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz NULL,
    outcome text NOT NULL DEFAULT 'pending',
    hops integer NOT NULL DEFAULT 0,
    last_hop integer NOT NULL DEFAULT -1,
    candidates bigint NOT NULL DEFAULT 0,
    pruned bigint NOT NULL DEFAULT 0,
    retained jsonb NOT NULL DEFAULT '{}',
    rows_deleted jsonb NOT NULL DEFAULT '{}',
    files_deleted bigint NOT NULL DEFAULT 0,
    bytes_reclaimed bigint NOT NULL DEFAULT 0,
    file_errors bigint NOT NULL DEFAULT 0,
    last_error text NULL,
    PRIMARY KEY (job, scope, slot)
);
CREATE INDEX IF NOT EXISTS passes_slot ON sexton.passes (slot);

-- Sums two objects of counts key by key ({"a":1} + {"a":2,"b":1} = {"a":3,"b":1}).
CREATE OR REPLACE FUNCTION sexton.add_counts(a jsonb, b jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT COALESCE(jsonb_object_agg(key, total), '{}'::jsonb)
    FROM (SELECT key, sum(value::bigint) AS total
          FROM (SELECT * FROM jsonb_each_text(a) UNION ALL SELECT * FROM jsonb_each_text(b)) pairs
          GROUP BY key) sums
$$;
