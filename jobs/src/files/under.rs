//! Paths under a root, resolved one component at a time from the root's descriptor without
//! following a symlink (`openat` with `O_NOFOLLOW`, `unlinkat`): nothing outside the root is
//! ever stat'ed or removed.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

use super::FileCounts;

/// Opens a root directory (the root itself may be a symlink: the operator configured it).
pub fn open_root(root: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

pub(super) fn escape(why: &str) -> io::Error {
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
pub(super) fn open_parent<'p>(
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
pub(super) fn remove_entry(
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
            match rustix::fs::unlinkat(&parent, name, AtFlags::empty()) {
                // Removed meanwhile (another spelling of it, in the same drain).
                Err(rustix::io::Errno::NOENT) => return Ok(FileCounts::default()),
                removal => removal?,
            }
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
pub(super) fn remove_tree(parent: impl AsFd, name: &CStr) -> io::Result<FileCounts> {
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
pub(super) fn open_directory(parent: impl AsFd, name: &CStr) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        parent,
        name,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// The device and inode of an open file: which directory it is, wherever it has moved.
pub(super) fn identity(fd: &OwnedFd) -> io::Result<(u64, u64)> {
    let stat = rustix::fs::fstat(fd)?;
    Ok((stat.st_dev, stat.st_ino))
}

pub(super) fn is_not_a_directory(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error().map(rustix::io::Errno::from_raw_os_error),
        Some(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR)
    )
}

/// Removes everything in the open directory `dir` that is not a directory; returns the names of
/// its subdirectories, to be visited.
pub(super) fn clear(dir: &OwnedFd, counts: &mut FileCounts) -> io::Result<Vec<CString>> {
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
pub(super) fn remove_leaf(dir: &OwnedFd, name: &CStr) -> io::Result<Option<FileCounts>> {
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

pub(super) fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}
