//! Local roots (DC-4): walked with [`crate::files::tree`] from the root's descriptor (no
//! symlink followed, nothing outside the root), entries judged in batches, and — confirmed —
//! each batch asked about again and each entry looked at again, inside one transaction through
//! the hold gate, just before its unlink (DC-2).

use std::ffi::{CStr, CString};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Stat};
use sqlx::PgConnection;

use crate::files::tree::{Look, Looked, Step, Tree, open_dir_at};
use crate::files::{Root, open_root, remove_under, stat_under};

use super::judge::{self, Kind, Subject};
use super::scan::{Ctx, kinds};
use super::walk::{File, Files, Top, mtime_ns, seen, walk};
use super::{BATCH, Error, MAX_DEPTH, RootCounts};

/// What a directory held when it was judged: its files, their bytes, every entry, and the
/// newest modification of anything in it (itself and its subdirectories included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Summary {
    files: u64,
    bytes: u64,
    entries: u64,
    newest_ns: i128,
    /// Every directory in it was read: none too deep, none that could not be opened.
    whole: bool,
}

/// The directories at the top of a root named by a UUID (a session's, an agent's).
struct Named;

impl Look for Named {
    type Found = uuid::Uuid;

    fn look(
        &self,
        _dir: &OwnedFd,
        name: &CStr,
        _relative: &[u8],
        stat: Result<Stat, rustix::io::Errno>,
    ) -> Looked<uuid::Uuid> {
        match (stat, judge::uuid_named(name.to_bytes())) {
            (Ok(stat), Some(id))
                if FileType::from_raw_mode(stat.st_mode) == FileType::Directory =>
            {
                Looked::Found(id)
            }
            _ => Looked::Skip,
        }
    }
}

/// Everything in a directory, each entry's size (a regular file's) and time.
struct Everything;

impl Look for Everything {
    type Found = Option<(bool, u64, i128)>;

    fn look(
        &self,
        _dir: &OwnedFd,
        _name: &CStr,
        _relative: &[u8],
        stat: Result<Stat, rustix::io::Errno>,
    ) -> Looked<Self::Found> {
        match stat {
            Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Directory => {
                Looked::Descend
            }
            Ok(stat) => {
                let regular = FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile;
                Looked::Found(Some((regular, stat.st_size.max(0) as u64, mtime_ns(&stat))))
            }
            // Unreadable: the directory cannot be judged whole.
            Err(_) => Looked::Found(None),
        }
    }
}

/// Sums up the directory `name` of `parent` (see [`Summary`]); `None` when it is gone or no
/// longer a directory.
fn summarise(parent: &OwnedFd, name: &CStr) -> Option<Summary> {
    let dir = open_dir_at(parent, name).ok()?;
    let top = rustix::fs::fstat(&dir).ok()?;
    let mut summary = Summary {
        newest_ns: mtime_ns(&top),
        whole: true,
        ..Summary::default()
    };
    // A directory deeper than a walk goes is seen, never read: the summary is then partial.
    let mut tree = Tree::new(dir, Vec::new(), MAX_DEPTH, Everything).ok()?;
    while let Some(step) = tree.next_step() {
        match step {
            Step::Entry(_, Some((regular, size, time))) => {
                summary.entries += 1;
                if regular {
                    summary.files += 1;
                    summary.bytes += size;
                }
                summary.newest_ns = summary.newest_ns.max(time);
            }
            Step::Entry(_, None) => summary.whole = false,
            Step::DirDone(fd) => match rustix::fs::fstat(&*fd) {
                Ok(stat) => summary.newest_ns = summary.newest_ns.max(mtime_ns(&stat)),
                Err(_) => summary.whole = false,
            },
        }
    }
    summary.whole &= tree.whole();
    Some(summary)
}

