//! The one way files leave the disk, for every job (EX-3, SS-6, TR-3, AT-1).
//!
//! A job records what is to go in `sexton.pending_file_deletions` — root, scope (the account,
//! or the nil uuid for a global job) and path — inside the transaction that removes the rows
//! owning it, so that a rolled-back owner leaves no record and its files are never touched.
//! [`drain`] then, after commit: makes those commits durable (a synchronous commit flushes the
//! WAL past them), removes each path under its root, and forgets the record. A crash in
//! between leaves the record for the next drain.
//!
//! A path is resolved below the root one component at a time, each directory opened without
//! following symlinks (`openat` with `O_NOFOLLOW`), and the last component removed relative to
//! its parent (`unlinkat`): no `..`, absolute path or symlink — file or directory — can lead
//! out of the root, whatever is swapped in on the way.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use sqlx::PgConnection;

mod drain;
pub mod object;
mod store;
pub mod tree;
mod under;
pub use drain::*;
pub use store::*;
pub use under::*;

use object::ObjectRoot;

/// The platform's file roots (SPEC §1.2); relative paths in the database resolve under them.
/// A root in an object store (OS-1) is in `objects`, its path field then the `s3://` URL as
/// given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathSettings {
    pub output_root: PathBuf,
    pub attachments_root: PathBuf,
    pub artifacts_root: PathBuf,
    pub sessions_root: PathBuf,
    pub traces_root: PathBuf,
    pub objects: Vec<(Root, Arc<ObjectRoot>)>,
}

impl PathSettings {
    /// Where `root`'s files are.
    pub fn store(&self, root: Root) -> Store {
        match self.objects.iter().find(|(r, _)| *r == root) {
            Some((_, objects)) => Store::Object(objects.clone()),
            None => Store::Local(root.path(self).to_owned()),
        }
    }
}

/// A root files are removed from. Generated artifacts have none: they are never removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Root {
    Outputs,
    Sessions,
    Attachments,
    Traces,
}

impl Root {
    /// The name stored in `sexton.pending_file_deletions.root`.
    pub fn as_str(self) -> &'static str {
        match self {
            Root::Outputs => "outputs",
            Root::Sessions => "sessions",
            Root::Attachments => "attachments",
            Root::Traces => "traces",
        }
    }

    /// Where this root is.
    pub fn path(self, paths: &PathSettings) -> &Path {
        match self {
            Root::Outputs => &paths.output_root,
            Root::Sessions => &paths.sessions_root,
            Root::Attachments => &paths.attachments_root,
            Root::Traces => &paths.traces_root,
        }
    }
}

/// What a drain removed and what it could not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FileCounts {
    /// Files unlinked (a directory's files each count).
    pub deleted: u64,
    /// Bytes of the files unlinked: what was actually removed, not what rows said.
    pub bytes: u64,
    /// Paths left in place: escaping the root, not a regular file, or not removable.
    pub errors: u64,
}

impl FileCounts {
    pub fn add(&mut self, other: FileCounts) {
        self.deleted += other.deleted;
        self.bytes += other.bytes;
        self.errors += other.errors;
    }
}

/// Why a drain stopped; the hop fails and is retried, the records stay.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    /// The root is gone or not a directory: nothing under it can be told apart from
    /// "already deleted", so nothing is forgotten (ER-3).
    #[error("file root {} cannot be opened: {source}", path.display())]
    Root {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The object store does not answer for the root (a bucket gone, credentials refused):
    /// nothing is forgotten, as with a missing directory (ER-3).
    #[error("file root {root} cannot be reached: {why}")]
    Store { root: String, why: String },
    /// The runtime shut down under the drain's unlinks.
    #[error("the drain was cancelled")]
    Cancelled,
}

/// Records a drain claims at once: one synchronous commit, one reference check and one
/// `DELETE` for each so many paths.
const BATCH: u64 = 500;

/// Paths recorded before a drain starts beside the hop that records them: enough that it is
/// not a synchronous commit per owner transaction (which cost about 10% at seed scale 10), few
/// enough that the hop's own last drain has little left (a scale-100 copy: 10.4 and 10.9 s
/// with 100, 11.4 and 12.1 s with 500, 10.7–14.1 s when the hop drained everything itself).
const BESIDE_AFTER: u64 = BATCH / 5;

/// How often a removal that failed for a reason that may pass (permissions, a busy file
/// system) — or never finished, its process dying during it — is tried, one drain after
/// another, before its record is quarantined: kept, counted and passed by (see [`quarantined`]).
pub const MAX_ATTEMPTS: i32 = 10;

impl Root {
    /// Whether a recorded path may name a directory, removed with what is in it: a session's
    /// frame directory may; an output file or an attachment is a file, never a tree.
    fn holds_directories(self) -> bool {
        matches!(self, Root::Sessions)
    }

