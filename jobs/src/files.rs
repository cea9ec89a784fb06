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

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use serde::Serialize;
use sqlx::{Connection as _, PgConnection};
use tracing::Instrument as _;
use uuid::Uuid;

/// The platform's file roots (SPEC §1.2); relative paths in the database resolve under them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathSettings {
    pub output_root: PathBuf,
    pub attachments_root: PathBuf,
    pub artifacts_root: PathBuf,
    pub sessions_root: PathBuf,
    pub traces_root: PathBuf,
}

/// A root files are removed from. Generated artifacts have none: they are never removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
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

    /// Which of `paths` a surviving row still references: those stay on disk (EX-3, SS-6).
    async fn referenced(
        self,
        conn: &mut PgConnection,
        paths: &[String],
    ) -> Result<Vec<String>, sqlx::Error> {
        let sql = match self {
            Root::Outputs => {
                "SELECT p FROM unnest($1::text[]) p
                 WHERE EXISTS (SELECT 1 FROM output_files o
                               WHERE sexton.path_key(o.relative_path) = sexton.path_key(p))"
            }
            Root::Sessions => {
                "SELECT p FROM unnest($1::text[]) p
                 WHERE EXISTS (SELECT 1 FROM sessions s
                               WHERE s.id = sexton.jsonb_uuid(to_jsonb(p)))"
            }
            Root::Attachments => {
                "SELECT p FROM unnest($1::text[]) p
                 WHERE EXISTS (SELECT 1 FROM attachments a
                               WHERE sexton.path_key(a.relative_path) = sexton.path_key(p)
                                 AND a.bytes_expired_at IS NULL)"
            }
            Root::Traces => return Ok(Vec::new()),
        };
        sqlx::query_scalar(sql)
            .bind(paths)
            .fetch_all(&mut *conn)
            .await
    }
}

/// SQL: whether the account `account` (an SQL expression) has removals waiting in `root` that
/// its next hop drains (FL-8's discovery: such an account has something to do).
pub fn waiting_sql(root: Root, account: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM sexton.pending_file_deletions w \
                 WHERE w.root = '{}' AND w.account_id = {account} AND w.quarantined_at IS NULL)",
        root.as_str()
    )
}

/// Removes the paths recorded under `root` (found at `root_path`) for `scope` (an account, or
/// `None` for a global job). Before anything is unlinked, a synchronous commit that writes
/// (counting the attempt) makes durable every commit that recorded these paths; a path a
/// surviving row still references (under any spelling of it) stays. A record is forgotten once
/// its path is gone, refused (outside the root, not of the root's kind) or still referenced; a
/// removal that failed otherwise is tried again by later drains, [`MAX_ATTEMPTS`] times in all,
/// and then quarantined — as is a record claimed that often whose removal never reported back
/// (its process died during it), without trying it again. The
/// caller guarantees that no other drain of the same root and scope runs at the same time
/// (the scope lock). Dropped midway (its hop failed or was cancelled), a drain also stops its
/// unlinks, which run on a thread of their own, after the one in progress.
///
/// # Errors
/// [`DrainError`] when the database fails or the root cannot be opened; what was not yet
/// removed stays recorded.
pub async fn drain(
    conn: &mut PgConnection,
    root: Root,
    root_path: &Path,
    scope: Option<Uuid>,
) -> Result<FileCounts, DrainError> {
    Ok(drain_from(conn, root, root_path, scope, 0).await?.0)
}

/// [`drain`] of the records after id `after` only, for a hop that drains more than once: with
/// it, each of its drains takes up where the last left off, and a removal that keeps failing is
/// tried once per hop, not once per drain. Returns the last id claimed (`after` if none).
///
/// # Errors
/// As [`drain`].
pub async fn drain_from(
    conn: &mut PgConnection,
    root: Root,
    root_path: &Path,
    scope: Option<Uuid>,
    after: i64,
) -> Result<(FileCounts, i64), DrainError> {
    drain_until(conn, root, root_path, scope, after, &Arc::default()).await
}