/// Scans the local root at `path` into `ctx` (see [`super::Scan::run`]).
///
/// # Errors
/// A database error.
pub(super) async fn scan_root(ctx: &mut Ctx<'_>, path: &Path) -> Result<(), Error> {
    let problem = match std::fs::metadata(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Some(("missing", err)),
        Err(err) => Some(("unreadable", err)),
        Ok(meta) if !meta.is_dir() => {
            Some(("not_directory", std::io::Error::other("not a directory")))
        }
        Ok(_) => None,
    };
    let opened = match problem {
        Some(problem) => Err(problem),
        None => open_root(path)
            .and_then(|fd| Ok((fd.try_clone()?, fd)))
            .map_err(|err| ("unreadable", err)),
    };
    let (walked, root) = match opened {
        Ok(fds) => fds,
        Err((state, err)) => {
            tracing::warn!(root = ctx.root.as_str(), path = %path.display(), error = %err, "orphans: root not scanned");
            ctx.counts.state = state;
            ctx.counts.error = Some(format!("{}: {err}", path.display()));
            return Ok(());
        }
    };
    let kind = kinds(ctx.root);
    let depth = if matches!(kind, Kind::SessionDir | Kind::TraceDir) {
        1
    } else {
        MAX_DEPTH
    };
    let result = match kind {
        Kind::SessionDir | Kind::TraceDir => {
            Tree::new(walked, Vec::new(), depth, Named).map(Walk::Directories)
        }
        _ => Tree::new(walked, Vec::new(), 1, Top).map(Walk::Files),
    };
    match result {
        Ok(Walk::Files(tree)) => files(ctx, kind, tree).await,
        Ok(Walk::Directories(tree)) => directories(ctx, kind, &root, tree).await,
        Err(err) => {
            ctx.counts.state = "unreadable";
            ctx.counts.error = Some(format!("{}: {err}", path.display()));
            Ok(())
        }
    }
}

enum Walk {
    Files(Tree<Top>),
    Directories(Tree<Named>),
}

/// The files of an outputs or attachments root, a batch at a time as [`walk`] hands them over,
/// each judged, and removed, as one.
async fn files(ctx: &mut Ctx<'_>, kind: Kind, top: Tree<Top>) -> Result<(), Error> {
    let (batches, mut walked) = tokio::sync::mpsc::channel::<Vec<File>>(1);
    let walkers = tokio::task::spawn_blocking(move || walk(top, &batches));
    while let Some(batch) = walked.recv().await {
        judge_files(ctx, kind, batch).await?;
        if ctx.stopped() {
            break;
        }
    }
    // The walkers end at their next batch once nothing takes it.
    drop(walked);
    let _ = walkers.await;
    Ok(())
}

fn file_subject(file: &File) -> Subject {
    Subject {
        text: String::from_utf8(file.path.clone()).ok(),
        id: None,
        ids: judge::ids_in(&file.path),
    }
}

/// Judges a batch of files (DC-1, DC-2), lists the orphans and, confirmed, removes them.
async fn judge_files(ctx: &mut Ctx<'_>, kind: Kind, batch: Vec<File>) -> Result<(), Error> {
    let subjects: Vec<Subject> = batch.iter().map(file_subject).collect();
    let named = judge::named(ctx.conn, kind, &subjects).await?;
    let orphans: Vec<File> = batch
        .into_iter()
        .zip(named)
        .filter_map(|(file, named)| (!named).then_some(file))
        .collect();
    let orphans = young_and_held(ctx, kind, orphans, file_subject, |f| f.seen.mtime_ns).await?;
    for file in &orphans {
        ctx.list(
            &file.path,
            false,
            file.seen.size.max(0) as u64,
            file.seen.mtime_ns,
        );
    }
    if !ctx.confirm || orphans.is_empty() {
        return Ok(());
    }
    let mut tx = crate::gate::begin(ctx.conn, "").await?;
    let orphans = asked_again(&mut tx, ctx.counts, kind, orphans, file_subject).await?;
    for file in orphans {
        let now = rustix::fs::statat(&*file.dir, file.name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW);
        let unchanged = now.as_ref().is_ok_and(|stat| {
            FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile
                && seen(stat) == file.seen
        });
        if !unchanged {
            ctx.counts.count("changed", 1);
            continue;
        }
        match rustix::fs::unlinkat(&*file.dir, file.name.as_c_str(), AtFlags::empty()) {
            Ok(()) => {
                ctx.counts.gone += 1;
                ctx.counts.removed.deleted += 1;
                ctx.counts.removed.bytes += file.seen.size.max(0) as u64;
            }
            Err(err) => unremovable(ctx.counts, ctx.root, &file.path, &err.to_string()),
        }
    }
    Ok(tx.commit().await?)
}

