//! The one walk of a directory tree under a root, for every job that lists files (the trace
//! cleaner, an erasure's derivatives, derivative cleanup): directories read one at a time, each
//! opened relative to its parent without following a symlink (TR-3: no symlink, file or
//! directory, and no `..` lead out of the root), every entry `lstat`ed and handed to the
//! caller's [`Look`], which says what it is. Names are bytes: one that is not UTF-8 is walked
//! like any other.
//!
//! Memory holds one directory reader, at most [`LISTED`] of its entries and the directories
//! still to read.

use std::collections::VecDeque;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use rustix::fs::{AtFlags, Mode, OFlags, Stat};

use super::each_at_once;

/// Entries of a directory listed, then looked at together ([`each_at_once`]).
pub const LISTED: usize = 512;

/// What a walk makes of one entry.
pub trait Look: Sync {
    /// What it hands out.
    type Found: Send;

    /// The entry `name` of the open directory `dir`, its path `relative` to the walk's root
    /// (its exact bytes) and its `lstat` (an entry gone since it was listed is never shown).
    fn look(
        &self,
        dir: &OwnedFd,
        name: &CStr,
        relative: &[u8],
        stat: Result<Stat, rustix::io::Errno>,
    ) -> Looked<Self::Found>;
}

/// What [`Look::look`] made of an entry.
pub enum Looked<F> {
    /// Nothing to hand out.
    Skip,
    /// A directory to walk into (if the walk's depth allows).
    Descend,
    /// Handed out as it is.
    Found(F),
}

/// One step of a walk.
pub enum Step<F> {
    /// What the [`Look`] found, with the directory it was listed in (to find it again).
    Entry(Arc<OwnedFd>, F),
    /// Every entry of the directory has been seen.
    DirDone(Arc<OwnedFd>),
}

/// A directory still to be read: opened relative to its parent when its turn comes.
struct Pending {
    parent: Arc<OwnedFd>,
    name: CString,
    /// Its path relative to the walk's root and a `/`.
    prefix: Vec<u8>,
    depth: usize,
}

/// The directory being read.
struct Level<F> {
    fd: Arc<OwnedFd>,
    dir: rustix::fs::Dir,
    prefix: Vec<u8>,
    depth: usize,
    ready: VecDeque<Looked<F>>,
    /// The names of `ready`'s entries, in its order, for those that descend.
    names: VecDeque<(CString, Vec<u8>)>,
}

/// A streaming walk of the tree below an open directory.
pub struct Tree<L: Look> {
    look: L,
    /// Directories deeper than this below the walk's root are not read.
    max_depth: usize,
    current: Option<Level<L::Found>>,
    todo: Vec<Pending>,
    /// No directory was left unread: none too deep, none that could not be opened.
    whole: bool,
}

impl<L: Look> Tree<L> {
    /// A walk of the directory `fd`, whose entries' paths start with `prefix` (empty, or ending
    /// in `/`), reading directories at most `max_depth` levels below it (1: `fd`'s own entries
    /// only).
    ///
    /// # Errors
    /// The directory cannot be read.
    pub fn new(fd: OwnedFd, prefix: Vec<u8>, max_depth: usize, look: L) -> io::Result<Self> {
        let fd = Arc::new(fd);
        let dir = rustix::fs::Dir::read_from(&*fd)?;
        Ok(Tree {
            look,
            max_depth,
            current: Some(Level {
                fd,
                dir,
                prefix,
                depth: 0,
                ready: VecDeque::new(),
                names: VecDeque::new(),
            }),
            todo: Vec::new(),
            whole: true,
        })
    }

    /// Whether every directory met so far was read: none lay deeper than the walk goes, none
    /// could not be opened (it may have been removed meanwhile).
    pub fn whole(&self) -> bool {
        self.whole
    }

    /// Opens the next directory waiting to be walked, if it is still a directory; `None` when
    /// none is left.
    fn open_next(&mut self) -> Option<()> {
        let pending = self.todo.pop()?;
        let opened = rustix::fs::openat(
            &*pending.parent,
            pending.name.as_c_str(),
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        );
        // A directory swapped for a symlink, or removed, since it was listed: skipped.
        if let Ok(fd) = opened
            && let Ok(dir) = rustix::fs::Dir::read_from(&fd)
        {
            self.current = Some(Level {
                fd: Arc::new(fd),
                dir,
                prefix: pending.prefix,
                depth: pending.depth,
                ready: VecDeque::new(),
                names: VecDeque::new(),
            });
        } else {
            self.whole = false;
        }
        Some(())
    }

    /// The next step; `None` when the walk is done.
    pub fn next_step(&mut self) -> Option<Step<L::Found>> {
        loop {
            let Some(level) = self.current.as_mut() else {
                self.open_next()?;
                continue;
            };
            let Some(seen) = level.ready.pop_front() else {
                let names = level.list();
                if names.is_empty() {
                    let done = self.current.take().map(|level| level.fd)?;
                    return Some(Step::DirDone(done));
                }
                let look = &self.look;
                let fd = &level.fd;
                level.ready = each_at_once(&names, |(name, relative)| {
                    match rustix::fs::statat(&**fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                        Err(rustix::io::Errno::NOENT) => Looked::Skip,
                        stat => look.look(fd, name, relative, stat),
                    }
                })
                .into();
                level.names = names.into();
                continue;
            };
            let (name, relative) = level.names.pop_front().unwrap_or_default();
            match seen {
                Looked::Skip => {}
                Looked::Descend => {
                    if level.depth + 1 < self.max_depth {
                        self.todo.push(Pending {
                            parent: level.fd.clone(),
                            name,
                            prefix: [relative.as_slice(), b"/"].concat(),
                            depth: level.depth + 1,
                        });
                    } else {
                        self.whole = false;
                    }
                }
                Looked::Found(found) => return Some(Step::Entry(level.fd.clone(), found)),
            }
        }
    }
}

impl<F> Level<F> {
    /// The directory's next [`LISTED`] entries (fewer at its end), each with its path
    /// relative to the walk's root; `.` and `..` left out.
    fn list(&mut self) -> Vec<(CString, Vec<u8>)> {
        let mut names = Vec::new();
        while names.len() < LISTED {
            let Some(entry) = self.dir.next() else {
                break;
            };
            let Ok(entry) = entry else {
                continue;
            };
            let name = entry.file_name();
            let bytes = name.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            names.push((name.to_owned(), [self.prefix.as_slice(), bytes].concat()));
        }
        names
    }
}

/// Opens the directory `name` of `parent` without following a symlink.
///
/// # Errors
/// It is not there, not a directory, or a symlink.
pub fn open_dir_at(parent: &OwnedFd, name: &CStr) -> io::Result<OwnedFd> {
    super::under::open_directory(parent, name)
}

/// Whether opening a directory failed because a symlink or a non-directory is there.
pub fn is_not_a_directory(err: &io::Error) -> bool {
    super::under::is_not_a_directory(err)
}