/// [`drain_from`] that also ends, after the unlink in progress, once `stop` is raised; it
/// raises `stop` itself when dropped or done.
async fn drain_until(
    conn: &mut PgConnection,
    root: Root,
    root_path: &Path,
    scope: Option<Uuid>,
    mut after: i64,
    stop: &Arc<AtomicBool>,
) -> Result<(FileCounts, i64), DrainError> {
    let _stop = RaiseOnDrop(stop.clone());
    let mut counts = FileCounts::default();
    loop {
        let batch: Vec<(i64, String, i32)> = {
            let mut tx = conn
                .begin_with("BEGIN; SET LOCAL synchronous_commit = on")
                .await?;
            let batch = sqlx::query_as(
                "UPDATE sexton.pending_file_deletions SET attempts = attempts + 1
                 WHERE id IN (SELECT id FROM sexton.pending_file_deletions
                              WHERE root = $1 AND account_id = $2 AND id > $3
                                AND quarantined_at IS NULL
                              ORDER BY id LIMIT $4)
                 RETURNING id, relative_path, attempts",
            )
            .bind(root.as_str())
            .bind(scope.unwrap_or_default())
            .bind(after)
            .bind(BATCH as i64)
            .fetch_all(&mut *tx)
            .await?;
            tx.commit().await?;
            batch
        };
        let Some(last) = batch.iter().map(|(id, _, _)| *id).max() else {
            return Ok((counts, after));
        };
        after = last;
        let paths: Vec<String> = batch.iter().map(|(_, p, _)| p.clone()).collect();
        let referenced = root.referenced(conn, &paths).await?;
        let dir = open_root(root_path).map_err(|source| DrainError::Root {
            path: root_path.to_owned(),
            source,
        })?;
        // The unlinks block: on a thread of their own, so that the runtime's threads go on
        // serving the hops and drains beside this one.
        let unlinks = tokio::task::spawn_blocking({
            let (stop, span) = (stop.clone(), tracing::Span::current());
            move || span.in_scope(|| remove_batch(root, &dir, &batch, &referenced, &stop))
        });
        let removed = joined(unlinks.await)?;
        counts.add(removed.counts);
        conclude(conn, &removed).await?;
        if stop.load(Ordering::Relaxed) {
            return Ok((counts, after));
        }
    }
}

/// Raises its flag when dropped.
struct RaiseOnDrop(Arc<AtomicBool>);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A task's result; its panic goes on in the caller.
fn joined<T>(result: Result<T, tokio::task::JoinError>) -> Result<T, DrainError> {
    match result {
        Ok(value) => Ok(value),
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        Err(_) => Err(DrainError::Cancelled),
    }
}

/// A [`drain`] beside the hop that records the paths, so that its unlinks and its synchronous
/// commits overlap the hop's own transactions: one drain at a time, on a connection of its own
/// from `pool` (a job using it declares a second connection, `Job::CONNECTIONS`). The hop
/// tells it how many paths each of its transactions may have recorded
/// ([`recorded`](Self::recorded)); once [`BESIDE_AFTER`] may be waiting and no drain is running,
/// it starts one, which drains what is committed by then and stops when it has caught up. Each
/// drain takes up after the last record the one before claimed. Whatever they have not reached,
/// the hop's own last drain takes, from where [`finish`](Self::finish) says they stopped.
/// Dropped before that (the hop failed or was cancelled), it stops the running drain's unlinks
/// after the one in progress and aborts the drain.
pub struct Beside {
    pool: sqlx::PgPool,
    root: Root,
    root_path: PathBuf,
    scope: Option<Uuid>,
    running: Option<Running>,
    /// The last record id a drain of this hop claimed.
    after: i64,
    /// Paths recorded since the running drain started, at most.
    waiting: u64,
    counts: FileCounts,
}

struct Running {
    task: tokio::task::JoinHandle<Result<(FileCounts, i64), DrainError>>,
    stop: Arc<AtomicBool>,
}

impl Beside {
    /// For the hop's drains after the one that claimed up to id `after`.
    pub fn new(
        pool: &sqlx::PgPool,
        root: Root,
        root_path: &Path,
        scope: Option<Uuid>,
        after: i64,
    ) -> Self {
        Self {
            pool: pool.clone(),
            root,
            root_path: root_path.to_owned(),
            scope,
            running: None,
            after,
            waiting: 0,
            counts: FileCounts::default(),
        }
    }

