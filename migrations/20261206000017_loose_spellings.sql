-- Every spelling that could name a file (EX-3, AT-1; issue #55). `sexton.path_key` makes one key
-- of the spellings that name one file whatever the directories are (`a//x`, `./a/x`). A stored
-- path with a `..` segment, or an absolute one, is never removed, and what it names cannot be
-- told from its text: `d/sub/../f.out` names `d/f.out` when `sub` is a directory, and through a
-- symlink on the way it can name an `f.out` anywhere. The still-referenced check errs toward
-- keeping: such a "loose" path of a surviving row keeps every file whose path ends with what
-- follows its last `..` (or, for an absolute path, every file its path ends with).

-- Whether `path` is loose: absolute, or with a `..` segment.
CREATE OR REPLACE FUNCTION sexton.is_loose(path text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT left($1, 1) = '/' OR '..' = ANY (string_to_array($1, '/'))
$$;

-- Whether the loose path `loose` could name the file at the relative path `path`: their keys'
-- segments, after the last `..` of `loose`, end one with the other.
CREATE OR REPLACE FUNCTION sexton.may_name(loose text, path text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT tail <> '' AND key <> ''
           AND (tail = key OR right(tail, length(key) + 1) = '/' || key
                OR right(key, length(tail) + 1) = '/' || tail)
    FROM (SELECT array_to_string(s[COALESCE((SELECT max(i) FROM generate_subscripts(s, 1) AS i
                                             WHERE s[i] = '..'), 0) + 1:], '/') AS tail,
                 sexton.path_key($2) AS key
          FROM (SELECT array_remove(array_remove(string_to_array($1, '/'), ''), '.') AS s) segments
         ) parts
$$;

-- Loose paths are rare (hostile or broken rows): the check reads them through these.
CREATE INDEX IF NOT EXISTS output_files_loose ON output_files (relative_path)
    WHERE sexton.is_loose(relative_path);
CREATE INDEX IF NOT EXISTS attachments_live_loose ON attachments (relative_path)
    WHERE bytes_expired_at IS NULL AND sexton.is_loose(relative_path);