    /// The statement behind [`Root::referenced`]: `$1` the paths, each returned when a surviving
    /// row references it; `None` for a root no row names a file of (traces).
    pub(crate) fn referenced_sql(self) -> Option<&'static str> {
        match self {
            Root::Outputs => Some(
                "SELECT p FROM unnest($1::text[]) p,
                 LATERAL (SELECT 1 FROM output_files o
                          WHERE sexton.path_key(o.relative_path) = sexton.path_key(p)
                          LIMIT 1) referencing
                 UNION
                 SELECT p FROM unnest($1::text[]) p
                 WHERE EXISTS (SELECT 1 FROM output_files o
                               WHERE sexton.is_loose(o.relative_path)
                                 AND sexton.may_name(o.relative_path, p))",
            ),
            Root::Sessions => Some(
                "SELECT p FROM unnest($1::text[]) p
                 WHERE EXISTS (SELECT 1 FROM sessions s
                               WHERE s.id = sexton.jsonb_uuid(to_jsonb(p)))",
            ),
            Root::Attachments => Some(
                "SELECT p FROM unnest($1::text[]) p,
                 LATERAL (SELECT 1 FROM attachments a
                          WHERE sexton.path_key(a.relative_path) = sexton.path_key(p)
                            AND sexton.attachment_live(a.bytes_expired_at)
                          LIMIT 1) referencing
                 UNION
                 SELECT p FROM unnest($1::text[]) p
                 WHERE EXISTS (SELECT 1 FROM attachments a
                               WHERE sexton.attachment_live(a.bytes_expired_at)
                                 AND sexton.is_loose(a.relative_path)
                                 AND sexton.may_name(a.relative_path, p))",
            ),
            Root::Traces => None,
        }
    }

    /// Which of `paths` a surviving row still references: those stay on disk (EX-3, SS-6).
    /// Each path is looked up in the spelling index on its own (a `LATERAL … LIMIT 1`): as a
    /// semi-join the planner, which prices the spelling function at nothing, hashed every
    /// output file's spelling instead, 34 ms for 200 paths at seed scale 10 against 5 ms. A
    /// surviving row whose path is loose (`..`, or absolute) keeps every file it could name
    /// (`sexton.may_name`), read through the partial index of such rows.
    pub(crate) async fn referenced(
        self,
        conn: &mut PgConnection,
        paths: &[String],
    ) -> Result<Vec<String>, sqlx::Error> {
        let Some(sql) = self.referenced_sql() else {
            return Ok(Vec::new());
        };
        sqlx::query_scalar(sql)
            .bind(paths)
            .fetch_all(&mut *conn)
            .await
    }
}

/// SQL: the accounts that have removals waiting in `root` that their next hop drains (FL-8's
/// discovery: such an account has something to do), one row each.
pub fn waiting_sql(root: Root) -> String {
    format!(
        "SELECT a.id FROM accounts a \
         WHERE a.id IN (SELECT w.account_id FROM sexton.pending_file_deletions w \
                        WHERE w.root = '{}' AND w.quarantined_at IS NULL)",
        root.as_str()
    )
}

/// Removals that failed, per root: retried by later drains, or quarantined after their last
/// attempt (what an operator must look at: `sexton.pending_file_deletions WHERE quarantined_at
/// IS NOT NULL`, with `last_error`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Failing {
    /// Failed at least once (a key the object store refused, a busy file system), waiting for
    /// the next drain.
    pub retrying: std::collections::BTreeMap<String, i64>,
    pub quarantined: std::collections::BTreeMap<String, i64>,
}

/// The removals that failed, per root (see [`Failing`]).
///
/// # Errors
/// A database error.
pub async fn failing<'e>(db: impl sqlx::PgExecutor<'e>) -> Result<Failing, sqlx::Error> {
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT root, count(*) FILTER (WHERE quarantined_at IS NULL),
                count(*) FILTER (WHERE quarantined_at IS NOT NULL)
         FROM sexton.pending_file_deletions
         WHERE last_error IS NOT NULL OR quarantined_at IS NOT NULL
         GROUP BY root",
    )
    .fetch_all(db)
    .await?;
    let mut failing = Failing::default();
    for (root, retrying, quarantined) in rows {
        for (counts, n) in [
            (&mut failing.retrying, retrying),
            (&mut failing.quarantined, quarantined),
        ] {
            if n > 0 {
                counts.insert(root.clone(), n);
            }
        }
    }
    Ok(failing)
}

/// Where a kind's hops remove files: the root, and how it is reached.
pub struct Removals {
    pub root: Root,
    pub store: Store,
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;

    use rustix::fs::{Mode, OFlags};

    use super::*;

    fn root() -> (tempfile::TempDir, OwnedFd) {
        let dir = tempfile::tempdir().unwrap();
        let fd = open_root(dir.path()).unwrap();
        (dir, fd)
    }