    /// Counts up to `paths` more recorded by a committed transaction (each output row it
    /// deleted records at most its path); starts a drain when [`BESIDE_AFTER`] may be waiting
    /// and none is running.
    ///
    /// # Errors
    /// The [`DrainError`] of a drain that finished since.
    pub async fn recorded(&mut self, paths: u64) -> Result<(), DrainError> {
        self.waiting += paths;
        let busy = self
            .running
            .as_ref()
            .is_some_and(|running| !running.task.is_finished());
        if self.waiting < BESIDE_AFTER || busy {
            return Ok(());
        }
        self.collect().await?;
        self.waiting = 0;
        let (pool, root, root_path, scope, after) = (
            self.pool.clone(),
            self.root,
            self.root_path.clone(),
            self.scope,
            self.after,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let drain = {
            let stop = stop.clone();
            async move {
                let mut conn = pool.acquire().await?;
                drain_until(&mut conn, root, &root_path, scope, after, &stop).await
            }
        };
        self.running = Some(Running {
            task: tokio::spawn(drain.in_current_span()),
            stop,
        });
        Ok(())
    }

    /// Waits for the running drain; what every drain of this hop removed, and the last record
    /// id they claimed, after which the hop's last drain goes on.
    ///
    /// # Errors
    /// The first [`DrainError`] of a drain not yet collected.
    pub async fn finish(mut self) -> Result<(FileCounts, i64), DrainError> {
        self.collect().await?;
        Ok((self.counts, self.after))
    }

    async fn collect(&mut self) -> Result<(), DrainError> {
        if let Some(running) = self.running.as_mut() {
            // Awaited in place: cancelled meanwhile, the drain is still there for `drop`.
            let result = (&mut running.task).await;
            self.running = None;
            let (counts, after) = joined(result)??;
            self.counts.add(counts);
            self.after = self.after.max(after);
        }
        Ok(())
    }
}

impl Drop for Beside {
    fn drop(&mut self) {
        if let Some(running) = &self.running {
            running.stop.store(true, Ordering::Relaxed);
            running.task.abort();
        }
    }
}

/// What became of one claimed batch's records.
#[derive(Debug, Default)]
struct Removed {
    counts: FileCounts,
    /// Gone, refused or still referenced: the record is deleted.
    forget: Vec<i64>,
    /// Failed on its last attempt, or claimed past it: kept aside, with why.
    quarantine: Vec<(i64, String)>,
    /// Failed, to be tried again: why, for people.
    failed: Vec<(i64, String)>,
}

/// Writes down what became of a batch's records (see [`drain`]).
async fn conclude(conn: &mut PgConnection, removed: &Removed) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM sexton.pending_file_deletions WHERE id = ANY($1)")
        .bind(&removed.forget)
        .execute(&mut *conn)
        .await?;
    for (records, quarantine) in [(&removed.quarantine, true), (&removed.failed, false)] {
        if records.is_empty() {
            continue;
        }
        let (ids, errors): (Vec<i64>, Vec<&str>) =
            records.iter().map(|(id, e)| (*id, e.as_str())).unzip();
        sqlx::query(
            "UPDATE sexton.pending_file_deletions p
             SET last_error = e.error,
                 quarantined_at = CASE WHEN $3 THEN now() END
             FROM unnest($1::bigint[], $2::text[]) AS e (id, error)
             WHERE p.id = e.id",
        )
        .bind(&ids)
        .bind(&errors)
        .bind(quarantine)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Removes the paths of one claimed `batch` (id, path, attempts) below the open root `dir`,
/// except those `referenced`, until `stop` is raised (see [`drain`]).
fn remove_batch(
    root: Root,
    dir: &OwnedFd,
    batch: &[(i64, String, i32)],
    referenced: &[String],
    stop: &AtomicBool,
) -> Removed {
    let mut removed = Removed::default();
    for (id, relative, attempts) in batch {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if referenced.contains(relative) {
            removed.forget.push(*id);
            continue;
        }
        if *attempts > MAX_ATTEMPTS {
            // Claimed that often without ever reporting back: each try ended the process that
            // made it. Never again (ER-3).
            removed.counts.errors += 1;
            let why = format!(
                "claimed {} times without a result: each removal ended its process",
                attempts - 1
            );
            tracing::error!(root = root.as_str(), path = %relative, attempts, "file quarantined: {why}");
            removed.quarantine.push((*id, why));
            continue;
        }
        match remove_under(dir, relative, root.holds_directories()) {
            Ok(counts) => {
                removed.counts.add(counts);
                removed.forget.push(*id);
            }
            Err(err) => {
                removed.counts.errors += 1;
                let refused = err.kind() == io::ErrorKind::InvalidInput;
                let last = *attempts >= MAX_ATTEMPTS;
                tracing::warn!(
                    root = root.as_str(), path = %relative, error = %err, attempts,
                    refused, quarantined = !refused && last,
                    "file not deleted"
                );
                if refused {
                    removed.forget.push(*id);
                } else if last {
                    removed.quarantine.push((*id, err.to_string()));
                } else {
                    removed.failed.push((*id, err.to_string()));
                }
            }
        }
    }
    removed
}

/// Records quarantined after their last attempt, per root: what an operator must look at
/// (`sexton.pending_file_deletions WHERE quarantined_at IS NOT NULL`, with `last_error`).
///
/// # Errors
/// A database error.
pub async fn quarantined<'e>(
    db: impl sqlx::PgExecutor<'e>,
) -> Result<std::collections::BTreeMap<String, i64>, sqlx::Error> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT root, count(*) FROM sexton.pending_file_deletions
         WHERE quarantined_at IS NOT NULL GROUP BY root",
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Opens a root directory (the root itself may be a symlink: the operator configured it).
pub fn open_root(root: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

fn escape(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why.to_owned())
}

/// Removes `relative` below the open root `root`: a regular file, or — where `directories`
/// — a directory with everything in it. A path that is already gone removes nothing.
///
/// # Errors
/// `InvalidInput` when the path is absolute, climbs with `..` or names the root (empty and `.`
/// segments are dropped: `a//x` is `a/x`), passes through a symlink or a non-directory, or
/// names something that is not a regular file (or, where allowed, a directory); any other I/O
/// error of the removal.
pub fn remove_under(root: &OwnedFd, relative: &str, directories: bool) -> io::Result<FileCounts> {
    match open_parent(root, relative)? {
        Some((dir, last)) => {
            let parent = dir.as_ref().map_or(root.as_fd(), |d| d.as_fd());
            remove_entry(parent, last, directories)
        }
        None => Ok(FileCounts::default()),
    }
}

/// What is at `relative` below the open root, without following a symlink anywhere on the way
/// (the last component included: a symlink is reported as one); `None` when it does not exist.
///
/// # Errors
/// As [`remove_under`]: `InvalidInput` for a path that is not canonical or passes through a
/// symlink or a non-directory; any other I/O error.
pub fn stat_under(root: &OwnedFd, relative: &str) -> io::Result<Option<rustix::fs::Stat>> {
    let Some((dir, last)) = open_parent(root, relative)? else {
        return Ok(None);
    };
    let parent = dir.as_ref().map_or(root.as_fd(), |d| d.as_fd());
    match rustix::fs::statat(parent, last, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(stat)),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// The directory holding `relative`'s last component, opened one component at a time without
/// following a symlink (`None`: the root itself), and that component; `Ok(None)` when a
/// directory on the way does not exist.
fn open_parent<'p>(
    root: &OwnedFd,
    relative: &'p str,
) -> io::Result<Option<(Option<OwnedFd>, &'p str)>> {
    if relative.starts_with('/') {
        return Err(escape("path is absolute"));
    }
    // `a//x` and `a/./x` name `a/x`; the still-referenced check compares the same key
    // (`sexton.path_key`). `..` is never resolved.
    let names: Vec<&str> = relative
        .split('/')
        .filter(|name| !name.is_empty() && *name != ".")
        .collect();
    if names
        .iter()
        .any(|name| *name == ".." || name.contains('\0'))
    {
        return Err(escape("path climbs with `..` or holds a NUL"));
    }
    let Some((last, parents)) = names.split_last() else {
        return Err(escape("path names the root itself"));
    };
    let mut dir: Option<OwnedFd> = None;
    for name in parents {
        let parent = dir.as_ref().map_or(root.as_fd(), |d| d.as_fd());
        match rustix::fs::openat(
            parent,
            *name,
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(next) => dir = Some(next),
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
                return Err(escape("a symlink or non-directory lies on the path"));
            }
            Err(err) => return Err(err.into()),
        }
    }
    Ok(Some((dir, *last)))
}

