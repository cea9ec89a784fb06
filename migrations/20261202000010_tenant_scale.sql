-- FL-8: a slot starts passes only for the accounts that have something due. The fan-outs
-- record, per job and slot, that discovery went through every account: an account found with
-- nothing due has no pass row, and its pass counts as finished once its job's fan-out has
-- (OP-3's last success). accounts: accounts looked at; started: passes started.
CREATE TABLE IF NOT EXISTS sexton.fan_outs (
    job text NOT NULL,
    slot timestamptz NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz NULL,
    accounts bigint NOT NULL DEFAULT 0,
    started bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (job, slot)
);

-- Slots already fanned out before this migration went through every account.
INSERT INTO sexton.fan_outs (job, slot, started_at, finished_at, accounts, started)
SELECT job, slot, min(updated_at), min(updated_at), count(*), count(*)
FROM sexton.passes GROUP BY job, slot
ON CONFLICT DO NOTHING;

-- What holds a slot back from being complete, found without reading its finished passes.
CREATE INDEX IF NOT EXISTS passes_unfinished ON sexton.passes (job, slot)
    WHERE finished_at IS NULL;
