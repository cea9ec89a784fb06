-- Health-aware pruning (issue #16): the pass ledger remembers how often and why a pass was
-- throttled, for `sexton status`.
ALTER TABLE sexton.passes ADD COLUMN IF NOT EXISTS throttles integer NOT NULL DEFAULT 0;
ALTER TABLE sexton.passes ADD COLUMN IF NOT EXISTS last_throttled_at timestamptz;
ALTER TABLE sexton.passes ADD COLUMN IF NOT EXISTS last_throttled_by text;
