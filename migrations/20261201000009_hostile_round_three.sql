-- Hostile input, round three (issue #25).

-- One file, one key (EX-3, AT-1): on a POSIX file system `a//x.out`, `./a/x.out` and
-- `a/./x.out` name the file `a/x.out`, so "no surviving row still references the same path"
-- compares paths by this key: empty and `.` segments dropped. `..` is never resolved (a symlink
-- on the way would change what it means): such a path is refused by the removal, whatever its
-- key. An absolute path keeps its spelling and is refused too.
CREATE OR REPLACE FUNCTION sexton.path_key(path text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN left($1, 1) = '/' THEN $1
                ELSE array_to_string(
                         array_remove(array_remove(string_to_array($1, '/'), ''), '.'), '/')
           END
$$;

-- The still-referenced checks look paths up by key. On a large table build these concurrently
-- before migrating (README, "Migrating a large database").
CREATE INDEX IF NOT EXISTS output_files_path_key ON output_files (sexton.path_key(relative_path));
DROP INDEX IF EXISTS output_files_relative_path;
CREATE INDEX IF NOT EXISTS attachments_live_path_key
    ON attachments (sexton.path_key(relative_path)) WHERE bytes_expired_at IS NULL;
DROP INDEX IF EXISTS attachments_live_path;

-- A record whose removal keeps failing — or never finishes, because the process dies during it
-- — is quarantined after its last attempt instead of being tried forever or forgotten: the
-- drains pass it by, `status` and the metrics count it, and an operator can see why
-- (last_error) and release it (`UPDATE … SET quarantined_at = NULL, attempts = 0`).
ALTER TABLE sexton.pending_file_deletions
    ADD COLUMN IF NOT EXISTS quarantined_at timestamptz NULL,
    ADD COLUMN IF NOT EXISTS last_error text NULL;
