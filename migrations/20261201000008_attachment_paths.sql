-- The removal mechanism keeps a file that a live attachment still names (AT-1): that check
-- looks attachments up by path, after every batch of expired rows.
CREATE INDEX IF NOT EXISTS attachments_live_path
    ON attachments (relative_path) WHERE bytes_expired_at IS NULL;
