-- Files in object storage (SPEC §10). An object store has no flock(2): the one trace cleaner of
-- a traces root in a bucket (TR-3, OS-2) holds a row here, with who it is and until when; it
-- renews the row while it runs and deletes it when done, and a row past its expiry is anyone's.
CREATE TABLE IF NOT EXISTS sexton.trace_leases (
    root text PRIMARY KEY,
    holder text NOT NULL,
    token uuid NOT NULL,
    expires_at timestamptz NOT NULL
);