    #[test]
    fn ex3_paths_that_climb_out_or_are_absolute_are_refused() {
        let (_dir, fd) = root();
        for path in [
            "../etc/passwd",
            "/etc/passwd",
            "a/../../b",
            "",
            ".",
            "./",
            "//",
        ] {
            assert!(remove_under(&fd, path, true).is_err(), "{path}");
        }
    }

    #[test]
    fn ex3_empty_and_dot_segments_name_the_same_file() {
        let (dir, fd) = root();
        for path in ["./a/x.out", "a//x.out", "a/./x.out", "a/x.out/"] {
            std::fs::create_dir_all(dir.path().join("a")).unwrap();
            std::fs::write(dir.path().join("a/x.out"), b"12").unwrap();
            assert_eq!(remove_under(&fd, path, false).unwrap().deleted, 1, "{path}");
            assert!(!dir.path().join("a/x.out").exists(), "{path}");
        }
    }

    #[test]
    fn ex3_a_symlinked_directory_inside_the_root_is_never_followed() {
        let (dir, fd) = root();
        let elsewhere = tempfile::tempdir().unwrap();
        let secret = elsewhere.path().join("secret.txt");
        std::fs::write(&secret, b"keep").unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("evil")).unwrap();
        std::os::unix::fs::symlink(&secret, dir.path().join("link.txt")).unwrap();

        assert!(remove_under(&fd, "evil/secret.txt", false).is_err());
        assert!(remove_under(&fd, "link.txt", false).is_err());
        assert!(secret.exists(), "a file outside the root was deleted");
        assert!(dir.path().join("link.txt").symlink_metadata().is_ok());
        // The control: a real file inside the root goes.
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::fs::write(dir.path().join("real/out.bin"), b"12345").unwrap();
        assert_eq!(remove_under(&fd, "real/out.bin", false).unwrap().bytes, 5);
        assert!(!dir.path().join("real/out.bin").exists());
    }

    /// A chain of `depth` directories named `d` below `top`, with a file at every `every`-th
    /// level; made relative to open directories, as no path that long can be spelled.
    fn deep_tree(top: &Path, depth: usize, every: usize) -> u64 {
        std::fs::create_dir(top).unwrap();
        let mut dir = open_root(top).unwrap();
        let mut files = 0;
        for level in 0..depth {
            if level % every == 0 {
                let file = rustix::fs::openat(
                    &dir,
                    c"f",
                    OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                )
                .unwrap();
                rustix::io::write(&file, b"x").unwrap();
                files += 1;
            }
            rustix::fs::mkdirat(&dir, c"d", Mode::from_raw_mode(0o755)).unwrap();
            dir = open_directory(&dir, c"d").unwrap();
        }
        files
    }

    #[test]
    fn ss6_a_tree_of_any_depth_is_removed_without_recursion() {
        // In memory where the machine has it: a deep tree costs a disk file system about ten
        // times as much to make and remove (100,000 levels: 50 s for `rm -rf` on ext4 here).
        let dir = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let fd = open_root(dir.path()).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("keep.txt"), b"keep").unwrap();
        for depth in [8_000, 100_000] {
            let name = format!("s{depth}");
            let files = deep_tree(&dir.path().join(&name), depth, 1_000);
            std::os::unix::fs::symlink(elsewhere.path(), dir.path().join(&name).join("d/out"))
                .unwrap();
            // On a thread with a small stack: the depth of the tree must not matter.
            let removed = std::thread::scope(|scope| {
                std::thread::Builder::new()
                    .stack_size(256 * 1024)
                    .spawn_scoped(scope, || remove_under(&fd, &name, true))
                    .unwrap()
                    .join()
                    .unwrap()
            })
            .unwrap();
            assert_eq!((removed.deleted, removed.bytes), (files, files), "{depth}");
            assert!(!dir.path().join(&name).exists(), "{depth}");
        }
        assert!(elsewhere.path().join("keep.txt").exists());
    }

    #[test]
    fn ss6_a_directory_goes_with_its_files_and_counts_their_bytes() {
        let (dir, fd) = root();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("keep.txt"), b"keep").unwrap();
        let session = dir.path().join("s1/archive");
        std::fs::create_dir_all(&session).unwrap();
        std::fs::write(session.join("a.frame"), b"12345").unwrap();
        std::fs::write(session.join("b.frame"), b"678").unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), session.join("out")).unwrap();

        assert!(
            remove_under(&fd, "s1", false).is_err(),
            "a file's root never removes a tree"
        );
        assert!(session.join("a.frame").exists());
        let removed = remove_under(&fd, "s1", true).unwrap();
        assert_eq!((removed.deleted, removed.bytes), (2, 8));
        assert!(!dir.path().join("s1").exists());
        assert!(elsewhere.path().join("keep.txt").exists());
        assert_eq!(
            remove_under(&fd, "s1", true).unwrap(),
            FileCounts::default()
        );
    }
}
