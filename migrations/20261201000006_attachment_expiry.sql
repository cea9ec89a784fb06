-- Attachment expiry (AT-1): a pass walks one account's live attachments in id order.
CREATE INDEX IF NOT EXISTS attachments_expiry
    ON attachments (account_id, id) WHERE bytes_expired_at IS NULL;