/// A removal that failed: counted and reported, the scan goes on (ER-3).
pub(super) fn unremovable(counts: &mut RootCounts, root: Root, path: &[u8], why: &str) {
    counts.removed.errors += 1;
    tracing::warn!(
        root = root.as_str(), path = %crate::shown::Shown(&String::from_utf8_lossy(path)),
        error = %why, "orphan not removed"
    );
}

/// Of `orphans`, those old enough and held by nothing, the others counted (`grace`,
/// `legal_hold`).
pub(super) async fn young_and_held<T>(
    ctx: &mut Ctx<'_>,
    kind: Kind,
    orphans: Vec<T>,
    subject: impl Fn(&T) -> Subject,
    time: impl Fn(&T) -> i128,
) -> Result<Vec<T>, Error> {
    ctx.counts.count("no_row", orphans.len() as u64);
    let (old, young): (Vec<T>, Vec<T>) = orphans
        .into_iter()
        .partition(|orphan| time(orphan) < ctx.cutoff_ns);
    ctx.counts.count("grace", young.len() as u64);
    let subjects: Vec<Subject> = old.iter().map(&subject).collect();
    let held = judge::held(ctx.conn, kind, &subjects).await?;
    let mut free = Vec::with_capacity(old.len());
    for (orphan, held) in old.into_iter().zip(held) {
        if held {
            ctx.counts.count("legal_hold", 1);
        } else {
            free.push(orphan);
        }
    }
    Ok(free)
}

/// Of `orphans`, asked about again on `conn` — the transaction through the hold gate in which
/// they are then removed (HD-3: a hold placed meanwhile waits for it, or is seen by it) — those
/// no row names now (else `row_appeared`) and no hold keeps now (else `legal_hold`).
pub(super) async fn asked_again<T>(
    conn: &mut PgConnection,
    counts: &mut RootCounts,
    kind: Kind,
    orphans: Vec<T>,
    subject: impl Fn(&T) -> Subject,
) -> Result<Vec<T>, Error> {
    let subjects: Vec<Subject> = orphans.iter().map(&subject).collect();
    let named = judge::named(&mut *conn, kind, &subjects).await?;
    let held = judge::held(conn, kind, &subjects).await?;
    let mut going = Vec::with_capacity(orphans.len());
    for ((orphan, named), held) in orphans.into_iter().zip(named).zip(held) {
        if named {
            counts.count("row_appeared", 1);
        } else if held {
            counts.count("legal_hold", 1);
        } else {
            going.push(orphan);
        }
    }
    Ok(going)
}

/// A directory at the top of a sessions or traces root whose owner row is gone.
struct Directory {
    id: uuid::Uuid,
    summary: Summary,
}

fn directory_subject(dir: &Directory) -> Subject {
    Subject {
        text: Some(dir.id.to_string()),
        id: Some(dir.id),
        ids: vec![dir.id],
    }
}

/// The directories at the top of a sessions or traces root, a batch at a time; an existing
/// session's frames too.
async fn directories(
    ctx: &mut Ctx<'_>,
    kind: Kind,
    root: &OwnedFd,
    mut tree: Tree<Named>,
) -> Result<(), Error> {
    let mut frames = super::frames::Frames::default();
    let mut batch = Vec::new();
    loop {
        let step = tree.next_step();
        if let Some(Step::Entry(_, id)) = step {
            batch.push(id);
        }
        if batch.len() >= BATCH || (step.is_none() && !batch.is_empty()) {
            let ids = std::mem::take(&mut batch);
            judge_directories(ctx, kind, root, &ids).await?;
            if kind == Kind::SessionDir {
                for session in judge::sessions(ctx.conn, &ids).await? {
                    frames.of_session(ctx, root, session).await?;
                }
            }
            if ctx.stopped() {
                return Ok(());
            }
        }
        if step.is_none() {
            return frames.finish(ctx, root).await;
        }
    }
}

