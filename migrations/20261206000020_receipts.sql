-- Erasure receipts (SPEC §11, RQ-6): what each completed request removed, kept by law and
-- withheld, written once and kept after the data is gone. The subject appears only as a keyed
-- hash (`body->>'subject_hash'`, HMAC-SHA-256 under `[erasure] receipt_key`), never as an id.
-- Appending, verifying, exporting and finding are `sexton_jobs::receipts`.

-- RQ-6. One receipt per request. The receipts are chained: `hash` is SHA-256 over `prev_hash`
-- and the body's canonical text (jsonb's, read back), `prev_hash` is the hash of the receipt at
-- `seq - 1` (64 zeros for the first), so a receipt removed, altered or moved shows as a broken
-- link (`sexton receipts verify`). `seq` is assigned by the appender under its advisory lock,
-- not by a sequence: a rolled-back append leaves no gap that would read as a removal.
CREATE TABLE IF NOT EXISTS sexton.receipts (
    seq bigint PRIMARY KEY,
    request_id uuid NOT NULL UNIQUE,
    body jsonb NOT NULL,
    prev_hash text NOT NULL,
    hash text NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
);
-- `sexton receipts find` recomputes a subject's hash and looks it up here; the expression is
-- written the same in its query.
CREATE INDEX IF NOT EXISTS receipts_subject_hash ON sexton.receipts ((body->>'subject_hash'));

-- No job removes a receipt (RQ-6), nor rewrites one: a receipt is only ever inserted. The chain
-- shows what a role that can turn this trigger off does anyway.
CREATE OR REPLACE FUNCTION sexton.keep_receipts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'receipts are never deleted or rewritten (% refused)', TG_OP
        USING ERRCODE = 'integrity_constraint_violation',
              HINT = 'RQ-6: a receipt outlives the data it records; no job removes a receipt, '
                     'and sexton receipts verify names any that was removed, altered or reordered';
END
$$;

CREATE OR REPLACE TRIGGER sexton_keep_receipts
    BEFORE UPDATE OR DELETE ON sexton.receipts
    FOR EACH ROW EXECUTE FUNCTION sexton.keep_receipts();
CREATE OR REPLACE TRIGGER sexton_keep_receipts_truncate
    BEFORE TRUNCATE ON sexton.receipts
    FOR EACH STATEMENT EXECUTE FUNCTION sexton.keep_receipts();
