-- OS-2: what was judged is what is compared. The ETag an object had when it was judged (attachment
-- expiry's HEAD, written with the record) or, for a file whose rows were just removed, when a drain
-- first read it after its record (kept once that drain's delete failed) stays with the pending
-- record; a later drain deletes the object only while its ETag is still that one, and keeps an
-- object whose ETag changed (rewritten since). NULL: nothing was judged yet (a local root, a store
-- that gives no ETags, a record the drain has not read), and `LastModified` decides, its
-- one-second resolution never taken as proof that an object is older than its record.
ALTER TABLE sexton.pending_file_deletions
    ADD COLUMN IF NOT EXISTS etag text NULL;