/// Judges the directories named `ids` (DC-1, DC-2): those whose row is gone, every entry in
/// them older than the grace and held by nothing, are listed and, confirmed, removed whole.
async fn judge_directories(
    ctx: &mut Ctx<'_>,
    kind: Kind,
    root: &OwnedFd,
    ids: &[uuid::Uuid],
) -> Result<(), Error> {
    let subjects: Vec<Subject> = ids
        .iter()
        .map(|id| Subject {
            text: Some(id.to_string()),
            id: Some(*id),
            ids: vec![*id],
        })
        .collect();
    let named = judge::named(ctx.conn, kind, &subjects).await?;
    let mut gone: Vec<Directory> = Vec::new();
    for (id, named) in ids.iter().zip(named) {
        let Some(summary) = (!named)
            .then(|| CString::new(id.to_string()).ok())
            .flatten()
            .and_then(|name| summarise(root, &name))
        else {
            continue;
        };
        if summary.whole {
            gone.push(Directory { id: *id, summary });
        } else {
            // Nothing can say everything in it is older than the grace: it stays, counted.
            let why = "not every directory in it could be read (deeper than the walk goes, or \
                       unreadable): left whole";
            unremovable(ctx.counts, ctx.root, id.to_string().as_bytes(), why);
        }
    }
    let gone = young_and_held(ctx, kind, gone, directory_subject, |d| d.summary.newest_ns).await?;
    for dir in &gone {
        ctx.list(
            dir.id.to_string().as_bytes(),
            true,
            dir.summary.bytes,
            dir.summary.newest_ns,
        );
    }
    if !ctx.confirm || gone.is_empty() {
        return Ok(());
    }
    let mut tx = crate::gate::begin(ctx.conn, "").await?;
    let gone = asked_again(&mut tx, ctx.counts, kind, gone, directory_subject).await?;
    for dir in gone {
        let name = dir.id.to_string();
        let Ok(c_name) = CString::new(name.clone()) else {
            continue;
        };
        let now = summarise(root, &c_name);
        if now != Some(dir.summary) {
            ctx.counts.count("changed", 1);
            continue;
        }
        match remove_under(root, &name, true) {
            Ok(removed) => {
                ctx.counts.gone += 1;
                ctx.counts.removed.add(removed);
            }
            Err(err) => unremovable(ctx.counts, ctx.root, name.as_bytes(), &err.to_string()),
        }
    }
    Ok(tx.commit().await?)
}

/// A frame under `<session>/archive/` (see [`super::frames`]), looked at again and removed.
pub(super) fn remove_frame(
    root: &OwnedFd,
    path: &str,
    judged: (u64, i64, i128),
) -> Result<bool, String> {
    match stat_under(root, path) {
        Ok(Some(stat))
            if FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile
                && (stat.st_ino, stat.st_size, mtime_ns(&stat)) == judged =>
        {
            remove_under(root, path, false)
                .map(|_| true)
                .map_err(|err| err.to_string())
        }
        Ok(_) => Ok(false),
        Err(err) => Err(err.to_string()),
    }
}

/// The frames of `archive/` in the open session directory: regular files named
/// `<kind>-<archive id>.frame` (`kind` one of the archive kinds), each with its archive id, its
/// name and how it looked (inode, size, time).
pub(super) fn frames_in(
    root: &OwnedFd,
    session: &str,
) -> Vec<(uuid::Uuid, String, (u64, i64, i128))> {
    let Ok(name) = CString::new(session) else {
        return Vec::new();
    };
    let Some(archive) = open_dir_at(root, &name)
        .ok()
        .and_then(|dir| open_dir_at(&dir, c"archive").ok())
    else {
        return Vec::new();
    };
    let Ok(mut tree) = Tree::new(archive, Vec::new(), 1, Files) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    while let Some(step) = tree.next_step() {
        let Step::Entry(_, (name, _, seen)) = step else {
            continue;
        };
        let Ok(name) = name.into_string() else {
            continue;
        };
        let id = ["compaction-", "reset-"]
            .iter()
            .find_map(|kind| name.strip_prefix(kind))
            .and_then(|rest| rest.strip_suffix(".frame"))
            .and_then(|id| judge::uuid_named(id.as_bytes()));
        if let Some(id) = id {
            found.push((id, name, (seen.ino, seen.size, seen.mtime_ns)));
        }
    }
    found
}