/// Removes the entry `name` of the open directory `parent` without following a symlink.
fn remove_entry(
    parent: impl AsFd,
    name: impl rustix::path::Arg + Copy,
    directories: bool,
) -> io::Result<FileCounts> {
    let stat = match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(rustix::io::Errno::NOENT) => return Ok(FileCounts::default()),
        Err(err) => return Err(err.into()),
    };
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => {
            rustix::fs::unlinkat(&parent, name, AtFlags::empty())?;
            Ok(FileCounts {
                deleted: 1,
                bytes: stat.st_size.max(0) as u64,
                errors: 0,
            })
        }
        FileType::Directory if directories => remove_tree(parent, &name.into_c_str()?),
        FileType::Directory => Err(escape("a directory where a file was expected")),
        _ => Err(escape("not a regular file or directory")),
    }
}

/// Removes a directory and everything in it, however deep, without recursion: what is left to
/// visit is a list of levels, each holding the names of its subdirectories not yet removed, and
/// one directory is open at a time. The way back up is `..`, checked to be the very directory
/// it came from (device and inode): a subtree moved elsewhere meanwhile is never followed out,
/// the removal stops instead (the record is tried again). Inside the tree a symlink is unlinked
/// itself, never followed.
fn remove_tree(parent: impl AsFd, name: &CStr) -> io::Result<FileCounts> {
    struct Level {
        id: (u64, u64),
        name: CString,
        subdirectories: Vec<CString>,
    }
    let mut counts = FileCounts::default();
    let mut dir = open_directory(&parent, name)?;
    let mut levels = vec![Level {
        id: identity(&dir)?,
        name: name.to_owned(),
        subdirectories: clear(&dir, &mut counts)?,
    }];
    loop {
        let next = levels
            .last_mut()
            .and_then(|level| level.subdirectories.pop());
        if let Some(child) = next {
            match open_directory(&dir, &child) {
                Ok(opened) => {
                    let subdirectories = clear(&opened, &mut counts)?;
                    levels.push(Level {
                        id: identity(&opened)?,
                        name: child,
                        subdirectories,
                    });
                    dir = opened;
                }
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                // Swapped for a symlink or a file since it was read: removed as what it is now.
                Err(err) if is_not_a_directory(&err) => {
                    if let Some(removed) = remove_leaf(&dir, &child)? {
                        counts.add(removed);
                    }
                }
                Err(err) => return Err(err),
            }
            continue;
        }
        let done = levels.pop().expect("a level is open while the loop runs");
        let Some(above) = levels.last() else {
            drop(dir);
            rustix::fs::unlinkat(&parent, done.name.as_c_str(), AtFlags::REMOVEDIR)?;
            return Ok(counts);
        };
        let up = open_directory(&dir, c"..")?;
        if identity(&up)? != above.id {
            return Err(io::Error::other(
                "a directory was moved while its tree was removed; left for the next drain",
            ));
        }
        rustix::fs::unlinkat(&up, done.name.as_c_str(), AtFlags::REMOVEDIR)?;
        dir = up;
    }
}

/// Opens the directory `name` of `parent` without following a symlink.
fn open_directory(parent: impl AsFd, name: &CStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        parent,
        name,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The device and inode of an open file: which directory it is, wherever it has moved.
fn identity(fd: &OwnedFd) -> io::Result<(u64, u64)> {
    let stat = rustix::fs::fstat(fd)?;
    Ok((stat.st_dev, stat.st_ino))
}

fn is_not_a_directory(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error().map(rustix::io::Errno::from_raw_os_error),
        Some(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR)
    )
}

/// Removes everything in the open directory `dir` that is not a directory; returns the names of
/// its subdirectories, to be visited.
fn clear(dir: &OwnedFd, counts: &mut FileCounts) -> io::Result<Vec<CString>> {
    let entries: Vec<(CString, FileType)> = Dir::read_from(dir)?
        .filter_map(|entry| entry.ok())
        .filter(|entry| !is_dot(entry.file_name()))
        .map(|entry| (entry.file_name().to_owned(), entry.file_type()))
        .collect();
    let mut subdirectories = Vec::new();
    for (child, kind) in entries {
        match kind {
            FileType::Directory => subdirectories.push(child),
            FileType::Symlink => rustix::fs::unlinkat(dir, child.as_c_str(), AtFlags::empty())?,
            _ => match remove_leaf(dir, &child)? {
                Some(removed) => counts.add(removed),
                None => subdirectories.push(child),
            },
        }
    }
    Ok(subdirectories)
}

/// Removes the entry `name` of `dir` unless it is a directory (`None`): a regular file counted
/// with its bytes, anything else (a symlink, a socket, a FIFO) unlinked itself.
fn remove_leaf(dir: &OwnedFd, name: &CStr) -> io::Result<Option<FileCounts>> {
    let stat = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(rustix::io::Errno::NOENT) => return Ok(Some(FileCounts::default())),
        Err(err) => return Err(err.into()),
    };
    let kind = FileType::from_raw_mode(stat.st_mode);
    if kind == FileType::Directory {
        return Ok(None);
    }
    rustix::fs::unlinkat(dir, name, AtFlags::empty())?;
    Ok(Some(if kind == FileType::RegularFile {
        FileCounts {
            deleted: 1,
            bytes: stat.st_size.max(0) as u64,
            errors: 0,
        }
    } else {
        FileCounts::default()
    }))
}

fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

#[cfg(test)]
mod tests {
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
